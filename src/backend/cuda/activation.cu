// CUDA GeLU (tanh approximation) and SwiGLU: grid-stride pointwise kernels in
// f32 with one rounding per output.
#include "backend/cuda/activation.h"

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

namespace {

constexpr int kThreads = 256;
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float sigmoidf(float g) { return 1.0f / (1.0f + __expf(-g)); }

template <typename T>
__global__ void gelu_fwd_kernel(T* y, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_f32(x[i]);
    const float u = kGeluK * (v + kGeluC * v * v * v);
    y[i] = from_f32<T>(0.5f * v * (1.0f + tanhf(u)));
  }
}

// d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u',  u' = k (1 + 3 c x^2)
template <typename T>
__global__ void gelu_bwd_kernel(T* dx, const T* dy, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = to_f32(x[i]);
    const float u = kGeluK * (v + kGeluC * v * v * v);
    const float t = tanhf(u);
    const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * v * v);
    dx[i] = from_f32<T>(d * to_f32(dy[i]));
  }
}

// x rows [gate (H) | up (H)], y rows (H).
template <typename T>
__global__ void swiglu_fwd_kernel(T* y, const T* x, int64_t rows, int64_t H) {
  const int64_t n = rows * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / H, h = i - r * H;
    const float g = to_f32(x[r * 2 * H + h]), u = to_f32(x[r * 2 * H + H + h]);
    y[i] = from_f32<T>(g * sigmoidf(g) * u);
  }
}

// dgate = dy * up * silu'(g), silu'(g) = s (1 + g (1 - s)); dup = dy * silu(g)
template <typename T>
__global__ void swiglu_bwd_kernel(T* dx, const T* dy, const T* x, int64_t rows, int64_t H) {
  const int64_t n = rows * H;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / H, h = i - r * H;
    const float g = to_f32(x[r * 2 * H + h]), u = to_f32(x[r * 2 * H + H + h]), d = to_f32(dy[i]);
    const float s = sigmoidf(g);
    dx[r * 2 * H + h] = from_f32<T>(d * u * s * (1.0f + g * (1.0f - s)));
    dx[r * 2 * H + H + h] = from_f32<T>(d * g * s);
  }
}

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
