// CPU LayerNorm / RMSNorm kernels. Math and gradient rules: see norm.h.
//
// Layout of the work:
//   forward   one row per iteration of an OpenMP loop over rows; three short
//             passes over the row while it sits in L1 (shifted sum, centred
//             sum of squares, output).
//   backward  rows are split into a fixed number of chunks (a function of N
//             only); each chunk accumulates dw/db into its own f32 partial
//             buffer, and the partials are summed in chunk order afterwards, so
//             dw/db do not depend on the thread count. dx is two passes per row
//             (the two row sums, then the output).
// Rows are processed in 32-element blocks with simd16's load32/store32 (see
// activation.h): for bf16 the two vectors of a block hold the even and the odd
// elements. Row sums do not care about that order; the per-column f32 arrays
// (w, b and the dw/db partials) are kept in the same block order ("column
// layout", padded to a multiple of 32 columns) so that lanes line up.
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

using namespace simd16;

// --- column layout ------------------------------------------------------------------

// C rounded up to whole 32-element blocks.
inline int64_t padded_cols(int64_t C) { return (C + kV2 - 1) / kV2 * kV2; }

// Where column c lives in the column layout of T: within its 32-block, lane
// order of load32<T> (f32: natural; bf16: 16 even columns, then 16 odd ones).
template <typename T>
inline int64_t col_pos(int64_t c) {
  const int64_t blk = c - c % kV2, k = c % kV2;
  if constexpr (std::is_same_v<T, float>) return c;
  return blk + (k % 2) * kV + k / 2;
}

// The element index (within a 32-block) held by each lane of v0 / v1.
template <typename T>
inline i32x16 lane_elems(int half) {
  const i32x16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  if constexpr (std::is_same_v<T, float>) return iota + int32_t(half * kV);
  return iota * 2 + half;
}

// w or b (C, f32 or bf16) in T's column layout, zero-padded, in the calling
// thread's scratch `slot` (read-only for the workers). Undefined -> nullptr.
template <typename T>
const float* columns_f32(const Tensor& t, int slot) {
  if (!t.defined()) return nullptr;
  const int64_t C = t.numel(), Cp = padded_cols(C);
  float* buf = thread_scratch(size_t(Cp), slot);
  std::fill(buf + C, buf + Cp, 0.0f);
  if (t.dtype() == DType::f32) {
    const float* src = t.data<float>();
    for (int64_t c = 0; c < C; ++c) buf[col_pos<T>(c)] = src[c];
  } else {
    const bf16* src = t.data<bf16>();
    for (int64_t c = 0; c < C; ++c) buf[col_pos<T>(c)] = to_float(src[c]);
  }
  return buf;
}

inline F32x32 load_cols(const float* p) { return {load16(p), load16(p + kV)}; }
inline void store_cols(float* p, F32x32 v) {
  store16(p, v.v0);
  store16(p + kV, v.v1);
}

// Sum over the row of f applied to the blocks of x (both halves; lanes past
// the end of the row masked off). Four independent accumulators (one would run
// at the latency of one add per vector), then a fixed-order horizontal sum.
template <typename T, typename F>
inline float row_sum(const T* x, int64_t C, F&& f) {
  f32x16 a0{}, a1{}, a2{}, a3{};
  int64_t c = 0;
  for (; c + 2 * kV2 <= C; c += 2 * kV2) {
    const F32x32 p = load32(x + c), q = load32(x + c + kV2);
    a0 += f(p.v0);
    a1 += f(p.v1);
    a2 += f(q.v0);
    a3 += f(q.v1);
  }
  for (; c + kV2 <= C; c += kV2) {
    const F32x32 p = load32(x + c);
    a0 += f(p.v0);
    a1 += f(p.v1);
  }
  if (c < C) {
    const int64_t n = C - c;
    const F32x32 p = load32_partial(x + c, n);
    a2 += lane_elems<T>(0) < int32_t(n) ? f(p.v0) : f32x16{};
    a3 += lane_elems<T>(1) < int32_t(n) ? f(p.v1) : f32x16{};
  }
  return hsum((a0 + a1) + (a2 + a3));
}

// --- forward ----------------------------------------------------------------------

