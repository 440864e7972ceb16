// Fused AdamW against a float64 reference over several steps.
//
// Tolerances: the kernel works in f32, so each step rounds p, m and v once
// (plus a few ulp inside the update). Over 5 steps with |p| ~ 1 and updates
// ~lr: master rtol 2e-6 (~30 f32 ulp). Where p crosses zero its error is
// absolute: lr * (error of the O(1) update, ~1e-6 after m's cancellation) per
// step, so atol 5e-6 * lr over 5 steps (seen: ~0.4e-6 * lr). v = sum of positive terms: rtol 1e-5.
// m can cancel (beta1 m + (1 - beta1) g with opposite signs), so its error is
// absolute, ~ulp of max|g|: atol 1e-6 * max|g|. bf16 grads are compared with
// the reference of the bf16 values (exact in f32).
#include "ops/adamw.h"

#include <cstdint>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
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

void set_all(const Tensor& t, double value) {
  for (int64_t i = 0; i < t.numel(); ++i) test::store_f64(t, i, value);
}

struct State {
  std::vector<double> p, m, v;
};

// One AdamW step in float64, exactly as the contract writes it.
void reference_step(State& s, const std::vector<double>& grad, const ops::AdamWParams& hp) {
  const double b1 = hp.beta1, b2 = hp.beta2;
  const double bc1 = 1.0 - std::pow(b1, double(hp.step)), bc2 = 1.0 - std::pow(b2, double(hp.step));
  for (size_t i = 0; i < s.p.size(); ++i) {
    const double g = grad[i] * double(hp.grad_scale);
    s.m[i] = b1 * s.m[i] + (1.0 - b1) * g;
    s.v[i] = b2 * s.v[i] + (1.0 - b2) * g * g;
    const double update = (s.m[i] / bc1) / (std::sqrt(s.v[i] / bc2) + double(hp.eps));
    s.p[i] -= double(hp.lr) * (update + double(hp.weight_decay) * s.p[i]);
  }
}

// The copy must be the master rounded by core/dtype.h, bit for bit.
void expect_copy_is_rounded_master(const Tensor& copy, const Tensor& master) {
  const float* p = master.data<float>();
  for (int64_t i = 0; i < master.numel(); ++i) {
    switch (copy.dtype()) {
      case DType::bf16: ASSERT_EQ(copy.data<bf16>()[i].bits, float_to_bf16(p[i]).bits) << i; break;
      case DType::f16: ASSERT_EQ(copy.data<f16>()[i].bits, float_to_f16(p[i]).bits) << i; break;
      case DType::f32:
        ASSERT_EQ(std::bit_cast<uint32_t>(copy.data<float>()[i]), std::bit_cast<uint32_t>(p[i])) << i;
        break;
      default: FAIL();
    }
  }
}

TEST(AdamWTest, SeveralStepsMatchFloat64) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(21);
  for (DType gdt : {DType::f32, DType::bf16}) {
    for (int copy_kind = 0; copy_kind < 4; ++copy_kind) {  // none, bf16, f16, f32
      for (int64_t n : {1, 7, 1000, 70001}) {
        const DType copy_dt[] = {DType::f32, DType::bf16, DType::f16, DType::f32};
        SCOPED_TRACE("grad " + std::string(dtype_name(gdt)) + " copy " +
                     (copy_kind == 0 ? std::string("none") : std::string(dtype_name(copy_dt[copy_kind]))) +
                     " n=" + std::to_string(n));
        Tensor p = random_tensor(Shape{n}, DType::f32, rng, -1, 1);
        Tensor m = Tensor::empty(Shape{n}, DType::f32), v = Tensor::empty(Shape{n}, DType::f32);
        set_all(m, 0.0);
        set_all(v, 0.0);
        Tensor copy = copy_kind ? Tensor::empty(Shape{n}, copy_dt[copy_kind]) : Tensor();
        State ref{to_f64(p), std::vector<double>(size_t(n), 0.0), std::vector<double>(size_t(n), 0.0)};
        ops::AdamWParams hp;
        hp.lr = 1e-2f;
        hp.beta1 = 0.9f;
        hp.beta2 = 0.95f;
        hp.eps = 1e-8f;
        hp.weight_decay = 0.1f;
        hp.grad_scale = 0.5f;
        double gmax = 0;
        for (int64_t step = 1; step <= 5; ++step) {
          hp.step = step;
          // Gradients of varied magnitude, some exactly zero.
          Tensor g = random_tensor(Shape{n}, gdt, rng, -1, 1);
          for (int64_t i = 0; i < n; i += 13) test::store_f64(g, i, 0.0);
          for (int64_t i = 5; i < n; i += 17) test::store_f64(g, i, test::load_f64(g, i) * 1e-4);
          const auto gv = to_f64(g);
          for (double x : gv) gmax = std::max(gmax, std::fabs(x) * hp.grad_scale);
          if (copy.defined()) poison(copy);
          ops::adamw_step(p, g, m, v, copy, hp);
          reference_step(ref, gv, hp);
          if (copy.defined()) expect_copy_is_rounded_master(copy, p);
        }
        EXPECT_TRUE(test::all_close(p, ref.p, 2e-6, 5e-6 * double(hp.lr)));
        EXPECT_TRUE(test::all_close(m, ref.m, 1e-5, 1e-6 * gmax));
        EXPECT_TRUE(test::all_close(v, ref.v, 1e-5, 1e-12 * gmax * gmax));
      }
    }
  }
}

