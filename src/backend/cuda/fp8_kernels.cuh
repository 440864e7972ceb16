// The kernels of fp8.cu: per-tensor fp8 quantisation on the device with the
// CPU backend's bits (backend/cpu/fp8.cpp; contract ops/fp8.h), and the byte
// transpose that puts fp8 operands in the K-major layout Hopper's fp8 GEMM
// reads. A header so that the warp emulator (tests/cuda_emu) runs them on the
// CPU.
//
// Quantising x takes three launches and no host synchronisation:
//   abs_max_partials  each block's max |x| (+inf for a NaN or inf element)
//   fp8_scale         one block: the partials' max -> the power-of-two scale
//                     (device memory) and scale_inv (the op's output)
//   encode            q = x * scale rounded to the format (RNE, saturating),
//                     a non-finite x the format's NaN code
// A max is exact in any order, so the result does not depend on the grid.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::fp8_kernels {

constexpr int kThreads = 256;
constexpr int kMaxPartials = 1024;  // blocks of the amax pass (fp8_scale's one block reads them all)
constexpr int kTile = 32;           // transpose tile (bytes a side); blocks of kTile x kTileRows threads
constexpr int kTileRows = 8;

// The CPU backend's NaN codes (core/dtype.cpp): E4M3 S.1111.111, E5M2 S.11111.10.
constexpr uint8_t kE4M3Nan = 0x7f, kE5M2Nan = 0x7e;
constexpr float kE4M3Max = 448.0f, kE5M2Max = 57344.0f;

// ops::fp8_scale on the device, the same operations: 2^floor(log2(max /
// amax)) within [2^-126, 2^127]; 1 for amax = 0 or non-finite.
__host__ __device__ __forceinline__ float fp8_scale_of(float amax, bool e4m3) {
  if (!(amax > 0.0f) || !(amax <= 3.402823466e38f)) return 1.0f;
  int e = 0;
  frexp((e4m3 ? double(kE4M3Max) : double(kE5M2Max)) / double(amax), &e);
  e = e - 1 < -126 ? -126 : (e - 1 > 127 ? 127 : e - 1);
  return float(ldexp(1.0, e));
}

template <bool kE4M3>
__device__ __forceinline__ uint8_t encode_one(float v) {
  // A non-finite input stays non-finite: the step's finiteness check sees it.
  if (!(fabsf(v) <= 3.402823466e38f)) return kE4M3 ? kE4M3Nan : kE5M2Nan;
  return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

template <bool kE4M3>
__device__ __forceinline__ float decode_one(uint8_t q) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(q), kE4M3 ? __NV_E4M3 : __NV_E5M2);
  return __half2float(__half(h));  // every fp8 value is a half exactly
}

// partials[blockIdx.x] = max over the block's grid-stride elements of |x|,
// +inf where one is not finite.
template <typename T>
__global__ void abs_max_partials_kernel(float* partials, const T* x, int64_t n) {
  __shared__ float scratch[32];
  float m = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float a = fabsf(to_f32(x[i]));
    m = fmaxf(m, a <= 3.402823466e38f ? a : INFINITY);  // NaN compares false: +inf
  }
  m = block_max(m, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = m;
}

// One block: amax = max of the partials; scale[0] = fp8_scale_of(amax),
// scale_inv[0] = 1 / scale (a power of two: exact).
template <bool kE4M3>
__global__ void fp8_scale_kernel(float* scale, float* scale_inv, const float* partials, int num_partials) {
  __shared__ float scratch[32];
  float m = 0.0f;
  for (int i = threadIdx.x; i < num_partials; i += blockDim.x) m = fmaxf(m, partials[i]);
  m = block_max(m, scratch);
  if (threadIdx.x == 0) {
    const float s = fp8_scale_of(m, kE4M3);
    scale[0] = s;
    scale_inv[0] = 1.0f / s;
  }
}

// q[i] = x[i] * scale[0] in the format (Q's codes as bytes).
template <typename T, bool kE4M3>
__global__ void encode_kernel(uint8_t* q, const T* x, const float* scale, int64_t n) {
  const float s = scale[0];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    q[i] = encode_one<kE4M3>(__fmul_rn(to_f32(x[i]), s));
}

// out[i] = q[i] * scale_inv[0], rounded once to T.
template <typename T, bool kE4M3>
__global__ void dequantize_kernel(T* out, const uint8_t* q, const float* scale_inv, int64_t n) {
  const float s = scale_inv[0];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(__fmul_rn(decode_one<kE4M3>(q[i]), s));
}

// out (cols, rows) = in (rows, cols)^T for elements of type E (fp8 codes:
// uint8_t), through kTile x kTile tiles in shared memory (a row of 33).
// Grid: x over column tiles, y (striding) over row tiles.
template <typename E>
__global__ void transpose_kernel(E* out, const E* in, int64_t rows, int64_t cols) {
  __shared__ E tile[kTile][kTile + 1];
  const int64_t c0 = int64_t(blockIdx.x) * kTile;
  for (int64_t r0 = int64_t(blockIdx.y) * kTile; r0 < rows; r0 += int64_t(gridDim.y) * kTile) {
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const int64_t r = r0 + k, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[k][threadIdx.x] = in[r * cols + c];
    }
    __syncthreads();
    for (int k = threadIdx.y; k < kTile; k += kTileRows) {
      const int64_t c = c0 + k, r = r0 + threadIdx.x;  // out's row c, column r
      if (c < cols && r < rows) out[c * rows + r] = tile[threadIdx.x][k];
    }
    __syncthreads();  // the tile is refilled by the next row tile
  }
}

}  // namespace zt::cuda::fp8_kernels
