// CPU kernels for the pointwise activations (zt::ops::gelu_*, swiglu_* in
// src/ops/activation.h). Arguments are already validated by
// ops/activation.cpp: one dtype T in {f32, bf16} for all tensors, contiguous.
//
// GeLU (tanh approximation), with u = sqrt(2/pi) (x + 0.044715 x^3):
//   y = 0.5 x (1 + tanh(u)) = x * s,   s = sigmoid(2u) = 1 / (1 + e),  e = exp(-2u)
//   dy/dx = s + x s (1 - s) 2 du/dx = s (1 + 2 x du/dx e s),
//   du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// The sigmoid form avoids the cancellation of 1 + tanh(u) for x << 0 (the
// result keeps its relative accuracy all the way down), and 1 - s = e s.
//
// SwiGLU on rows [gate (H) | up (H)] -> y (H):
//   y = silu(g) u,   silu(g) = g s,  s = sigmoid(g) = 1 / (1 + exp(-g))
//   dgate = dy u silu'(g),  silu'(g) = s (1 + g (1 - s)) = s (1 + g e s)
//   dup   = dy silu(g)
//
// e (GeLU) is 2^z with z = -2 log2(e) u folded into the cubic's coefficients;
// exp(-g) (SiLU) uses a Cody-Waite reduction. Both evaluate a degree-6
// polynomial fitted for f32 (0.35 ulp over the reduced range) and build 2^n in
// the exponent field: ~1 ulp for exact arguments; the rounding of the argument
// itself (|z| 2^-24 relative) dominates for large |x|. The arguments stay in
// range because the math runs on x clamped to [-10, 10] for GeLU and g clamped
// to [-87, 87] for SiLU: beyond those the functions and derivatives equal their
// limits (x or 0, 1 or 0) to within 1e-35. NaN inputs propagate.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"
#include "core/tensor.h"

#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace zt::cpu {

// ---------------------------------------------------------------------------
// simd16: 16-lane f32 vector primitives shared by the CPU activation and norm
// kernels (GCC/Clang vector extensions: AVX-512 here, narrower ISAs elsewhere).
// They exist because the auto-vectoriser turns clamps into masked, branchy code
// and handles bf16 rounding in ~10 integer ops per vector; with explicit
// vectors the code is straight-line and bf16 stores are one VCVTNEPS2BF16 where
// the CPU has AVX512-BF16. (A candidate for a common backend header.)
//   load16<T>(p)            16 elements of T (f32 or bf16) widened to f32, exactly
//   store16<T>(p, v)        v rounded to T with core/dtype.h's float_to_bf16 bits
//                           (nearest even; NaN -> quiet NaN), bitwise
//   load_partial / store_partial   the same for the first n < 16 elements
//                           (loads zero-pad the missing lanes)
// (Without AVX-512, GCC warns that passing 64-byte vectors by value changes
// the ABI; these are inline helpers used within one build, so it does not
// matter.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
namespace simd16 {

using f32x16 = float __attribute__((vector_size(64)));
using i32x16 = int32_t __attribute__((vector_size(64)));
using u32x16 = uint32_t __attribute__((vector_size(64)));
using u16x16 = uint16_t __attribute__((vector_size(32)));
using u16x32 = uint16_t __attribute__((vector_size(64)));
constexpr int64_t kV = 16;

inline f32x16 splat(float s) { return f32x16{} + s; }
inline f32x16 vmax(f32x16 a, f32x16 b) { return a < b ? b : a; }  // NaN in a passes through
inline f32x16 vmin(f32x16 a, f32x16 b) { return a > b ? b : a; }  // NaN in a passes through

// bf16 -> f32 is exact: the bf16 bits become the high half of each f32 lane
// (interleaving with zeros, one shuffle).
template <typename T>
inline f32x16 load16(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    f32x16 v;
    std::memcpy(&v, p, sizeof v);
    return v;
  } else {
    static_assert(std::is_same_v<T, bf16>);
    u16x16 h;
    std::memcpy(&h, p, sizeof h);
    const u16x32 w = __builtin_shufflevector(u16x16{}, h, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                             8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    return (f32x16)w;
  }
}

// f32 -> bf16 with core/dtype.h's float_to_bf16 bits, in integer vector ops.
inline u16x16 to_bf16_bits(f32x16 v) {
  const u32x16 u = (u32x16)v;
  const u32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // nearest, ties to even
  const u32x16 qnan = (u >> 16) | 0x0040u;
  const u32x16 bits = (u & 0x7fffffffu) > 0x7f800000u ? qnan : rounded;
  return __builtin_convertvector(bits, u16x16);
}

template <typename T>
inline void store16(T* p, f32x16 v) {
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
    const u16x16 h = to_bf16_bits(v);
    std::memcpy(p, &h, sizeof h);
  }
}