// Normalises one row x (C) into y (C) (w, b in column layout); returns mean (0
// for RMSNorm) and rstd.
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
    const float s = row_sum(x, C, [&](f32x16 v) __attribute__((always_inline)) { return v - vx0; });
    const double mean = double(x0) + double(s) / double(C);
    mh = float(mean);
    ml = float(mean - double(mh));
  }
  const f32x16 vmh = splat(mh), vml = splat(ml);
  const float v = row_sum(x, C, [&](f32x16 xv) __attribute__((always_inline)) {
    const f32x16 d = (xv - vmh) - vml;
    return d * d;
  });
  const float r = 1.0f / std::sqrt(v / float(C) + eps);
  const f32x16 vr = splat(r);
  auto out = [&](F32x32 xv, int64_t c) __attribute__((always_inline)) {
    const F32x32 wv = load_cols(w + c);
    F32x32 yv{((xv.v0 - vmh) - vml) * (vr * wv.v0), ((xv.v1 - vmh) - vml) * (vr * wv.v1)};
    if constexpr (HasBias) {
      const F32x32 bv = load_cols(b + c);
      yv.v0 += bv.v0;
      yv.v1 += bv.v1;
    }
    return yv;
  };
  int64_t c = 0;
  for (; c + kV2 <= C; c += kV2) store32(y + c, out(load32(x + c), c));
  if (c < C) store32_partial(y + c, out(load32_partial(x + c, C - c), c), C - c);
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
  const float* w = columns_f32<T>(w_t, 0);
  const float* b = columns_f32<T>(b_t, 1);
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
      auto add = [](F32x32 a, F32x32 c) { return F32x32{a.v0 + c.v0, a.v1 + c.v1}; };
      int64_t c = 0;
      for (; c + kV2 <= C; c += kV2) store32(ro + c, add(load32(ri + c), load32(src + c)));
      if (c < C) store32_partial(ro + c, add(load32_partial(ri + c, C - c), load32_partial(src + c, C - c)), C - c);
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

// dx for one row, and the row's contribution to the chunk partials pdw/pdb
// (column layout, like w). dx may alias dy or dx_add: each block is loaded
// before it is stored. Zero-padded tail lanes have dy = 0, so they add nothing
// to the sums or the partials.
template <typename T, bool HasDb, bool HasAdd>
inline void norm_backward_row(bool rms, T* dx, const T* dy, const T* x, const float* w, float mean, float rstd,
                              const T* dx_add, float* pdw, float* pdb, int64_t C) {
  const f32x16 vmean = splat(mean), vrstd = splat(rstd);
  // Row sums of g = dy w and g xhat.
  f32x16 g0{}, g1{}, h0{}, h1{};
  auto sums = [&](F32x32 d, F32x32 xv, int64_t c) __attribute__((always_inline)) {
    const F32x32 wv = load_cols(w + c);
    const f32x16 ga = d.v0 * wv.v0, gb = d.v1 * wv.v1;
    g0 += ga;
    g1 += gb;
    h0 += ga * ((xv.v0 - vmean) * vrstd);
    h1 += gb * ((xv.v1 - vmean) * vrstd);
  };
  int64_t c = 0;
  for (; c + kV2 <= C; c += kV2) sums(load32(dy + c), load32(x + c), c);
  if (c < C) sums(load32_partial(dy + c, C - c), load32_partial(x + c, C - c), c);
  const float sg = hsum(g0 + g1), sgx = hsum(h0 + h1);
  const f32x16 vmg = splat(rms ? 0.0f : sg / float(C)), vmgx = splat(sgx / float(C));

  // dx = rstd (g - mean(g) - xhat mean(g xhat)) (+ dx_add); pdw += dy xhat; pdb += dy.
  auto half = [&](f32x16 d, f32x16 xv, f32x16 wv, f32x16 add, f32x16& pw, f32x16& pb)
      __attribute__((always_inline)) {
    const f32x16 xh = (xv - vmean) * vrstd;
    f32x16 v = vrstd * ((d * wv - vmg) - xh * vmgx);
    if constexpr (HasAdd) v += add;
    pw += d * xh;
    if constexpr (HasDb) pb += d;
    return v;
  };
  auto block = [&](F32x32 d, F32x32 xv, F32x32 add, int64_t c) __attribute__((always_inline)) {
    const F32x32 wv = load_cols(w + c);
    F32x32 pw = load_cols(pdw + c), pb = HasDb ? load_cols(pdb + c) : F32x32{};
    const F32x32 v{half(d.v0, xv.v0, wv.v0, add.v0, pw.v0, pb.v0), half(d.v1, xv.v1, wv.v1, add.v1, pw.v1, pb.v1)};
    store_cols(pdw + c, pw);
    if constexpr (HasDb) store_cols(pdb + c, pb);
    return v;
  };
  for (c = 0; c + kV2 <= C; c += kV2)
    store32(dx + c, block(load32(dy + c), load32(x + c), HasAdd ? load32(dx_add + c) : F32x32{}, c));
  if (c < C) {
    const int64_t n = C - c;
    store32_partial(dx + c,
                    block(load32_partial(dy + c, n), load32_partial(x + c, n),
                          HasAdd ? load32_partial(dx_add + c, n) : F32x32{}, c),
                    n);
  }
}

