// CPU elementwise kernels. Every loop is one OpenMP-parallel, vectorised pass
// over contiguous memory; small tensors (< kParallelMin elements) stay on the
// calling thread.
//
// cast: out[i] = convert(in[i]) with
//   float -> float  through f32 (exact for every source format), then the
//                   rounding of core/dtype.h: one rounding, RNE.
//   int   -> f32    static_cast (one rounding, RNE).
//   int   -> other float: the integer is first rounded to f32 with
//                   round-to-odd, then to the target with RNE; because f32
//                   has >= 2 more significand bits than bf16/f16/fp8 this is
//                   exactly the correctly rounded (RNE) value of the integer.
//   float -> int    truncation toward zero, saturating at the integer's
//                   range, NaN -> 0.
//   int   -> int    saturating at the target's range.
// sum_squares: chunks of kSumChunk elements, each summed in f64 (x^2 of a
//   f32/bf16/f16 value is exact in f64) over 32 interleaved accumulators,
//   chunk partials summed in index order: the result does not depend on the
//   thread count (or the vectoriser), and each partial is a sequential sum of
//   at most kSumChunk / 32 + 5 + n / kSumChunk positive terms, so the
//   relative error is below (261 + n / 8192) * 2^-53 (4.3e-14 for n = 1e6).
#include "backend/cpu/elementwise.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "backend/cpu/scratch.h"
#include "core/rng.h"

#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

