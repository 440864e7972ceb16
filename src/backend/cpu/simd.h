// f32 vector primitives shared by the CPU kernels that the auto-vectoriser
// handles badly (activations, norms, the cross entropy, attention): GCC/Clang
// vector extensions of the target's widest float vector, kV lanes (16 with
// AVX-512, 8 with AVX, 4 with SSE only).
//
// Why explicit vectors: the auto-vectoriser turns clamps and selects into
// masked or branchy code (or leaves a loop scalar: with AVX2 an `x < c ? 0 :
// e` in an exp loop kept it scalar, 20x slower) and handles bf16 rounding in
// ~10 integer ops per vector. Why the native width: GCC splits wider generic
// vectors into native ones for arithmetic, but their compares, selects and
// conversions become element-by-element code (measured 7-20x slower on AVX2).
//
//   load<T>(p), store<T>(p, v)      kV elements of T (f32 or bf16) <-> f32; bf16
//                                   widened exactly, stored with core/dtype.h's
//                                   float_to_bf16 bits (nearest even; NaN -> quiet)
//   load_partial / store_partial    the same for the first n < kV elements
//                                   (loads zero-pad the missing lanes)
//   Pair, load_pair, store_pair     blocks of kV2 = 2 kV elements in a lane order
//                                   private to the pair functions (below)
//   exp, exp2, exp_flush            e^x and 2^x, within 1 ulp with FMA (details below)
//
// The kernels' results depend on kV (sums run in kV lanes), so they are
// reproducible per build, not across ISAs. (GCC can warn that passing vectors
// by value changes the ABI; these are inline helpers used within one build, so
// it does not matter.)
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "core/dtype.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace zt::cpu::simd {

#if defined(__AVX512F__)
constexpr int64_t kV = 16;
#elif defined(__AVX__)
constexpr int64_t kV = 8;
#else
constexpr int64_t kV = 4;  // SSE (a build without -march=native)
#endif
constexpr int64_t kV2 = 2 * kV;

using f32v = float __attribute__((vector_size(4 * kV)));
using i32v = int32_t __attribute__((vector_size(4 * kV)));
using u32v = uint32_t __attribute__((vector_size(4 * kV)));
using u16v = uint16_t __attribute__((vector_size(2 * kV)));    // kV bf16
using u16v2 = uint16_t __attribute__((vector_size(4 * kV)));  // 2 kV bf16

inline f32v splat(float s) { return f32v{} + s; }
inline f32v vmax(f32v a, f32v b) { return a < b ? b : a; }  // NaN in a passes through
inline f32v vmin(f32v a, f32v b) { return a > b ? b : a; }  // NaN in a passes through

// {0, 1, ..., kV - 1}
inline i32v iota() {
  i32v v{};
  for (int l = 0; l < int(kV); ++l) v[l] = l;
  return v;
}

// All-ones in lanes [0, n), zero elsewhere (n <= kV).
inline i32v lanes_below(int64_t n) { return iota() < int32_t(n); }

namespace detail {
// Words (0, h0, 0, h1, ...): each bf16 becomes the high half of an f32 lane.
template <size_t... I>
inline u16v2 interleave_with_zero(u16v h, std::index_sequence<I...>) {
  return __builtin_shufflevector(u16v{}, h, ((I % 2) ? int(kV + I / 2) : int(I / 2))...);
}
}  // namespace detail

// bf16 -> f32 is exact: the bf16 bits become the high half of each f32 lane.
template <typename T>
inline f32v load(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    f32v v;
    std::memcpy(&v, p, sizeof v);
    return v;
  } else {
    static_assert(std::is_same_v<T, bf16>);
    u16v h;
    std::memcpy(&h, p, sizeof h);
    return (f32v)detail::interleave_with_zero(h, std::make_index_sequence<size_t(kV2)>());
  }
}

// f32 -> bf16 with core/dtype.h's float_to_bf16 bits, in integer vector ops.
inline u16v to_bf16_bits(f32v v) {
  const u32v u = (u32v)v;
  const u32v rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // nearest, ties to even
  const u32v qnan = (u >> 16) | 0x0040u;
  const u32v bits = (u & 0x7fffffffu) > 0x7f800000u ? qnan : rounded;
  return __builtin_convertvector(bits, u16v);
}

