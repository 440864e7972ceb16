// Fused softmax + cross-entropy against a float64 reference.
//
// Tolerances (f32 logits): the kernel's exp is ~2 ulp, x - max is rounded in
// f32 (relative error of e^(x-m) up to |x - m| * 2^-24, <= 6e-7 for the
// logit ranges used), and the row sum is f32 within blocks, so softmax values
// are good to ~1e-6 relative: rtol 1e-5. The loss is assembled in f64 from
// f32 pieces (log S good to ~1e-7 absolute): rtol 1e-5, atol 1e-6. The target
// column p_t - 1 cancels when p_t ~ 1, leaving ~1e-7 absolute: dlogits atol
// 1e-6 * |grad_scale|. bf16 logits are compared with the float64 reference
// of the bf16 values; bf16 dlogits get rtol 1e-2 (bf16 has 8 significant bits).
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"

#include <cstdint>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using test::make_rng;
using test::poison;
using test::random_tensor;
using test::to_f64;

using test::error_of;
using test::fake_cuda;

struct Ref {
  std::vector<double> loss;     // (N)
  std::vector<double> dlogits;  // (N, Vp)
};

// Forward loss of one row in float64.
double ref_row_loss(const double* x, int64_t V, int32_t t) {
  if (t < 0) return 0.0;
  double m = -INFINITY;
  for (int64_t j = 0; j < V; ++j) m = std::max(m, x[j]);
  double s = 0.0;
  for (int64_t j = 0; j < V; ++j) s += std::exp(x[j] - m);
  return m + std::log(s) - x[t];
}

Ref reference(const std::vector<double>& x, const std::vector<int32_t>& tg, int64_t N, int64_t Vp, int64_t V,
              double scale) {
  Ref r{std::vector<double>(size_t(N)), std::vector<double>(size_t(N * Vp), 0.0)};
  for (int64_t n = 0; n < N; ++n) {
    const double* row = x.data() + n * Vp;
    const int32_t t = tg[size_t(n)];
    r.loss[size_t(n)] = ref_row_loss(row, V, t);
    if (t < 0) continue;
    double m = -INFINITY;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, row[j]);
    double s = 0.0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(row[j] - m);
    for (int64_t j = 0; j < V; ++j)
      r.dlogits[size_t(n * Vp + j)] = (std::exp(row[j] - m) / s - (j == t ? 1.0 : 0.0)) * scale;
  }
  return r;
}

Tensor make_targets(int64_t N, int64_t V, std::mt19937_64& rng, double ignore_frac) {
  Tensor t = Tensor::empty(Shape{N}, DType::i32);
  std::uniform_int_distribution<int32_t> d(0, int32_t(V - 1));
  std::bernoulli_distribution ign(ignore_frac);
  for (int64_t n = 0; n < N; ++n) t.data<int32_t>()[n] = ign(rng) ? -1 - int32_t(rng() % 100) : d(rng);
  return t;
}

std::vector<int32_t> targets_vec(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

// Padding columns and ignored rows of dlogits must be exactly zero.
void expect_exact_zeros(const Tensor& dlogits, const std::vector<int32_t>& tg, int64_t V) {
  const int64_t N = dlogits.size(0), Vp = dlogits.size(1);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < Vp; ++j)
      if (j >= V || tg[size_t(n)] < 0) {
        ASSERT_EQ(test::load_f64(dlogits, n * Vp + j), 0.0) << "row " << n << " column " << j;
      }
}

struct Case {
  int64_t N, Vp, V;
};

