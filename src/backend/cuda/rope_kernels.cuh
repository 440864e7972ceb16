// The kernel of rope.cu: one thread per channel pair (Meta's interleaved
// pairs), in place allowed (each pair is read before the same thread writes
// it); the inverse rotation (the gradient) flips the sign of sin. The
// (T_max, D/2, 2) cos/sin table is built on the host (rope_table_host) in
// f64, rounded once, as the CPU builds it. A header so that the warp
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

// x, y: (B, T, H, D) with pairs = B*T*H*D/2, half = D/2; sign = -1 for the inverse.
template <typename T>
__global__ void rope_kernel(T* y, const T* x, const float* table, int64_t pairs, int64_t T_, int64_t H,
                            int64_t half, int64_t pos_offset, float sign) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i % half, bth = i / half;  // bth = (b*T + t)*H + h
    const int64_t t = (bth / H) % T_;
    const float c = table[((t + pos_offset) * half + p) * 2], s = sign * table[((t + pos_offset) * half + p) * 2 + 1];
    const float x0 = to_f32(x[2 * i]), x1 = to_f32(x[2 * i + 1]);
    y[2 * i] = from_f32<T>(x0 * c - x1 * s);
    y[2 * i + 1] = from_f32<T>(x0 * s + x1 * c);
  }
}

}  // namespace zt::cuda::rope_kernels
