// Elementwise ops: cast (every dtype pair, bitwise against an independent
// reference), add/scale/axpy, fill, sum_squares/global_norm, random fills.
//
// Cast reference (written here, independently of the kernels):
//   float -> float   core/dtype.h scalar conversions (to_float / from_float),
//                    which core's own tests check exhaustively.
//   int -> f32       the exact integer (long double) rounded by the FPU.
//   int -> bf16/f16/fp8: nearest finite encoding found by binary search over
//                    the sorted table of every encoding's value, ties to the
//                    even encoding; bf16/f16 overflow to inf from max + ulp/2,
//                    fp8 saturates at its max.
//   float -> int     NaN -> 0, else trunc(value) clamped to the range.
//   int -> int       clamped to the range.
#include "ops/elementwise.h"
#include "ops/device.h"

#include "backend/cpu/elementwise.h"  // sqrt_inplace: a shared CPU primitive

#include <cstdint>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using test::make_rng;
using test::poison;
using test::random_tensor;
using test::to_f64;

constexpr DType kAllDTypes[] = {
#define ZT_X(id, type, bytes, name, fl) DType::id,
    ZT_DTYPES(ZT_X)
#undef ZT_X
};

using test::error_of;

// A fake CUDA tensor (never dereferenced).
using test::fake_cuda;

// --- cast reference ------------------------------------------------------------

// The exact value of element i of a tensor of any dtype (integers exact in
// long double's 64-bit significand).
long double exact_value(DType dt, const void* base, int64_t i) {
  const char* p = static_cast<const char*>(base) + size_t(i) * dtype_size(dt);
  switch (dt) {
    case DType::f32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::bf16: { bf16 v; std::memcpy(&v, p, 2); return bf16_to_float(v); }
    case DType::f16: { f16 v; std::memcpy(&v, p, 2); return f16_to_float(v); }
    case DType::f8e4m3: { f8e4m3 v; std::memcpy(&v, p, 1); return f8e4m3_to_float(v); }
    case DType::f8e5m2: { f8e5m2 v; std::memcpy(&v, p, 1); return f8e5m2_to_float(v); }
    case DType::i32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::i64: { int64_t v; std::memcpy(&v, p, 8); return v; }
    case DType::u16: { uint16_t v; std::memcpy(&v, p, 2); return v; }
    case DType::u32: { uint32_t v; std::memcpy(&v, p, 4); return v; }
  }
  return NAN;
}

float decode_lowp(DType dt, uint32_t bits) {
  switch (dt) {
    case DType::bf16: return bf16_to_float(bf16{uint16_t(bits)});
    case DType::f16: return f16_to_float(f16{uint16_t(bits)});
    case DType::f8e4m3: return f8e4m3_to_float(f8e4m3{uint8_t(bits)});
    case DType::f8e5m2: return f8e5m2_to_float(f8e5m2{uint8_t(bits)});
    default: return NAN;
  }
}

// Correctly rounded (RNE) encoding of an exact value in a low-precision format.
uint32_t round_exact_lowp(DType dt, long double x) {
  struct Table {
    std::vector<std::pair<long double, uint32_t>> pos;  // finite non-negative encodings by value
    uint32_t sign_bit = 0;
    bool has_inf = false;
    uint32_t inf_bits = 0;
  };
  static std::array<Table, kNumDTypes> tables;
  Table& tb = tables[size_t(dt)];
  if (tb.pos.empty()) {
    const uint32_t count = dtype_size(dt) == 2 ? 65536u : 256u;
    tb.sign_bit = count / 2;
    for (uint32_t b = 0; b < count / 2; ++b) {
      const float v = decode_lowp(dt, b);
      if (std::isfinite(v)) tb.pos.push_back({v, b});
      if (std::isinf(v)) tb.has_inf = true, tb.inf_bits = b;
    }
    std::sort(tb.pos.begin(), tb.pos.end());
  }
  const uint32_t sign = x < 0 ? tb.sign_bit : 0;
  const long double a = std::fabs(x);
  const auto& pos = tb.pos;
  const long double max = pos.back().first, below_max = pos[pos.size() - 2].first;
  // bf16/f16 overflow to inf (IEEE RNE); the fp8 formats saturate (OCP saturation mode).
  if (tb.has_inf && dtype_size(dt) == 2 && a >= max + (max - below_max) / 2) return sign | tb.inf_bits;
  auto it = std::lower_bound(pos.begin(), pos.end(), std::make_pair(a, 0u));
  uint32_t bits;
  if (it == pos.end()) {
    bits = pos.back().second;  // saturate (fp8)
  } else if (it->first == a || it == pos.begin()) {
    bits = it->second;
  } else {
    const auto lo = *(it - 1), hi = *it;
    const long double dlo = a - lo.first, dhi = hi.first - a;
    bits = dlo < dhi ? lo.second : dhi < dlo ? hi.second : ((lo.second & 1) == 0 ? lo.second : hi.second);
  }
  if (bits == 0) return 0;  // zero keeps sign only for float sources (handled by core there)
  return sign | bits;
}

