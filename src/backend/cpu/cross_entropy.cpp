// CPU fused softmax + cross-entropy.
//
// Per row n (x = logits[n, :vocab], t = targets[n], s = grad_scale):
//   m = max_j x_j,  e_j = exp(x_j - m),  S = sum_j e_j
//   loss_n = (m - x_t) + log S                      (= logsumexp(x) - x_t)
//   dlogits[n, j] = s * (e_j / S - [j == t])   for j < vocab
//   dlogits[n, j] = 0                          for vocab <= j < Vp (padding)
// Ignored rows (t < 0): loss 0 and a zero gradient row.
//
// Memory traffic: three passes over a row that stays in L2 (a 50257-wide f32
// row is 200 KB): max, then exp + sum (e_j stored where the gradient goes,
// or in f32 scratch for bf16 logits, which pass 1 widens there), then the
// scaling into dlogits. So each row is read once from memory and the gradient
// written once; in-place (dlogits == logits) works because x_t is read first
// and every later pass reads only what the previous pass wrote.
//
// Accuracy: simd::exp_flush is ~1 ulp (exp of values below -87 flushed to
// 0); S is summed in f32 vector lanes over blocks of kSumBlock elements, block
// sums in f64; the loss is assembled in f64. The exps run on explicit vectors
// (simd.h): as a scalar function in an `omp simd` loop, GCC left the loop
// scalar on AVX2 (its flush-to-zero select became a branch), 20x slower.
#include "backend/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/simd.h"

namespace zt::cpu {

namespace {

using simd::f32v;
using simd::kV;

constexpr int64_t kSumBlock = 1024;  // a multiple of kV

inline float row_max(const float* x, int64_t V) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < V; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// Widens a bf16 row into buf and returns its max.
inline float widen_row_max(const bf16* x, float* buf, int64_t V) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < V; ++j) {
    const float v = load_f32(x[j]);
    buf[j] = v;
    m = v > m ? v : m;
  }
  return m;
}

// e_j = exp(x_j - m) for one kV-lane vector of x.
inline f32v exp_shifted(f32v x, f32v m) { return simd::exp_flush(x - m); }

// The first n (< kV) elements of x, the missing lanes -inf (their exp is 0).
inline f32v load_tail(const float* x, int64_t n) {
  return simd::lanes_below(n) ? simd::load_partial(x, n) : simd::splat(-std::numeric_limits<float>::infinity());
}

// sum_j exp(x_j - m); when kStore, e_j is written to e (which may be x).
template <bool kStore>
inline double exp_sum(const float* x, float* e, float m, int64_t V) {
  const f32v vm = simd::splat(m);
  double total = 0.0;
  for (int64_t j0 = 0; j0 < V; j0 += kSumBlock) {
    const int64_t j1 = std::min(V, j0 + kSumBlock);
    f32v s{};
    int64_t j = j0;
    for (; j + kV <= j1; j += kV) {
      const f32v ej = exp_shifted(simd::load(x + j), vm);
      if constexpr (kStore) simd::store(e + j, ej);
      s += ej;
    }
    if (j < j1) {
      const f32v ej = exp_shifted(load_tail(x + j, j1 - j), vm);
      if constexpr (kStore) simd::store_partial(e + j, ej, j1 - j);
      s += ej;
    }
    total += double(simd::hsum(s));
  }
  return total;
}

// d[j] = T(e[j] * r) for j < n (d may be e when T is float).
template <typename T>
inline void scale_into(T* d, const float* e, float r, int64_t n) {
  const f32v vr = simd::splat(r);
  int64_t j = 0;
  for (; j + kV <= n; j += kV) simd::store(d + j, simd::load(e + j) * vr);
  if (j < n) simd::store_partial(d + j, simd::load_partial(e + j, n - j) * vr, n - j);
}