TEST(CrossEntropyTest, MatchesFloat64) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(11);
  const Case cases[] = {{1, 1, 1}, {1, 7, 5}, {3, 50, 50}, {5, 1000, 997}, {2, 4099, 4097}, {17, 64, 33}, {4, 3000, 1}};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(c.N) + " Vp=" + std::to_string(c.Vp) +
                   " V=" + std::to_string(c.V));
      Tensor logits = random_tensor(Shape{c.N, c.Vp}, dt, rng, -6, 6);
      Tensor targets = make_targets(c.N, c.V, rng, 0.2);
      const auto tg = targets_vec(targets);
      const float scale = 0.37f;
      const Ref ref = reference(to_f64(logits), tg, c.N, c.Vp, c.V, scale);
      Tensor losses = Tensor::empty(Shape{c.N}, DType::f32), dlogits = Tensor::empty(Shape{c.N, c.Vp}, dt);
      poison(losses);
      poison(dlogits);
      ops::softmax_cross_entropy(losses, dlogits, logits, targets, c.V, scale);
      EXPECT_TRUE(test::all_close(losses, ref.loss, 1e-5, 1e-6));
      if (dt == DType::f32)
        EXPECT_TRUE(test::all_close(dlogits, ref.dlogits, 1e-5, 1e-6 * scale));
      else
        EXPECT_TRUE(test::all_close(dlogits, ref.dlogits, 1e-2, 1e-6 * scale));
      expect_exact_zeros(dlogits, tg, c.V);
      for (int64_t n = 0; n < c.N; ++n)
        if (tg[size_t(n)] < 0) {
          EXPECT_EQ(losses.data<float>()[n], 0.0f);
        }

      // Forward only: same losses, bit for bit.
      Tensor losses2 = Tensor::empty(Shape{c.N}, DType::f32);
      poison(losses2);
      ops::softmax_cross_entropy(losses2, Tensor(), logits, targets, c.V, scale);
      EXPECT_EQ(std::memcmp(losses.data_ptr(), losses2.data_ptr(), losses.nbytes()), 0);

      // In place: the same results, bit for bit.
      Tensor inplace = Tensor::empty(logits.shape(), dt);
      std::memcpy(inplace.data_ptr(), logits.data_ptr(), logits.nbytes());
      poison(losses2);
      ops::softmax_cross_entropy(losses2, inplace, inplace, targets, c.V, scale);
      EXPECT_EQ(std::memcmp(losses.data_ptr(), losses2.data_ptr(), losses.nbytes()), 0);
      EXPECT_EQ(std::memcmp(dlogits.data_ptr(), inplace.data_ptr(), dlogits.nbytes()), 0);
    }
  }
}

TEST(CrossEntropyTest, ReferenceGradientMatchesFiniteDifferences) {
  ZT_TEST_TRACE_SEED();
  // Verifies the float64 analytic reference itself: d(scale * sum_n loss_n)/dx.
  auto rng = make_rng(12);
  const int64_t N = 3, Vp = 7, V = 5;
  std::vector<double> x(size_t(N * Vp));
  std::uniform_real_distribution<double> u(-3, 3);
  for (double& v : x) v = u(rng);
  const std::vector<int32_t> tg = {2, -1, 4};
  const double scale = 0.7, h = 1e-5;
  const Ref ref = reference(x, tg, N, Vp, V, scale);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < Vp; ++j) {
      std::vector<double> xp = x, xm = x;
      xp[size_t(n * Vp + j)] += h;
      xm[size_t(n * Vp + j)] -= h;
      const double fd = scale * (ref_row_loss(xp.data() + n * Vp, V, tg[size_t(n)]) -
                                 ref_row_loss(xm.data() + n * Vp, V, tg[size_t(n)])) /
                        (2 * h);
      EXPECT_NEAR(ref.dlogits[size_t(n * Vp + j)], fd, 1e-8) << "row " << n << " column " << j;
    }
  }
}

TEST(CrossEntropyTest, PaddingDoesNotChangeTheResult) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(13);
  const int64_t N = 6, V = 300, Vp = 320;
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor unpadded = random_tensor(Shape{N, V}, dt, rng, -4, 4);
    Tensor padded = Tensor::empty(Shape{N, Vp}, dt);
    const double pad_values[] = {1e30, -1e30, 3e38, INFINITY, NAN, 1e4};
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = 0; j < Vp; ++j)
        test::store_f64(padded, n * Vp + j,
                        j < V ? test::load_f64(unpadded, n * V + j) : pad_values[size_t(n + j) % 6]);
    }
    Tensor targets = make_targets(N, V, rng, 0.0);
    targets.data<int32_t>()[0] = int32_t(V - 1);  // the last real column
    const auto tg = targets_vec(targets);
    Tensor l0 = Tensor::empty(Shape{N}, DType::f32), l1 = Tensor::empty(Shape{N}, DType::f32);
    Tensor d0 = Tensor::empty(Shape{N, V}, dt), d1 = Tensor::empty(Shape{N, Vp}, dt);
    poison(d1);
    ops::softmax_cross_entropy(l0, d0, unpadded, targets, V, 1.0f);
    ops::softmax_cross_entropy(l1, d1, padded, targets, V, 1.0f);
    EXPECT_EQ(std::memcmp(l0.data_ptr(), l1.data_ptr(), l0.nbytes()), 0);
    for (int64_t n = 0; n < N; ++n)
      EXPECT_EQ(std::memcmp(static_cast<char*>(d0.data_ptr()) + n * V * dtype_size(dt),
                            static_cast<char*>(d1.data_ptr()) + n * Vp * dtype_size(dt), size_t(V) * dtype_size(dt)),
                0)
          << "row " << n;
    expect_exact_zeros(d1, tg, V);
    const Ref ref = reference(to_f64(unpadded), tg, N, V, V, 1.0);
    EXPECT_TRUE(test::all_close(l1, ref.loss, 1e-5, 1e-6));
  }
}

