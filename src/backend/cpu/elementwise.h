// CPU elementwise kernels (casts, add/scale/axpy, fill, sum of squares,
// random fills) and the vectorisable scalar primitives the other CPU kernels
// of this family share (bf16/f16/fp8 load/store, sqrt). Explicit-vector
// primitives (exp among them) are in simd.h.
//
// Load/store primitives: `load_f32(x)` widens any floating storage type to
// float; `store_as<T>(f)` narrows a float with the rounding of core/dtype.h
// (round to nearest even; bf16/f16 overflow -> inf, NaN -> quiet NaN with the
// sign and top payload bits kept; fp8 saturating). They are branch-free bit
// manipulation, bitwise identical to core/dtype.h's scalar conversions
// (tests/ops/elementwise_test.cpp checks every 8/16-bit encoding and random
// f32 bit patterns), written so that loops calling them vectorise.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "core/tensor.h"

namespace zt::cpu {

// ---------------------------------------------------------------------------
// Scalar primitives (inline, branch-free for f32/bf16/f16).

inline float load_f32(float x) { return x; }
inline float load_f32(bf16 x) { return std::bit_cast<float>(uint32_t(x.bits) << 16); }
inline float load_f32(f16 x) {
  const uint32_t h = x.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t em = (h & 0x7fffu) << 13;  // exponent and mantissa moved to their f32 positions
  const uint32_t e = em & 0x0f800000u;
  const uint32_t normal = em + (112u << 23);  // rebias 15 -> 127
  const uint32_t infnan = em + (224u << 23);  // exponent 31 -> 255, payload kept
  // Zero/subnormal: 2^-14 * (1 + man/1024) - 2^-14 = man * 2^-24, exact.
  const float sub = std::bit_cast<float>(em + (113u << 23)) - 0x1p-14f;
  uint32_t r = e == 0x0f800000u ? infnan : normal;
  r = e == 0 ? std::bit_cast<uint32_t>(sub) : r;
  return std::bit_cast<float>(r | sign);
}

namespace detail {

// fp8 with E exponent and M mantissa bits (bias 2^(E-1) - 1) -> float.
// NaN encodings give the quiet NaN 0x7fc00000 with the sign, as core does.
template <int E, int M, bool kHasInf>
inline float fp8_to_f32(uint8_t b) {
  constexpr uint32_t bias = (1u << (E - 1)) - 1;
  const uint32_t sign = uint32_t(b & 0x80u) << 24;
  const uint32_t em = uint32_t(b & 0x7fu) << (23 - M);
  const uint32_t e = uint32_t(b & 0x7fu) >> M;
  const uint32_t normal = em + ((127u - bias) << 23);
  // Zero/subnormal: 2^(1-bias) * (1 + man/2^M) - 2^(1-bias), exact.
  constexpr float min_normal = std::bit_cast<float>((127u - bias + 1) << 23);
  const float sub = std::bit_cast<float>(em + ((127u - bias + 1) << 23)) - min_normal;
  uint32_t r = e == 0 ? std::bit_cast<uint32_t>(sub) : normal;
  if constexpr (kHasInf)
    r = e == (1u << E) - 1 ? ((b & ((1u << M) - 1)) ? 0x7fc00000u : 0x7f800000u) : r;
  else
    r = (b & 0x7fu) == 0x7fu ? 0x7fc00000u : r;
  return std::bit_cast<float>(r | sign);
}

// float -> fp8, round to nearest even, saturating: |x| > max (and +-inf) ->
// +-max; NaN -> kNanEnc with the sign. kMaxF32Bits: the f32 bits of max.
template <int E, int M, uint32_t kMaxF32Bits, uint8_t kMaxEnc, uint8_t kNanEnc>
inline uint8_t f32_to_fp8(float f) {
  constexpr uint32_t bias = (1u << (E - 1)) - 1;
  constexpr uint32_t shift = 23 - M;
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t normal = ((a + ((1u << (shift - 1)) - 1) + ((a >> shift) & 1u)) >> shift) - ((127u - bias) << M);
  // Below the smallest normal 2^(1-bias): adding 2^(1-bias+shift), whose ulp
  // is the subnormal spacing, makes the FPU round to nearest even.
  constexpr float magic = std::bit_cast<float>((127u + 1 - bias + shift) << 23);
  const uint32_t sub = std::bit_cast<uint32_t>(std::bit_cast<float>(a) + magic) - std::bit_cast<uint32_t>(magic);
  uint32_t r = a < ((127u + 1 - bias) << 23) ? sub : normal;
  r = a > kMaxF32Bits ? uint32_t(kMaxEnc) : r;
  r = a > 0x7f800000u ? uint32_t(kNanEnc) : r;
  return uint8_t(r | sign);
}

}  // namespace detail

inline float load_f32(f8e4m3 x) { return detail::fp8_to_f32<4, 3, false>(x.bits); }
inline float load_f32(f8e5m2 x) { return detail::fp8_to_f32<5, 2, true>(x.bits); }

inline uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline uint16_t f32_to_f16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t x = u & 0x7fffffffu;
  const uint32_t nan = sign | 0x7e00u | ((x >> 13) & 0x1ffu);
  const uint32_t inf = sign | 0x7c00u;
  // Subnormal/zero result: adding 0.5f (ulp 2^-24 = f16 subnormal spacing)
  // makes the FPU round to nearest even.
  const uint32_t sub = sign | (std::bit_cast<uint32_t>(std::bit_cast<float>(x) + 0.5f) - 0x3f000000u);
  const uint32_t normal = sign | ((x + 0xc8000fffu + ((x >> 13) & 1u)) >> 13);  // rebias by -112, RNE
  const uint32_t r = x > 0x7f800000u ? nan : (x >= 0x477ff000u ? inf : (x < 0x38800000u ? sub : normal));
  return uint16_t(r);
}

