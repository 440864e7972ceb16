// CUDA LayerNorm / RMSNorm forward and backward: one block per row, f32
// statistics (LayerNorm variance from (x - mean)^2, as the CPU computes it),
// and deterministic two-stage weight/bias gradients.
#include "backend/cuda/norm.h"

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

namespace {

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

const float* f32_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

void launch_forward(bool rms, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                    const Tensor& r_in, const Tensor& r_out, const Tensor& w, const Tensor& b, float eps) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  if (N == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "norm_forward", [&] {
    using TX = T;
    ZT_CUDA_DISPATCH_FLOAT(w.dtype(), "norm_forward", [&] {
      norm_forward_kernel<TX, T><<<unsigned(N), kThreads, 0, stream_of(y)>>>(
          rms, static_cast<TX*>(y.data_ptr()), mean.defined() ? mean.data<float>() : nullptr, rstd.data<float>(),
          static_cast<const TX*>(x.data_ptr()), ptr_or_null<TX>(r_in),
          r_out.defined() ? static_cast<TX*>(r_out.data_ptr()) : nullptr, static_cast<const T*>(w.data_ptr()),
          ptr_or_null<T>(b), C, eps);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("norm_forward_kernel");
}

void add_partials(const Tensor& out, const Tensor& partials, int64_t chunks, int64_t C) {
  const unsigned grid = unsigned((C + kThreads - 1) / kThreads);
  ZT_CUDA_DISPATCH_FLOAT(out.dtype(), "norm_backward", [&] {
    add_partials_kernel<T><<<grid, kThreads, 0, stream_of(out)>>>(static_cast<T*>(out.data_ptr()),
                                                                  partials.data<float>(), chunks, C);
  });
  ZT_CUDA_CHECK_LAUNCH("add_partials_kernel");
}

}  // namespace

void norm_forward(bool rms, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                  const Tensor& w, const Tensor& b, float eps) {
  launch_forward(rms, y, mean, rstd, x, Tensor(), Tensor(), w, b, eps);
}

void residual_norm_forward(bool rms, const Tensor& r_out, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                           const Tensor& r_in, const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  launch_forward(rms, y, mean, rstd, x, r_in, r_out, w, b, eps);
}

void norm_backward(bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  if (N == 0) return;
  cudaStream_t s = stream_of(dx);
  // Weight/bias partials first: dx may overwrite dy in place.
  const int64_t chunks = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  Tensor pdw = Tensor::empty(Shape{chunks, C}, DType::f32, x.device(), MemCategory::workspace);
  Tensor pdb = db.defined() ? Tensor::empty(Shape{chunks, C}, DType::f32, x.device(), MemCategory::workspace)
                            : Tensor();
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "norm_backward", [&] {
    const dim3 grid(unsigned((C + kThreads - 1) / kThreads), unsigned(chunks));
    norm_dwdb_partial_kernel<T><<<grid, kThreads, 0, s>>>(rms, pdw.data<float>(), pdb.defined() ? pdb.data<float>() : nullptr,
                                                          static_cast<const T*>(dy.data_ptr()),
                                                          static_cast<const T*>(x.data_ptr()), f32_or_null(mean),
                                                          rstd.data<float>(), N, C);
  });
  ZT_CUDA_CHECK_LAUNCH("norm_dwdb_partial_kernel");
  add_partials(dw, pdw, chunks, C);
  if (db.defined()) add_partials(db, pdb, chunks, C);
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "norm_backward", [&] {
    using TX = T;
    ZT_CUDA_DISPATCH_FLOAT(w.dtype(), "norm_backward", [&] {
      norm_dx_kernel<TX, T><<<unsigned(N), kThreads, 0, s>>>(
          rms, static_cast<TX*>(dx.data_ptr()), static_cast<const TX*>(dy.data_ptr()),
          static_cast<const TX*>(x.data_ptr()), static_cast<const T*>(w.data_ptr()), f32_or_null(mean),
          rstd.data<float>(), ptr_or_null<TX>(dx_add), C);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("norm_dx_kernel");
}

}  // namespace zt::cuda