template <typename I>
I clamp_to_int(long double v) {
  using L = std::numeric_limits<I>;
  if (std::isnan(v)) return 0;
  if (v <= (long double)L::min()) return L::min();
  if (v >= (long double)L::max()) return L::max();
  return I(std::trunc(v));
}

// The expected bytes of one converted element.
void expected_element(DType src, const void* src_base, int64_t i, DType dst, void* out) {
  const char* sp = static_cast<const char*>(src_base) + size_t(i) * dtype_size(src);
  const long double v = exact_value(src, src_base, i);
  const bool src_float = dtype_is_float(src);
  float fsrc = 0;  // a float source as f32, NaN payload included (core's to_float)
  switch (src) {
    case DType::f32: std::memcpy(&fsrc, sp, 4); break;
    case DType::bf16: fsrc = to_float(*reinterpret_cast<const bf16*>(sp)); break;
    case DType::f16: fsrc = to_float(*reinterpret_cast<const f16*>(sp)); break;
    case DType::f8e4m3: fsrc = to_float(*reinterpret_cast<const f8e4m3*>(sp)); break;
    case DType::f8e5m2: fsrc = to_float(*reinterpret_cast<const f8e5m2*>(sp)); break;
    default: break;
  }
  auto put = [&](auto x) { std::memcpy(out, &x, sizeof(x)); };
  if (src == dst) {  // a cast to the same dtype is a bit copy (signalling NaNs stay as they are)
    std::memcpy(out, sp, dtype_size(src));
    return;
  }
  switch (dst) {
    case DType::f32:
      if (src_float)
        put(fsrc);  // core's to_float: exact, NaN payload kept
      else
        put(float(v));  // one RNE rounding of the exact integer
      return;
    case DType::bf16:
    case DType::f16:
    case DType::f8e4m3:
    case DType::f8e5m2: {
      if (src_float) {
        if (dst == DType::bf16) put(from_float<bf16>(fsrc));
        if (dst == DType::f16) put(from_float<f16>(fsrc));
        if (dst == DType::f8e4m3) put(from_float<f8e4m3>(fsrc));
        if (dst == DType::f8e5m2) put(from_float<f8e5m2>(fsrc));
      } else {
        const uint32_t bits = round_exact_lowp(dst, v);
        if (dtype_size(dst) == 2) put(uint16_t(bits));
        else put(uint8_t(bits));
      }
      return;
    }
    case DType::i32: put(clamp_to_int<int32_t>(v)); return;
    case DType::i64: put(clamp_to_int<int64_t>(v)); return;
    case DType::u16: put(clamp_to_int<uint16_t>(v)); return;
    case DType::u32: put(clamp_to_int<uint32_t>(v)); return;
  }
}

