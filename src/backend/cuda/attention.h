// CUDA causal attention with grouped-query heads (contract: ops/attention.h).
// Host-callable; no CUDA headers.
#pragma once

#include "core/tensor.h"

namespace zt::cuda {

// scale is resolved by the ops layer (> 0).
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       float scale);
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale);

}  // namespace zt::cuda
