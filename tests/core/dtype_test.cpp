// DType conversions against an independent reference: every finite value of a
// format is enumerated into a sorted table, and "round to nearest, ties to
// even" is done by searching that table - a different method from the bit
// manipulation in core/dtype.cpp.
#include <cstdint>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "test_util.h"

namespace zt {
namespace {

// All finite non-negative values of a format, sorted, with their codes.
struct FormatTable {
  std::vector<double> values;
  std::vector<uint32_t> codes;
  double max_finite = 0;
  bool ieee_overflow_to_inf = false;  // bf16/f16: overflow -> inf; fp8: saturate
  uint32_t inf_code = 0;              // positive inf code (IEEE formats)
  uint32_t sign_bit = 0;
};

template <typename Decode>
FormatTable make_table(int bits, Decode decode, bool ieee, uint32_t inf_code) {
  FormatTable t;
  t.sign_bit = 1u << (bits - 1);
  std::vector<std::pair<double, uint32_t>> v;
  for (uint32_t c = 0; c < t.sign_bit; ++c) {
    const double x = decode(c);
    if (std::isfinite(x)) v.emplace_back(x, c);
  }
  std::sort(v.begin(), v.end());
  for (auto& [x, c] : v) {
    t.values.push_back(x);
    t.codes.push_back(c);
  }
  t.max_finite = t.values.back();
  t.ieee_overflow_to_inf = ieee;
  t.inf_code = inf_code;
  return t;
}

// Reference: the code of the nearest representable value (ties to the even
// code), IEEE overflow to inf or saturation, sign applied. NaN handled by caller.
uint32_t reference_round(const FormatTable& t, double x) {
  const uint32_t sign = std::signbit(x) ? t.sign_bit : 0;
  const double a = std::fabs(x);
  if (std::isinf(a)) return sign | (t.ieee_overflow_to_inf ? t.inf_code : t.codes.back());
  if (a >= t.max_finite) {
    if (!t.ieee_overflow_to_inf) return sign | t.codes.back();
    // IEEE: overflow threshold is max + half an ulp of max (ties go to inf,
    // whose "mantissa" is even while max's is odd).
    const size_t n = t.values.size();
    const double half_ulp = (t.values[n - 1] - t.values[n - 2]) / 2;
    return sign | (a >= t.max_finite + half_ulp ? t.inf_code : t.codes.back());
  }
  auto it = std::lower_bound(t.values.begin(), t.values.end(), a);
  const size_t hi = size_t(it - t.values.begin());
  if (t.values[hi] == a) return sign | t.codes[hi];
  const size_t lo = hi - 1;
  const double dlo = a - t.values[lo], dhi = t.values[hi] - a;
  if (dlo < dhi) return sign | t.codes[lo];
  if (dhi < dlo) return sign | t.codes[hi];
  return sign | ((t.codes[lo] & 1u) == 0 ? t.codes[lo] : t.codes[hi]);
}

// Test points: every representable value, the exact midpoints between
// neighbours, points a hair on either side of each midpoint, values beyond
// the max, and random floats across the format's range.
std::vector<float> probe_points(const FormatTable& t, std::mt19937_64& rng) {
  std::vector<float> pts;
  for (size_t i = 0; i + 1 < t.values.size(); ++i) {
    const double a = t.values[i], b = t.values[i + 1], mid = (a + b) / 2;
    for (double x : {a, mid}) {
      const float f = float(x);
      pts.push_back(f);
      pts.push_back(std::nextafter(f, 0.0f));
      pts.push_back(std::nextafter(f, INFINITY));
    }
  }
  const double top = t.max_finite;
  for (double x : {top, top * 1.01, top * 1.5, top * 2, top * 1e3}) pts.push_back(float(x));
  std::uniform_real_distribution<double> exp_dist(std::log2(t.values[1]) - 2, std::log2(top) + 1);
  for (int i = 0; i < 200000; ++i) pts.push_back(float(std::exp2(exp_dist(rng))));
  const size_t n = pts.size();
  for (size_t i = 0; i < n; ++i) pts.push_back(-pts[i]);
  return pts;
}

const FormatTable& bf16_table() {
  static const FormatTable t = make_table(16, [](uint32_t c) { return double(bf16_to_float(bf16{uint16_t(c)})); },
                                          true, 0x7f80u);
  return t;
}
const FormatTable& f16_table() {
  static const FormatTable t =
      make_table(16, [](uint32_t c) { return double(f16_to_float(f16{uint16_t(c)})); }, true, 0x7c00u);
  return t;
}
const FormatTable& e4m3_table() {
  static const FormatTable t =
      make_table(8, [](uint32_t c) { return double(f8e4m3_to_float(f8e4m3{uint8_t(c)})); }, false, 0);
  return t;
}
const FormatTable& e5m2_table() {
  static const FormatTable t =
      make_table(8, [](uint32_t c) { return double(f8e5m2_to_float(f8e5m2{uint8_t(c)})); }, false, 0);
  return t;
}

TEST(DType, TableIsConsistent) {
  EXPECT_EQ(kNumDTypes, 9);
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::f8e4m3), 1u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_name(DType::f8e5m2), "f8e5m2");
  EXPECT_TRUE(dtype_is_float(DType::f16));
  EXPECT_FALSE(dtype_is_float(DType::u16));
  EXPECT_EQ(dtype_of<bf16>(), DType::bf16);
  EXPECT_EQ(dtype_of<uint32_t>(), DType::u32);
  for (int i = 0; i < kNumDTypes; ++i) EXPECT_EQ(parse_dtype(dtype_name(DType(i))), DType(i));
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  try {
    parse_dtype("f64");
    FAIL() << "parse_dtype accepted f64";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown dtype 'f64'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos);
  }
}