template <typename T>
void ce_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N, int64_t Vp,
               int64_t V, float grad_scale) {
  const bool grad = dlogits != nullptr;
#pragma omp parallel if (N > 1)
  {
    float* buf = std::is_same_v<T, float> ? nullptr : thread_scratch(size_t(V), 0);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* x = logits + n * Vp;
      T* d = grad ? dlogits + n * Vp : nullptr;
      const int32_t t = targets[n];
      if (t < 0) {
        losses[n] = 0.0f;
        if (grad) std::fill(d, d + Vp, store_as<T>(0.0f));
        continue;
      }
      const float xt = load_f32(x[t]);  // before any in-place write
      double S;
      float m;
      if constexpr (std::is_same_v<T, float>) {
        m = row_max(x, V);
        S = grad ? exp_sum<true>(x, d, m, V) : exp_sum<false>(x, nullptr, m, V);
        if (grad) {
          const float r = float(double(grad_scale) / S);
          scale_into(d, d, r, V);
          d[t] -= grad_scale;
          std::fill(d + V, d + Vp, 0.0f);
        }
      } else {
        m = widen_row_max(x, buf, V);
        S = grad ? exp_sum<true>(buf, buf, m, V) : exp_sum<false>(buf, nullptr, m, V);
        if (grad) {
          const float r = float(double(grad_scale) / S);
          const float et = buf[t];
          scale_into(d, buf, r, V);
          d[t] = store_as<T>(et * r - grad_scale);
          std::fill(d + V, d + Vp, store_as<T>(0.0f));
        }
      }
      losses[n] = float((double(m) - double(xt)) + std::log(S));
    }
  }
}

// A row of logits as f32: the row itself, or widened into buf.
inline const float* f32_row(const float* x, float*, int64_t) { return x; }
inline const float* f32_row(const bf16* x, float* buf, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) buf[j] = load_f32(x[j]);
  return buf;
}

template <typename T>
void vp_max_kernel(float* row_max_out, const T* logits, int64_t N, int64_t Vl, int64_t real) {
#pragma omp parallel if (N > 1)
  {
    float* buf = std::is_same_v<T, float> ? nullptr : thread_scratch(size_t(std::max<int64_t>(real, 1)), 0);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) row_max_out[n] = row_max(f32_row(logits + n * Vl, buf, real), real);
  }
}

template <typename T>
void vp_sums_kernel(float* sum_exp, float* target_logit, const T* logits, const float* row_max_in,
                    const int32_t* targets, int64_t N, int64_t Vl, int64_t col_start, int64_t real) {
#pragma omp parallel if (N > 1)
  {
    float* buf = std::is_same_v<T, float> ? nullptr : thread_scratch(size_t(std::max<int64_t>(real, 1)), 0);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const float* x = f32_row(logits + n * Vl, buf, real);
      const int64_t t = int64_t(targets[n]) - col_start;
      target_logit[n] = targets[n] >= 0 && t >= 0 && t < real ? x[t] : 0.0f;
      // A row whose global max is -inf has no real column anywhere (cannot
      // happen with vocab >= 1); a rank without real columns adds 0.
      sum_exp[n] = real == 0 ? 0.0f : float(exp_sum<false>(x, nullptr, row_max_in[n], real));
    }
  }
}