TEST(AdamWTest, BiasCorrectionAndWeightDecayAtLateStep) {
  ZT_TEST_TRACE_SEED();
  // Step 1000 (bias correction ~1 for beta1, not for beta2 = 0.999), big
  // weight decay, non-trivial state: exercises every term of the update.
  auto rng = make_rng(22);
  const int64_t n = 513;
  Tensor p = random_tensor(Shape{n}, DType::f32, rng, -2, 2);
  Tensor m = random_tensor(Shape{n}, DType::f32, rng, -0.1, 0.1);
  Tensor v = random_tensor(Shape{n}, DType::f32, rng, 1e-6, 1e-2);
  Tensor g = random_tensor(Shape{n}, DType::f32, rng, -0.3, 0.3);
  State ref{to_f64(p), to_f64(m), to_f64(v)};
  ops::AdamWParams hp;
  hp.lr = 3e-3f;
  hp.beta1 = 0.8f;
  hp.beta2 = 0.999f;
  hp.eps = 1e-6f;
  hp.weight_decay = 0.5f;
  hp.step = 1000;
  hp.grad_scale = 2.0f;
  ops::adamw_step(p, g, m, v, Tensor(), hp);
  reference_step(ref, to_f64(g), hp);
  EXPECT_TRUE(test::all_close(p, ref.p, 1e-6, 1e-6 * double(hp.lr)));
  EXPECT_TRUE(test::all_close(m, ref.m, 1e-5, 1e-7));
  EXPECT_TRUE(test::all_close(v, ref.v, 1e-5, 1e-12));

  // Zero gradient and zero state: only decoupled weight decay acts.
  set_all(m, 0.0);
  set_all(v, 0.0);
  set_all(g, 0.0);
  const auto before = to_f64(p);
  hp.step = 1;
  ops::adamw_step(p, g, m, v, Tensor(), hp);
  std::vector<double> want(before.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = before[i] * (1.0 - double(hp.lr) * double(hp.weight_decay));
  EXPECT_TRUE(test::all_close(p, want, 1e-6, 0));
}

// --- stochastic rounding of the bf16 model copy ------------------------------------

// bf16 neighbours of f (finite): the truncation and the next value up in magnitude.
std::pair<uint16_t, uint16_t> bf16_neighbours(float f) {
  const uint16_t lo = uint16_t(std::bit_cast<uint32_t>(f) >> 16);
  return {lo, uint16_t(lo + ((std::bit_cast<uint32_t>(f) & 0xffffu) ? 1 : 0))};
}

// One step with lr = 0 (the master stays as set) writing a stochastically
// rounded copy of `values`.
std::vector<uint16_t> rounded_copy(const std::vector<float>& values, uint64_t seed, int64_t step, int64_t offset) {
  const int64_t n = int64_t(values.size());
  Tensor p = Tensor::empty(Shape{n}, DType::f32), g = Tensor::empty(Shape{n}, DType::f32);
  Tensor m = Tensor::empty(Shape{n}, DType::f32), v = Tensor::empty(Shape{n}, DType::f32);
  Tensor copy = Tensor::empty(Shape{n}, DType::bf16);
  std::memcpy(p.data<float>(), values.data(), values.size() * sizeof(float));
  set_all(g, 0.5);
  set_all(m, 0.0);
  set_all(v, 0.0);
  poison(copy);
  ops::AdamWParams hp;
  hp.lr = 0.0f;
  hp.step = step;
  hp.stochastic_rounding = true;
  hp.rounding_seed = seed;
  hp.rounding_offset = offset;
  ops::adamw_step(p, g, m, v, copy, hp);
  std::vector<uint16_t> bits(values.size());
  for (int64_t i = 0; i < n; ++i) bits[size_t(i)] = copy.data<bf16>()[i].bits;
  return bits;
}

TEST(AdamWTest, StochasticRoundingPicksANeighbourWithoutBias) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(31);
  const int64_t n = int64_t(1) << 20;
  // A quarter at 1 + 0.3 ulp (ulp = 2^-7 at 1), a quarter at its negative,
  // half random of every magnitude from 1e-30 to 1e30.
  const float x = 1.0f + 0.3f * 0x1p-7f;
  std::vector<float> values(static_cast<size_t>(n));
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t q = i % 4;
    values[size_t(i)] = q == 0 ? x : q == 1 ? -x
                        : std::ldexp(mant(rng), int(rng() % 200) - 100) * ((rng() & 1) ? 1.0f : -1.0f);
  }
  const std::vector<uint16_t> bits = rounded_copy(values, rng(), 3, 0);
  int64_t up_x = 0, up_neg = 0;
  double bias = 0, variance = 0;  // sum of (copy - master), and its variance under the contract
  for (int64_t i = 0; i < n; ++i) {
    const float f = values[size_t(i)];
    const auto [lo, hi] = bf16_neighbours(f);
    const uint16_t b = bits[size_t(i)];
    ASSERT_TRUE(b == lo || b == hi) << "element " << i << " = " << f << ": bits " << b << " not " << lo << "/" << hi;
    const double lo_v = bf16_to_float(bf16{lo}), hi_v = bf16_to_float(bf16{hi});
    const double frac = hi == lo ? 0.0 : (double(f) - lo_v) / (hi_v - lo_v);  // P(round up)
    bias += double(bf16_to_float(bf16{b})) - double(f);
    variance += (hi_v - lo_v) * (hi_v - lo_v) * frac * (1 - frac);
    if (i % 4 == 0) up_x += b == hi;
    if (i % 4 == 1) up_neg += b == hi;
  }
  // 0.3 of each, within 6 standard deviations; the total error within 6 of its own.
  const double count = double(n / 4), sd = std::sqrt(count * 0.3 * 0.7);
  EXPECT_NEAR(double(up_x), 0.3 * count, 6 * sd);
  EXPECT_NEAR(double(up_neg), 0.3 * count, 6 * sd);
  EXPECT_LT(std::fabs(bias), 6 * std::sqrt(variance)) << "the rounding is biased";
  // The rounding itself (an AdamW step turns an infinite master into NaN):
  // representable values stay, NaN becomes the quiet NaN float_to_bf16
  // gives, infinities stay, whatever the random word.
  const float special[] = {1.0f, -2.5f, 0.0f, -0.0f, 0x1p-130f, INFINITY, -INFINITY, NAN,
                           std::bit_cast<float>(0x7fbfffffu)};  // a signalling NaN
  for (uint32_t r : {0u, 1u, 0x7fffu, 0x8000u, 0xffffu, 0xffffffffu, uint32_t(rng())})
    for (float f : special) EXPECT_EQ(float_to_bf16_bits_stochastic(f, r), float_to_bf16(f).bits) << f << " " << r;
  // Beyond the largest bf16 (0x7f7f) a value rounds to infinity with the
  // probability that it lies beyond: here 3/4 of the way.
  const float beyond = std::bit_cast<float>(0x7f7fc000u);
  EXPECT_EQ(float_to_bf16_bits_stochastic(beyond, 0x3fffu), 0x7f7fu);
  EXPECT_EQ(float_to_bf16_bits_stochastic(beyond, 0x4000u), 0x7f80u);
}