template <typename T, bool HasDb, bool HasAdd>
void norm_backward_rows(bool rms, T* dx, const T* dy, const T* x, const float* w, const float* mean,
                        const float* rstd, const T* dx_add, float* partials, int64_t N, int64_t C,
                        int64_t chunks) {
  const int64_t Cp = padded_cols(C);
  const int64_t stride = HasDb ? 2 * Cp : Cp;  // per-chunk partials: [dw (Cp) | db (Cp)]
#pragma omp parallel for schedule(static) if (N * C >= kParallelMinElems)
  for (int64_t k = 0; k < chunks; ++k) {
    float* pdw = partials + k * stride;
    float* pdb = HasDb ? pdw + Cp : nullptr;
    std::fill(pdw, pdw + stride, 0.0f);
    const int64_t r0 = N * k / chunks, r1 = N * (k + 1) / chunks;
    for (int64_t i = r0; i < r1; ++i)
      norm_backward_row<T, HasDb, HasAdd>(rms, dx + i * C, dy + i * C, x + i * C, w, mean ? mean[i] : 0.0f,
                                          rstd[i], HasAdd ? dx_add + i * C : nullptr, pdw, pdb, C);
  }
}

// Sums the chunk partials (column layout, stride floats apart) into chunk 0's,
// in chunk order for every column (columns are independent, so splitting them
// over threads changes no result).
void sum_partials(float* partials, int64_t chunks, int64_t stride, int64_t width) {
  const int64_t blocks = width / kV;
#pragma omp parallel for schedule(static) if (chunks * width >= kParallelMinElems)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    float* acc = partials + blk * kV;
    f32x16 s = load16(acc);
    for (int64_t k = 1; k < chunks; ++k) s += load16(acc + k * stride);
    store16(acc, s);
  }
}

// out (C) += sums (column layout of T).
template <typename T, typename G>
void add_columns(const Tensor& out_t, const float* sums, int64_t C) {
  G* out = out_t.data<G>();
  for (int64_t c = 0; c < C; ++c) out[c] = from_float<G>(to_float(out[c]) + sums[col_pos<T>(c)]);
}

template <typename T>
void add_columns_any(const Tensor& out_t, const float* sums, int64_t C) {
  if (out_t.dtype() == DType::f32)
    add_columns<T, float>(out_t, sums, C);
  else
    add_columns<T, bf16>(out_t, sums, C);
}

template <typename T>
void norm_backward_impl(bool rms, const Tensor& dx_t, const Tensor& dw_t, const Tensor& db_t, const Tensor& dy_t,
                        const Tensor& x_t, const Tensor& w_t, const Tensor& mean_t, const Tensor& rstd_t,
                        const Tensor& dx_add_t) {
  const int64_t C = w_t.numel();
  const int64_t N = C > 0 ? x_t.numel() / C : 0;
  if (N == 0 || C == 0) return;
  const float* w = columns_f32<T>(w_t, 0);
  const int64_t chunks = std::clamp<int64_t>(N / kGradRows, 1, kGradChunks);
  const bool has_db = db_t.defined(), has_add = dx_add_t.defined();
  const int64_t Cp = padded_cols(C);
  const int64_t stride = has_db ? 2 * Cp : Cp;
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
  sum_partials(partials, chunks, stride, stride);
  add_columns_any<T>(dw_t, partials, C);
  if (has_db) add_columns_any<T>(db_t, partials + Cp, C);
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
