// CUDA GeLU (tanh approximation) and SwiGLU: grid-stride pointwise kernels in
// f32 with one rounding per output, over 16-byte packs where they fit. The
// launches; the kernels are in activation_kernels.cuh.
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
    T* yp = static_cast<T*>(y.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(n, yp, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      gelu_fwd_kernel<T, V><<<grid_for(n / V, kThreads, x.device()), kThreads, 0, stream_of(y)>>>(yp, xp, n);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("gelu_fwd_kernel");
}

void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "gelu_backward", [&] {
    T* dxp = static_cast<T*>(dx.data_ptr());
    const T *dyp = static_cast<const T*>(dy.data_ptr()), *xp = static_cast<const T*>(x.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(n, dxp, dyp, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      gelu_bwd_kernel<T, V><<<grid_for(n / V, kThreads, x.device()), kThreads, 0, stream_of(dx)>>>(dxp, dyp, xp, n);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("gelu_bwd_kernel");
}

// The packs tile a row of H (x's gate and up halves start at multiples of H).
void swiglu_forward(const Tensor& y, const Tensor& x) {
  const int64_t H = y.size(-1), rows = y.numel() / std::max<int64_t>(1, H);
  if (y.numel() == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "swiglu_forward", [&] {
    T* yp = static_cast<T*>(y.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(H, yp, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      swiglu_fwd_kernel<T, V><<<grid_for(rows * H / V, kThreads, x.device()), kThreads, 0, stream_of(y)>>>(yp, xp,
                                                                                                           rows, H);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("swiglu_fwd_kernel");
}

void swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const int64_t H = dy.size(-1), rows = dy.numel() / std::max<int64_t>(1, H);
  if (dy.numel() == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "swiglu_backward", [&] {
    T* dxp = static_cast<T*>(dx.data_ptr());
    const T *dyp = static_cast<const T*>(dy.data_ptr()), *xp = static_cast<const T*>(x.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(H, dxp, dyp, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      swiglu_bwd_kernel<T, V><<<grid_for(rows * H / V, kThreads, x.device()), kThreads, 0, stream_of(dx)>>>(
          dxp, dyp, xp, rows, H);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("swiglu_bwd_kernel");
}

}  // namespace zt::cuda
