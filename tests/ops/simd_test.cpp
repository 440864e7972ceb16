// The CPU kernels' explicit-vector primitives (backend/cpu/simd.h), at this
// build's width kV: exp / exp2 / exp_flush against std::exp in double, the
// bf16 loads and stores bitwise against core/dtype.h's conversions, the pair
// blocks' lane order, partial loads and stores, and hsum's summation order.
#include "backend/cpu/simd.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "test_util.h"

// Vectors by value in non-AVX builds (see simd.h).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace zt {
namespace {

namespace simd = cpu::simd;
using simd::f32v;
using simd::kV;
using simd::kV2;
using test::make_rng;

// f(x) over xs in whole vectors, the last one partial (as the kernels do).
template <typename F>
std::vector<float> map_vectors(const std::vector<float>& xs, F f) {
  std::vector<float> out(xs.size(), std::nanf("0x5a"));  // poison
  size_t i = 0;
  for (; i + kV <= xs.size(); i += kV) simd::store(out.data() + i, f(simd::load(xs.data() + i)));
  if (i < xs.size()) {
    const int64_t n = int64_t(xs.size() - i);
    simd::store_partial(out.data() + i, f(simd::load_partial(xs.data() + i, n)), n);
  }
  return out;
}

// The exps' error bound in ulps: 1 where the build has FMA; without it each
// Horner step rounds twice (measured max 1.23 ulp; simd.h).
#if defined(__FMA__)
constexpr double kExpUlps = 1.0;
#else
constexpr double kExpUlps = 1.3;
#endif

// |got - want| in units of the last place of the f32 nearest want.
double ulps(float got, double want) {
  return std::fabs(double(got) - want) / std::ldexp(1.0, std::ilogb(float(want)) - 23);
}

TEST(Simd, ExpFlushWithinItsBoundAndFlushesBelowMinus87) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(1);
  std::uniform_real_distribution<float> u(-90.0f, 0.0f);
  std::vector<float> xs = {0.0f,   -0.0f,   -1.0f,   -1e-8f,  -0x1p-149f, -0.34657359f, -0.3465736f, -0.6931472f,
                           -86.99f, -87.0f, -87.01f, -87.5f, -103.0f,    -200.0f,      -1e4f,       -3e38f,
                           1e-7f,  0.5f,    10.0f,   87.0f};
  for (int k = 0; k < 1000000; ++k) xs.push_back(u(rng));
  for (int k = 0; k < 100000; ++k) xs.push_back(-std::ldexp(u(rng) / -90.0f, -int(rng() % 40)));  // tiny |x|
  xs.push_back(-1.0f);  // a partial last vector (unless the count happens to divide)
  const std::vector<float> got = map_vectors(xs, [](f32v v) { return simd::exp_flush(v); });
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] < -87.0f) {
      ASSERT_EQ(got[i], 0.0f) << "x = " << xs[i];
      continue;
    }
    ASSERT_LE(ulps(got[i], std::exp(double(xs[i]))), kExpUlps) << "x = " << xs[i] << " got " << got[i];
  }
  const f32v specials = simd::exp_flush(simd::splat(NAN));
  EXPECT_TRUE(std::isnan(specials[0]));
  EXPECT_EQ(simd::exp_flush(simd::splat(-INFINITY))[kV - 1], 0.0f);
  EXPECT_EQ(simd::exp_flush(simd::splat(0.0f))[0], 1.0f);
}

TEST(Simd, ExpAndExp2WithinTheirBoundOverTheirRanges) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(2);
  std::uniform_real_distribution<float> ue(-87.3f, 87.3f), u2(-126.0f, 126.0f);
  std::vector<float> xe = {0.0f, -87.3f, 87.3f, 1e-30f, -1e-30f, 0.34657359f, -0.34657359f}, x2 = {0.0f, -126.0f,
                                                                                                      126.0f, 0.5f, -0.5f};
  for (int k = 0; k < 500000; ++k) {
    xe.push_back(ue(rng));
    x2.push_back(u2(rng));
  }
  const std::vector<float> ge = map_vectors(xe, [](f32v v) { return simd::exp(v); });
  const std::vector<float> g2 = map_vectors(x2, [](f32v v) { return simd::exp2(v); });
  for (size_t i = 0; i < xe.size(); ++i)
    ASSERT_LE(ulps(ge[i], std::exp(double(xe[i]))), kExpUlps) << "exp(" << xe[i] << ") = " << ge[i];
  for (size_t i = 0; i < x2.size(); ++i)
    ASSERT_LE(ulps(g2[i], std::exp2(double(x2[i]))), kExpUlps) << "exp2(" << x2[i] << ") = " << g2[i];
  EXPECT_TRUE(std::isnan(simd::exp(simd::splat(NAN))[1]));
}

