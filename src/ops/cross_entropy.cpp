// Fused softmax + cross-entropy: argument validation, then dispatch by device.
// Math: ops/cross_entropy.h and backend/cpu/cross_entropy.cpp.
#include <algorithm>
#include <cstdint>

#include "ops/cross_entropy.h"

#include "backend/cpu/cross_entropy.h"
#include "ops/check.h"
#include "ops/op_profile.h"
#include "ops/device.h"
#if ZT_WITH_CUDA
#include "backend/cuda/cross_entropy.h"
#endif

namespace zt::ops {

void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                           const Tensor& targets, int64_t vocab, float grad_scale) {
  const char* op = "softmax_cross_entropy";
  const OpScope scope(op, logits);
  check_ndim(op, "logits", logits, 2);
  check_compute_dtype(op, "logits", logits);
  const int64_t N = logits.size(0), Vp = logits.size(1);
  ZT_CHECK(vocab >= 1 && vocab <= Vp, op, ": vocab ", vocab, " must be in [1, ", Vp, "] (the width of 'logits' ",
           logits.shape().str(), ")");
  check_shape(op, "targets", targets, Shape{N});
  check_dtype(op, "targets", targets, {DType::i32});
  check_shape(op, "losses", losses, Shape{N});
  check_dtype(op, "losses", losses, {DType::f32});
  if (dlogits.defined()) {
    check_shape(op, "dlogits", dlogits, logits.shape());
    check_same_dtype(op, "logits", logits, "dlogits", dlogits);
    check_alias_or_disjoint(op, "dlogits", dlogits, "logits", logits);
    check_disjoint(op, "dlogits", dlogits, "losses", losses);
    check_disjoint(op, "dlogits", dlogits, "targets", targets);
  }
  check_disjoint(op, "losses", losses, "logits", logits);
  check_disjoint(op, "losses", losses, "targets", targets);
  check_device(op, logits.device(), {{"logits", &logits}, {"losses", &losses}, {"dlogits", &dlogits}});
  check_ids_device(op, "targets", targets, logits.device());
  const bool on_gpu = use_cuda(op, logits.device());
  if (!logits.device().is_cpu() && !on_gpu) no_backend(op, logits.device());

  // Targets are read on the host, before anything is written (targets on a
  // GPU are copied back: N ints, and a wait for the GPU).
  const Tensor host_targets = on_device(targets, Device::cpu(), MemCategory::workspace);
  const int32_t* tg = host_targets.data<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    ZT_CHECK(tg[n] < vocab, op, ": target ", tg[n], " at row ", n, " is out of range: targets must be < vocab (",
             vocab, "), or negative to ignore the row");
#if ZT_WITH_CUDA
  if (on_gpu)
    return cuda::softmax_cross_entropy(losses, dlogits, logits,
                                       on_device(targets, logits.device(), MemCategory::workspace), vocab, grad_scale);
#endif
  cpu::softmax_cross_entropy(losses, dlogits, logits, targets, vocab, grad_scale);
}

}  // namespace zt::ops

