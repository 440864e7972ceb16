// The kernels of activation.cu: GeLU (tanh approximation) and SwiGLU,
// forward and backward, grid-stride pointwise loops in f32 with one rounding
// per output, over packs of 16 bytes where they fit. A header so that the
// warp emulator (tests/cuda_emu) runs them on the CPU.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::activation_kernels {

constexpr int kThreads = 256;
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float sigmoidf(float g) { return 1.0f / (1.0f + __expf(-g)); }

// Each thread moves V consecutive elements per load and store (V = 1, or
// kPack16<T> when the launch checked that packs fit: 16-byte memory
// instructions); the arithmetic is per element either way.
template <typename T, int V>
__global__ void gelu_fwd_kernel(T* y, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n / V; i += int64_t(gridDim.x) * blockDim.x) {
    const Pack<T, V> xv = load_pack<T, V>(x + i * V);
    Pack<T, V> yv;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = to_f32(xv.v[k]);
      const float u = kGeluK * (v + kGeluC * v * v * v);
      yv.v[k] = from_f32<T>(0.5f * v * (1.0f + tanhf(u)));
    }
    store_pack<T, V>(y + i * V, yv);
  }
}

// d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u',  u' = k (1 + 3 c x^2)
template <typename T, int V>
__global__ void gelu_bwd_kernel(T* dx, const T* dy, const T* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n / V; i += int64_t(gridDim.x) * blockDim.x) {
    const Pack<T, V> xv = load_pack<T, V>(x + i * V), dyv = load_pack<T, V>(dy + i * V);
    Pack<T, V> dxv;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float v = to_f32(xv.v[k]);
      const float u = kGeluK * (v + kGeluC * v * v * v);
      const float t = tanhf(u);
      const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * v * v);
      dxv.v[k] = from_f32<T>(d * to_f32(dyv.v[k]));
    }
    store_pack<T, V>(dx + i * V, dxv);
  }
}

// x rows [gate (H) | up (H)], y rows (H). Pack i covers row r, columns
// [h, h + V): one division per pack, not per element.
template <typename T, int V>
__global__ void swiglu_fwd_kernel(T* y, const T* x, int64_t rows, int64_t H) {
  const int64_t per_row = H / V, n = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, h = (i - r * per_row) * V;
    const Pack<T, V> g = load_pack<T, V>(x + r * 2 * H + h), u = load_pack<T, V>(x + r * 2 * H + H + h);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float gf = to_f32(g.v[k]);
      out.v[k] = from_f32<T>(gf * sigmoidf(gf) * to_f32(u.v[k]));
    }
    store_pack<T, V>(y + r * H + h, out);
  }
}

// dgate = dy * up * silu'(g), silu'(g) = s (1 + g (1 - s)); dup = dy * silu(g)
template <typename T, int V>
__global__ void swiglu_bwd_kernel(T* dx, const T* dy, const T* x, int64_t rows, int64_t H) {
  const int64_t per_row = H / V, n = rows * per_row;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, h = (i - r * per_row) * V;
    const Pack<T, V> g = load_pack<T, V>(x + r * 2 * H + h), u = load_pack<T, V>(x + r * 2 * H + H + h);
    const Pack<T, V> d = load_pack<T, V>(dy + r * H + h);
    Pack<T, V> dg, du;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float gf = to_f32(g.v[k]), df = to_f32(d.v[k]);
      const float s = sigmoidf(gf);
      dg.v[k] = from_f32<T>(df * to_f32(u.v[k]) * s * (1.0f + gf * (1.0f - s)));
      du.v[k] = from_f32<T>(df * gf * s);
    }
    store_pack<T, V>(dx + r * 2 * H + h, dg);
    store_pack<T, V>(dx + r * 2 * H + H + h, du);
  }
}

}  // namespace zt::cuda::activation_kernels
