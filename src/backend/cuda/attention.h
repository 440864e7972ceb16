// CUDA causal attention with grouped-query heads (contract: ops/attention.h).
// Host-callable; no CUDA headers.
#pragma once

#include "core/tensor.h"

#include <cstdint>

namespace zt::cuda {

// Two implementations:
//   gemm    tensor cores: the (T, T) score and probability matrices of a
//           chunk of heads as cuBLASLt products, causal softmax (and its
//           backward) as row kernels (attention_gemm.cu). Workspace
//           ~12 bytes x heads x T^2 in backward, in head chunks of at most
//           kAttentionWorkspaceBudget.
//   simple  one warp per query (or key) row on CUDA cores, O(T) memory
//           (attention.cu): the fallback when one head's matrices exceed the
//           budget, and a second implementation to test against.
// automatic picks gemm when it fits. Both are deterministic.
enum class AttentionKernel { automatic, simple, gemm };
constexpr int64_t kAttentionWorkspaceBudget = int64_t(1) << 30;  // bytes

// scale is resolved by the ops layer (> 0).
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       float scale, AttentionKernel kernel = AttentionKernel::automatic);
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale,
                        AttentionKernel kernel = AttentionKernel::automatic);

// The gemm implementation (attention_gemm.cu), and whether a shape's score
// matrices for one kv head's group fit the workspace budget (bytes; tests
// pass a small one to exercise the head chunks).
bool gemm_attention_fits(const Tensor& q, const Tensor& k, bool backward,
                         int64_t budget = kAttentionWorkspaceBudget);
void gemm_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                            float scale, int64_t budget = kAttentionWorkspaceBudget);
void gemm_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                             const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse, float scale,
                             int64_t budget = kAttentionWorkspaceBudget);

}  // namespace zt::cuda