TEST(AdamWTest, StochasticRoundingBitsDependOnPositionStepAndSeedOnly) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(32);
  const int64_t n = 5000;
  std::vector<float> values(static_cast<size_t>(n));
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (auto& f : values) f = u(rng);
  const uint64_t seed = rng();
  const std::vector<uint16_t> whole = rounded_copy(values, seed, 5, 100);
  EXPECT_EQ(rounded_copy(values, seed, 5, 100), whole) << "not repeatable";
  // Split into two calls at an odd point, each told where it starts.
  const int64_t cut = 1237;
  std::vector<float> a(values.begin(), values.begin() + cut), b(values.begin() + cut, values.end());
  std::vector<uint16_t> split = rounded_copy(a, seed, 5, 100);
  const std::vector<uint16_t> tail = rounded_copy(b, seed, 5, 100 + cut);
  split.insert(split.end(), tail.begin(), tail.end());
  EXPECT_EQ(split, whole) << "the bits depend on how the buffer is split";
  // The word is the documented one.
  for (int64_t i = 0; i < n; i += 97)
    EXPECT_EQ(whole[size_t(i)], float_to_bf16_bits_stochastic(values[size_t(i)], philox_word_at(seed, 5, 100 + i)));
  // Another step, seed or position draws other bits (each element rounds
  // differently with probability ~1/2 or less; thousands cannot all agree).
  auto differing = [&](const std::vector<uint16_t>& other) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; ++i) d += other[size_t(i)] != whole[size_t(i)];
    return d;
  };
  EXPECT_GT(differing(rounded_copy(values, seed, 6, 100)), n / 20) << "step";
  EXPECT_GT(differing(rounded_copy(values, seed + 1, 5, 100)), n / 20) << "seed";
  EXPECT_GT(differing(rounded_copy(values, seed, 5, 101)), n / 20) << "offset";
}