// Source values of one dtype, as raw bytes: special values plus random or
// exhaustive bit patterns.
std::vector<uint8_t> cast_sources(DType dt, std::mt19937_64& rng) {
  std::vector<uint8_t> bytes;
  auto push = [&](auto x) {
    const auto* p = reinterpret_cast<const uint8_t*>(&x);
    bytes.insert(bytes.end(), p, p + sizeof(x));
  };
  const size_t sz = dtype_size(dt);
  if (sz <= 2 && dt != DType::u16) {  // bf16, f16, fp8: every encoding
    for (uint32_t b = 0; b < (1u << (8 * sz)); ++b) {
      if (sz == 2) push(uint16_t(b));
      else push(uint8_t(b));
    }
    return bytes;
  }
  if (dt == DType::u16) {
    for (uint32_t b = 0; b < 65536; ++b) push(uint16_t(b));
    return bytes;
  }
  if (dt == DType::f32) {
    const float specials[] = {
        0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 2.5f, -2.5f, 3.5f, 0.49999997f, -0.99999994f,
        1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 1.0f + 0x1p-8f + 0x1p-20f,  // bf16 ties
        1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-11f + 0x1p-23f,                // f16 ties
        0x1p-126f, 0x1p-149f, -0x1p-149f, 1e-40f, -3e-39f, 0x1.fffffcp-127f,            // f32 subnormals
        0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f, 3e-8f, 6e-5f, -6.1e-5f,              // f16 subnormal range
        65504.0f, 65519.99f, 65520.0f, 70000.0f, -1e5f,                                 // f16 overflow
        3.3895314e38f, 3.4028235e38f, -3.4028235e38f, 0x1.fefffep127f, 0x1.ff0000p127f,  // bf16 overflow
        448.0f, 464.0f, 480.0f, 500.0f, -1000.0f, 0x1p-9f, 0x1p-10f, 0x1.8p-10f,        // e4m3
        57344.0f, 61440.0f, 65536.0f, 0x1p-16f, 0x1p-17f,                               // e5m2
        2147483520.0f, 2147483648.0f, -2147483648.0f, -2147483904.0f, 4294967040.0f, 4294967296.0f,
        65535.5f, 65536.0f, -0.5f, -1.5f, 9.2233715e18f, 9.223372e18f, -9.223372e18f, 1e20f, -1e20f,
        INFINITY, -INFINITY, NAN, -NAN, std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffc12345u),
        std::bit_cast<float>(0x7fbfffffu)};
    for (float f : specials) push(f);
    for (int k = 0; k < 200000; ++k) push(uint32_t(rng()));  // random bit patterns
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int k = 0; k < 20000; ++k) push(nd(rng) * std::ldexp(1.0f, int(rng() % 60) - 30));
    return bytes;
  }
  // i32, i64, u32: boundary values, double-rounding traps, random magnitudes.
  const int64_t specials[] = {0,          1,          -1,         2,          7,          -7,
                              255,        256,        447,        448,        449,        464,
                              465,        480,        57343,      57344,      61439,      61440,
                              65503,      65504,      65519,      65520,      65535,      65536,
                              (1 << 24) + 1,          (1 << 24) + 3,          (1 << 24) + (1 << 16) + 1,
                              (1 << 24) + (1 << 16),  -(1 << 24) - (1 << 16) - 1,         (1 << 25) + (1 << 17) + 1,
                              2147483647, -2147483647 - 1,                    4294967295LL,
                              4294967296LL,           (int64_t(1) << 53) + 1, (int64_t(1) << 62) + (int64_t(1) << 38) + 1,
                              std::numeric_limits<int64_t>::max(),            std::numeric_limits<int64_t>::min(),
                              -(int64_t(1) << 40) - 12345};
  for (int64_t s : specials) {
    if (dt == DType::i32) push(clamp_to_int<int32_t>((long double)s));
    if (dt == DType::i64) push(s);
    if (dt == DType::u32) push(clamp_to_int<uint32_t>((long double)s));
  }
  for (int k = 0; k < 50000; ++k) {
    const uint64_t r = rng() >> (rng() % 64);  // random magnitudes
    const bool neg = rng() & 1;
    if (dt == DType::i32) push(int32_t(neg ? -int64_t(uint32_t(r)) : int64_t(uint32_t(r) >> 1)));
    if (dt == DType::i64) push(int64_t(neg ? -int64_t(r >> 1) : int64_t(r >> 1)));
    if (dt == DType::u32) push(uint32_t(r));
  }
  return bytes;
}