// The first n (< 16) elements, zero-padded to a full vector.
template <typename T>
inline f32x16 load_partial(const T* p, int64_t n) {
  T tmp[kV] = {};
  std::memcpy(tmp, p, size_t(n) * sizeof(T));
  return load16(tmp);
}

template <typename T>
inline void store_partial(T* p, f32x16 v, int64_t n) {
  T tmp[kV];
  store16(tmp, v);
  std::memcpy(p, tmp, size_t(n) * sizeof(T));
}

// --- 32-element blocks for elementwise kernels ---------------------------------
// A block of 32 consecutive elements of T as two f32 vectors, in a lane order
// private to load32/store32: f32: v0 = elements 0..15, v1 = 16..31; bf16:
// v0 = the even elements, v1 = the odd ones, split with two integer ops (each
// u32 lane of the raw load holds an even/odd bf16 pair), because 512-bit
// lane-crossing shuffles are slow on this CPU (measured: a bf16 load via a
// shuffle costs ~3x an f32 load; the integer split costs less than one).
// Elementwise code that reads every input and writes every output of the same
// element type through these is unaffected by the order. store32 inverts
// load32: with AVX512-BF16 one VCVTNE2PS2BF16 plus one in-register word
// interleave; otherwise (and for blocks holding a subnormal, which that
// instruction flushes) integer rounding into the two halves of each lane.
constexpr int64_t kV2 = 2 * kV;

struct F32x32 {
  f32x16 v0, v1;
};

template <typename T>
inline F32x32 load32(const T* p) {
  if constexpr (std::is_same_v<T, float>) {
    return {load16(p), load16(p + kV)};
  } else {
    static_assert(std::is_same_v<T, bf16>);
    u32x16 r;
    std::memcpy(&r, p, sizeof r);
    return {(f32x16)(r << 16), (f32x16)(r & 0xffff0000u)};
  }
}

// float_to_bf16's bits in the high half of each lane (low half zero).
inline u32x16 bf16_bits_high(f32x16 v) {
  const u32x16 u = (u32x16)v;
  const u32x16 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;  // nearest, ties to even
  const u32x16 qnan = (u | 0x00400000u) & 0xffff0000u;
  return (u & 0x7fffffffu) > 0x7f800000u ? qnan : rounded;
}

template <typename T>
inline void store32(T* p, F32x32 v) {
  if constexpr (std::is_same_v<T, float>) {
    store16(p, v.v0);
    store16(p + kV, v.v1);
  } else {
    static_assert(std::is_same_v<T, bf16>);
#if defined(__AVX512BF16__)
    const __m512 e = (__m512)v.v0, o = (__m512)v.v1;
    if (__builtin_expect((_mm512_fpclass_ps_mask(e, 0x20) | _mm512_fpclass_ps_mask(o, 0x20)) == 0, 1)) {
      // words 0..15: even elements, 16..31: odd ones -> interleave.
      const u16x32 h = (u16x32)_mm512_cvtne2ps_pbh(o, e);
      const u16x32 w = __builtin_shufflevector(h, h, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24,
                                               9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
      std::memcpy(p, &w, sizeof w);
      return;
    }
#endif
    const u32x16 bits = (bf16_bits_high(v.v0) >> 16) | bf16_bits_high(v.v1);
    std::memcpy(p, &bits, sizeof bits);
  }
}

// The first n (< 32) elements, zero-padded.
template <typename T>
inline F32x32 load32_partial(const T* p, int64_t n) {
  T tmp[kV2] = {};
  std::memcpy(tmp, p, size_t(n) * sizeof(T));
  return load32(tmp);
}

template <typename T>
inline void store32_partial(T* p, F32x32 v, int64_t n) {
  T tmp[kV2];
  store32(tmp, v);
  std::memcpy(p, tmp, size_t(n) * sizeof(T));
}

// All-ones in lanes [0, n), zero elsewhere (n <= 16).
inline i32x16 lanes_below(int64_t n) {
  const i32x16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  return iota < int32_t(n);
}

// Sum of the 16 lanes in a fixed order (a pairwise tree: 4 dependent adds).
inline float hsum(f32x16 v) {
  using f32x8 = float __attribute__((vector_size(32)));
  using f32x4 = float __attribute__((vector_size(16)));
  const f32x8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const f32x4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

}  // namespace simd16
#pragma GCC diagnostic pop

// y = gelu(x), elementwise over all elements; y may alias x.
void gelu_forward(const Tensor& y, const Tensor& x);
// dx = gelu'(x) * dy; dx may alias dy.
void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);
// x (N, 2H) -> y (N, H), with H = y's last dim.
void swiglu_forward(const Tensor& y, const Tensor& x);
// dy (N, H), x (N, 2H) -> dx (N, 2H); dx does not overlap x or dy.
void swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);

}  // namespace zt::cpu
