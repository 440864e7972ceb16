// CPU LayerNorm / RMSNorm kernels. Math and gradient rules: see norm.h.
//
// Layout of the work:
//   forward   one row per iteration of an OpenMP loop over rows; three short
//             passes over the row while it sits in L1 (shifted sum, centred
//             sum of squares, output), on 16-lane vectors (simd16 in
//             activation.h: bf16 widened on load, rounded on store).
//   backward  rows are split into a fixed number of chunks (a function of N
//             only); each chunk accumulates dw/db into its own f32 partial
//             buffer, and the partials are summed in chunk order afterwards, so
//             dw/db do not depend on the thread count. dx is two passes per row
//             (the two row sums, then the output).
// RMSNorm is LayerNorm with mean fixed at 0 and without the mean(g) term, so
// both share the kernels below.
// 64-byte vectors by value (simd16 in activation.h) without AVX-512 make GCC
// warn about an ABI change; everything here is internal to one build.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "backend/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/activation.h"  // simd16 vector primitives
#include "backend/cpu/scratch.h"
#include "core/dtype.h"
#include "core/error.h"

namespace zt::cpu {

namespace {

// Below this many elements the OpenMP fork/join costs more than it saves.
constexpr int64_t kParallelMinElems = int64_t(1) << 15;
// Row chunks of the deterministic dw/db reduction: about one per kGradRows rows,
// at most kGradChunks (a function of N only, never of the thread count).
constexpr int64_t kGradChunks = 64;
constexpr int64_t kGradRows = 16;

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

using namespace simd16;

// Row sums keep four independent 16-lane accumulators (one accumulator runs at
// the latency of one add per vector) and finish with a fixed-order horizontal
// sum: deterministic. vf(c) gives the 16 terms at c; the last C % 16 terms come
// from tail(), zero in the lanes past the end.
template <typename VF, typename TF>
inline float row_sum(int64_t C, VF&& vf, TF&& tail) {
  f32x16 a0{}, a1{}, a2{}, a3{};
  int64_t c = 0;
  for (; c + 4 * kV <= C; c += 4 * kV) {
    a0 += vf(c);
    a1 += vf(c + kV);
    a2 += vf(c + 2 * kV);
    a3 += vf(c + 3 * kV);
  }
  for (; c + kV <= C; c += kV) a0 += vf(c);
  if (c < C) a1 += tail(c, C - c);
  return hsum((a0 + a1) + (a2 + a3));
}

// --- forward ----------------------------------------------------------------------

// Normalises one row x (C) into y (C); returns mean (0 for RMSNorm) and rstd.
//
// The mean is sum(x - x0) / C + x0 with x0 = x[0] (the shifted sum does not
// grow with |mean|), formed in f64 and kept as mean_hi + mean_lo (two floats),
// so d = (x - mean_hi) - mean_lo is x - mean to a few ulp of |x - mean| even
// when |mean| >> std or x ~ mean. The variance is the two-pass sum of d^2
// (positive terms, no cancellation). The saved mean is mean_hi.
template <typename T, bool HasBias>
inline void norm_row(bool rms, T* y, const T* x, const float* w, const float* b, int64_t C, float eps,
                     float& mean_out, float& rstd_out) {
  float mh = 0.0f, ml = 0.0f;
  if (!rms) {
    const float x0 = to_float(x[0]);
    const f32x16 vx0 = splat(x0);
    const float s = row_sum(
        C, [&](int64_t c) __attribute__((always_inline)) { return load16(x + c) - vx0; },
        [&](int64_t c, int64_t n) __attribute__((always_inline)) { return lanes_below(n) ? load_partial(x + c, n) - vx0 : f32x16{}; });
    const double mean = double(x0) + double(s) / double(C);
    mh = float(mean);
    ml = float(mean - double(mh));
  }
  const f32x16 vmh = splat(mh), vml = splat(ml);
  auto sq = [&](f32x16 v) __attribute__((always_inline)) {
    const f32x16 d = (v - vmh) - vml;
    return d * d;
  };
  const float v = row_sum(
      C, [&](int64_t c) __attribute__((always_inline)) { return sq(load16(x + c)); },
      [&](int64_t c, int64_t n) __attribute__((always_inline)) { return lanes_below(n) ? sq(load_partial(x + c, n)) : f32x16{}; });
  const float r = 1.0f / std::sqrt(v / float(C) + eps);
  const f32x16 vr = splat(r);
  auto out = [&](f32x16 xv, f32x16 wv, f32x16 bv) __attribute__((always_inline)) {
    const f32x16 yv = ((xv - vmh) - vml) * (vr * wv);
    if constexpr (HasBias) return yv + bv;
    return yv;
  };
  int64_t c = 0;
  for (; c + kV <= C; c += kV)
    store16(y + c, out(load16(x + c), load16(w + c), HasBias ? load16(b + c) : f32x16{}));
  if (c < C) {
    const int64_t n = C - c;
    store_partial(y + c, out(load_partial(x + c, n), load_partial(w + c, n), HasBias ? load_partial(b + c, n) : f32x16{}),
                  n);
  }
  mean_out = mh;
  rstd_out = r;
}

template <typename T>
void norm_forward_impl(bool rms, const Tensor& r_out_t, const Tensor& y_t, const Tensor& mean_t,
                       const Tensor& rstd_t, const Tensor& r_in_t, const Tensor& x_t, const Tensor& w_t,
                       const Tensor& b_t, float eps) {
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

#pragma omp parallel for schedule(static) if (N * C >= kParallelMinElems)
  for (int64_t i = 0; i < N; ++i) {
    const T* src = x + i * C;
    if (residual) {
      // r_out = r_in + x, rounded to T; the norm reads the rounded sum back
      // (what the backward sees) while it is in L1. r_out may alias r_in: each
      // block is loaded before it is stored.
      T* ro = r_out + i * C;
      const T* ri = r_in + i * C;
      int64_t c = 0;
      for (; c + kV <= C; c += kV) store16(ro + c, load16(ri + c) + load16(src + c));
      if (c < C) store_partial(ro + c, load_partial(ri + c, C - c) + load_partial(src + c, C - c), C - c);
      src = ro;
    }
    float mu, rs;
    if (b)
      norm_row<T, true>(rms, y + i * C, src, w, b, C, eps, mu, rs);
    else
      norm_row<T, false>(rms, y + i * C, src, w, b, C, eps, mu, rs);
    if (mean) mean[i] = mu;
    rstd[i] = rs;
  }
}

// --- backward ---------------------------------------------------------------------

// dx for one row, and the row's contribution to the chunk partials pdw/pdb.
// dx may alias dy or dx_add: each 16-element block is loaded before it is
// stored.
template <typename T, bool HasDb, bool HasAdd>
inline void norm_backward_row(bool rms, T* dx, const T* dy, const T* x, const float* w, float mean, float rstd,
                              const T* dx_add, float* pdw, float* pdb, int64_t C) {
  const f32x16 vmean = splat(mean), vrstd = splat(rstd);
  // Row sums of g = dy w and g xhat (zero-padded tail lanes have g = 0).
  f32x16 g0{}, g1{}, h0{}, h1{};
  auto step = [&](f32x16 d, f32x16 wv, f32x16 xv, f32x16& sg, f32x16& sgx) __attribute__((always_inline)) {
    const f32x16 g = d * wv;
    sg += g;
    sgx += g * ((xv - vmean) * vrstd);
  };
  int64_t c = 0;
  for (; c + 2 * kV <= C; c += 2 * kV) {
    step(load16(dy + c), load16(w + c), load16(x + c), g0, h0);
    step(load16(dy + c + kV), load16(w + c + kV), load16(x + c + kV), g1, h1);
  }
  for (; c + kV <= C; c += kV) step(load16(dy + c), load16(w + c), load16(x + c), g0, h0);
  if (c < C) {
    const int64_t n = C - c;
    step(load_partial(dy + c, n), load_partial(w + c, n), load_partial(x + c, n), g1, h1);
  }
  const float sg = hsum(g0 + g1), sgx = hsum(h0 + h1);
  const f32x16 vmg = splat(rms ? 0.0f : sg / float(C)), vmgx = splat(sgx / float(C));

  // dx = rstd (g - mean(g) - xhat mean(g xhat)) (+ dx_add); pdw += dy xhat; pdb += dy.
  auto block = [&](f32x16 d, f32x16 xv, f32x16 wv, f32x16 add, f32x16& dw_acc, f32x16& db_acc) __attribute__((always_inline)) {
    const f32x16 xh = (xv - vmean) * vrstd;
    f32x16 v = vrstd * ((d * wv - vmg) - xh * vmgx);
    if constexpr (HasAdd) v += add;
    dw_acc += d * xh;
    if constexpr (HasDb) db_acc += d;
    return v;
  };
  for (c = 0; c + kV <= C; c += kV) {
    f32x16 pw = load16(pdw + c), pb = HasDb ? load16(pdb + c) : f32x16{};
    const f32x16 v = block(load16(dy + c), load16(x + c), load16(w + c), HasAdd ? load16(dx_add + c) : f32x16{},
                           pw, pb);
    store16(pdw + c, pw);
    if constexpr (HasDb) store16(pdb + c, pb);
    store16(dx + c, v);
  }
  if (c < C) {
    const int64_t n = C - c;
    f32x16 pw = load_partial(pdw + c, n), pb = HasDb ? load_partial(pdb + c, n) : f32x16{};
    const f32x16 v = block(load_partial(dy + c, n), load_partial(x + c, n), load_partial(w + c, n),
                           HasAdd ? load_partial(dx_add + c, n) : f32x16{}, pw, pb);
    store_partial(pdw + c, pw, n);
    if constexpr (HasDb) store_partial(pdb + c, pb, n);
    store_partial(dx + c, v, n);
  }
}

template <typename T, bool HasDb, bool HasAdd>
void norm_backward_rows(bool rms, T* dx, const T* dy, const T* x, const float* w, const float* mean,
                        const float* rstd, const T* dx_add, float* partials, int64_t N, int64_t C,
                        int64_t chunks) {
  const int64_t stride = HasDb ? 2 * C : C;  // per-chunk partials: [dw (C) | db (C)]
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinElems)
  for (int64_t k = 0; k < chunks; ++k) {
    float* pdw = partials + k * stride;
    float* pdb = HasDb ? pdw + C : nullptr;
    std::fill(pdw, pdw + stride, 0.0f);
    const int64_t r0 = N * k / chunks, r1 = N * (k + 1) / chunks;
    for (int64_t i = r0; i < r1; ++i)
      norm_backward_row<T, HasDb, HasAdd>(rms, dx + i * C, dy + i * C, x + i * C, w, mean ? mean[i] : 0.0f,
                                          rstd[i], HasAdd ? dx_add + i * C : nullptr, pdw, pdb, C);
  }
}

// out (C) += sum over chunks k of partials[k * stride + c], summed in chunk
// order for every c (16 columns per vector lane group; columns are independent,
// so the split of columns over threads does not change any result).
template <typename G>
void add_partials(const Tensor& out_t, const float* partials, int64_t chunks, int64_t stride, int64_t C) {
  G* out = out_t.data<G>();
  const int64_t blocks = (C + kV - 1) / kV;
#pragma omp parallel for schedule(static) if (chunks * C >= kParallelMinElems)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c = blk * kV, n = std::min(kV, C - c);
    if (n == kV) {
      f32x16 s = load16(partials + c);
      for (int64_t k = 1; k < chunks; ++k) s += load16(partials + k * stride + c);
      store16(out + c, load16(out + c) + s);
    } else {
      f32x16 s = load_partial(partials + c, n);
      for (int64_t k = 1; k < chunks; ++k) s += load_partial(partials + k * stride + c, n);
      store_partial(out + c, load_partial(out + c, n) + s, n);
    }
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
  const int64_t chunks = std::clamp<int64_t>(N / kGradRows, 1, kGradChunks);
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