std::string hex_bytes(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (size_t k = n; k-- > 0;) {
    const uint8_t b = static_cast<const uint8_t*>(p)[k];
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

TEST(ElementwiseTest, CastEveryDTypePairBitwise) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(1);
  for (DType src : kAllDTypes) {
    const std::vector<uint8_t> bytes = cast_sources(src, rng);
    const int64_t n = int64_t(bytes.size() / dtype_size(src));
    Tensor in = Tensor::empty(Shape{n}, src);
    std::memcpy(in.data_ptr(), bytes.data(), bytes.size());
    for (DType dst : kAllDTypes) {
      SCOPED_TRACE(std::string(dtype_name(src)) + " -> " + std::string(dtype_name(dst)));
      Tensor out = Tensor::empty(Shape{n}, dst);
      poison(out);
      ops::cast(out, in);
      const size_t ds = dtype_size(dst);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        uint8_t want[8];
        expected_element(src, in.data_ptr(), i, dst, want);
        const uint8_t* got = static_cast<const uint8_t*>(out.data_ptr()) + size_t(i) * ds;
        if (std::memcmp(got, want, ds) != 0 && bad++ < 5)
          ADD_FAILURE() << "element " << i << ": source bits "
                        << hex_bytes(static_cast<const uint8_t*>(in.data_ptr()) + size_t(i) * dtype_size(src),
                                     dtype_size(src))
                        << " (value " << double(exact_value(src, in.data_ptr(), i)) << ") gave "
                        << hex_bytes(got, ds) << ", expected " << hex_bytes(want, ds);
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST(ElementwiseTest, CastIntToLowPrecisionRoundsOnce) {
  ZT_TEST_TRACE_SEED();
  // 2^24 + 2^16 + 1: via f32 with RNE it would tie at 2^24 + 2^16 and then
  // round to 2^24 in bf16; the correct bf16 value is 2^24 + 2^17.
  int32_t v[2] = {(1 << 24) + (1 << 16) + 1, -((1 << 24) + (1 << 16) + 1)};
  Tensor in = Tensor::wrap(v, Shape{2}, DType::i32);
  Tensor out = Tensor::empty(Shape{2}, DType::bf16);
  ops::cast(out, in);
  EXPECT_EQ(bf16_to_float(out.data<bf16>()[0]), float((1 << 24) + (1 << 17)));
  EXPECT_EQ(bf16_to_float(out.data<bf16>()[1]), -float((1 << 24) + (1 << 17)));
}

TEST(ElementwiseTest, CastSameDTypeCopiesAndInPlace) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(2);
  for (int64_t n : {1, 5, 1000, 100003}) {
    Tensor a = random_tensor(Shape{n}, DType::bf16, rng);
    Tensor b = Tensor::empty(Shape{n}, DType::bf16);
    poison(b);
    ops::cast(b, a);
    EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0);
    // In place between equal-size types: f32 -> i32 over the same bytes.
    Tensor f = random_tensor(Shape{n}, DType::f32, rng, -1e6, 1e6);
    const std::vector<double> ref = to_f64(f);
    Tensor as_int = Tensor::wrap(f.data_ptr(), Shape{n}, DType::i32);
    ops::cast(as_int, f);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(as_int.data<int32_t>()[i], int32_t(std::trunc(ref[size_t(i)])));
  }
}

TEST(ElementwiseTest, CastBadArguments) {
  ZT_TEST_TRACE_SEED();
  Tensor a = Tensor::empty(Shape{4, 3}, DType::f32), b = Tensor::empty(Shape{11}, DType::bf16);
  std::string msg = error_of([&] { ops::cast(b, a); });
  EXPECT_THAT(msg, HasSubstr("cast"));
  EXPECT_THAT(msg, HasSubstr("'out'"));
  EXPECT_THAT(msg, HasSubstr("(4, 3)"));
  msg = error_of([&] { ops::cast(fake_cuda(Shape{12}, DType::bf16), a); });
  EXPECT_THAT(msg, HasSubstr("cast"));
  EXPECT_THAT(msg, HasSubstr("'in'"));
  msg = error_of([&] { ops::cast(Tensor(), a); });
  EXPECT_THAT(msg, HasSubstr("'out'"));
  // Partial overlap, and an exact alias between element sizes that differ.
  Tensor buf = Tensor::empty(Shape{8}, DType::f32);
  msg = error_of([&] { ops::cast(buf.flat_view(2, Shape{4}), buf.flat_view(0, Shape{4})); });
  EXPECT_THAT(msg, HasSubstr("cast"));
  EXPECT_THAT(msg, HasSubstr("overlaps"));
  Tensor as_bf16 = Tensor::wrap(buf.data_ptr(), Shape{8}, DType::bf16);
  msg = error_of([&] { ops::cast(as_bf16, buf); });
  EXPECT_THAT(msg, HasSubstr("overlaps"));
}

// --- add / scale / axpy --------------------------------------------------------

// Relative tolerance of one rounding to dtype (correctly rounded results are
// within half an ulp; one ulp leaves room for f32 -> dtype double rounding).
double ulp_rtol(DType dt) {
  switch (dt) {
    case DType::f32: return 0x1p-23;
    case DType::bf16: return 0x1p-7;
    case DType::f16: return 0x1p-10;
    default: return 0;
  }
}
// Absolute tolerance: the spacing of the dtype's subnormals (results there
// have fewer significant bits than ulp_rtol assumes).
double subnormal_atol(DType dt) {
  switch (dt) {
    case DType::f32: return 0x1p-149;
    case DType::bf16: return 0x1p-133;
    case DType::f16: return 0x1p-24;
    default: return 0;
  }
}

TEST(ElementwiseTest, AddScaleAxpyMatchFloat64) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(3);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t n : {1, 7, 33, 1000, 70001}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n));
      const Shape s{n};
      Tensor a = random_tensor(s, dt, rng, -4, 4), b = random_tensor(s, dt, rng, -4, 4);
      const auto av = to_f64(a), bv = to_f64(b);
      const double rt = ulp_rtol(dt), at = subnormal_atol(dt);
      std::vector<double> ref(av.size());
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = av[i] + bv[i];
      Tensor out = Tensor::empty(s, dt);
      poison(out);
      ops::add(out, a, b);
      EXPECT_TRUE(test::all_close(out, ref, rt, at));
      // In place: out = a, then out = b.
      Tensor a2 = Tensor::empty(s, dt), b2 = Tensor::empty(s, dt);
      ops::cast(a2, a);
      ops::cast(b2, b);
      ops::add(a2, a2, b);
      EXPECT_TRUE(test::all_close(a2, ref, rt, at));
      ops::add(b2, a, b2);
      EXPECT_TRUE(test::all_close(b2, ref, rt, at));

      const float alpha = -1.7f;
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = double(alpha) * av[i];
      poison(out);
      ops::scale(out, a, alpha);
      EXPECT_TRUE(test::all_close(out, ref, rt, at));
      ops::cast(a2, a);
      ops::scale(a2, a2, alpha);
      EXPECT_TRUE(test::all_close(a2, ref, rt, at));

      // axpy with every x dtype: y_after = y_before + alpha * x.
      for (DType xdt : {DType::f32, DType::bf16, DType::f16}) {
        Tensor x = random_tensor(Shape{n}, xdt, rng, -4, 4);
        Tensor y = random_tensor(Shape{n}, dt, rng, -4, 4);
        const auto xv = to_f64(x), yv = to_f64(y);
        for (size_t i = 0; i < ref.size(); ++i) ref[i] = yv[i] + double(alpha) * xv[i];
        ops::axpy(y, alpha, x);
        EXPECT_TRUE(test::all_close(y, ref, rt, at))
            << "x " << dtype_name(xdt);
      }
      // y += alpha * y (exact alias).
      Tensor y = random_tensor(Shape{n}, dt, rng, -4, 4);
      const auto yv = to_f64(y);
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = yv[i] * (1.0 + double(alpha));
      ops::axpy(y, alpha, y);
      EXPECT_TRUE(test::all_close(y, ref, rt, at)) << "y aliased";
    }
  }
}

