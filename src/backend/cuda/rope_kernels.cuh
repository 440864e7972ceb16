// The kernel of rope.cu: Meta's interleaved channel pairs, a thread per
// pair or per 16-byte pack of pairs, in place allowed (each pair is read
// before the same thread writes it); the inverse rotation (the gradient)
// flips the sign of sin. The same kernel splits the fused qkv product into
// rotated q and k and copied v, and joins their gradients back. The
// (T_max, D/2, 2) cos/sin table is built on the host (rope_table_host) in
// f64, rounded once, as the CPU builds it. A header so that the warp emulator
// (tests/cuda_emu) runs the kernel on the CPU with the same table.
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

// Tokens of Hq + 2 Hkv (+ skipped) heads of D = 2 half channels in
// `packed`, and the same heads as separate tensors q (tokens, Hq, D), k and v
// (tokens, Hkv, D). Heads [0, Hq + Hkv) are rotated (sign = -1: the
// inverse), the next Hkv copied, a token's last `skipped` heads not visited;
// to_packed: from the separate tensors into packed, else from packed into
// them. A plain rotation is Hkv = 0 (k, v unused), in place when
// q == packed: each thread reads its unit before writing it, and q shares
// packed's layout (a fused product's query and key heads rotated in place:
// Hq + Hkv heads, the Hkv value heads skipped).
template <typename T>
struct HeadLayout {
  T* packed;
  T* q;
  T* k;
  T* v;
  int64_t Hq, Hkv;
  int64_t skipped = 0;
};

// Each thread takes V consecutive elements of a visited head row (V / 2
// pairs): V = 2, one pair by element loads, or V = kPack16<T> in 16-byte
// packs when the launch checked that they fit (V divides D, aligned
// pointers). units = tokens (Hq + 2 Hkv) D / V: the skipped heads get no
// thread. The position, head and pair index cost 64-bit divisions, once per
// unit.
template <typename T, int V>
__global__ void rope_kernel(HeadLayout<T> l, const float* table, int64_t units, int64_t T_, int64_t half,
                            int64_t pos_offset, float sign, bool to_packed) {
  static_assert(V % 2 == 0, "a unit holds whole pairs");
  const int64_t H = l.Hq + 2 * l.Hkv, token_heads = H + l.skipped;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < units; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t pair0 = i * (V / 2), bth = pair0 / half;  // bth = (b*T + t)*H + h
    const int64_t p0 = pair0 - bth * half, bt = bth / H, h = bth - bt * H, t = bt % T_;
    T* pk = l.packed + ((bt * token_heads + h) * half + p0) * 2;
    T* sep = l.q == l.packed   ? pk
             : h < l.Hq        ? l.q + (bt * l.Hq + h) * 2 * half + 2 * p0
             : h < l.Hq + l.Hkv ? l.k + (bt * l.Hkv + h - l.Hq) * 2 * half + 2 * p0
                                : l.v + (bt * l.Hkv + h - l.Hq - l.Hkv) * 2 * half + 2 * p0;
    const T* src = to_packed ? sep : pk;
    T* dst = to_packed ? pk : sep;
    Pack<T, V> in, out;
    if constexpr (V == 2) {
      in.v[0] = src[0];
      in.v[1] = src[1];
    } else {
      in = load_pack<T, V>(src);
    }
    if (h < l.Hq + l.Hkv) {
      const float* cs = table + ((t + pos_offset) * half + p0) * 2;  // (cos, sin) of pairs p0, p0 + 1, ...
#pragma unroll
      for (int q = 0; q < V / 2; ++q) {
        const float c = cs[2 * q], s = sign * cs[2 * q + 1];
        const float x0 = to_f32(in.v[2 * q]), x1 = to_f32(in.v[2 * q + 1]);
        out.v[2 * q] = from_f32<T>(x0 * c - x1 * s);
        out.v[2 * q + 1] = from_f32<T>(x0 * s + x1 * c);
      }
    } else {
      out = in;
    }
    if constexpr (V == 2) {
      dst[0] = out.v[0];
      dst[1] = out.v[1];
    } else {
      store_pack<T, V>(dst, out);
    }
  }
}

}  // namespace zt::cuda::rope_kernels
