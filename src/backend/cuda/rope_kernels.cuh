// The kernel of rope.cu: Meta's interleaved channel pairs, a thread per
// pair or per 16-byte pack of pairs, in place allowed (each pair is read
// before the same thread writes it); the inverse rotation (the gradient)
// flips the sign of sin. The (T_max, D/2, 2) cos/sin table is built on the
// host (rope_table_host) in f64, rounded once, as the CPU builds it. A header so that the warp
// emulator (tests/cuda_emu) runs the kernel on the CPU with the same table.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::rope_kernels {

constexpr int kThreads = 256;

// Host side: table[t][i] = (cos(t freqs[i]), sin(t freqs[i])) for t < T_max,
// i < half; table holds T_max * half * 2 floats.
inline void rope_table_host(float* table, int64_t T_max, int64_t half, const double* freqs) {
  for (int64_t t = 0; t < T_max; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(t) * freqs[i];
      table[(t * half + i) * 2] = float(std::cos(a));
      table[(t * half + i) * 2 + 1] = float(std::sin(a));
    }
}

// x, y: (B, T, H, D), half = D/2; sign = -1 for the inverse. Each thread
// takes V consecutive elements (V / 2 pairs of one head row): V = 2, one
// pair by element loads, or V = kPack16<T> in 16-byte packs when the launch
// checked that they fit (V divides D, aligned pointers). units = numel / V.
// The position and pair index cost 64-bit divisions, once per unit.
template <typename T, int V>
__global__ void rope_kernel(T* y, const T* x, const float* table, int64_t units, int64_t T_, int64_t H,
                            int64_t half, int64_t pos_offset, float sign) {
  static_assert(V % 2 == 0, "a unit holds whole pairs");
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < units; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pair0 = i * (V / 2), bth = pair0 / half;  // bth = (b*T + t)*H + h
    const int64_t p0 = pair0 - bth * half, t = (bth / H) % T_;
    const float* cs = table + ((t + pos_offset) * half + p0) * 2;  // (cos, sin) of pairs p0, p0 + 1, ...
    Pack<T, V> in, out;
    if constexpr (V == 2) {
      in.v[0] = x[2 * pair0];
      in.v[1] = x[2 * pair0 + 1];
    } else {
      in = load_pack<T, V>(x + 2 * pair0);
    }
#pragma unroll
    for (int q = 0; q < V / 2; ++q) {
      const float c = cs[2 * q], s = sign * cs[2 * q + 1];
      const float x0 = to_f32(in.v[2 * q]), x1 = to_f32(in.v[2 * q + 1]);
      out.v[2 * q] = from_f32<T>(x0 * c - x1 * s);
      out.v[2 * q + 1] = from_f32<T>(x0 * s + x1 * c);
    }
    if constexpr (V == 2) {
      y[2 * pair0] = out.v[0];
      y[2 * pair0 + 1] = out.v[1];
    } else {
      store_pack<T, V>(y + 2 * pair0, out);
    }
  }
}

}  // namespace zt::cuda::rope_kernels
