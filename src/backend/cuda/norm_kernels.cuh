// The kernels of norm.cu: LayerNorm / RMSNorm forward and backward, one
// block per row, f32 statistics (LayerNorm variance from (x - mean)^2, as
// the CPU computes it), and deterministic two-stage weight/bias gradients.
// A header so that the warp emulator (tests/cuda_emu) runs them on the CPU.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::norm_kernels {

constexpr int kThreads = 256;
constexpr int64_t kRowsPerChunk = 64;  // rows per dw/db partial (fixed: results do not depend on the grid)

// One block per row. When r_in is given: r = r_in + x is rounded, written to
// r_out, and normalised (the backward sees the same rounded r_out).
template <typename T, typename W>
__global__ void norm_forward_kernel(bool rms, T* y, float* mean_out, float* rstd_out, const T* x, const T* r_in,
                                    T* r_out, const W* w, const W* b, int64_t C, float eps) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* xr = x + row * C;
  const T* src = xr;
  if (r_in != nullptr) {
    T* rr = r_out + row * C;
    const T* ri = r_in + row * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) rr[c] = from_f32<T>(to_f32(ri[c]) + to_f32(xr[c]));
    src = rr;  // each thread re-reads only the elements it wrote
  }
  float mean = 0.0f;
  if (!rms) {
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) s += to_f32(src[c]);
    mean = block_sum(s, scratch) / float(C);
  }
  float ss = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float d = to_f32(src[c]) - mean;
    ss += d * d;
  }
  const float rstd = rsqrtf(block_sum(ss, scratch) / float(C) + eps);
  T* yr = y + row * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float v = (to_f32(src[c]) - mean) * rstd * to_f32(w[c]);
    if (b != nullptr) v += to_f32(b[c]);
    yr[c] = from_f32<T>(v);
  }
  if (threadIdx.x == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// dx for one row per block:
//   g = dy * w, xhat = (x - mean) * rstd
//   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat))
template <typename T, typename W>
__global__ void norm_dx_kernel(bool rms, T* dx, const T* dy, const T* x, const W* w, const float* mean,
                               const float* rstd, const T* dx_add, int64_t C) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* dyr = dy + row * C;
  const T* xr = x + row * C;
  const float mu = rms ? 0.0f : mean[row], rs = rstd[row];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = to_f32(dyr[c]) * to_f32(w[c]);
    const float xhat = (to_f32(xr[c]) - mu) * rs;
    sg += g;
    sgx += g * xhat;
  }
  const float mg = rms ? 0.0f : block_sum(sg, scratch) / float(C);
  const float mgx = block_sum(sgx, scratch) / float(C);
  T* dxr = dx + row * C;
  const T* addr = dx_add != nullptr ? dx_add + row * C : nullptr;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = to_f32(dyr[c]) * to_f32(w[c]);
    const float xhat = (to_f32(xr[c]) - mu) * rs;
    float v = rs * (g - mg - xhat * mgx);
    if (addr != nullptr) v += to_f32(addr[c]);
    dxr[c] = from_f32<T>(v);
  }
}

// Partials of dw (and db) over rows [chunk*R, (chunk+1)*R): thread per column.
template <typename T>
__global__ void norm_dwdb_partial_kernel(bool rms, float* pdw, float* pdb, const T* dy, const T* x,
                                         const float* mean, const float* rstd, int64_t N, int64_t C) {
  const int64_t chunk = blockIdx.y;
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = chunk * kRowsPerChunk, r1 = min(N, r0 + kRowsPerChunk);
  float sw = 0.0f, sb = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float g = to_f32(dy[r * C + c]);
    const float xhat = (to_f32(x[r * C + c]) - (rms ? 0.0f : mean[r])) * rstd[r];
    sw += g * xhat;
    sb += g;
  }
  pdw[chunk * C + c] = sw;
  if (pdb != nullptr) pdb[chunk * C + c] = sb;
}

template <typename G>
__global__ void add_partials_kernel(G* out, const float* partials, int64_t chunks, int64_t C) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) s += partials[k * C + c];  // chunk order: deterministic
  out[c] = from_f32<G>(to_f32(out[c]) + s);
}

}  // namespace zt::cuda::norm_kernels
