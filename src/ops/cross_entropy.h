// Fused softmax + cross-entropy over the vocabulary. One pass per row computes
// the loss and (optionally) the logits gradient; the probability matrix is
// never stored.
//
//   logits: (N, Vp) f32 or bf16, of which the first `vocab` columns are real
//           and the rest padding (ignored by the softmax; gradient 0)
//   targets: (N) i32, on logits' device or on the host (validated on the
//            host before any write: host targets save a copy back and its
//            wait); a negative target marks an ignored row (loss 0, grad 0);
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

// Vocabulary-parallel cross-entropy in three passes, with the caller reducing
// over the tensor-parallel group between them (max, then sum): each rank
// holds columns [col_start, col_start + Vl) of the (N, vocab) logits (columns
// at or past `vocab` are padding), so no rank ever holds a full row.
//   logits: (N, Vl) f32 or bf16;  targets: (N) i32 global ids (< 0: ignored)
//   1. row_max (N) f32 = max over this rank's real columns (-inf if none)
//      -> all-reduce max
//   2. sum_exp (N) f32 = sum over real columns of exp(x - row_max);
//      target_logit (N) f32 = x[target] where this rank holds the target, else 0
//      -> all-reduce sum (of both)
//   3. losses (N) f32 = row_max + log(sum_exp) - target_logit (0 for ignored rows);
//      dlogits (N, Vl) logits' dtype (may alias logits; undefined: no gradient)
//      = grad_scale * (exp(x - row_max) / sum_exp - [column == target]), 0 in
//      padding columns and ignored rows.
// Targets must be < vocab (checked in pass 2, before anything is written);
// they may be on the host when the logits are on a GPU.
void vocab_parallel_ce_max(const Tensor& row_max, const Tensor& logits, int64_t col_start, int64_t vocab);
void vocab_parallel_ce_sums(const Tensor& sum_exp, const Tensor& target_logit, const Tensor& logits,
                            const Tensor& row_max, const Tensor& targets, int64_t col_start, int64_t vocab);
void vocab_parallel_ce_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                              const Tensor& targets, int64_t col_start, int64_t vocab, float grad_scale);

}  // namespace zt::ops