TEST(CrossEntropyTest, LargeLogitsAreStable) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(14);
  const int64_t N = 8, V = 513;
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor logits = random_tensor(Shape{N, V}, dt, rng, -1e4, 1e4);
    // Rows 0/1: every logit huge and nearly equal; row 2: two tied maxima.
    for (int64_t j = 0; j < V; ++j) {
      test::store_f64(logits, j, 1e4 - double(j % 7));
      test::store_f64(logits, V + j, -1e4 + double(j % 5));
      test::store_f64(logits, 2 * V + j, j == 3 || j == 9 ? 5e3 : -5e3);
    }
    Tensor targets = make_targets(N, V, rng, 0.0);
    targets.data<int32_t>()[2] = 3;
    const auto tg = targets_vec(targets);
    const Ref ref = reference(to_f64(logits), tg, N, V, V, 1.0 / double(N));
    Tensor losses = Tensor::empty(Shape{N}, DType::f32), dlogits = Tensor::empty(Shape{N, V}, dt);
    poison(losses);
    poison(dlogits);
    ops::softmax_cross_entropy(losses, dlogits, logits, targets, V, 1.0f / float(N));
    EXPECT_TRUE(test::all_close(losses, ref.loss, 1e-5, 1e-6));
    EXPECT_TRUE(test::all_close(dlogits, ref.dlogits, dt == DType::f32 ? 1e-5 : 1e-2, 1e-6 / double(N)));
    EXPECT_NEAR(losses.data<float>()[2], std::log(2.0), 1e-6);
  }
}

TEST(CrossEntropyTest, SingleClassAndSingleRow) {
  ZT_TEST_TRACE_SEED();
  // V = 1: softmax is 1, loss 0, gradient 0 whatever the logit; padding ignored.
  float x[3] = {123.0f, 1e30f, -7.0f};
  Tensor logits = Tensor::wrap(x, Shape{1, 3}, DType::f32);
  int32_t t = 0;
  Tensor targets = Tensor::wrap(&t, Shape{1}, DType::i32);
  Tensor losses = Tensor::empty(Shape{1}, DType::f32), d = Tensor::empty(Shape{1, 3}, DType::f32);
  poison(d);
  ops::softmax_cross_entropy(losses, d, logits, targets, 1, 2.0f);
  EXPECT_EQ(losses.data<float>()[0], 0.0f);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(d.data<float>()[j], 0.0f);
}