template <typename T>
inline void store(T* p, f32v v) {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(p, &v, sizeof v);
  } else {
    static_assert(std::is_same_v<T, bf16>);
#if defined(__AVX512BF16__)
    // VCVTNEPS2BF16 rounds exactly like float_to_bf16 (nearest even; NaN ->
    // (bits >> 16) | 0x40) except that it flushes subnormal inputs to zero:
    // vectors holding a subnormal take the integer path instead.
    const __m512 f = (__m512)v;
    if (__builtin_expect(_mm512_fpclass_ps_mask(f, 0x20) == 0, 1)) {  // 0x20: subnormal
      const __m256bh h = _mm512_cvtneps_pbh(f);
      std::memcpy(p, &h, sizeof h);
      return;
    }
#endif
    const u16v h = to_bf16_bits(v);
    std::memcpy(p, &h, sizeof h);
  }
}

// The first n (< kV) elements, zero-padded to a full vector.
template <typename T>
inline f32v load_partial(const T* p, int64_t n) {
  T tmp[kV] = {};
  std::memcpy(tmp, p, size_t(n) * sizeof(T));
  return load(tmp);
}

template <typename T>
inline void store_partial(T* p, f32v v, int64_t n) {
  T tmp[kV];
  store(tmp, v);
  std::memcpy(p, tmp, size_t(n) * sizeof(T));
}

// --- kV2-element blocks for elementwise kernels ---------------------------------
// A block of kV2 consecutive elements of T as two f32 vectors, in a lane order
// private to load_pair/store_pair: f32: v0 = elements 0..kV-1, v1 = kV..kV2-1;
// bf16: v0 = the even elements, v1 = the odd ones, split with two integer ops
// (each u32 lane of the raw load holds an even/odd bf16 pair), because
// lane-crossing shuffles are slow (measured on AVX-512: a bf16 load via a
// shuffle costs ~3x an f32 load; the integer split costs less than one).
// Elementwise code that reads every input and writes every output of the same
// element type through these is unaffected by the order. store_pair inverts
// load_pair: with AVX512-BF16 one VCVTNE2PS2BF16 plus one in-register word
// interleave; otherwise (and for blocks holding a subnormal, which that
// instruction flushes) integer rounding into the two halves of each lane.
struct Pair {
  f32v v0, v1;
};

template <typename T>
inline Pair load_pair(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return {load(p), load(p + kV)};
  } else {
    static_assert(std::is_same_v<T, bf16>);
    u32v r;
    std::memcpy(&r, p, sizeof r);
    return {(f32v)(r << 16), (f32v)(r & 0xffff0000u)};
  }
}

// float_to_bf16's bits in the high half of each lane (low half zero).
inline u32v bf16_bits_high(f32v v) {
  const u32v u = (u32v)v;
  const u32v rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;  // nearest, ties to even
  const u32v qnan = (u | 0x00400000u) & 0xffff0000u;
  return (u & 0x7fffffffu) > 0x7f800000u ? qnan : rounded;
}

