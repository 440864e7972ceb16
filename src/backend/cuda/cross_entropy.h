// CUDA fused softmax + cross-entropy + dlogits (contract: ops/cross_entropy.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cuda {

// The fused classifier's kernel (cross_entropy_kernels.cuh says what each
// trades): the row staged in shared memory, read once from device memory
// (where 16-byte packs tile it; else the re-reading kernel), or re-read at
// `rows_per_sm` rows in flight per SM (1, 2 or 4). The bits are the same.
struct ClassifierKernel {
  bool staged = false;
  int rows_per_sm = 4;
};
// The kernel training takes: ZT_CUDA_CE_STAGED=1 and ZT_CUDA_CE_ROWS (1, 2 or
// 4) in the environment (the A/B of a training run), else rows_per_sm 4.
ClassifierKernel classifier_kernel();

void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale);
// The same on a given kernel: the kernel bench's sweep.
void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale, ClassifierKernel kernel);

// The vocabulary-parallel passes (contract: ops/cross_entropy.h); `real` is
// the number of this rank's columns below the vocabulary; targets on the GPU.
void vocab_parallel_ce_max(const Tensor& row_max, const Tensor& logits, int64_t real);
void vocab_parallel_ce_sums(const Tensor& sum_exp, const Tensor& target_logit, const Tensor& logits,
                            const Tensor& row_max, const Tensor& targets, int64_t col_start, int64_t real);
void vocab_parallel_ce_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                              const Tensor& targets, int64_t col_start, int64_t real, float grad_scale);

}  // namespace zt::cuda
