// The kernel of attention_merge.cu (contract: ops/attention.h,
// attention_merge). A header so that the warp emulator (tests/cuda_emu) runs
// it on the CPU.
//
// One warp per row (b, h, i) of the block: every lane reads the row's
// running and block lse, forms the same two weights, and rescales its
// elements d = lane, lane + 32, ... of the head's D; lane 0 writes the merged
// lse after the warp's reads of the old one (__syncwarp).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::merge_kernels {

constexpr int kWarps = 4;  // rows a block

// out (B, T, H, D) f32, lse (B, H, T) f32 at rows [row0, row0 + n) merged
// with part (B, n, H, D), part_lse (B, H, n).
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    attention_merge_kernel(float* out, float* lse, const T* part, const float* part_lse, int64_t B, int64_t T_all,
                           int64_t H, int64_t D, int64_t n, int64_t row0) {
  const int lane = int(threadIdx.x & 31);
  const int64_t row = int64_t(blockIdx.x) * kWarps + int64_t(threadIdx.x >> 5);  // over (b, h, i)
  if (row >= B * H * n) return;  // the whole warp: row is the warp's
  const int64_t i = row % n, h = (row / n) % H, b = row / (n * H);
  float* run_lse = lse + (b * H + h) * T_all + row0 + i;
  const float run = *run_lse, blk = part_lse[row];
  const float hi = fmaxf(run, blk);
  const float merged = hi + log1pf(expf(fminf(run, blk) - hi));  // log(e^run + e^blk)
  const float w_run = expf(run - merged), w_blk = expf(blk - merged);
  float* dst = out + ((b * T_all + row0 + i) * H + h) * D;
  const T* src = part + ((b * n + i) * H + h) * D;
  for (int64_t d = lane; d < D; d += 32) dst[d] = w_run * dst[d] + w_blk * to_f32(src[d]);
  __syncwarp();  // every lane has read the running lse
  if (lane == 0) *run_lse = merged;
}

}  // namespace zt::cuda::merge_kernels
