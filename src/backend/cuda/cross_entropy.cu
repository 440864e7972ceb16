// CUDA fused classifier (softmax + cross-entropy + dlogits) and its
// vocabulary-parallel passes: the launches (16-byte packs where they tile the
// rows); the kernels are in cross_entropy_kernels.cuh.
#include "backend/cuda/cross_entropy.h"

#include <algorithm>
#include <iterator>
#include <optional>

#include "backend/cuda/cross_entropy_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "core/env.h"

namespace zt::cuda {

namespace {

using namespace ce_kernels;

}  // namespace

ClassifierKernel classifier_kernel() {
  static const ClassifierKernel kernel = [] {
    ClassifierKernel k;
    k.staged = env_switch("ZT_CUDA_CE_STAGED",
                          "1: the classifier stages each row in shared memory; 0: it reads the row twice");
    const std::optional<int64_t> rows =
        env_whole_number("ZT_CUDA_CE_ROWS", 1, "the classifier's rows in flight per SM");
    if (rows) {
      ZT_CHECK(std::ranges::find(kRowsPerSmChoices, *rows) != std::end(kRowsPerSmChoices), "ZT_CUDA_CE_ROWS = ", *rows,
               " is not one of 1, 2, 4 (the classifier's rows in flight per SM); unset it for the default");
      k.rows_per_sm = int(*rows);
    }
    return k;
  }();
  return kernel;
}

void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale) {
  softmax_cross_entropy(losses, dlogits, logits, targets, vocab, grad_scale, classifier_kernel());
}

namespace {

// ce_staged_kernel where 16-byte packs tile the rows and some fit the shared
// memory of a block; false (nothing launched) otherwise.
template <typename T>
bool staged_classifier(const Tensor& losses, T* dp, const T* lp, const Tensor& targets, int64_t N, int64_t Vp,
                       int64_t vocab, float grad_scale) {
  constexpr int V = kPack16<T>;
  if (!packs_of_16_fit<T>(Vp, lp, dp)) return false;
  const Device device = losses.device();
  // The block's own __shared__ scratch (32 floats) comes out of the same limit.
  const int64_t staged = staged_packs(Vp / V, max_shared_optin(device) - 32 * int64_t(sizeof(float)));
  if (staged == 0) return false;
  const size_t smem = size_t(staged) * 16;
  const auto kernel = ce_staged_kernel<T>;
  const int64_t per_sm = resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, smem, device);
  const int64_t grid = std::min(N, per_sm * num_sms(device));
  kernel<<<unsigned(grid), kThreads, smem, stream_of(losses)>>>(losses.data<float>(), dp, lp, targets.data<int32_t>(),
                                                                 N, Vp, vocab, grad_scale, staged);
  ZT_CUDA_CHECK_LAUNCH("ce_staged_kernel");
  return true;
}

}  // namespace

void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale, ClassifierKernel choice) {
  const int64_t N = logits.size(0), Vp = logits.size(1);
  if (N == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(logits.dtype(), "softmax_cross_entropy", [&] {
    T* dp = dlogits.defined() ? static_cast<T*>(dlogits.data_ptr()) : nullptr;
    const T* lp = static_cast<const T*>(logits.data_ptr());
    if (choice.staged && staged_classifier<T>(losses, dp, lp, targets, N, Vp, vocab, grad_scale)) return;
    const unsigned grid = ce_grid(N, num_sms(logits.device()), choice.rows_per_sm);
    with_pack_width<T>(packs_of_16_fit<T>(Vp, lp, dp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      const auto launch = [&](auto kernel) {
        kernel<<<grid, kThreads, 0, stream_of(losses)>>>(losses.data<float>(), dp, lp, targets.data<int32_t>(), N, Vp,
                                                         vocab, grad_scale);
      };
      with_int_constant<1, 2, 4>(choice.rows_per_sm, "softmax_cross_entropy: rows per SM",
                                 [&](auto r) { launch(ce_kernel<T, V, decltype(r)::value>); });
    });
    ZT_CUDA_CHECK_LAUNCH("ce_kernel");
  });
}

void vocab_parallel_ce_max(const Tensor& row_max, const Tensor& logits, int64_t real) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  if (N == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(logits.dtype(), "vocab_parallel_ce_max", [&] {
    const T* lp = static_cast<const T*>(logits.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(Vl, lp), [&](auto v) {
      vp_max_kernel<T, decltype(v)::value><<<unsigned(N), kThreads, 0, stream_of(row_max)>>>(row_max.data<float>(),
                                                                                              lp, Vl, real);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("vp_max_kernel");
}

void vocab_parallel_ce_sums(const Tensor& sum_exp, const Tensor& target_logit, const Tensor& logits,
                            const Tensor& row_max, const Tensor& targets, int64_t col_start, int64_t real) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  if (N == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(logits.dtype(), "vocab_parallel_ce_sums", [&] {
    const T* lp = static_cast<const T*>(logits.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(Vl, lp), [&](auto v) {
      vp_sums_kernel<T, decltype(v)::value><<<unsigned(N), kThreads, 0, stream_of(sum_exp)>>>(
          sum_exp.data<float>(), target_logit.data<float>(), lp, row_max.data<float>(), targets.data<int32_t>(), Vl,
          col_start, real);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("vp_sums_kernel");
}

void vocab_parallel_ce_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                              const Tensor& targets, int64_t col_start, int64_t real, float grad_scale) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  if (N == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(logits.dtype(), "vocab_parallel_ce_finish", [&] {
    T* dp = dlogits.defined() ? static_cast<T*>(dlogits.data_ptr()) : nullptr;
    const T* lp = static_cast<const T*>(logits.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(Vl, lp, dp), [&](auto v) {
      vp_finish_kernel<T, decltype(v)::value><<<unsigned(N), kThreads, 0, stream_of(losses)>>>(
          losses.data<float>(), dp, lp, row_max.data<float>(), sum_exp.data<float>(), target_logit.data<float>(),
          targets.data<int32_t>(), Vl, col_start, real, grad_scale);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("vp_finish_kernel");
}

}  // namespace zt::cuda
