// CUDA GeLU (tanh approximation) and SwiGLU: grid-stride pointwise kernels in
// f32 with one rounding per output. The launches; the kernels are in
// activation_kernels.cuh.
#include "backend/cuda/activation.h"

#include <algorithm>

#include "backend/cuda/activation_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

namespace {

using namespace activation_kernels;

}  // namespace

void gelu_forward(const Tensor& y, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "gelu_forward", [&] {
    gelu_fwd_kernel<T><<<grid_for(n, kThreads, x.device()), kThreads, 0, stream_of(y)>>>(
        static_cast<T*>(y.data_ptr()), static_cast<const T*>(x.data_ptr()), n);
  });
  ZT_CUDA_CHECK_LAUNCH("gelu_fwd_kernel");
}

void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "gelu_backward", [&] {
    gelu_bwd_kernel<T><<<grid_for(n, kThreads, x.device()), kThreads, 0, stream_of(dx)>>>(
        static_cast<T*>(dx.data_ptr()), static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()), n);
  });
  ZT_CUDA_CHECK_LAUNCH("gelu_bwd_kernel");
}

void swiglu_forward(const Tensor& y, const Tensor& x) {
  const int64_t H = y.size(-1), rows = y.numel() / std::max<int64_t>(1, H);
  if (y.numel() == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "swiglu_forward", [&] {
    swiglu_fwd_kernel<T><<<grid_for(rows * H, kThreads, x.device()), kThreads, 0, stream_of(y)>>>(
        static_cast<T*>(y.data_ptr()), static_cast<const T*>(x.data_ptr()), rows, H);
  });
  ZT_CUDA_CHECK_LAUNCH("swiglu_fwd_kernel");
}

void swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const int64_t H = dy.size(-1), rows = dy.numel() / std::max<int64_t>(1, H);
  if (dy.numel() == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "swiglu_backward", [&] {
    swiglu_bwd_kernel<T><<<grid_for(rows * H, kThreads, x.device()), kThreads, 0, stream_of(dx)>>>(
        static_cast<T*>(dx.data_ptr()), static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()),
        rows, H);
  });
  ZT_CUDA_CHECK_LAUNCH("swiglu_bwd_kernel");
}

}  // namespace zt::cuda
