// The kernel of cross_entropy.cu (the fused classifier): one block per row;
// pass 1 is an online max/sum over the real vocabulary (per thread, then
// merged across the block), pass 2 writes dlogits = (softmax - onehot) *
// grad_scale (in place allowed: each element is read before the same thread
// overwrites it). No probability matrix is stored. A header so that the warp
// emulator (tests/cuda_emu) runs it on the CPU.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::ce_kernels {

constexpr int kThreads = 512;

template <typename T>
__global__ void ce_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t Vp,
                          int64_t vocab, float grad_scale) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * Vp;
  const int32_t target = targets[row];
  // Per-thread running max and sum of exp(x - max).
  float m = -INFINITY, s = 0.0f;
  for (int64_t c = threadIdx.x; c < vocab; c += blockDim.x) {
    const float x = to_f32(lr[c]);
    if (x > m) {
      s = s * __expf(m - x) + 1.0f;
      m = x;
    } else {
      s += __expf(x - m);
    }
  }
  const float row_max = block_max(m, scratch);
  const float sum = block_sum(m == -INFINITY ? 0.0f : s * __expf(m - row_max), scratch);
  const float lse = row_max + logf(sum);
  const bool ignored = target < 0;
  // Read the target logit before any in-place write.
  const float target_logit = ignored ? 0.0f : to_f32(lr[target]);
  __syncthreads();
  if (threadIdx.x == 0) losses[row] = ignored ? 0.0f : lse - target_logit;
  if (dlogits == nullptr) return;
  T* dr = dlogits + row * Vp;
  for (int64_t c = threadIdx.x; c < Vp; c += blockDim.x) {
    float g = 0.0f;
    if (!ignored && c < vocab) g = (__expf(to_f32(lr[c]) - lse) - (c == target ? 1.0f : 0.0f)) * grad_scale;
    dr[c] = from_f32<T>(g);
  }
}

}  // namespace zt::cuda::ce_kernels
