// The kernels of activation.cu: GeLU (tanh approximation) and SwiGLU,
// forward and backward, grid-stride pointwise loops in f32 with one rounding
// per output. A header so that the warp emulator (tests/cuda_emu) runs them
// on the CPU.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::activation_kernels {

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

}  // namespace zt::cuda::activation_kernels