TEST(ElementwiseTest, AddScaleAxpyBadArguments) {
  ZT_TEST_TRACE_SEED();
  Tensor a = Tensor::empty(Shape{4, 3}, DType::f32), b = Tensor::empty(Shape{3, 4}, DType::f32);
  Tensor out = Tensor::empty(Shape{4, 3}, DType::f32), h = Tensor::empty(Shape{4, 3}, DType::bf16);
  std::string msg = error_of([&] { ops::add(out, a, b); });
  EXPECT_THAT(msg, HasSubstr("add"));
  EXPECT_THAT(msg, HasSubstr("'b'"));
  EXPECT_THAT(msg, HasSubstr("(3, 4)"));
  msg = error_of([&] { ops::add(out, a, h); });
  EXPECT_THAT(msg, HasSubstr("'b'"));
  EXPECT_THAT(msg, HasSubstr("bf16"));
  msg = error_of([&] { ops::add(fake_cuda(Shape{4, 3}, DType::f32), a, a); });
  EXPECT_THAT(msg, HasSubstr("add"));
  EXPECT_THAT(msg, HasSubstr("cuda"));
  Tensor i = Tensor::empty(Shape{4, 3}, DType::i32);
  msg = error_of([&] { ops::add(i, i, i); });
  EXPECT_THAT(msg, HasSubstr("'a'"));
  EXPECT_THAT(msg, HasSubstr("i32"));
  Tensor buf = Tensor::empty(Shape{16}, DType::f32);
  msg = error_of([&] { ops::add(buf.flat_view(1, Shape{12}), buf.flat_view(0, Shape{12}), a.view(Shape{12})); });
  EXPECT_THAT(msg, HasSubstr("overlaps 'a'"));

  msg = error_of([&] { ops::scale(h, a, 2.0f); });
  EXPECT_THAT(msg, HasSubstr("scale"));
  EXPECT_THAT(msg, HasSubstr("'out'"));
  msg = error_of([&] { ops::scale(b, a, 2.0f); });
  EXPECT_THAT(msg, HasSubstr("scale"));
  EXPECT_THAT(msg, HasSubstr("'out'"));

  msg = error_of([&] { ops::axpy(a, 1.0f, Tensor::empty(Shape{11}, DType::f32)); });
  EXPECT_THAT(msg, HasSubstr("axpy"));
  EXPECT_THAT(msg, HasSubstr("'x'"));
  msg = error_of([&] { ops::axpy(a, 1.0f, i); });
  EXPECT_THAT(msg, HasSubstr("axpy"));
  EXPECT_THAT(msg, HasSubstr("'x'"));
  msg = error_of([&] { ops::axpy(a, 1.0f, fake_cuda(Shape{4, 3}, DType::f32)); });
  EXPECT_THAT(msg, HasSubstr("axpy"));
  EXPECT_THAT(msg, HasSubstr("'x'"));
}

// --- fill ----------------------------------------------------------------------

// ops::copy_columns (ops/device.h) against the element loop it stands for:
// dst[r, dst_col + j] = src[r, src_col + j] for j < cols, every other element
// of dst keeping its poisoned bits; a 2-byte and a 4-byte dtype.
TEST(ElementwiseTest, CopyColumnsIsTheStridedLoop) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(31);
  const int64_t rows = 5, src_row = 17, dst_row = 9, src_col = 6, dst_col = 2, cols = 7;
  for (const DType dt : {DType::bf16, DType::f32}) {
    const Tensor src = test::random_tensor(Shape{rows, src_row}, dt, rng);
    const Tensor dst = Tensor::empty(Shape{rows, 3, 3}, dt);  // any shape of rows x dst_row elements
    test::poison(dst);
    const Tensor before = ops::to_device(dst, Device::cpu());
    ops::copy_columns(dst, dst_col, src, src_col, cols, rows);
    const size_t es = dtype_size(dt);
    const auto* d = static_cast<const unsigned char*>(dst.data_ptr());
    const auto* b = static_cast<const unsigned char*>(before.data_ptr());
    const auto* s = static_cast<const unsigned char*>(src.data_ptr());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < dst_row; ++j) {
        const bool copied = j >= dst_col && j < dst_col + cols;
        const unsigned char* want =
            copied ? s + (r * src_row + src_col + j - dst_col) * es : b + (r * dst_row + j) * es;
        ASSERT_EQ(std::memcmp(d + (r * dst_row + j) * es, want, es), 0)
            << dtype_name(dt) << " row " << r << " column " << j << (copied ? " (copied)" : " (left alone)");
      }
  }
}

