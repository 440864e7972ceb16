// CUDA fused softmax + cross-entropy + dlogits (contract: ops/cross_entropy.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cuda {

void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale);
// The same at `rows_per_sm` rows in flight per SM (1, 2 or 4;
// cross_entropy_kernels.cuh says what it trades): the kernel bench's sweep.
// The bits do not depend on it.
void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale, int rows_per_sm);
// The rows per SM the first form takes: ZT_CUDA_CE_ROWS in the environment
// (1, 2 or 4: the A/B of a training run), else the default (4).
int classifier_rows_per_sm();

// The vocabulary-parallel passes (contract: ops/cross_entropy.h); `real` is
// the number of this rank's columns below the vocabulary; targets on the GPU.
void vocab_parallel_ce_max(const Tensor& row_max, const Tensor& logits, int64_t real);
void vocab_parallel_ce_sums(const Tensor& sum_exp, const Tensor& target_logit, const Tensor& logits,
                            const Tensor& row_max, const Tensor& targets, int64_t col_start, int64_t real);
void vocab_parallel_ce_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                              const Tensor& targets, int64_t col_start, int64_t real, float grad_scale);

}  // namespace zt::cuda