namespace zt::ops {

namespace {

// Shared validation of the vocabulary-parallel passes; returns the number of
// this rank's columns below the vocabulary.
int64_t check_vocab_parallel(const char* op, const Tensor& logits, int64_t col_start, int64_t vocab,
                             std::initializer_list<NamedTensor> per_row) {
  check_ndim(op, "logits", logits, 2);
  check_compute_dtype(op, "logits", logits);
  const int64_t N = logits.size(0), Vl = logits.size(1);
  ZT_CHECK(vocab >= 1 && col_start >= 0, op, ": the slice starting at column ", col_start, " of a vocabulary of ",
           vocab, " is invalid (need vocab >= 1, col_start >= 0)");
  for (const auto& [name, t] : per_row) {
    check_shape(op, name, *t, Shape{N});
    check_dtype(op, name, *t, {std::string_view(name) == "targets" ? DType::i32 : DType::f32});
  }
  check_all_disjoint(op, per_row);
  for (const auto& [name, t] : per_row) check_disjoint(op, name, *t, "logits", logits);
  // Targets may come from the host (uploaded for a GPU); the rest live with the logits.
  for (const auto& [name, t] : per_row) {
    if (std::string_view(name) == "targets")
      check_ids_device(op, name, *t, logits.device());
    else
      ZT_CHECK(t->device() == logits.device(), op, ": '", name, "' is on ", t->device().str(), ", logits on ",
               logits.device().str());
  }
  if (!logits.device().is_cpu() && !use_cuda(op, logits.device())) no_backend(op, logits.device());
  return std::clamp<int64_t>(vocab - col_start, 0, Vl);
}

}  // namespace

void vocab_parallel_ce_max(const Tensor& row_max, const Tensor& logits, int64_t col_start, int64_t vocab) {
  const OpScope scope("vocab_parallel_ce_max", logits);
  const int64_t real = check_vocab_parallel("vocab_parallel_ce_max", logits, col_start, vocab, {{"row_max", &row_max}});
#if ZT_WITH_CUDA
  if (logits.device().is_cuda()) return cuda::vocab_parallel_ce_max(row_max, logits, real);
#endif
  cpu::vocab_parallel_ce_max(row_max, logits, real);
}

void vocab_parallel_ce_sums(const Tensor& sum_exp, const Tensor& target_logit, const Tensor& logits,
                            const Tensor& row_max, const Tensor& targets, int64_t col_start, int64_t vocab) {
  const char* op = "vocab_parallel_ce_sums";
  const OpScope scope(op, logits);
  const int64_t real = check_vocab_parallel(
      op, logits, col_start, vocab,
      {{"sum_exp", &sum_exp}, {"target_logit", &target_logit}, {"row_max", &row_max}, {"targets", &targets}});
  // Read on the host before anything is written (GPU targets are copied back).
  const Tensor host_targets = on_device(targets, Device::cpu(), MemCategory::workspace);
  const int32_t* tg = host_targets.data<int32_t>();
  for (int64_t n = 0; n < host_targets.numel(); ++n)
    ZT_CHECK(tg[n] < vocab, op, ": target ", tg[n], " at row ", n, " is out of range: targets must be < vocab (",
             vocab, "), or negative to ignore the row");
#if ZT_WITH_CUDA
  if (logits.device().is_cuda())
    return cuda::vocab_parallel_ce_sums(sum_exp, target_logit, logits, row_max,
                                        on_device(targets, logits.device(), MemCategory::workspace), col_start, real);
#endif
  cpu::vocab_parallel_ce_sums(sum_exp, target_logit, logits, row_max, targets, col_start, real);
}

void vocab_parallel_ce_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                              const Tensor& targets, int64_t col_start, int64_t vocab, float grad_scale) {
  const char* op = "vocab_parallel_ce_finish";
  const OpScope scope(op, logits);
  const std::initializer_list<NamedTensor> per_row = {{"losses", &losses},
                                                       {"row_max", &row_max},
                                                       {"sum_exp", &sum_exp},
                                                       {"target_logit", &target_logit},
                                                       {"targets", &targets}};
  const int64_t real = check_vocab_parallel(op, logits, col_start, vocab, per_row);
  if (dlogits.defined()) {
    check_shape(op, "dlogits", dlogits, logits.shape());
    check_same_dtype(op, "logits", logits, "dlogits", dlogits);
    check_alias_or_disjoint(op, "dlogits", dlogits, "logits", logits);
    check_disjoint_from(op, "dlogits", dlogits, per_row);
    ZT_CHECK(dlogits.device() == logits.device(), op, ": 'dlogits' is on another device than 'logits'");
  }
#if ZT_WITH_CUDA
  if (logits.device().is_cuda())
    return cuda::vocab_parallel_ce_finish(losses, dlogits, logits, row_max, sum_exp, target_logit,
                                          on_device(targets, logits.device(), MemCategory::workspace), col_start,
                                          real, grad_scale);
#endif
  cpu::vocab_parallel_ce_finish(losses, dlogits, logits, row_max, sum_exp, target_logit, targets, col_start, real,
                                grad_scale);
}

}  // namespace zt::ops