template <typename T>
inline void store_pair(T* p, Pair v) {
  if constexpr (std::is_same_v<T, float>) {
    store(p, v.v0);
    store(p + kV, v.v1);
  } else {
    static_assert(std::is_same_v<T, bf16>);
#if defined(__AVX512BF16__)
    const __m512 e = (__m512)v.v0, o = (__m512)v.v1;
    if (__builtin_expect((_mm512_fpclass_ps_mask(e, 0x20) | _mm512_fpclass_ps_mask(o, 0x20)) == 0, 1)) {
      // words 0..15: even elements, 16..31: odd ones -> interleave.
      const u16v2 h = (u16v2)_mm512_cvtne2ps_pbh(o, e);
      const u16v2 w = __builtin_shufflevector(h, h, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24,
                                              9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
      std::memcpy(p, &w, sizeof w);
      return;
    }
#endif
    const u32v bits = (bf16_bits_high(v.v0) >> 16) | bf16_bits_high(v.v1);
    std::memcpy(p, &bits, sizeof bits);
  }
}

// The first n (< kV2) elements, zero-padded.
template <typename T>
inline Pair load_pair_partial(const T* p, int64_t n) {
  T tmp[kV2] = {};
  std::memcpy(tmp, p, size_t(n) * sizeof(T));
  return load_pair(tmp);
}

template <typename T>
inline void store_pair_partial(T* p, Pair v, int64_t n) {
  T tmp[kV2];
  store_pair(tmp, v);
  std::memcpy(p, tmp, size_t(n) * sizeof(T));
}

// The element index (within a kV2 block of T) held by each lane of v0 / v1.
template <typename T>
inline i32v pair_lane_elems(int half) {
  if constexpr (std::is_same_v<T, float>) return iota() + int32_t(half * kV);
  return iota() * 2 + half;
}

// Sum of the kV lanes in a fixed order: halves added pairwise down to 4 lanes,
// then (l0 + l2) + (l1 + l3). (Called per row or per block, not per element.)
inline float hsum(f32v v) {
  float a[kV];
  std::memcpy(a, &v, sizeof a);
  for (int64_t h = kV / 2; h >= 4; h /= 2)
    for (int64_t l = 0; l < h; ++l) a[l] += a[l + h];
  return (a[0] + a[2]) + (a[1] + a[3]);
}

// --- exp ------------------------------------------------------------------------
// e^x = 2^n e^r with n = round(x / ln2) and r = x - n ln2 (|r| <= ln2/2, n ln2
// in two parts with n ln2_hi exact), e^r by its Taylor series to r^7
// (truncation error < 0.1 ulp). 2^x = 2^n 2^f with |f| <= 1/2 exact, 2^f by a
// degree-6 Chebyshev fit (coefficients rounded to f32: 0.35 ulp). 2^n is built
// in the exponent field. Both are within 1 ulp over their ranges where the
// target has FMA (every -march=native build on x86 since Haswell; measured
// max 0.92 / 0.96 ulp over 4M points); without it each Horner step rounds
// twice (measured max 1.18 / 1.23 ulp). tests/ops/simd_test.cpp checks the
// bound of the build.
namespace detail {

inline f32v exp_poly(f32v r) {
  f32v p = splat(1.0f / 5040);
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}

inline f32v exp2_poly(f32v f) {
  f32v p = splat(1.546144485e-04f);
  p = p * f + 1.340042800e-03f;
  p = p * f + 9.618056938e-03f;
  p = p * f + 5.550327152e-02f;
  p = p * f + 2.402265072e-01f;
  p = p * f + 6.931471825e-01f;
  return p * f + 1.0f;
}

constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
constexpr int32_t kRoundBits = 0x4B400000;

// 2^n for the integer-valued n held in t = n + kRound (|n| <= 126): built
// directly in the exponent field, a normal float.
inline f32v pow2_from_rounded(f32v t) { return (f32v)((((i32v)t - kRoundBits) + 127) << 23); }

}  // namespace detail

// e^z for |z| <= 87.3 (callers clamp; outside, garbage). NaN -> NaN.
inline f32v exp(f32v z) {
  const f32v t = z * 1.44269504088896341f + detail::kRound;
  const f32v n = t - detail::kRound;
  f32v r = z - n * 0.693145751953125f;  // ln2_hi: 15 significant bits, |n| <= 126: exact product
  r = r - n * 1.428606820309417232e-6f;  // ln2 - ln2_hi
  return detail::exp_poly(r) * detail::pow2_from_rounded(t);
}

// 2^z for |z| <= 126 (callers clamp).
inline f32v exp2(f32v z) {
  const f32v t = z + detail::kRound;
  const f32v n = t - detail::kRound;
  return detail::exp2_poly(z - n) * detail::pow2_from_rounded(t);
}

// e^x for x <= 87, the softmax case (x - max): 0 for x < -87 (including -inf),
// where e^x < 1.7e-38 (results that would be subnormal are flushed); NaN -> NaN.
inline f32v exp_flush(f32v x) {
  constexpr float kMin = -87.0f;
  const f32v e = exp(vmax(x, splat(kMin)));
  return x < kMin ? f32v{} : e;
}

}  // namespace zt::cpu::simd

#pragma GCC diagnostic pop
