// CUDA fused classifier (softmax + cross-entropy + dlogits): the launch; the
// kernel is in cross_entropy_kernels.cuh.
#include "backend/cuda/cross_entropy.h"

#include "backend/cuda/cross_entropy_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

namespace {

using namespace ce_kernels;

}  // namespace

void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale) {
  const int64_t N = logits.size(0), Vp = logits.size(1);
  if (N == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(logits.dtype(), "softmax_cross_entropy", [&] {
    ce_kernel<T><<<unsigned(N), kThreads, 0, stream_of(losses)>>>(
        losses.data<float>(), dlogits.defined() ? static_cast<T*>(dlogits.data_ptr()) : nullptr,
        static_cast<const T*>(logits.data_ptr()), targets.data<int32_t>(), Vp, vocab, grad_scale);
  });
  ZT_CUDA_CHECK_LAUNCH("ce_kernel");
}

}  // namespace zt::cuda
