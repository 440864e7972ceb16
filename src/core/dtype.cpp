#include "core/dtype.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace zt {

DType parse_dtype(std::string_view s) {
#define ZT_X(id, type, bytes, name, fl) \
  if (s == name) return DType::id;
  ZT_DTYPES(ZT_X)
#undef ZT_X
  if (s == "float32" || s == "fp32" || s == "float") return DType::f32;
  if (s == "bfloat16") return DType::bf16;
  if (s == "float16" || s == "fp16" || s == "half") return DType::f16;
  std::string valid;
#define ZT_X(id, type, bytes, name, fl) valid += std::string(valid.empty() ? "" : ", ") + name;
  ZT_DTYPES(ZT_X)
#undef ZT_X
  ZT_FAIL("unknown dtype '", s, "'; valid dtypes are: ", valid);
}

// --- f16 -------------------------------------------------------------------

float f16_to_float(f16 h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t man = h.bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
    const float v = float(man) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

f16 float_to_f16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return f16{uint16_t(sign | 0x7e00u | ((x >> 13) & 0x1ffu))};  // NaN stays NaN
  if (x >= 0x477ff000u) return f16{uint16_t(sign | 0x7c00u)};  // >= 65520 rounds to inf (or is inf)
  if (x < 0x38800000u) {
    // Result is subnormal or zero: let the FPU round by adding 0.5f, whose
    // ulp equals the f16 subnormal spacing 2^-24 (RNE in the default mode).
    const float magic = 0.5f;
    const uint32_t r = std::bit_cast<uint32_t>(std::bit_cast<float>(x) + magic) - std::bit_cast<uint32_t>(magic);
    return f16{uint16_t(sign | r)};
  }
  const uint32_t mant_odd = (x >> 13) & 1u;
  x += (uint32_t(15 - 127) << 23) + 0xfffu + mant_odd;  // rebias + round to nearest even
  return f16{uint16_t(sign | (x >> 13))};
}

// --- fp8 ---------------------------------------------------------------------

namespace {

struct Fp8Format {
  int exp_bits;
  int man_bits;
  bool finite_only;  // E4M3: no inf, only S.1111.111 is NaN
  double max_finite;
  uint8_t nan_bits;  // encoding used for NaN (sign added separately)
  uint8_t max_code;  // max_finite's encoding
};
constexpr Fp8Format kE4M3{4, 3, true, 448.0, 0x7f, 0x7e};
constexpr Fp8Format kE5M2{5, 2, false, 57344.0, 0x7e, 0x7b};

// Round to nearest, ties to even, on the f32 bits (exact: every step is an
// integer operation or a scaling by a power of two), saturating at the max
// finite code; NaN keeps its sign. Quantising activations runs this per
// element, so it avoids the double arithmetic of the decoder's definition
// (8x faster; tests/core/dtype_test.cpp holds it to a reference rounding).
uint8_t encode_fp8(float f, const Fp8Format& fmt) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint8_t sign = uint8_t((bits >> 24) & 0x80u);
  const uint32_t u = bits & 0x7fffffffu;
  if (u > 0x7f800000u) return uint8_t(sign | fmt.nan_bits);
  // max and above (inf too) saturate; anything below rounds to max at most.
  if (u >= std::bit_cast<uint32_t>(float(fmt.max_finite))) return uint8_t(sign | fmt.max_code);
  const int bias = (1 << (fmt.exp_bits - 1)) - 1;
  const int e = int(u >> 23) - 127;  // f's binade (f32 subnormals: -127, far below any fp8 value)
  if (e < 1 - bias) {
    // An fp8 subnormal (or zero, or the smallest normal by rounding up):
    // the count of 2^(1 - bias - man) steps, rounded to even by nearbyint.
    const float steps = std::ldexp(std::bit_cast<float>(u), bias + fmt.man_bits - 1);
    return uint8_t(sign | uint32_t(std::nearbyint(steps)));
  }
  const int drop = 23 - fmt.man_bits;  // f32 mantissa bits below the format's
  uint32_t code = (uint32_t(e + bias) << fmt.man_bits) | ((u & 0x7fffffu) >> drop);
  const uint32_t rest = u & ((1u << drop) - 1), half = 1u << (drop - 1);
  if (rest > half || (rest == half && (code & 1u))) ++code;  // a carry moves into the exponent, as it should
  return uint8_t(sign | code);
}

float decode_fp8(uint8_t bits, const Fp8Format& fmt) {
  const bool neg = bits & 0x80;
  const uint32_t exp_all = (1u << fmt.exp_bits) - 1, man_all = (1u << fmt.man_bits) - 1;
  const uint32_t exp = (bits >> fmt.man_bits) & exp_all;
  const uint32_t man = bits & man_all;
  const int bias = (1 << (fmt.exp_bits - 1)) - 1;
  double v;
  if (fmt.finite_only && exp == exp_all && man == man_all) {
    v = std::nan("");
  } else if (!fmt.finite_only && exp == exp_all) {
    v = man ? std::nan("") : INFINITY;
  } else if (exp == 0) {
    v = std::ldexp(double(man), 1 - bias - fmt.man_bits);
  } else {
    v = std::ldexp(double(man | (1u << fmt.man_bits)), int(exp) - bias - fmt.man_bits);
  }
  return float(neg ? -v : v);
}

std::array<float, 256> make_fp8_table(const Fp8Format& fmt) {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) t[i] = decode_fp8(uint8_t(i), fmt);
  return t;
}

}  // namespace

// Function-local tables: safe to use from other translation units' static init.
float f8e4m3_to_float(f8e4m3 h) {
  static const std::array<float, 256> table = make_fp8_table(kE4M3);
  return table[h.bits];
}
f8e4m3 float_to_f8e4m3(float f) { return f8e4m3{encode_fp8(f, kE4M3)}; }
float f8e5m2_to_float(f8e5m2 h) {
  static const std::array<float, 256> table = make_fp8_table(kE5M2);
  return table[h.bits];
}
f8e5m2 float_to_f8e5m2(float f) { return f8e5m2{encode_fp8(f, kE5M2)}; }

}  // namespace zt
