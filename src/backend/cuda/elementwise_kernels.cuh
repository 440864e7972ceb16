// The pointwise kernels of elementwise.cu that move activations every step:
// grid-stride loops in f32 with one rounding per output; add and scale move
// V elements per load and store (V = 1, or kPack16<T> when the launch checked
// that 16-byte packs fit). A header so that the warp emulator
// (tests/cuda_emu) runs them on the CPU.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::elementwise_kernels {

constexpr int kThreads = 256;

// out = a + b (the residual add at the end of a block).
template <typename T, int V>
__global__ void add_kernel(T* out, const T* a, const T* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n / V; i += int64_t(gridDim.x) * blockDim.x) {
    const Pack<T, V> av = load_pack<T, V>(a + i * V), bv = load_pack<T, V>(b + i * V);
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_f32<T>(to_f32(av.v[k]) + to_f32(bv.v[k]));
    store_pack<T, V>(out + i * V, o);
  }
}

// out = alpha * x.
template <typename T, int V>
__global__ void scale_kernel(T* out, const T* x, float alpha, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n / V; i += int64_t(gridDim.x) * blockDim.x) {
    const Pack<T, V> xv = load_pack<T, V>(x + i * V);
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) o.v[k] = from_f32<T>(alpha * to_f32(xv.v[k]));
    store_pack<T, V>(out + i * V, o);
  }
}

// y += alpha * x (y and x of different types: an element per load).
template <typename TY, typename TX>
__global__ void axpy_kernel(TY* y, float alpha, const TX* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f32<TY>(fmaf(alpha, to_f32(x[i]), to_f32(y[i])));
}

}  // namespace zt::cuda::elementwise_kernels