TEST(AdamWTest, BadArguments) {
  ZT_TEST_TRACE_SEED();
  const int64_t n = 12;
  Tensor p = Tensor::empty(Shape{3, 4}, DType::f32), g = Tensor::empty(Shape{n}, DType::bf16);
  Tensor m = Tensor::empty(Shape{n}, DType::f32), v = Tensor::empty(Shape{4, 3}, DType::f32);
  Tensor copy = Tensor::empty(Shape{n}, DType::bf16);
  set_all(p, 1.0);
  set_all(g, 1.0);
  set_all(m, 0.0);
  set_all(v, 0.0);
  ops::AdamWParams hp;
  auto expect_msg = [](const std::string& msg, const char* what) {
    EXPECT_THAT(msg, HasSubstr("adamw_step"));
    EXPECT_THAT(msg, HasSubstr(what));
  };
  // Shapes of equal numel are fine.
  EXPECT_NO_THROW(ops::adamw_step(p, g, m, v, copy, hp));
  expect_msg(error_of([&] { ops::adamw_step(copy, g, m, v, Tensor(), hp); }), "'master'");
  expect_msg(error_of([&] { ops::adamw_step(p, Tensor::empty(Shape{n}, DType::f16), m, v, copy, hp); }), "'grad'");
  expect_msg(error_of([&] { ops::adamw_step(p, g, Tensor::empty(Shape{n + 1}, DType::f32), v, copy, hp); }), "'m'");
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, Tensor::empty(Shape{n}, DType::bf16), copy, hp); }), "'v'");
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, Tensor::empty(Shape{n}, DType::i32), hp); }),
             "'model_copy'");
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, Tensor::empty(Shape{n - 1}, DType::bf16), hp); }),
             "'model_copy'");
  expect_msg(error_of([&] { ops::adamw_step(p, fake_cuda(Shape{n}, DType::bf16), m, v, copy, hp); }), "'grad'");
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, m, copy, hp); }), "'m' f32(12) on cpu overlaps 'v'");
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, p, hp); }), "'master' f32(3, 4) on cpu overlaps 'model_copy'");
  ops::AdamWParams bad = hp;
  bad.step = 0;
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, copy, bad); }), "step");
  bad = hp;
  bad.beta1 = 1.0f;
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, copy, bad); }), "beta1");
  bad = hp;
  bad.beta2 = -0.1f;
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, copy, bad); }), "beta2");
  bad = hp;
  bad.lr = NAN;
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, copy, bad); }), "lr");
  bad = hp;
  bad.stochastic_rounding = true;
  EXPECT_NO_THROW(ops::adamw_step(p, g, m, v, copy, bad));
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, Tensor::empty(Shape{n}, DType::f16), bad); }),
             "stochastic rounding writes a bf16 model copy, but 'model_copy' is f16");
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, Tensor(), bad); }), "'model_copy' is undefined");
  bad.rounding_offset = -1;
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, copy, bad); }), "rounding_offset");
  bad = hp;
  bad.no_decay = {{5, 9}, {7, 12}};
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, copy, bad); }), "no_decay span 1 [7, 12)");
  bad.no_decay = {{5, 5}};
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, copy, bad); }), "sorted and disjoint");
  bad.no_decay = {{5, n + 1}};
  expect_msg(error_of([&] { ops::adamw_step(p, g, m, v, copy, bad); }), "within the");
}