// Decoding: the formats' defining values, checked against the specs.
TEST(DType, DecodeKnownValues) {
  EXPECT_EQ(bf16_to_float(bf16{0x3f80}), 1.0f);
  EXPECT_EQ(bf16_to_float(bf16{0xc000}), -2.0f);
  EXPECT_EQ(f16_to_float(f16{0x3c00}), 1.0f);
  EXPECT_EQ(f16_to_float(f16{0x7bff}), 65504.0f);
  EXPECT_EQ(f16_to_float(f16{0x0001}), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_float(f16{0x0400}), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::isinf(f16_to_float(f16{0x7c00})));
  EXPECT_TRUE(std::isnan(f16_to_float(f16{0x7e00})));
  // OCP E4M3: bias 7, no inf, S.1111.111 NaN, max S.1111.110 = 448.
  EXPECT_EQ(f8e4m3_to_float(f8e4m3{0x7e}), 448.0f);
  EXPECT_EQ(f8e4m3_to_float(f8e4m3{0x78}), 256.0f);  // 1111.000 = 2^8 is a normal number, not inf
  EXPECT_TRUE(std::isnan(f8e4m3_to_float(f8e4m3{0x7f})));
  EXPECT_TRUE(std::isnan(f8e4m3_to_float(f8e4m3{0xff})));
  EXPECT_EQ(f8e4m3_to_float(f8e4m3{0x08}), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(f8e4m3_to_float(f8e4m3{0x01}), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(f8e4m3_to_float(f8e4m3{0x38}), 1.0f);
  // OCP E5M2: bias 15, IEEE-like.
  EXPECT_EQ(f8e5m2_to_float(f8e5m2{0x7b}), 57344.0f);
  EXPECT_TRUE(std::isinf(f8e5m2_to_float(f8e5m2{0x7c})));
  EXPECT_TRUE(std::isnan(f8e5m2_to_float(f8e5m2{0x7d})));
  EXPECT_EQ(f8e5m2_to_float(f8e5m2{0x3c}), 1.0f);
  EXPECT_EQ(f8e5m2_to_float(f8e5m2{0x01}), std::ldexp(1.0f, -16));
  EXPECT_EQ(f8e5m2_to_float(f8e5m2{0x80}), 0.0f);
  EXPECT_TRUE(std::signbit(f8e5m2_to_float(f8e5m2{0x80})));
}

// Exhaustive: every code that is not NaN survives decode -> encode unchanged.
TEST(DType, ExhaustiveRoundTrip16) {
  for (uint32_t c = 0; c < 65536; ++c) {
    const float b = bf16_to_float(bf16{uint16_t(c)});
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(b)))) << std::hex << c;
    } else {
      ASSERT_EQ(float_to_bf16(b).bits, c) << "bf16 code 0x" << std::hex << c;
    }
    const float h = f16_to_float(f16{uint16_t(c)});
    if (std::isnan(h)) {
      EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(h)))) << std::hex << c;
    } else {
      ASSERT_EQ(float_to_f16(h).bits, c) << "f16 code 0x" << std::hex << c;
    }
  }
}

TEST(DType, ExhaustiveRoundTripFp8) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float a = f8e4m3_to_float(f8e4m3{uint8_t(c)});
    if (std::isnan(a)) {
      EXPECT_TRUE(std::isnan(f8e4m3_to_float(float_to_f8e4m3(a))));
    } else {
      EXPECT_EQ(float_to_f8e4m3(a).bits, c) << "e4m3 code 0x" << std::hex << c;
    }
    const float b = f8e5m2_to_float(f8e5m2{uint8_t(c)});
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(f8e5m2_to_float(float_to_f8e5m2(b))));
    } else if (std::isinf(b)) {
      // Saturating conversion: inf encodes as the max finite value.
      EXPECT_EQ(float_to_f8e5m2(b).bits, (c & 0x80u) | 0x7bu);
    } else {
      EXPECT_EQ(float_to_f8e5m2(b).bits, c) << "e5m2 code 0x" << std::hex << c;
    }
  }
}

