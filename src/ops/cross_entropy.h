// Fused softmax + cross-entropy over the vocabulary. One pass per row computes
// the loss and (optionally) the logits gradient; the probability matrix is
// never stored.
//
//   logits: (N, Vp) f32 or bf16, of which the first `vocab` columns are real
//           and the rest padding (ignored by the softmax; gradient 0)
//   targets: (N) i32; a negative target marks an ignored row (loss 0, grad 0);
//           a target >= vocab is an error (checked before anything is written)
//   losses: (N) f32:  logsumexp(logits[n, :vocab]) - logits[n, target]
//   dlogits: (N, Vp), logits' dtype, or undefined for a forward-only pass:
//           (softmax(logits[n, :vocab]) - onehot(target)) * grad_scale
//           dlogits may alias logits exactly (computed in place); any other
//           overlap between arguments is an error.
//   1 <= vocab <= Vp. N = 0 is allowed (nothing to do).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::ops {

void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                           const Tensor& targets, int64_t vocab, float grad_scale);

}  // namespace zt::ops
