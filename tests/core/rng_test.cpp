#include <cstdint>
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"

namespace zt {
namespace {

// Known-answer vectors of Philox4x32-10 published with Random123 (kat_vectors).
TEST(Philox, KnownAnswerVectors) {
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const PhiloxBlock b = philox4x32_10(k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3], k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(b.w[i], k.out[i]) << "word " << i;
  }
}

TEST(Philox, FillEqualsPointwiseDraws) {
  const int64_t n = 1001;  // not a multiple of 4
  std::vector<float> u(n), g(n);
  philox_fill_uniform(u.data(), n, 1234, 77, -2.0f, 3.0f);
  philox_fill_normal(g.data(), n, 1234, 77, 0.5f, 2.0f);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_FLOAT_EQ(u[i], -2.0f + 5.0f * philox_uniform_at(1234, 77, i));
    EXPECT_FLOAT_EQ(g[i], 0.5f + 2.0f * philox_normal_at(1234, 77, i));
    EXPECT_GE(u[i], -2.0f);
    EXPECT_LT(u[i], 3.0f);
  }
}

// The batched words (stochastic rounding's) are the pointwise ones, for any
// start (mid-block too), length and chunk boundary; nothing outside is written.
TEST(Philox, WordsEqualPointwiseWords) {
  const uint64_t seed = 0x9e3779b97f4a7c15ull, stream = (uint64_t(3) << 32) | 17;
  for (uint64_t first : {uint64_t(0), uint64_t(1), uint64_t(6), (uint64_t(1) << 34) + 3})
    for (int64_t n : {1, 3, 4, 5, 255, 256, 257, 1031}) {
      std::vector<uint32_t> out(size_t(n) + 2, 0xdeadbeefu);
      philox_words(seed, stream, first, n, out.data() + 1);
      EXPECT_EQ(out[0], 0xdeadbeefu);
      EXPECT_EQ(out[size_t(n) + 1], 0xdeadbeefu) << "wrote past n = " << n;
      for (int64_t k = 0; k < n; ++k)
        ASSERT_EQ(out[size_t(k) + 1], philox_word_at(seed, stream, first + uint64_t(k))) << first << " + " << k;
    }
  // The pointwise word is word i % 4 of block (i / 4, stream).
  const PhiloxBlock b = philox4x32_10(2, 0, uint32_t(stream), uint32_t(stream >> 32), uint32_t(seed),
                                      uint32_t(seed >> 32));
  EXPECT_EQ(philox_word_at(seed, stream, 9), b.w[1]);
}

TEST(Philox, StreamDependsOnlyOnSeedAndOffset) {
  // A draw at offset 5 equals the tail of a draw at offset 4 (4 values per counter).
  std::vector<float> a(12), b(8);
  philox_fill_normal(a.data(), 12, 99, 4, 0, 1);
  philox_fill_normal(b.data(), 8, 99, 5, 0, 1);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(a[4 + i], b[i]);
  // Another seed gives other numbers.
  std::vector<float> c(8);
  philox_fill_normal(c.data(), 8, 100, 5, 0, 1);
  int same = 0;
  for (int i = 0; i < 8; ++i) same += c[i] == b[i];
  EXPECT_EQ(same, 0);
  // The seed's high 32 bits matter too.
  EXPECT_NE(philox_uniform_at(1, 0, 0), philox_uniform_at(1 + (uint64_t(1) << 32), 0, 0));
}

TEST(Philox, IndependentOfThreadCount) {
  const int64_t n = 100003;
  std::vector<float> one(n), two(n);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  philox_fill_normal(one.data(), n, 5, 0, 0, 1);
  omp_set_num_threads(2);
  philox_fill_normal(two.data(), n, 5, 0, 0, 1);
  omp_set_num_threads(saved);
  EXPECT_EQ(0, std::memcmp(one.data(), two.data(), n * sizeof(float)));
}

TEST(Philox, NormalMomentsAreSane) {
  const int64_t n = 1 << 20;
  std::vector<float> g(n);
  philox_fill_normal(g.data(), n, 2024, 0, 0, 1);
  double s = 0, s2 = 0, s4 = 0;
  int64_t beyond3 = 0;
  for (float x : g) {
    ASSERT_TRUE(std::isfinite(x));
    s += x;
    s2 += double(x) * x;
    s4 += double(x) * x * x * x;
    beyond3 += std::fabs(x) > 3;
  }
  const double mean = s / n, var = s2 / n - mean * mean, kurt = s4 / n / (var * var);
  // Standard errors for n = 2^20: mean 1e-3, var 1.4e-3, kurtosis 4.8e-3.
  EXPECT_LT(std::fabs(mean), 5e-3);
  EXPECT_LT(std::fabs(var - 1.0), 7e-3);
  EXPECT_LT(std::fabs(kurt - 3.0), 3e-2);
  // P(|x| > 3) = 0.0027: expected 2831, sd ~53.
  EXPECT_NEAR(double(beyond3), 0.0026998 * n, 300.0);
}

TEST(Philox, UniformMomentsAreSane) {
  const int64_t n = 1 << 20;
  std::vector<float> u(n);
  philox_fill_uniform(u.data(), n, 7, 3, 0, 1);
  double s = 0, s2 = 0;
  for (float x : u) {
    ASSERT_GE(x, 0.0f);
    ASSERT_LT(x, 1.0f);
    s += x;
    s2 += double(x) * x;
  }
  EXPECT_NEAR(s / n, 0.5, 3e-3);
  EXPECT_NEAR(s2 / n - (s / n) * (s / n), 1.0 / 12, 2e-3);
}

TEST(Generator, ReservesDisjointCounters) {
  Generator gen(42);
  EXPECT_EQ(gen.reserve(10), 0u);  // 10 values -> 3 counters
  EXPECT_EQ(gen.reserve(4), 3u);
  EXPECT_EQ(gen.reserve(1), 4u);
  EXPECT_EQ(gen.offset(), 5u);
  EXPECT_EQ(gen.seed(), 42u);
  Generator resumed(42, 5);  // a checkpoint restores (seed, offset)
  EXPECT_EQ(resumed.reserve(1), gen.reserve(1));
}

}  // namespace
}  // namespace zt