TEST(CrossEntropyTest, BadArguments) {
  ZT_TEST_TRACE_SEED();
  const int64_t N = 4, Vp = 10;
  Tensor logits = Tensor::empty(Shape{N, Vp}, DType::f32), targets = Tensor::empty(Shape{N}, DType::i32);
  for (int64_t n = 0; n < N; ++n) targets.data<int32_t>()[n] = int32_t(n);
  Tensor losses = Tensor::empty(Shape{N}, DType::f32), d = Tensor::empty(Shape{N, Vp}, DType::f32);
  auto expect_msg = [](const std::string& msg, const char* arg) {
    EXPECT_THAT(msg, HasSubstr("softmax_cross_entropy"));
    EXPECT_THAT(msg, HasSubstr(arg));
  };
  expect_msg(error_of([&] { ops::softmax_cross_entropy(losses, d, logits.view(Shape{N * Vp}), targets, Vp, 1); }),
             "'logits'");
  expect_msg(error_of([&] {
               ops::softmax_cross_entropy(losses, d, Tensor::empty(Shape{N, Vp}, DType::f16), targets, Vp, 1);
             }),
             "'logits'");
  expect_msg(error_of([&] { ops::softmax_cross_entropy(losses, d, logits, targets.slice(0, 3), Vp, 1); }), "'targets'");
  expect_msg(error_of([&] {
               ops::softmax_cross_entropy(losses, d, logits, Tensor::empty(Shape{N}, DType::i64), Vp, 1);
             }),
             "'targets'");
  expect_msg(error_of([&] {
               ops::softmax_cross_entropy(Tensor::empty(Shape{N}, DType::bf16), d, logits, targets, Vp, 1);
             }),
             "'losses'");
  expect_msg(error_of([&] {
               ops::softmax_cross_entropy(losses, Tensor::empty(Shape{N, Vp + 1}, DType::f32), logits, targets, Vp, 1);
             }),
             "'dlogits'");
  expect_msg(error_of([&] {
               ops::softmax_cross_entropy(losses, Tensor::empty(Shape{N, Vp}, DType::bf16), logits, targets, Vp, 1);
             }),
             "'dlogits'");
  expect_msg(error_of([&] { ops::softmax_cross_entropy(losses, d, logits, targets, 0, 1); }), "vocab");
  expect_msg(error_of([&] { ops::softmax_cross_entropy(losses, d, logits, targets, Vp + 1, 1); }), "vocab");
  expect_msg(error_of([&] {
               ops::softmax_cross_entropy(losses, d, logits, fake_cuda(Shape{N}, DType::i32), Vp, 1);
             }),
             "'targets'");
  // dlogits partially overlapping logits.
  Tensor big = Tensor::empty(Shape{N + 1, Vp}, DType::f32);
  expect_msg(error_of([&] { ops::softmax_cross_entropy(losses, big.slice(1, N + 1), big.slice(0, N), targets, Vp, 1); }),
             "'dlogits'");
  // A target >= vocab: named with its row, and nothing is written.
  poison(losses);
  poison(d);
  test::store_f64(logits, 0, 0.0);
  targets.data<int32_t>()[2] = 7;
  const std::string msg = error_of([&] { ops::softmax_cross_entropy(losses, d, logits, targets, 7, 1); });
  expect_msg(msg, "target 7");
  EXPECT_THAT(msg, HasSubstr("row 2"));
  EXPECT_THAT(msg, HasSubstr("vocab (7)"));
  for (int64_t n = 0; n < N; ++n) EXPECT_TRUE(std::isnan(losses.data<float>()[n]));
  for (int64_t i = 0; i < N * Vp; ++i) EXPECT_TRUE(std::isnan(d.data<float>()[i]));
}

}  // namespace
}  // namespace zt