TEST(Simd, Bf16LoadsAndStoresMatchCoreBitwise) {
  ZT_TEST_TRACE_SEED();
  // Every bf16 encoding widens to exactly core's value.
  for (uint32_t base = 0; base < 65536; base += uint32_t(kV)) {
    bf16 h[kV];
    for (int l = 0; l < int(kV); ++l) h[l] = bf16{uint16_t(base + uint32_t(l))};
    const f32v v = simd::load(h);
    for (int l = 0; l < int(kV); ++l)
      ASSERT_EQ(std::bit_cast<uint32_t>(v[l]), std::bit_cast<uint32_t>(bf16_to_float(h[l]))) << "bits " << h[l].bits;
  }
  // Random f32 bit patterns (every class: NaNs, infinities, subnormals, ties)
  // round to core's float_to_bf16 bits, through store and store_pair.
  auto rng = make_rng(3);
  std::vector<float> xs;
  for (int k = 0; k < 200000; ++k) xs.push_back(std::bit_cast<float>(uint32_t(rng())));
  for (uint32_t b : {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x00000001u, 0x807fffffu,
                     0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x0u, 0x80000000u})
    xs.push_back(std::bit_cast<float>(b));
  while (xs.size() % kV2) xs.push_back(1.0f);
  std::vector<bf16> single(xs.size()), paired(xs.size());
  for (size_t i = 0; i < xs.size(); i += kV) simd::store(single.data() + i, simd::load(xs.data() + i));
  const simd::i32v even = simd::pair_lane_elems<bf16>(0), odd = simd::pair_lane_elems<bf16>(1);
  for (size_t i = 0; i < xs.size(); i += kV2) {
    simd::Pair p;  // f32 values in bf16's pair lane order
    for (int l = 0; l < int(kV); ++l) {
      p.v0[l] = xs[i + size_t(even[l])];
      p.v1[l] = xs[i + size_t(odd[l])];
    }
    simd::store_pair(paired.data() + i, p);
  }
  for (size_t i = 0; i < xs.size(); ++i) {
    const uint16_t want = float_to_bf16(xs[i]).bits;
    ASSERT_EQ(single[i].bits, want) << "f32 bits " << std::bit_cast<uint32_t>(xs[i]);
    ASSERT_EQ(paired[i].bits, want) << "f32 bits " << std::bit_cast<uint32_t>(xs[i]);
  }
}

template <typename T>
void check_pairs() {
  T x[kV2 + 3];
  for (int i = 0; i < int(kV2) + 3; ++i) x[i] = from_float<T>(float(i + 1));
  // Each lane holds the element pair_lane_elems names.
  const simd::Pair p = simd::load_pair(x);
  for (int half = 0; half < 2; ++half) {
    const simd::i32v elems = simd::pair_lane_elems<T>(half);
    const f32v v = half ? p.v1 : p.v0;
    for (int l = 0; l < int(kV); ++l) EXPECT_EQ(v[l], float(elems[l] + 1)) << "half " << half << " lane " << l;
  }
  // Partial: the first n elements, zero elsewhere; stores write only n.
  for (int64_t n : {int64_t(1), kV - 1, kV, kV2 - 1}) {
    const simd::Pair q = simd::load_pair_partial(x, n);
    for (int half = 0; half < 2; ++half) {
      const simd::i32v elems = simd::pair_lane_elems<T>(half);
      const f32v v = half ? q.v1 : q.v0;
      for (int l = 0; l < int(kV); ++l) EXPECT_EQ(v[l], elems[l] < n ? float(elems[l] + 1) : 0.0f);
    }
    T out[kV2 + 3];
    for (auto& o : out) o = from_float<T>(-7.0f);  // poison
    simd::store_pair_partial(out, q, n);
    for (int i = 0; i < int(kV2) + 3; ++i) EXPECT_EQ(to_float(out[i]), i < n ? float(i + 1) : -7.0f) << "n " << n;
  }
  for (int64_t n : {int64_t(1), kV - 1}) {
    const f32v v = simd::load_partial(x, n);
    T out[kV + 1];
    for (auto& o : out) o = from_float<T>(-7.0f);
    simd::store_partial(out, v, n);
    for (int i = 0; i <= int(kV); ++i) EXPECT_EQ(to_float(out[i]), i < n ? float(i + 1) : -7.0f);
    for (int l = 0; l < int(kV); ++l) EXPECT_EQ(v[l], l < n ? float(l + 1) : 0.0f);
  }
}

TEST(Simd, PairsKeepTheirLaneOrderAndPartialsTouchOnlyTheirElements) {
  check_pairs<float>();
  check_pairs<bf16>();
  for (int64_t n = 0; n <= kV; ++n) {
    const simd::i32v m = simd::lanes_below(n);
    for (int l = 0; l < int(kV); ++l) EXPECT_EQ(m[l], l < n ? -1 : 0);
  }
}

TEST(Simd, HsumAddsInTheDocumentedOrder) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(4);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int trial = 0; trial < 1000; ++trial) {
    f32v v;
    // Mixed magnitudes, so that another order gives another float.
    for (int l = 0; l < int(kV); ++l) v[l] = u(rng) * std::ldexp(1.0f, int(rng() % 40) - 20);
    // Halves added pairwise down to four lanes, then (l0 + l2) + (l1 + l3).
    std::vector<float> a(static_cast<size_t>(kV));
    for (int l = 0; l < int(kV); ++l) a[size_t(l)] = v[l];
    while (a.size() > 4) {
      const size_t h = a.size() / 2;
      for (size_t l = 0; l < h; ++l) a[l] = a[l] + a[l + h];
      a.resize(h);
    }
    const float want = (a[0] + a[2]) + (a[1] + a[3]);
    ASSERT_EQ(std::bit_cast<uint32_t>(simd::hsum(v)), std::bit_cast<uint32_t>(want)) << "trial " << trial;
  }
}

}  // namespace
}  // namespace zt
