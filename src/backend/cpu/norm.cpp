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
// Rows are processed in kV2-element blocks with simd.h's load_pair/store_pair:
// for bf16 the two vectors of a block hold the even and the odd elements. Row
// sums do not care about that order; the per-column f32 arrays (w, b and the
// dw/db partials) are kept in the same block order ("column layout", padded
// to a multiple of kV2 columns) so that lanes line up.
// RMSNorm is LayerNorm with mean fixed at 0 and without the mean(g) term, so
// both share the kernels below.

#include "backend/cpu/norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cpu/scratch.h"
#include "backend/cpu/simd.h"
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

using namespace simd;

// --- column layout ------------------------------------------------------------------

// C rounded up to whole kV2-element blocks.
inline int64_t padded_cols(int64_t C) { return (C + kV2 - 1) / kV2 * kV2; }

// Where column c lives in the column layout of T: within its kV2-block, lane
// order of load_pair<T> (f32: natural; bf16: kV even columns, then kV odd ones).
template <typename T>
inline int64_t col_pos(int64_t c) {
  const int64_t blk = c - c % kV2, k = c % kV2;
  if constexpr (std::is_same_v<T, float>) return c;
  return blk + (k % 2) * kV + k / 2;
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

inline Pair load_cols(const float* p) { return {load(p), load(p + kV)}; }
inline void store_cols(float* p, Pair v) {
  store(p, v.v0);
  store(p + kV, v.v1);
}

// Sum over the row of f applied to the blocks of x (both halves; lanes past
// the end of the row masked off). Four independent accumulators (one would run
// at the latency of one add per vector), then a fixed-order horizontal sum.
template <typename T, typename F>
inline float row_sum(const T* x, int64_t C, F&& f) {
  f32v a0{}, a1{}, a2{}, a3{};
  int64_t c = 0;
  for (; c + 2 * kV2 <= C; c += 2 * kV2) {
    const Pair p = load_pair(x + c), q = load_pair(x + c + kV2);
    a0 += f(p.v0);
    a1 += f(p.v1);
    a2 += f(q.v0);
    a3 += f(q.v1);
  }
  for (; c + kV2 <= C; c += kV2) {
    const Pair p = load_pair(x + c);
    a0 += f(p.v0);
    a1 += f(p.v1);
  }
  if (c < C) {
    const int64_t n = C - c;
    const Pair p = load_pair_partial(x + c, n);
    a2 += pair_lane_elems<T>(0) < int32_t(n) ? f(p.v0) : f32v{};
    a3 += pair_lane_elems<T>(1) < int32_t(n) ? f(p.v1) : f32v{};
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
    const f32v vx0 = splat(x0);
    const float s = row_sum(x, C, [&](f32v v) __attribute__((always_inline)) { return v - vx0; });
    const double mean = double(x0) + double(s) / double(C);
    mh = float(mean);
    ml = float(mean - double(mh));
  }
  const f32v vmh = splat(mh), vml = splat(ml);
  const float v = row_sum(x, C, [&](f32v xv) __attribute__((always_inline)) {
    const f32v d = (xv - vmh) - vml;
    return d * d;
  });
  const float r = 1.0f / std::sqrt(v / float(C) + eps);
  const f32v vr = splat(r);
  auto out = [&](Pair xv, int64_t c) __attribute__((always_inline)) {
    const Pair wv = load_cols(w + c);
    Pair yv{((xv.v0 - vmh) - vml) * (vr * wv.v0), ((xv.v1 - vmh) - vml) * (vr * wv.v1)};
    if constexpr (HasBias) {
      const Pair bv = load_cols(b + c);
      yv.v0 += bv.v0;
      yv.v1 += bv.v1;
    }
    return yv;
  };
  int64_t c = 0;
  for (; c + kV2 <= C; c += kV2) store_pair(y + c, out(load_pair(x + c), c));
  if (c < C) store_pair_partial(y + c, out(load_pair_partial(x + c, C - c), c), C - c);
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
      auto add = [](Pair a, Pair c) { return Pair{a.v0 + c.v0, a.v1 + c.v1}; };
      int64_t c = 0;
      for (; c + kV2 <= C; c += kV2) store_pair(ro + c, add(load_pair(ri + c), load_pair(src + c)));
      if (c < C) store_pair_partial(ro + c, add(load_pair_partial(ri + c, C - c), load_pair_partial(src + c, C - c)), C - c);
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
  const f32v vmean = splat(mean), vrstd = splat(rstd);
  // Row sums of g = dy w and g xhat.
  f32v g0{}, g1{}, h0{}, h1{};
  auto sums = [&](Pair d, Pair xv, int64_t c) __attribute__((always_inline)) {
    const Pair wv = load_cols(w + c);
    const f32v ga = d.v0 * wv.v0, gb = d.v1 * wv.v1;
    g0 += ga;
    g1 += gb;
    h0 += ga * ((xv.v0 - vmean) * vrstd);
    h1 += gb * ((xv.v1 - vmean) * vrstd);
  };
  int64_t c = 0;
  for (; c + kV2 <= C; c += kV2) sums(load_pair(dy + c), load_pair(x + c), c);
  if (c < C) sums(load_pair_partial(dy + c, C - c), load_pair_partial(x + c, C - c), c);
  const float sg = hsum(g0 + g1), sgx = hsum(h0 + h1);
  const f32v vmg = splat(rms ? 0.0f : sg / float(C)), vmgx = splat(sgx / float(C));

  // dx = rstd (g - mean(g) - xhat mean(g xhat)) (+ dx_add); pdw += dy xhat; pdb += dy.
  auto half = [&](f32v d, f32v xv, f32v wv, f32v add, f32v& pw, f32v& pb)
      __attribute__((always_inline)) {
    const f32v xh = (xv - vmean) * vrstd;
    f32v v = vrstd * ((d * wv - vmg) - xh * vmgx);
    if constexpr (HasAdd) v += add;
    pw += d * xh;
    if constexpr (HasDb) pb += d;
    return v;
  };
  auto block = [&](Pair d, Pair xv, Pair add, int64_t c) __attribute__((always_inline)) {
    const Pair wv = load_cols(w + c);
    Pair pw = load_cols(pdw + c), pb = HasDb ? load_cols(pdb + c) : Pair{};
    const Pair v{half(d.v0, xv.v0, wv.v0, add.v0, pw.v0, pb.v0), half(d.v1, xv.v1, wv.v1, add.v1, pw.v1, pb.v1)};
    store_cols(pdw + c, pw);
    if constexpr (HasDb) store_cols(pdb + c, pb);
    return v;
  };
  for (c = 0; c + kV2 <= C; c += kV2)
    store_pair(dx + c, block(load_pair(dy + c), load_pair(x + c), HasAdd ? load_pair(dx_add + c) : Pair{}, c));
  if (c < C) {
    const int64_t n = C - c;
    store_pair_partial(dx + c,
                    block(load_pair_partial(dy + c, n), load_pair_partial(x + c, n),
                          HasAdd ? load_pair_partial(dx_add + c, n) : Pair{}, c),
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
    f32v s = load(acc);
    for (int64_t k = 1; k < chunks; ++k) s += load(acc + k * stride);
    store(acc, s);
  }
}

// out (C) += sums (column layout of T); overwrite: =, out not read.
template <typename T, typename G>
void add_columns(const Tensor& out_t, const float* sums, int64_t C, bool overwrite) {
  G* out = out_t.data<G>();
  for (int64_t c = 0; c < C; ++c)
    out[c] = from_float<G>(overwrite ? sums[col_pos<T>(c)] : to_float(out[c]) + sums[col_pos<T>(c)]);
}

template <typename T>
void add_columns_any(const Tensor& out_t, const float* sums, int64_t C, bool overwrite) {
  if (out_t.dtype() == DType::f32)
    add_columns<T, float>(out_t, sums, C, overwrite);
  else
    add_columns<T, bf16>(out_t, sums, C, overwrite);
}

template <typename T>
void norm_backward_impl(bool rms, const Tensor& dx_t, const Tensor& dw_t, const Tensor& db_t, const Tensor& dy_t,
                        const Tensor& x_t, const Tensor& w_t, const Tensor& mean_t, const Tensor& rstd_t,
                        const Tensor& dx_add_t, bool overwrite) {
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
  add_columns_any<T>(dw_t, partials, C, overwrite);
  if (has_db) add_columns_any<T>(db_t, partials + Cp, C, overwrite);
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
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add,
                   bool overwrite) {
  if (x.dtype() == DType::f32)
    norm_backward_impl<float>(rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite);
  else
    norm_backward_impl<bf16>(rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite);
}

}  // namespace zt::cpu