template <typename Encode>
void check_rounding(const FormatTable& t, Encode encode, const char* name) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(std::hash<std::string>{}(name));
  int64_t mismatches = 0;
  for (float f : probe_points(t, rng)) {
    const uint32_t got = encode(f), want = reference_round(t, double(f));
    if (got != want && ++mismatches <= 5)
      ADD_FAILURE() << name << "(" << f << ") = 0x" << std::hex << got << ", reference 0x" << want;
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(DType, RoundToNearestEvenBf16) {
  check_rounding(bf16_table(), [](float f) { return uint32_t(float_to_bf16(f).bits); }, "bf16");
}
TEST(DType, RoundToNearestEvenF16) {
  check_rounding(f16_table(), [](float f) { return uint32_t(float_to_f16(f).bits); }, "f16");
}
TEST(DType, RoundToNearestEvenSaturatingE4M3) {
  check_rounding(e4m3_table(), [](float f) { return uint32_t(float_to_f8e4m3(f).bits); }, "e4m3");
}
TEST(DType, RoundToNearestEvenSaturatingE5M2) {
  check_rounding(e5m2_table(), [](float f) { return uint32_t(float_to_f8e5m2(f).bits); }, "e5m2");
}

// fp8 from every bf16 value (all 65536 patterns: every binade, subnormals,
// the saturating range, inf and NaN) and from a million random f32 bit
// patterns, against the reference rounding on the format's value table.
TEST(DType, Fp8FromEveryBf16AndRandomF32Bits) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(29);
  std::vector<float> inputs;
  for (uint32_t c = 0; c < 65536; ++c) inputs.push_back(bf16_to_float(bf16{uint16_t(c)}));
  for (int i = 0; i < 1000000; ++i) inputs.push_back(std::bit_cast<float>(uint32_t(rng())));
  int64_t mismatches = 0;
  for (float f : inputs) {
    if (std::isnan(f)) {
      const uint32_t sign = std::signbit(f) ? 0x80u : 0u;
      EXPECT_EQ(uint32_t(float_to_f8e4m3(f).bits), sign | 0x7fu);
      EXPECT_EQ(uint32_t(float_to_f8e5m2(f).bits), sign | 0x7eu);
      continue;
    }
    const uint32_t e4 = float_to_f8e4m3(f).bits, e5 = float_to_f8e5m2(f).bits;
    const uint32_t want4 = reference_round(e4m3_table(), double(f)), want5 = reference_round(e5m2_table(), double(f));
    if ((e4 != want4 || e5 != want5) && ++mismatches <= 5)
      ADD_FAILURE() << f << " (0x" << std::hex << std::bit_cast<uint32_t>(f) << "): e4m3 0x" << e4 << " (reference 0x"
                    << want4 << "), e5m2 0x" << e5 << " (reference 0x" << want5 << ")";
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(DType, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // bf16/f16 keep inf and NaN.
  EXPECT_EQ(float_to_bf16(inf).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(-inf).bits, 0xff80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(nan))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7f800001u)))));  // signalling NaN stays NaN
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7c00);  // exactly half an ulp above max -> inf
  EXPECT_EQ(float_to_f16(65519.99f).bits, 0x7bff);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(nan))));
  EXPECT_EQ(float_to_f16(-0.0f).bits, 0x8000);
  // fp8: saturate +-inf and overflow; NaN -> NaN with sign.
  EXPECT_EQ(float_to_f8e4m3(inf).bits, 0x7e);
  EXPECT_EQ(float_to_f8e4m3(-inf).bits, 0xfe);
  EXPECT_EQ(float_to_f8e4m3(1e6f).bits, 0x7e);
  EXPECT_EQ(float_to_f8e4m3(nan).bits, 0x7f);
  EXPECT_EQ(float_to_f8e4m3(-nan).bits, 0xff);
  EXPECT_EQ(float_to_f8e5m2(inf).bits, 0x7b);
  EXPECT_EQ(float_to_f8e5m2(-1e9f).bits, 0xfb);
  EXPECT_TRUE(std::isnan(f8e5m2_to_float(float_to_f8e5m2(nan))));
  // Below half the smallest subnormal rounds to (signed) zero.
  EXPECT_EQ(float_to_f8e4m3(std::ldexp(1.0f, -11)).bits, 0x00);
  EXPECT_EQ(float_to_f8e4m3(-std::ldexp(1.0f, -11)).bits, 0x80);
  EXPECT_EQ(float_to_f8e4m3(std::ldexp(1.0f, -10)).bits, 0x00);        // exact tie -> even (0)
  EXPECT_EQ(float_to_f8e4m3(std::ldexp(1.5f, -10)).bits, 0x01);        // above the tie
  EXPECT_EQ(float_to_f8e4m3(std::ldexp(3.0f, -10)).bits, 0x02);        // tie 1.5 ulp -> even (2)
}

}  // namespace
}  // namespace zt