namespace zt::cpu {

namespace {

constexpr int64_t kParallelMin = int64_t(1) << 15;
constexpr int64_t kSumChunk = int64_t(1) << 13;
constexpr int kLanes = 32;  // f64 accumulators per chunk (4 vectors: hides the add latency)
constexpr int64_t kRandBlock = int64_t(1) << 12;  // multiple of 4: blocks start on Philox block boundaries

// --- scalar conversions used by cast ----------------------------------------

template <typename D>
inline D float_to_int(float f) {
  using L = std::numeric_limits<D>;
  constexpr float lo = float(L::min());                                   // 0 or -2^digits: exact
  constexpr float hi = float(uint64_t(1) << L::digits);                   // max + 1 = 2^digits: exact
  constexpr float below_hi = float(uint64_t(1) << L::digits) * (1.0f - 0x1p-24f);  // largest float < hi
  float c = f < lo ? lo : f;
  c = c > below_hi ? below_hi : c;
  c = f == f ? c : 0.0f;  // NaN -> 0
  const D r = D(c);       // in range: truncation toward zero
  return f >= hi ? L::max() : r;
}

// The integer rounded to f32 with round-to-odd (truncate, then set the last
// significand bit if anything was cut off).
template <typename S>
inline float int_to_f32_odd(S v) {
  if constexpr (sizeof(S) <= 2) {
    return float(v);  // exact
  } else {
    const bool neg = v < 0;
    const uint64_t u = neg ? uint64_t(0) - uint64_t(v) : uint64_t(v);
    if (u < (uint64_t(1) << 24)) return float(v);  // exact
    const int width = 64 - std::countl_zero(u);
    const int sh = width - 24;
    uint64_t mant = u >> sh;
    if (u & ((uint64_t(1) << sh) - 1)) mant |= 1;
    const float f = float(mant) * std::bit_cast<float>(uint32_t(127 + sh) << 23);  // exact
    return neg ? -f : f;
  }
}

// The double rounded to f32 with round-to-odd (exact values, inf and NaN kept).
inline float double_to_f32_odd(double d) {
  float f = float(d);
  if (!std::isfinite(d) || double(f) == d) return f;
  if (std::fabs(double(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);  // truncate toward zero
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}

template <typename D, typename S>
inline D saturate_int(S s) {
  using L = std::numeric_limits<D>;
  if (std::cmp_less(s, L::min())) return L::min();
  if (std::cmp_greater(s, L::max())) return L::max();
  return D(s);
}

template <typename S, typename D>
inline D convert(S s) {
  if constexpr (std::is_integral_v<S> && std::is_integral_v<D>) {
    return saturate_int<D>(s);
  } else if constexpr (std::is_integral_v<S>) {
    if constexpr (std::is_same_v<D, float>)
      return float(s);
    else
      return store_as<D>(int_to_f32_odd(s));
  } else if constexpr (std::is_integral_v<D>) {
    return float_to_int<D>(load_f32(s));
  } else {
    return store_as<D>(load_f32(s));
  }
}

template <typename S, typename D>
void cast_kernel(D* out, const S* in, int64_t n) {
  // out may be exactly in (equal element sizes): each element is read before
  // it is written, at the same index.
#pragma omp parallel for simd schedule(simd : static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = convert<S, D>(in[i]);
}

template <typename S>
void cast_from(const Tensor& out, const S* in, int64_t n) {
  switch (out.dtype()) {
#define ZT_X(id, type, bytes, name, fl)                                  \
  case DType::id:                                                        \
    cast_kernel<S, type>(static_cast<type*>(out.data_ptr()), in, n);     \
    return;
    ZT_DTYPES(ZT_X)
#undef ZT_X
  }
}

void parallel_copy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kPiece = size_t(1) << 20;
  const int64_t pieces = int64_t((bytes + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static) if (pieces > 1)
  for (int64_t p = 0; p < pieces; ++p) {
    const size_t begin = size_t(p) * kPiece;
    std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin,
                std::min(kPiece, bytes - begin));
  }
}

// --- add / scale / axpy -----------------------------------------------------

template <typename T>
void add_kernel(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for simd schedule(simd : static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = store_as<T>(load_f32(a[i]) + load_f32(b[i]));
}

template <typename T>
void scale_kernel(T* out, const T* x, float alpha, int64_t n) {
#pragma omp parallel for simd schedule(simd : static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = store_as<T>(alpha * load_f32(x[i]));
}

template <typename Y, typename X>
void axpy_kernel(Y* y, float alpha, const X* x, int64_t n) {
#pragma omp parallel for simd schedule(simd : static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = store_as<Y>(std::fma(alpha, load_f32(x[i]), load_f32(y[i])));
}

template <typename Fn>
void dispatch_float3(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: fn(float{}); return;
    case DType::bf16: fn(bf16{}); return;
    case DType::f16: fn(f16{}); return;
    default: ZT_ASSERT(false, "unexpected dtype ", dtype_name(t));
  }
}

// --- fill -------------------------------------------------------------------

template <typename T>
T fill_value(double v) {
  if constexpr (std::is_integral_v<T>)
    return T(v);  // the caller checked: integral and in range
  else if constexpr (std::is_same_v<T, float>)
    return float(v);
  else
    return store_as<T>(double_to_f32_odd(v));  // one correct rounding of the double
}

template <typename T>
void fill_kernel(T* out, T value, int64_t n) {
#pragma omp parallel for simd schedule(simd : static) if (parallel : n >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = value;
}

// --- sum of squares ---------------------------------------------------------

template <typename T>
double sum_squares_kernel(const T* x, int64_t n) {
  const int64_t chunks = (n + kSumChunk - 1) / kSumChunk;
  if (chunks == 0) return 0.0;
  double* partial = reinterpret_cast<double*>(thread_scratch(size_t(chunks) * 2, 0));
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const T* p = x + c * kSumChunk;
    const int64_t len = std::min(kSumChunk, n - c * kSumChunk);
    // kLanes explicit accumulators (element i goes to lane i % kLanes), so
    // the order of additions is fixed by the code, not by the vectoriser.
    double acc[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= len; i += kLanes) {
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) {
        const double v = double(load_f32(p[i + l]));
        acc[l] += v * v;
      }
    }
    for (int l = 0; i < len; ++i, ++l) {
      const double v = double(load_f32(p[i]));
      acc[l] += v * v;
    }
    for (int w = kLanes / 2; w >= 1; w /= 2)  // pairwise combine, fixed order
      for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
    partial[c] = acc[0];
  }
  double s = 0.0;
  for (int64_t c = 0; c < chunks; ++c) s += partial[c];
  return s;
}

// --- random fills -----------------------------------------------------------

// Low-precision outputs: each block of kRandBlock elements is generated by
// core's f32 fill into per-thread scratch (element start + i of the draw is
// element i of a draw at offset + start / 4), then rounded.
template <typename T, bool kNormal>
void fill_random_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, float a, float b) {
  const int64_t blocks = (n + kRandBlock - 1) / kRandBlock;
#pragma omp parallel if (blocks > 1)
  {
    float* buf = thread_scratch(size_t(kRandBlock), 0);
#pragma omp for schedule(static)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t start = blk * kRandBlock;
      const int64_t len = std::min(kRandBlock, n - start);
      if constexpr (kNormal)
        philox_fill_normal(buf, len, seed, offset + uint64_t(start / 4), a, b);
      else
        philox_fill_uniform(buf, len, seed, offset + uint64_t(start / 4), a, b);
      T* o = out + start;
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) o[i] = store_as<T>(buf[i]);
    }
  }
}

