// CUDA fused softmax + cross-entropy + dlogits (contract: ops/cross_entropy.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cuda {

void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale);

}  // namespace zt::cuda
