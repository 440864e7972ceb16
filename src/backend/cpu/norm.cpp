// CPU LayerNorm / RMSNorm kernels. Math and gradient rules: see norm.h.
//
// Layout of the work:
//   forward   one row per iteration of an OpenMP loop over rows; three short
//             passes over the row while it sits in L1 (shifted sum, centred
//             sum of squares, output), each a contiguous vectorised loop. bf16
//             rows are widened once into a per-thread f32 row buffer.
//   backward  rows are split into a fixed number of chunks (a function of N
//             only); each chunk accumulates dw/db into its own f32 partial
//             buffer, and the partials are summed in chunk order afterwards, so
//             dw/db do not depend on the thread count. dx is two passes per row
//             (the two row sums, then the output; bf16 dy/x rows widened once).
// RMSNorm is LayerNorm with mean fixed at 0 and without the mean(g) term, so
// both share the kernels below.
#include "backend/cpu/norm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/scratch.h"
#include "core/dtype.h"
#include "core/error.h"

namespace zt::cpu {

namespace {

// Below this many elements the OpenMP fork/join costs more than it saves.
constexpr int64_t kParallelMinElems = int64_t(1) << 15;
// Row chunks of the deterministic dw/db reduction (upper bound; min(N, this)).
constexpr int64_t kGradChunks = 64;

// w (and b) as f32: the tensor's own memory when it is f32, otherwise widened
// into the calling thread's scratch `slot` (read-only by the workers).
const float* weights_f32(const Tensor& t, int slot) {
  if (!t.defined()) return nullptr;
  if (t.dtype() == DType::f32) return t.data<float>();
  const int64_t n = t.numel();
  float* buf = thread_scratch(size_t(n), slot);
  const bf16* src = t.data<bf16>();
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) buf[i] = to_float(src[i]);
  return buf;
}

// --- row reductions -----------------------------------------------------------
// Row sums use GCC/Clang vector extensions with four independent 16-lane
// accumulators (the compiler's own simd reductions keep one accumulator and
// run at the latency of one add per vector), then a fixed-order horizontal sum:
// deterministic, and the same on every ISA the extensions lower to.
using f32x16 = float __attribute__((vector_size(64)));
constexpr int64_t kV = 16;

inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float hsum(f32x16 v) {
  float s = 0.0f;
  for (int i = 0; i < kV; ++i) s += v[i];
  return s;
}

// sum_c vf(c) over 16-wide blocks, then sf(c) over the last C % 16 elements.
template <typename VF, typename SF>
inline float row_sum(int64_t C, VF&& vf, SF&& sf) {
  f32x16 a0{}, a1{}, a2{}, a3{};
  int64_t c = 0;
  for (; c + 4 * kV <= C; c += 4 * kV) {
    a0 += vf(c);
    a1 += vf(c + kV);
    a2 += vf(c + 2 * kV);
    a3 += vf(c + 3 * kV);
  }
  for (; c + kV <= C; c += kV) a0 += vf(c);
  float s = hsum((a0 + a1) + (a2 + a3));
  for (; c < C; ++c) s += sf(c);
  return s;
}

// --- forward ----------------------------------------------------------------------

// Normalises one f32 row xf (C) into y (C); returns mean (0 for RMSNorm), rstd.
//
// The mean is sum(x - x0) / C + x0 with x0 = xf[0] (the shifted sum does not
// grow with |mean|), formed in f64 and kept as mean_hi + mean_lo (two floats),
// so d = (x - mean_hi) - mean_lo is x - mean to a few ulp of |x - mean| even
// when |mean| >> std or x ~ mean. The variance is the two-pass sum of d^2
// (positive terms, no cancellation). The saved mean is mean_hi.
template <typename T>
inline void norm_row(bool rms, T* y, const float* xf, const float* __restrict w, const float* __restrict b,
                     int64_t C, float eps, float& mean_out, float& rstd_out) {
  float mh = 0.0f, ml = 0.0f;
  if (!rms) {
    const float x0 = xf[0];
    const f32x16 vx0 = f32x16{} + x0;
    const float s = row_sum(
        C, [&](int64_t c) { return load16(xf + c) - vx0; }, [&](int64_t c) { return xf[c] - x0; });
    const double mean = double(x0) + double(s) / double(C);
    mh = float(mean);
    ml = float(mean - double(mh));
  }
  const f32x16 vmh = f32x16{} + mh, vml = f32x16{} + ml;
  const float v = row_sum(
      C,
      [&](int64_t c) {
        const f32x16 d = (load16(xf + c) - vmh) - vml;
        return d * d;
      },
      [&](int64_t c) {
        const float d = (xf[c] - mh) - ml;
        return d * d;
      });
  const float r = 1.0f / std::sqrt(v / float(C) + eps);
  if (b) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = from_float<T>(((xf[c] - mh) - ml) * (r * w[c]) + b[c]);
  } else {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = from_float<T>(((xf[c] - mh) - ml) * (r * w[c]));
  }
  mean_out = mh;
  rstd_out = r;
}

