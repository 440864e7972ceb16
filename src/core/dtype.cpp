#include "core/dtype.h"

#include <array>
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

// --- fp8 (generic exact rounding through double) -----------------------------

namespace {

struct Fp8Format {
  int exp_bits;
  int man_bits;
  bool finite_only;  // E4M3: no inf, only S.1111.111 is NaN
  double max_finite;
  uint8_t nan_bits;  // encoding used for NaN (sign added separately)
};
constexpr Fp8Format kE4M3{4, 3, true, 448.0, 0x7f};
constexpr Fp8Format kE5M2{5, 2, false, 57344.0, 0x7e};

uint8_t encode_fp8(float f, const Fp8Format& fmt) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  if (std::isnan(f)) return uint8_t(sign | fmt.nan_bits);
  double a = std::fabs(double(f));
  if (a == 0.0) return sign;
  const int bias = (1 << (fmt.exp_bits - 1)) - 1;
  const int emin = 1 - bias;
  double v;
  if (std::isinf(a)) {
    v = fmt.max_finite;  // saturate
  } else {
    int e;
    std::frexp(a, &e);  // a = fr * 2^e, fr in [0.5, 1): floor(log2 a) = e - 1
    const int E = std::max(e - 1, emin);
    const double ulp = std::ldexp(1.0, E - fmt.man_bits);
    v = std::nearbyint(a / ulp) * ulp;  // exact division (power of two); RNE
    if (v > fmt.max_finite) v = fmt.max_finite;
    if (v == 0.0) return sign;
  }
  uint32_t exp_field, man_field;
  if (v < std::ldexp(1.0, emin)) {
    exp_field = 0;
    man_field = uint32_t(v / std::ldexp(1.0, emin - fmt.man_bits));
  } else {
    int e2;
    std::frexp(v, &e2);
    const int E2 = e2 - 1;
    exp_field = uint32_t(E2 + bias);
    man_field = uint32_t(v / std::ldexp(1.0, E2 - fmt.man_bits)) - (1u << fmt.man_bits);
  }
  return uint8_t(sign | (exp_field << fmt.man_bits) | man_field);
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
