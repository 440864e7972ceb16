// Fused softmax + cross-entropy: argument validation, then dispatch by device.
// Math: ops/cross_entropy.h and backend/cpu/cross_entropy.cpp.
#include <cstdint>

#include "ops/cross_entropy.h"

#include "backend/cpu/cross_entropy.h"
#include "ops/check.h"
#include "ops/device.h"
#if ZT_WITH_CUDA
#include "backend/cuda/cross_entropy.h"
#endif

namespace zt::ops {

namespace {

// True if the byte ranges of two defined tensors on one device intersect
// (by address, so views of separately wrapped memory are caught too).
bool bytes_overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.device() != b.device() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* pa = static_cast<const char*>(a.data_ptr());
  const auto* pb = static_cast<const char*>(b.data_ptr());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace

void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                           const Tensor& targets, int64_t vocab, float grad_scale) {
  const char* op = "softmax_cross_entropy";
  check_ndim(op, "logits", logits, 2);
  check_dtype(op, "logits", logits, {DType::f32, DType::bf16});
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
    ZT_CHECK(!bytes_overlap(dlogits, logits) || dlogits.data_ptr() == logits.data_ptr(), op,
             ": 'dlogits' partially overlaps 'logits'; it must be the same tensor (in place) or disjoint");
    ZT_CHECK(!bytes_overlap(dlogits, losses) && !bytes_overlap(dlogits, targets), op,
             ": 'dlogits' overlaps 'losses' or 'targets'");
  }
  ZT_CHECK(!bytes_overlap(losses, logits) && !bytes_overlap(losses, targets), op,
           ": 'losses' overlaps 'logits' or 'targets'");
  check_device(op, logits.device(),
               {{"logits", &logits}, {"targets", &targets}, {"losses", &losses}, {"dlogits", &dlogits}});
  const bool on_gpu = use_cuda(op, logits.device());
  if (!logits.device().is_cpu() && !on_gpu) no_backend(op, logits.device());

  // Targets are read on the host, before anything is written (a GPU's are
  // copied: N ints, one small transfer).
  const Tensor host_targets = on_gpu ? to_device(targets, Device::cpu()) : targets;
  const int32_t* tg = host_targets.data<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    ZT_CHECK(tg[n] < vocab, op, ": target ", tg[n], " at row ", n, " is out of range: targets must be < vocab (",
             vocab, "), or negative to ignore the row");
#if ZT_WITH_CUDA
  if (on_gpu) return cuda::softmax_cross_entropy(losses, dlogits, logits, targets, vocab, grad_scale);
#endif
  cpu::softmax_cross_entropy(losses, dlogits, logits, targets, vocab, grad_scale);
}

}  // namespace zt::ops