template <typename T>
void norm_forward_impl(bool rms, const Tensor& r_out_t, const Tensor& y_t, const Tensor& mean_t,
                       const Tensor& rstd_t, const Tensor& r_in_t, const Tensor& x_t, const Tensor& w_t,
                       const Tensor& b_t, float eps) {
  constexpr bool kF32 = std::is_same_v<T, float>;
  const int64_t C = w_t.numel();
  const int64_t N = C > 0 ? x_t.numel() / C : 0;
  if (N == 0 || C == 0) return;
  const float* w = weights_f32(w_t, 0);
  const float* b = weights_f32(b_t, 1);
  T* y = y_t.data<T>();
  const T* x = x_t.data<T>();
  float* mean = mean_t.defined() ? mean_t.data<float>() : nullptr;
  float* rstd = rstd_t.data<float>();
  const bool residual = r_out_t.defined();
  T* r_out = residual ? r_out_t.data<T>() : nullptr;
  const T* r_in = residual ? r_in_t.data<T>() : nullptr;

#pragma omp parallel if (N * C >= kParallelMinElems)
  {
    // bf16 rows are widened once into this thread's f32 row buffer.
    float* buf = kF32 ? nullptr : thread_scratch(size_t(C), 2);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < N; ++i) {
      const T* src = x + i * C;
      const float* xf;
      if (residual) {
        // r_out = r_in + x, rounded to T; the norm reads the rounded sum (what
        // the backward sees). r_out may alias r_in (same-index read, write).
        T* ro = r_out + i * C;
        const T* ri = r_in + i * C;
        if constexpr (kF32) {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) ro[c] = ri[c] + src[c];
          xf = ro;
        } else {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            // (via the raw bits: GCC does not vectorise the bf16 struct round trip)
            const uint16_t bits = from_float<bf16>(to_float(ri[c]) + to_float(src[c])).bits;
            ro[c].bits = bits;
            buf[c] = std::bit_cast<float>(uint32_t(bits) << 16);
          }
          xf = buf;
        }
      } else if constexpr (kF32) {
        xf = src;
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) buf[c] = to_float(src[c]);
        xf = buf;
      }
      float mu, rs;
      norm_row<T>(rms, y + i * C, xf, w, b, C, eps, mu, rs);
      if (mean) mean[i] = mu;
      rstd[i] = rs;
    }
  }
}

// --- backward ---------------------------------------------------------------------

// dx for one row (f32 views dyf, xf of dy, x), and the row's contribution to
// the chunk partials pdw/pdb. dx may alias dy (and dyf, for f32) or dx_add:
// every element is read before it is written, at the same index.
template <typename T, bool HasDb, bool HasAdd>
inline void norm_backward_row(bool rms, T* dx, const float* dyf, const float* __restrict xf,
                              const float* __restrict w, float mean, float rstd, const T* dx_add,
                              float* __restrict pdw, float* __restrict pdb, int64_t C) {
  const f32x16 vmean = f32x16{} + mean, vrstd = f32x16{} + rstd;
  f32x16 g0{}, g1{}, h0{}, h1{};  // sum(g), sum(g xhat), two accumulators each
  int64_t c = 0;
  auto step = [&](int64_t k, f32x16& sg, f32x16& sgx) {
    const f32x16 g = load16(dyf + k) * load16(w + k);
    sg += g;
    sgx += g * ((load16(xf + k) - vmean) * vrstd);
  };
  for (; c + 2 * kV <= C; c += 2 * kV) {
    step(c, g0, h0);
    step(c + kV, g1, h1);
  }
  for (; c + kV <= C; c += kV) step(c, g0, h0);
  float sg = hsum(g0 + g1), sgx = hsum(h0 + h1);
  for (; c < C; ++c) {
    const float g = dyf[c] * w[c];
    sg += g;
    sgx += g * ((xf[c] - mean) * rstd);
  }
  const float mg = rms ? 0.0f : sg / float(C);
  const float mgx = sgx / float(C);
#pragma omp simd
  for (int64_t k = 0; k < C; ++k) {
    const float d = dyf[k];
    const float xh = (xf[k] - mean) * rstd;
    float v = rstd * ((d * w[k] - mg) - xh * mgx);
    if constexpr (HasAdd) v += to_float(dx_add[k]);
    pdw[k] += d * xh;
    if constexpr (HasDb) pdb[k] += d;
    dx[k] = from_float<T>(v);
  }
}

