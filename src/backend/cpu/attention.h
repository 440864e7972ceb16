// CPU kernels of causal grouped-query attention (see ops/attention.h for the
// contract). Arguments are validated by zt::ops; `scale` is already resolved
// (> 0).
//
//   q, dq, out, dout: (B, T, Hq, D)   k, v, dk, dv: (B, T, Hkv, D)   lse: (B, Hq, T) f32
//   All of q, k, v, out, dout, dq, dk, dv share one dtype: f32 or bf16.
#pragma once

#include "core/tensor.h"

namespace zt::cpu {

// out = softmax(scale q k^T + causal mask) v per (batch, query head);
// lse = logsumexp of the masked scaled scores.
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       float scale);

// dq, dk, dv overwritten. Deterministic: the result does not depend on the
// number of OpenMP threads.
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale);

}  // namespace zt::cpu