TEST(ElementwiseTest, CopyColumnsBadArguments) {
  const Tensor src = Tensor::empty(Shape{4, 10}, DType::f32), dst = Tensor::empty(Shape{4, 6}, DType::f32);
  EXPECT_NE(error_of([&] { ops::copy_columns(dst, 0, src, 5, 6, 4); }).find("must lie within their rows"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::copy_columns(dst, 0, src, 0, 2, 3); }).find("must both split into rows = 3"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::copy_columns(Tensor::empty(Shape{4, 6}, DType::bf16), 0, src, 0, 2, 4); })
                .find("copy_columns"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ops::copy_columns(src, 0, src, 5, 5, 4); }).find("copy_columns"), std::string::npos);
}

TEST(ElementwiseTest, FillEveryDType) {
  ZT_TEST_TRACE_SEED();
  for (DType dt : kAllDTypes) {
    for (int64_t n : {1, 3, 40000}) {
      Tensor t = Tensor::empty(Shape{n}, dt);
      poison(t);
      const double value = dtype_is_float(dt) ? -2.5 : 7.0;
      ops::fill(t, value);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(test::load_f64(t, i), value) << dtype_name(dt) << " at " << i;
    }
  }
  // Large integers are exact.
  Tensor t64 = Tensor::empty(Shape{3}, DType::i64);
  ops::fill(t64, 0x1p62 + 4096.0);
  EXPECT_EQ(t64.data<int64_t>()[2], (int64_t(1) << 62) + 4096);
  Tensor tu = Tensor::empty(Shape{3}, DType::u32);
  ops::fill(tu, 4294967295.0);
  EXPECT_EQ(tu.data<uint32_t>()[1], 4294967295u);
}

TEST(ElementwiseTest, FillRoundsTheDoubleOnce) {
  ZT_TEST_TRACE_SEED();
  // 1 + 2^-8 + 2^-30: rounding to f32 first gives the bf16 tie 1 + 2^-8 (->
  // 1.0 by RNE); the correctly rounded bf16 value is 1 + 2^-7.
  Tensor t = Tensor::empty(Shape{5}, DType::bf16);
  ops::fill(t, 1.0 + 0x1p-8 + 0x1p-30);
  EXPECT_EQ(bf16_to_float(t.data<bf16>()[4]), 1.0f + 0x1p-7f);
  Tensor h = Tensor::empty(Shape{2}, DType::f16);
  ops::fill(h, -(1.0 + 0x1p-11 + 0x1p-40));
  EXPECT_EQ(f16_to_float(h.data<f16>()[0]), -(1.0f + 0x1p-10f));
  ops::fill(h, 1e300);
  EXPECT_TRUE(std::isinf(f16_to_float(h.data<f16>()[1])));
  Tensor f = Tensor::empty(Shape{2}, DType::f32);
  ops::fill(f, -INFINITY);
  EXPECT_EQ(f.data<float>()[1], -INFINITY);
}

TEST(ElementwiseTest, FillBadArguments) {
  ZT_TEST_TRACE_SEED();
  Tensor i = Tensor::empty(Shape{3}, DType::i32), u = Tensor::empty(Shape{3}, DType::u16);
  std::string msg = error_of([&] { ops::fill(i, 3.5); });
  EXPECT_THAT(msg, HasSubstr("fill"));
  EXPECT_THAT(msg, HasSubstr("3.5"));
  msg = error_of([&] { ops::fill(u, -1.0); });
  EXPECT_THAT(msg, HasSubstr("fill"));
  EXPECT_THAT(msg, HasSubstr("u16"));
  msg = error_of([&] { ops::fill(i, 0x1p31); });
  EXPECT_THAT(msg, HasSubstr("i32"));
  msg = error_of([&] { ops::fill(i, NAN); });
  EXPECT_THAT(msg, HasSubstr("fill"));
  msg = error_of([&] { ops::fill(Tensor(), 0.0); });
  EXPECT_THAT(msg, HasSubstr("'out'"));
  msg = error_of([&] { ops::fill(fake_cuda(Shape{3}, DType::f32), 0.0); });
  EXPECT_THAT(msg, HasSubstr("fill"));
  EXPECT_THAT(msg, HasSubstr("cuda"));
}