template <typename T>
T store_as(float f);
template <>
inline float store_as<float>(float f) { return f; }
template <>
inline bf16 store_as<bf16>(float f) { return bf16{f32_to_bf16_bits(f)}; }
template <>
inline f16 store_as<f16>(float f) { return f16{f32_to_f16_bits(f)}; }
// E4M3: max 448 (f32 0x43e00000, encoding 0x7e), NaN 0x7f.
template <>
inline f8e4m3 store_as<f8e4m3>(float f) { return f8e4m3{detail::f32_to_fp8<4, 3, 0x43e00000u, 0x7e, 0x7f>(f)}; }
// E5M2: max 57344 (f32 0x47600000, encoding 0x7b), NaN 0x7e.
template <>
inline f8e5m2 store_as<f8e5m2>(float f) { return f8e5m2{detail::f32_to_fp8<5, 2, 0x47600000u, 0x7b, 0x7e>(f)}; }

// x[i] = sqrt(x[i]) (IEEE, correctly rounded: bitwise the same as std::sqrt).
// GCC cannot vectorise std::sqrt without -fno-math-errno (it keeps a branch
// that sets errno for negative inputs), so kernels that need square roots in
// a hot loop stage them in a small block and call this, which uses the
// AVX-512/AVX sqrt instructions when the build targets them.
void sqrt_inplace(float* x, int64_t n);

// ---------------------------------------------------------------------------
// Kernels on validated CPU tensors (see ops/elementwise.h for the contracts).

// out = in converted (equal numel; any dtype pair).
void cast(const Tensor& out, const Tensor& in);
// out = a + b (one floating dtype).
void add(const Tensor& out, const Tensor& a, const Tensor& b);
// out = alpha * x (one floating dtype).
void scale(const Tensor& out, const Tensor& x, float alpha);
// y += alpha * x (floating dtypes, may differ).
void axpy(const Tensor& y, float alpha, const Tensor& x);
// out[:] = value, converted to out's dtype like cast does (integers: value
// must be integral and in range, checked by the caller).
void fill(const Tensor& out, double value);
// sum of x^2 in f64 with a fixed chunking: independent of the thread count.
double sum_squares(const Tensor& x);
// Element i = mean + std * philox_normal_at(seed, offset, i) (resp. lo + (hi -
// lo) * uniform), generated in f32 and cast to out's dtype.
void fill_normal(const Tensor& out, uint64_t seed, uint64_t offset, float mean, float std);
void fill_uniform(const Tensor& out, uint64_t seed, uint64_t offset, float lo, float hi);

}  // namespace zt::cpu