template <bool kNormal>
void fill_random(const Tensor& out, uint64_t seed, uint64_t offset, float a, float b) {
  const int64_t n = out.numel();
  switch (out.dtype()) {
    case DType::f32:
      if constexpr (kNormal)
        philox_fill_normal(out.data<float>(), n, seed, offset, a, b);
      else
        philox_fill_uniform(out.data<float>(), n, seed, offset, a, b);
      return;
    case DType::bf16: fill_random_kernel<bf16, kNormal>(out.data<bf16>(), n, seed, offset, a, b); return;
    case DType::f16: fill_random_kernel<f16, kNormal>(out.data<f16>(), n, seed, offset, a, b); return;
    case DType::f8e4m3: fill_random_kernel<f8e4m3, kNormal>(out.data<f8e4m3>(), n, seed, offset, a, b); return;
    case DType::f8e5m2: fill_random_kernel<f8e5m2, kNormal>(out.data<f8e5m2>(), n, seed, offset, a, b); return;
    default: ZT_ASSERT(false, "random fill of dtype ", dtype_name(out.dtype()));
  }
}

}  // namespace

void sqrt_inplace(float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512 a = _mm512_loadu_ps(x + i);
    // The masked form with every lane set: _mm512_sqrt_ps trips a GCC 12
    // false -Wmaybe-uninitialized inside its header.
    _mm512_storeu_ps(x + i, _mm512_mask_sqrt_ps(a, __mmask16(0xffff), a));
  }
#elif defined(__AVX__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

void cast(const Tensor& out, const Tensor& in) {
  const int64_t n = in.numel();
  if (out.dtype() == in.dtype()) {
    if (out.data_ptr() != in.data_ptr()) parallel_copy(out.data_ptr(), in.data_ptr(), in.nbytes());
    return;
  }
  switch (in.dtype()) {
#define ZT_X(id, type, bytes, name, fl)                                     \
  case DType::id:                                                           \
    cast_from<type>(out, static_cast<const type*>(in.data_ptr()), n);       \
    return;
    ZT_DTYPES(ZT_X)
#undef ZT_X
  }
}

void add(const Tensor& out, const Tensor& a, const Tensor& b) {
  dispatch_float3(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    add_kernel<T>(out.data<T>(), a.data<T>(), b.data<T>(), out.numel());
  });
}

void scale(const Tensor& out, const Tensor& x, float alpha) {
  dispatch_float3(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T>(out.data<T>(), x.data<T>(), alpha, out.numel());
  });
}

void axpy(const Tensor& y, float alpha, const Tensor& x) {
  dispatch_float3(y.dtype(), [&](auto ytag) {
    using Y = decltype(ytag);
    dispatch_float3(x.dtype(), [&](auto xtag) {
      using X = decltype(xtag);
      axpy_kernel<Y, X>(y.data<Y>(), alpha, x.data<X>(), y.numel());
    });
  });
}

void fill(const Tensor& out, double value) {
  switch (out.dtype()) {
#define ZT_X(id, type, bytes, name, fl)                                                  \
  case DType::id:                                                                        \
    fill_kernel<type>(static_cast<type*>(out.data_ptr()), fill_value<type>(value), out.numel()); \
    return;
    ZT_DTYPES(ZT_X)
#undef ZT_X
  }
}

double sum_squares(const Tensor& x) {
  switch (x.dtype()) {
    case DType::f32: return sum_squares_kernel(x.data<float>(), x.numel());
    case DType::bf16: return sum_squares_kernel(x.data<bf16>(), x.numel());
    case DType::f16: return sum_squares_kernel(x.data<f16>(), x.numel());
    default: ZT_ASSERT(false, "sum_squares of dtype ", dtype_name(x.dtype()));
  }
  return 0.0;
}

void fill_normal(const Tensor& out, uint64_t seed, uint64_t offset, float mean, float std) {
  fill_random<true>(out, seed, offset, mean, std);
}

void fill_uniform(const Tensor& out, uint64_t seed, uint64_t offset, float lo, float hi) {
  fill_random<false>(out, seed, offset, lo, hi);
}

}  // namespace zt::cpu