// --- sum_squares / global_norm ------------------------------------------------

long double ref_sum_squares(const Tensor& t) {
  // Kahan-compensated in long double: x^2 of a float is exact in long double.
  long double s = 0, c = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const long double v = (long double)test::load_f64(t, i);
    const long double y = v * v - c;
    const long double u = s + y;
    c = (u - s) - y;
    s = u;
  }
  return s;
}

TEST(ElementwiseTest, SumSquaresAccurateAndThreadCountIndependent) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(4);
  // 1e6 f32 values spanning many magnitudes.
  const int64_t n = 1000000;
  Tensor x = Tensor::empty(Shape{n}, DType::f32);
  std::normal_distribution<double> nd(0.0, 1.0);
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = float(nd(rng) * std::ldexp(1.0, int(rng() % 40) - 20));
  const long double ref = ref_sum_squares(x);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double s1 = ops::sum_squares(x);
  omp_set_num_threads(2);
  const double s2 = ops::sum_squares(x);
  omp_set_num_threads(3);
  const double s3 = ops::sum_squares(x);
  omp_set_num_threads(saved);
  EXPECT_LE(std::fabs((long double)s1 - ref) / ref, 1e-12L);
  EXPECT_EQ(std::bit_cast<uint64_t>(s1), std::bit_cast<uint64_t>(s2));
  EXPECT_EQ(std::bit_cast<uint64_t>(s1), std::bit_cast<uint64_t>(s3));

  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t m : {1, 2, 17, 8193, 50000}) {
      Tensor y = random_tensor(Shape{m}, dt, rng, -3, 3);
      const long double r = ref_sum_squares(y);
      EXPECT_LE(std::fabs((long double)ops::sum_squares(y) - r), 1e-12L * r) << dtype_name(dt) << " n=" << m;
    }
  }
  EXPECT_EQ(ops::sum_squares(Tensor::empty(Shape{0}, DType::f32)), 0.0);
}

TEST(ElementwiseTest, GlobalNorm) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(5);
  std::vector<Tensor> ts = {random_tensor(Shape{3, 5}, DType::f32, rng), random_tensor(Shape{100}, DType::bf16, rng),
                            random_tensor(Shape{7, 1, 3}, DType::f16, rng), random_tensor(Shape{20000}, DType::f32, rng)};
  long double ref = 0;
  for (const Tensor& t : ts) ref += ref_sum_squares(t);
  const double got = ops::global_norm(ts);
  EXPECT_LE(std::fabs((long double)got - std::sqrt(ref)), 1e-14L * std::sqrt(ref));
  EXPECT_EQ(ops::global_norm({}), 0.0);

  std::vector<Tensor> bad = {ts[0], Tensor::empty(Shape{3}, DType::i32)};
  std::string msg = error_of([&] { ops::global_norm(bad); });
  EXPECT_THAT(msg, HasSubstr("global_norm"));
  EXPECT_THAT(msg, HasSubstr("'tensors[1]'"));
  bad[1] = fake_cuda(Shape{3}, DType::f32);
  msg = error_of([&] { ops::global_norm(bad); });
  EXPECT_THAT(msg, HasSubstr("global_norm"));
  EXPECT_THAT(msg, HasSubstr("'tensors[1]'"));
  bad[1] = Tensor();
  msg = error_of([&] { ops::global_norm(bad); });
  EXPECT_THAT(msg, HasSubstr("'tensors[1]'"));
  msg = error_of([&] { ops::sum_squares(Tensor::empty(Shape{3}, DType::f8e4m3)); });
  EXPECT_THAT(msg, HasSubstr("sum_squares"));
  EXPECT_THAT(msg, HasSubstr("'x'"));
}

// --- random fills --------------------------------------------------------------