template <typename T>
void vp_finish_kernel(float* losses, T* dlogits, const T* logits, const float* row_max_in, const float* sum_exp,
                      const float* target_logit, const int32_t* targets, int64_t N, int64_t Vl, int64_t col_start,
                      int64_t real, float grad_scale) {
  const bool grad = dlogits != nullptr;
#pragma omp parallel if (N > 1)
  {
    float* buf = std::is_same_v<T, float> ? nullptr : thread_scratch(size_t(std::max<int64_t>(real, 1)), 0);
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      T* d = grad ? dlogits + n * Vl : nullptr;
      if (targets[n] < 0) {
        losses[n] = 0.0f;
        if (grad) std::fill(d, d + Vl, store_as<T>(0.0f));
        continue;
      }
      const double S = double(sum_exp[n]);
      const float m = row_max_in[n];
      losses[n] = float((double(m) - double(target_logit[n])) + std::log(S));
      if (!grad) continue;
      const float* x = f32_row(logits + n * Vl, buf, real);  // read fully before an in-place write
      const float r = float(double(grad_scale) / S);
      const int64_t t = int64_t(targets[n]) - col_start;
      const bool has_target = t >= 0 && t < real;
      const float xt = has_target ? x[t] : 0.0f;  // x may be d (f32 in place)
      const f32v vm = simd::splat(m), vr = simd::splat(r);
      int64_t j = 0;
      for (; j + kV <= real; j += kV) simd::store(d + j, exp_shifted(simd::load(x + j), vm) * vr);
      if (j < real) simd::store_partial(d + j, exp_shifted(simd::load_partial(x + j, real - j), vm) * vr, real - j);
      // The target column's exp from the same vector code as its neighbours'.
      if (has_target) d[t] = store_as<T>(exp_shifted(simd::splat(xt), vm)[0] * r - grad_scale);
      std::fill(d + real, d + Vl, store_as<T>(0.0f));
    }
  }
}

}  // namespace

void vocab_parallel_ce_max(const Tensor& row_max_out, const Tensor& logits, int64_t real) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  if (logits.dtype() == DType::f32)
    vp_max_kernel(row_max_out.data<float>(), logits.data<float>(), N, Vl, real);
  else
    vp_max_kernel(row_max_out.data<float>(), logits.data<bf16>(), N, Vl, real);
}

void vocab_parallel_ce_sums(const Tensor& sum_exp, const Tensor& target_logit, const Tensor& logits,
                            const Tensor& row_max_in, const Tensor& targets, int64_t col_start, int64_t real) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  if (logits.dtype() == DType::f32)
    vp_sums_kernel(sum_exp.data<float>(), target_logit.data<float>(), logits.data<float>(), row_max_in.data<float>(),
                   targets.data<int32_t>(), N, Vl, col_start, real);
  else
    vp_sums_kernel(sum_exp.data<float>(), target_logit.data<float>(), logits.data<bf16>(), row_max_in.data<float>(),
                   targets.data<int32_t>(), N, Vl, col_start, real);
}

void vocab_parallel_ce_finish(const Tensor& losses, const Tensor& dlogits, const Tensor& logits,
                              const Tensor& row_max_in, const Tensor& sum_exp, const Tensor& target_logit,
                              const Tensor& targets, int64_t col_start, int64_t real, float grad_scale) {
  const int64_t N = logits.size(0), Vl = logits.size(1);
  if (logits.dtype() == DType::f32)
    vp_finish_kernel(losses.data<float>(), dlogits.defined() ? dlogits.data<float>() : nullptr, logits.data<float>(),
                     row_max_in.data<float>(), sum_exp.data<float>(), target_logit.data<float>(),
                     targets.data<int32_t>(), N, Vl, col_start, real, grad_scale);
  else
    vp_finish_kernel(losses.data<float>(), dlogits.defined() ? dlogits.data<bf16>() : nullptr, logits.data<bf16>(),
                     row_max_in.data<float>(), sum_exp.data<float>(), target_logit.data<float>(),
                     targets.data<int32_t>(), N, Vl, col_start, real, grad_scale);
}

void softmax_cross_entropy(const Tensor& losses, const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                           int64_t vocab, float grad_scale) {
  const int64_t N = logits.size(0), Vp = logits.size(1);
  if (logits.dtype() == DType::f32) {
    ce_kernel<float>(losses.data<float>(), dlogits.defined() ? dlogits.data<float>() : nullptr,
                     logits.data<float>(), targets.data<int32_t>(), N, Vp, vocab, grad_scale);
  } else {
    ZT_ASSERT(logits.dtype() == DType::bf16, "softmax_cross_entropy: dtype ", dtype_name(logits.dtype()));
    ce_kernel<bf16>(losses.data<float>(), dlogits.defined() ? dlogits.data<bf16>() : nullptr, logits.data<bf16>(),
                    targets.data<int32_t>(), N, Vp, vocab, grad_scale);
  }
}

}  // namespace zt::cpu