template <typename T, bool HasDb, bool HasAdd>
void norm_backward_rows(bool rms, T* dx, const T* dy, const T* x, const float* w, const float* mean,
                        const float* rstd, const T* dx_add, float* partials, int64_t N, int64_t C,
                        int64_t chunks) {
  constexpr bool kF32 = std::is_same_v<T, float>;
  const int64_t stride = HasDb ? 2 * C : C;  // per-chunk partials: [dw (C) | db (C)]
#pragma omp parallel if (N * C >= kParallelMinElems)
  {
    // bf16 rows of dy and x are widened once into this thread's buffer.
    float* buf = kF32 ? nullptr : thread_scratch(size_t(2 * C), 2);
#pragma omp for schedule(static)
    for (int64_t k = 0; k < chunks; ++k) {
      float* pdw = partials + k * stride;
      float* pdb = HasDb ? pdw + C : nullptr;
      std::fill(pdw, pdw + stride, 0.0f);
      const int64_t r0 = N * k / chunks, r1 = N * (k + 1) / chunks;
      for (int64_t i = r0; i < r1; ++i) {
        const float *dyf, *xf;
        if constexpr (kF32) {
          dyf = dy + i * C;
          xf = x + i * C;
        } else {
          float* dyb = buf;
          float* xb = buf + C;
          const T* dyr = dy + i * C;
          const T* xr = x + i * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            dyb[c] = to_float(dyr[c]);
            xb[c] = to_float(xr[c]);
          }
          dyf = dyb;
          xf = xb;
        }
        norm_backward_row<T, HasDb, HasAdd>(rms, dx + i * C, dyf, xf, w, mean ? mean[i] : 0.0f, rstd[i],
                                            HasAdd ? dx_add + i * C : nullptr, pdw, pdb, C);
      }
    }
  }
}

// out (C) += sum over chunks k of partials[k * stride + c], in chunk order.
template <typename G>
void add_partials(const Tensor& out_t, const float* partials, int64_t chunks, int64_t stride, int64_t C) {
  G* out = out_t.data<G>();
#pragma omp parallel for schedule(static) if (chunks * C >= kParallelMinElems)
  for (int64_t c = 0; c < C; ++c) {
    double s = to_float(out[c]);
    for (int64_t k = 0; k < chunks; ++k) s += partials[k * stride + c];
    out[c] = from_float<G>(float(s));
  }
}

void add_partials_any(const Tensor& out_t, const float* partials, int64_t chunks, int64_t stride, int64_t C) {
  if (out_t.dtype() == DType::f32)
    add_partials<float>(out_t, partials, chunks, stride, C);
  else
    add_partials<bf16>(out_t, partials, chunks, stride, C);
}

template <typename T>
void norm_backward_impl(bool rms, const Tensor& dx_t, const Tensor& dw_t, const Tensor& db_t, const Tensor& dy_t,
                        const Tensor& x_t, const Tensor& w_t, const Tensor& mean_t, const Tensor& rstd_t,
                        const Tensor& dx_add_t) {
  const int64_t C = w_t.numel();
  const int64_t N = C > 0 ? x_t.numel() / C : 0;
  if (N == 0 || C == 0) return;
  const float* w = weights_f32(w_t, 0);
  const int64_t chunks = std::min(N, kGradChunks);
  const bool has_db = db_t.defined(), has_add = dx_add_t.defined();
  const int64_t stride = has_db ? 2 * C : C;
  float* partials = thread_scratch(size_t(chunks * stride), 1);

  T* dx = dx_t.data<T>();
  const T* dy = dy_t.data<T>();
  const T* x = x_t.data<T>();
  const float* mean = mean_t.defined() ? mean_t.data<float>() : nullptr;
  const float* rstd = rstd_t.data<float>();
  const T* dx_add = has_add ? dx_add_t.data<T>() : nullptr;
  if (has_db) {
    if (has_add)
      norm_backward_rows<T, true, true>(rms, dx, dy, x, w, mean, rstd, dx_add, partials, N, C, chunks);
    else
      norm_backward_rows<T, true, false>(rms, dx, dy, x, w, mean, rstd, dx_add, partials, N, C, chunks);
  } else {
    if (has_add)
      norm_backward_rows<T, false, true>(rms, dx, dy, x, w, mean, rstd, dx_add, partials, N, C, chunks);
    else
      norm_backward_rows<T, false, false>(rms, dx, dy, x, w, mean, rstd, dx_add, partials, N, C, chunks);
  }
  add_partials_any(dw_t, partials, chunks, stride, C);
  if (has_db) add_partials_any(db_t, partials + C, chunks, stride, C);
}

}  // namespace

void norm_forward(bool rms, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                  const Tensor& w, const Tensor& b, float eps) {
  if (x.dtype() == DType::f32)
    norm_forward_impl<float>(rms, Tensor(), y, mean, rstd, Tensor(), x, w, b, eps);
  else
    norm_forward_impl<bf16>(rms, Tensor(), y, mean, rstd, Tensor(), x, w, b, eps);
}

void residual_norm_forward(bool rms, const Tensor& r_out, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                           const Tensor& r_in, const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  ZT_ASSERT(r_out.defined() && r_in.defined());
  if (x.dtype() == DType::f32)
    norm_forward_impl<float>(rms, r_out, y, mean, rstd, r_in, x, w, b, eps);
  else
    norm_forward_impl<bf16>(rms, r_out, y, mean, rstd, r_in, x, w, b, eps);
}

void norm_backward(bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add) {
  if (x.dtype() == DType::f32)
    norm_backward_impl<float>(rms, dx, dw, db, dy, x, w, mean, rstd, dx_add);
  else
    norm_backward_impl<bf16>(rms, dx, dw, db, dy, x, w, mean, rstd, dx_add);
}

}  // namespace zt::cpu
