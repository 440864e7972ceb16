// CUDA fused softmax + cross-entropy + dlogits (contract: ops/cross_entropy.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cuda {

void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale);

// The vocabulary-parallel passes (contract: ops/cross_entropy.h); `real` is
// the number of this rank's columns below the vocabulary; targets on the GPU.
void vocab_parallel_ce_max(const Tensor& row_max, const Tensor& logits, int64_t real);
void vocab_parallel_ce_sums(const Tensor& sum_exp, const Tensor& target_logit, const Tensor& logits,
                            const Tensor& row_max, const Tensor& targets, int64_t col_start, int64_t real);
void vocab_parallel_ce_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                              const Tensor& targets, int64_t col_start, int64_t real, float grad_scale);

}  // namespace zt::cuda