namespace zt {
namespace {

// The three vocabulary-parallel passes over tp column slices of one (N, Vp)
// logits matrix, with the max and sum reductions done here in slice order
// (as the tensor-parallel group does): losses and every slice's dlogits
// against the float64 reference of the whole row.
TEST(CrossEntropyTest, VocabParallelSlicesMatchFloat64) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(23);
  struct VpCase {
    int64_t N, Vp, V, tp;
  };
  // Slices of ceil(Vp / tp) columns; the last ones may be all padding.
  const VpCase cases[] = {{5, 101, 101, 4}, {7, 128, 97, 2}, {3, 10, 9, 4}, {9, 1000, 997, 3}, {4, 64, 1, 4}};
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const VpCase& c : cases) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " N=" + std::to_string(c.N) + " Vp=" + std::to_string(c.Vp) +
                   " V=" + std::to_string(c.V) + " tp=" + std::to_string(c.tp));
      const int64_t Vl = (c.Vp + c.tp - 1) / c.tp;
      Tensor logits = random_tensor(Shape{c.N, c.Vp}, dt, rng, -6, 6);
      Tensor targets = make_targets(c.N, c.V, rng, 0.2);
      const auto tg = targets_vec(targets);
      const float scale = 0.29f;
      const Ref ref = reference(to_f64(logits), tg, c.N, c.Vp, c.V, scale);
      // Slice r holds columns [r Vl, r Vl + Vl) (past Vp: padding filled with junk that must be ignored).
      std::vector<Tensor> slices;
      for (int64_t r = 0; r < c.tp; ++r) {
        Tensor s = random_tensor(Shape{c.N, Vl}, dt, rng, 50, 60);
        for (int64_t n = 0; n < c.N; ++n)
          for (int64_t j = 0; j < Vl && r * Vl + j < c.Vp; ++j)
            test::store_f64(s, n * Vl + j, test::load_f64(logits, n * c.Vp + r * Vl + j));
        slices.push_back(s);
      }
      auto row_tensor = [&] {
        Tensor t = Tensor::empty(Shape{c.N}, DType::f32);
        poison(t);
        return t;
      };
      Tensor max_all = row_tensor(), sum_all = row_tensor(), tl_all = row_tensor();
      for (int64_t r = 0; r < c.tp; ++r) {
        Tensor m = row_tensor();
        ops::vocab_parallel_ce_max(m, slices[size_t(r)], r * Vl, c.V);
        for (int64_t n = 0; n < c.N; ++n)
          max_all.data<float>()[n] = r == 0 ? m.data<float>()[n] : std::max(max_all.data<float>()[n], m.data<float>()[n]);
      }
      for (int64_t r = 0; r < c.tp; ++r) {
        Tensor s = row_tensor(), tl = row_tensor();
        ops::vocab_parallel_ce_sums(s, tl, slices[size_t(r)], max_all, targets, r * Vl, c.V);
        for (int64_t n = 0; n < c.N; ++n) {
          sum_all.data<float>()[n] = (r == 0 ? 0.0f : sum_all.data<float>()[n]) + s.data<float>()[n];
          tl_all.data<float>()[n] = (r == 0 ? 0.0f : tl_all.data<float>()[n]) + tl.data<float>()[n];
        }
      }
      for (int64_t r = 0; r < c.tp; ++r) {
        Tensor losses = row_tensor(), d = Tensor::empty(Shape{c.N, Vl}, dt);
        poison(d);
        ops::vocab_parallel_ce_finish(losses, d, slices[size_t(r)], max_all, sum_all, tl_all, targets, r * Vl, c.V,
                                      scale);
        EXPECT_TRUE(test::all_close(losses, ref.loss, 1e-5, 1e-6));
        // This slice's columns of the reference gradient (0 past the vocabulary).
        std::vector<double> want(size_t(c.N * Vl), 0.0);
        for (int64_t n = 0; n < c.N; ++n)
          for (int64_t j = 0; j < Vl && r * Vl + j < c.Vp; ++j) want[size_t(n * Vl + j)] = ref.dlogits[size_t(n * c.Vp + r * Vl + j)];
        EXPECT_TRUE(test::all_close(d, want, dt == DType::f32 ? 1e-5 : 1e-2, 1e-6 * scale)) << "slice " << r;
        for (int64_t n = 0; n < c.N; ++n)
          for (int64_t j = 0; j < Vl; ++j)
            if (r * Vl + j >= c.V || tg[size_t(n)] < 0) {
              ASSERT_EQ(test::load_f64(d, n * Vl + j), 0.0) << "slice " << r << " row " << n << " column " << j;
            }
        // In place gives the same bits.
        Tensor inplace = Tensor::empty(Shape{c.N, Vl}, dt);
        std::memcpy(inplace.data_ptr(), slices[size_t(r)].data_ptr(), inplace.nbytes());
        Tensor losses2 = row_tensor();
        ops::vocab_parallel_ce_finish(losses2, inplace, inplace, max_all, sum_all, tl_all, targets, r * Vl, c.V, scale);
        EXPECT_EQ(std::memcmp(d.data_ptr(), inplace.data_ptr(), d.nbytes()), 0);
      }
    }
  }
}

TEST(CrossEntropyTest, VocabParallelRejectsTargetsPastTheVocabulary) {
  Tensor logits = Tensor::empty(Shape{2, 8}, DType::f32), m = Tensor::empty(Shape{2}, DType::f32);
  ops::fill(logits, 0.5);
  ops::fill(m, 0.5);
  Tensor s = Tensor::empty(Shape{2}, DType::f32), tl = Tensor::empty(Shape{2}, DType::f32);
  Tensor targets = Tensor::empty(Shape{2}, DType::i32);
  targets.data<int32_t>()[0] = 3;
  targets.data<int32_t>()[1] = 40;
  EXPECT_THAT(error_of([&] { ops::vocab_parallel_ce_sums(s, tl, logits, m, targets, 8, 20); }),
              HasSubstr("target 40 at row 1 is out of range"));
}

}  // namespace
}  // namespace zt