// Weight decay off in spans: every element gets the bits of a call on its run
// of one rule alone (with the run's rounding offset), and the float64
// reference with decay only outside the spans.
TEST(AdamWTest, NoDecaySpansEqualACallPerRun) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(24);
  const int64_t n = 1000;
  const Tensor p0 = random_tensor(Shape{n}, DType::f32, rng, -2, 2), g = random_tensor(Shape{n}, DType::bf16, rng);
  const Tensor m0 = random_tensor(Shape{n}, DType::f32, rng, -0.1, 0.1);
  const Tensor v0 = random_tensor(Shape{n}, DType::f32, rng, 1e-6, 1e-2);
  ops::AdamWParams hp;
  hp.lr = 1e-2f;
  hp.weight_decay = 0.5f;
  hp.step = 3;
  hp.stochastic_rounding = true;
  hp.rounding_seed = 77;
  hp.rounding_offset = 4099;
  hp.no_decay = {{0, 30}, {300, 301}, {520, 777}, {990, 1000}};
  auto fresh = [](const Tensor& t) {
    Tensor c = Tensor::empty(t.shape(), t.dtype());
    std::memcpy(c.data_ptr(), t.data_ptr(), t.nbytes());
    return c;
  };
  Tensor p = fresh(p0), m = fresh(m0), v = fresh(v0), copy = Tensor::empty(Shape{n}, DType::bf16);
  ops::adamw_step(p, g, m, v, copy, hp);
  Tensor rp = fresh(p0), rm = fresh(m0), rv = fresh(v0), rcopy = Tensor::empty(Shape{n}, DType::bf16);
  const std::array<std::array<int64_t, 3>, 7> runs = {
      {{0, 30, 0}, {30, 300, 1}, {300, 301, 0}, {301, 520, 1}, {520, 777, 0}, {777, 990, 1}, {990, 1000, 0}}};
  for (const auto& [begin, end, decays] : runs) {
    ops::AdamWParams run = hp;
    run.no_decay.clear();
    run.weight_decay = decays ? hp.weight_decay : 0.0f;
    run.rounding_offset = hp.rounding_offset + begin;
    const Shape len{end - begin};
    ops::adamw_step(rp.flat_view(begin, len), g.flat_view(begin, len), rm.flat_view(begin, len),
                    rv.flat_view(begin, len), rcopy.flat_view(begin, len), run);
  }
  EXPECT_EQ(to_f64(p), to_f64(rp));
  EXPECT_EQ(to_f64(m), to_f64(rm));
  EXPECT_EQ(to_f64(v), to_f64(rv));
  EXPECT_EQ(to_f64(copy), to_f64(rcopy));
  // Against float64: decayed and undecayed runs, one step each.
  State ref{to_f64(p0), to_f64(m0), to_f64(v0)};
  State undecayed = ref;
  ops::AdamWParams no_wd = hp;
  no_wd.weight_decay = 0.0f;
  reference_step(ref, to_f64(g), hp);
  reference_step(undecayed, to_f64(g), no_wd);
  for (const auto& [begin, end] : hp.no_decay)
    for (int64_t i = begin; i < end; ++i) ref.p[size_t(i)] = undecayed.p[size_t(i)];
  EXPECT_TRUE(test::all_close(p, ref.p, 1e-6, 1e-6 * double(hp.lr)));
}

}  // namespace
}  // namespace zt
