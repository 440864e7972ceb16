// Device-side pieces shared by the fused attention kernels
// (attention_flash_kernels.cuh: WMMA, attention_mma_kernels.cuh: mma.sync):
// the block shape, the problem's dims, the shared-memory declaration and the
// global-to-shared tile copy; the warp emulator (tests/cuda_emu) compiles it
// too.
#pragma once

#include <vector_functions.h>
#include <vector_types.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"  // to_f32 / from_f32, ZT_SHARED_MEMORY

namespace zt::cuda::attn {

constexpr int kWarps = 4;  // per block; each owns 16 rows of the block's tile
constexpr int kThreads = 32 * kWarps;

// q, out, dq, dout (B, T, Hq, D); k, v, dk, dv (B, T, Hkv, D); lse, delta (B, Hq, T).
struct Dims {
  int64_t B, T, Hq, Hkv;
  __host__ __device__ int64_t tiles(int rows) const { return (T + rows - 1) / rows; }
  __host__ __device__ int64_t group() const { return Hq / Hkv; }
};

// Copies rows [0, min(valid, kRows)) of a (kRows, kD) tile from global (rows
// `stride` elements apart, 16-byte aligned) into shared (rows `ld` elements
// apart), zeros below: the padding rows of the last tile stay finite and the
// callers mask them.
template <typename T, int kD, int kRows>
__device__ __forceinline__ void load_tile(T* __restrict__ dst, int ld, const T* __restrict__ src, int64_t stride,
                                          int64_t valid) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (r < valid) x = *reinterpret_cast<const uint4*>(src + r * stride + col);
    *reinterpret_cast<uint4*>(dst + r * ld + col) = x;
  }
}

}  // namespace zt::cuda::attn