TEST(ElementwiseTest, FillNormalMatchesPhiloxAndIsSane) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(6);
  const uint64_t seed = rng(), offset0 = rng() >> 20;
  Generator gen(seed, offset0);
  const int64_t n = 100001;  // not a multiple of 4
  const float mean = 0.25f, sd = 2.0f;
  Tensor x = Tensor::empty(Shape{n}, DType::f32);
  poison(x);
  ops::fill_normal(x, gen, mean, sd);
  EXPECT_EQ(gen.offset(), offset0 + uint64_t((n + 3) / 4));
  double s = 0, s2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = mean + sd * philox_normal_at(seed, offset0, uint64_t(i));
    ASSERT_EQ(std::bit_cast<uint32_t>(x.data<float>()[i]), std::bit_cast<uint32_t>(want)) << "element " << i;
    s += x.data<float>()[i];
    s2 += double(x.data<float>()[i]) * x.data<float>()[i];
  }
  const double m = s / double(n), var = s2 / double(n) - m * m;
  // Standard errors: mean sd/sqrt(n) = 0.0063; std about sd/sqrt(2n) = 0.0045.
  EXPECT_NEAR(m, mean, 5 * sd / std::sqrt(double(n)));
  EXPECT_NEAR(std::sqrt(var), sd, 5 * sd / std::sqrt(2.0 * double(n)));

  // A second call draws fresh numbers: it continues the stream.
  Tensor y = Tensor::empty(Shape{n}, DType::f32);
  ops::fill_normal(y, gen, 0.0f, 1.0f);
  for (int64_t i = 0; i < n; i += 997)
    ASSERT_EQ(y.data<float>()[i], 0.0f + 1.0f * philox_normal_at(seed, offset0 + uint64_t((n + 3) / 4), uint64_t(i)));
  EXPECT_NE(y.data<float>()[0], (x.data<float>()[0] - mean) / sd);

  // bf16 / f16 / fp8: the f32 draw rounded, across several scratch blocks.
  for (DType dt : {DType::bf16, DType::f16, DType::f8e4m3, DType::f8e5m2}) {
    const int64_t m2 = 3 * 4096 + 7;
    Tensor z = Tensor::empty(Shape{m2}, dt);
    poison(z);
    const uint64_t off = gen.offset();
    ops::fill_normal(z, gen, mean, sd);
    for (int64_t i = 0; i < m2; ++i) {
      const float f = mean + sd * philox_normal_at(seed, off, uint64_t(i));
      Tensor want = Tensor::empty(Shape{1}, dt);
      test::store_f64(want, 0, f);  // store_f64 rounds the float once, like core
      ASSERT_EQ(std::memcmp(static_cast<char*>(z.data_ptr()) + size_t(i) * dtype_size(dt), want.data_ptr(),
                            dtype_size(dt)),
                0)
          << dtype_name(dt) << " element " << i;
    }
  }
}

TEST(ElementwiseTest, FillUniformMatchesPhilox) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(7);
  const uint64_t seed = rng();
  Generator gen(seed, 5);
  const float lo = -0.5f, hi = 1.5f;
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t n = 20003;
    Tensor x = Tensor::empty(Shape{n}, dt);
    poison(x);
    const uint64_t off = gen.offset();
    ops::fill_uniform(x, gen, lo, hi);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float f = lo + (hi - lo) * philox_uniform_at(seed, off, uint64_t(i));
      const double got = test::load_f64(x, i);
      ASSERT_EQ(got, dt == DType::f32 ? double(f) : double(bf16_to_float(float_to_bf16(f)))) << i;
      ASSERT_GE(got, lo);
      ASSERT_LE(got, hi);
      s += got;
    }
    EXPECT_NEAR(s / double(n), 0.5, 5 * (hi - lo) / std::sqrt(12.0 * double(n)));
  }
}

TEST(ElementwiseTest, RandomFillBadArguments) {
  ZT_TEST_TRACE_SEED();
  Generator gen(1, 0);
  std::string msg = error_of([&] { ops::fill_normal(Tensor::empty(Shape{4}, DType::i32), gen, 0, 1); });
  EXPECT_THAT(msg, HasSubstr("fill_normal"));
  EXPECT_THAT(msg, HasSubstr("'out'"));
  msg = error_of([&] { ops::fill_normal(Tensor::empty(Shape{4}, DType::f32), gen, 0, -1); });
  EXPECT_THAT(msg, HasSubstr("fill_normal"));
  EXPECT_THAT(msg, HasSubstr("std"));
  msg = error_of([&] { ops::fill_uniform(Tensor::empty(Shape{4}, DType::f32), gen, 1, 0); });
  EXPECT_THAT(msg, HasSubstr("fill_uniform"));
  msg = error_of([&] { ops::fill_uniform(fake_cuda(Shape{4}, DType::f32), gen, 0, 1); });
  EXPECT_THAT(msg, HasSubstr("fill_uniform"));
  EXPECT_THAT(msg, HasSubstr("cuda"));
  EXPECT_EQ(gen.offset(), 0u);  // failed calls reserve nothing
}

// --- shared CPU primitives -------------------------------------------------------

TEST(ElementwiseTest, SqrtInplaceMatchesStdSqrt) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(9);
  for (int64_t n : {0, 1, 15, 16, 17, 100, 1027}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = std::bit_cast<float>(uint32_t(rng()) & 0x7fffffffu);  // every non-negative class
    const float specials[] = {0.0f, -0.0f, INFINITY, NAN, -1.0f, 0x1p-149f, 2.0f};
    for (size_t i = 0; i < std::min<size_t>(x.size(), 7); ++i) x[i * x.size() / 7] = specials[i];
    std::vector<float> y = x;
    cpu::sqrt_inplace(y.data(), n);
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = std::sqrt(x[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(y[i])) << x[i];
      } else {
        ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want)) << x[i];
      }
    }
  }
}

}  // namespace
}  // namespace zt
