// CPU fused softmax + cross-entropy (contract: ops/cross_entropy.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cpu {

// losses: (N) f32; dlogits: (N, Vp) like logits or undefined (may be logits
// itself); logits: (N, Vp) f32/bf16; targets: (N) i32, each < vocab (negative:
// ignored row). Arguments already validated.
void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale);

}  // namespace zt::cpu
