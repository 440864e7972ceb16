// CUDA fused softmax + cross-entropy + dlogits (contract: ops/cross_entropy.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/kernel_race.h"
#include "core/tensor.h"

namespace zt::cuda {

// The fused classifier's kernel (cross_entropy_kernels.cuh says what each
// trades): the row staged in shared memory, read once from device memory
// (where 16-byte packs tile it; else the re-reading kernel), or re-read at
// `rows_per_sm` rows in flight per SM (1, 2 or 4). The bits are the same.
struct ClassifierKernel {
  bool staged = false;
  int rows_per_sm = 4;
  bool operator==(const ClassifierKernel&) const = default;
};
// "staged", "rows4": as logs and the kernel bench name it.
std::string classifier_kernel_name(ClassifierKernel kernel);
// The kernels training races for each shape of call (kernel_race.h), in
// order of preference on a tie: the re-reading kernel at 4 rows per SM (the
// one measured fastest on an H100, bench/results/gpu-2026-11-26.md), the
// staged one, then 2 and 1 rows per SM.
inline constexpr ClassifierKernel kClassifierCandidates[] = {
    {.rows_per_sm = 4}, {.staged = true}, {.rows_per_sm = 2}, {.rows_per_sm = 1}};
// The kernel the environment pins for training's calls (the A/B of a run):
// ZT_CUDA_CE_STAGED=1 the staged one (the re-reading one at
// ZT_CUDA_CE_ROWS, or 4, where it cannot run), ZT_CUDA_CE_ROWS = 1, 2 or 4
// the re-reading one. Neither: nothing, and training races the candidates.
std::optional<ClassifierKernel> pinned_classifier_kernel();

// The races so far: one per shape of call (rows, padded columns, vocabulary,
// dtype, in place or not or losses alone, 16-byte packs or not, GPU).
struct ClassifierRaceStanding {
  std::string call;  // "4096 x 50304 bf16 (vocab 50257), in place, cuda:0"
  RaceTally tally;   // over kClassifierCandidates
};
std::vector<ClassifierRaceStanding> classifier_races();

// Training's classifier: the pinned kernel, else the race of this call's
// shape (each candidate on whole calls until each has kRaceSamples timed,
// then the fastest).
void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale);
// The same on a given kernel: the kernel bench's sweep, the tests.
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
