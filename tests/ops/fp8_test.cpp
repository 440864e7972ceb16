// Per-tensor fp8 quantisation and the linear layer on fp8 operands against
// float64 references on fresh random inputs (outputs poisoned first).
//
// Quantisation: the scale a power of two with amax * scale in (max/2, max];
// every code the round-to-nearest-even of x * scale on the format's grid,
// written here from the format's definition (exponent and mantissa bits,
// subnormals, saturation at max); a non-finite input a NaN code. Products:
// against float64 products of the dequantised operands, within f32
// accumulation (1e-5 relative to the sum of |terms|) for f32 outputs and one
// bf16 rounding more for bf16; and against the unquantised operands within
// what E4M3's 3 mantissa bits allow.
#include "ops/fp8.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using test::error_of;
using test::load_f64;
using test::make_rng;
using test::poison;
using test::random_tensor;
using test::to_f64;

struct Format {
  DType dtype;
  int exp_bits, man_bits;
  double max;
};
const Format kE4M3{DType::f8e4m3, 4, 3, 448.0};
const Format kE5M2{DType::f8e5m2, 5, 2, 57344.0};

// v rounded to the format's grid: nearest, ties to even, saturating at max.
double round_to_format(double v, const Format& f) {
  if (v == 0) return 0;
  const int emin = 2 - (1 << (f.exp_bits - 1));  // 1 - bias
  const double a = std::fabs(v);
  const int E = std::max(int(std::floor(std::log2(a))), emin);
  const double ulp = std::ldexp(1.0, E - f.man_bits);
  const double r = std::min(std::nearbyint(a / ulp) * ulp, f.max);
  return std::copysign(r, v);
}

TEST(Fp8, ScaleIsThePowerOfTwoThatFillsTheTopBinade) {
  auto rng = make_rng();
  std::uniform_real_distribution<double> exponent(-30, 30);
  for (const Format& f : {kE4M3, kE5M2})
    for (int i = 0; i < 1000; ++i) {
      const float amax = float(std::pow(2.0, exponent(rng)));
      const float s = ops::fp8_scale(amax, f.dtype);
      int e = 0;
      EXPECT_EQ(std::frexp(double(s), &e), 0.5) << "a power of two: " << s;
      EXPECT_LE(double(amax) * s, f.max) << amax;
      EXPECT_GT(double(amax) * s, f.max / 2) << amax;
    }
  EXPECT_EQ(ops::fp8_scale(0.0f, DType::f8e4m3), 1.0f);
  EXPECT_EQ(ops::fp8_scale(INFINITY, DType::f8e4m3), 1.0f);
  EXPECT_EQ(ops::fp8_scale(NAN, DType::f8e5m2), 1.0f);
  EXPECT_EQ(ops::fp8_scale(1e-44f, DType::f8e4m3), std::ldexp(1.0f, 127)) << "clamped: stays a finite f32";
  EXPECT_THAT(error_of([] { ops::fp8_scale(1.0f, DType::bf16); }), HasSubstr("must be f8e4m3 or f8e5m2"));
}

TEST(Fp8, QuantiseRoundsEveryElementOnTheScaledGrid) {
  auto rng = make_rng();
  for (const Format& f : {kE4M3, kE5M2})
    for (DType dt : {DType::f32, DType::bf16})
      for (const auto& [shape, magnitude] : std::vector<std::pair<Shape, double>>{
               {Shape{1}, 1.0}, {Shape{7, 5}, 3e-3}, {Shape{64, 33}, 250.0}, {Shape{3, 4, 129}, 1e5}}) {
        const Tensor x = random_tensor(shape, dt, rng, -magnitude, magnitude);
        const Tensor q = Tensor::empty(shape, f.dtype), s = Tensor::empty(Shape{1}, DType::f32);
        poison(q);
        poison(s);
        ops::quantize_fp8(q, s, x);
        double amax = 0;
        for (double v : to_f64(x)) amax = std::max(amax, std::fabs(v));
        const double scale = 1.0 / load_f64(s, 0);
        EXPECT_EQ(double(ops::fp8_scale(float(amax), f.dtype)), scale);
        for (int64_t i = 0; i < x.numel(); ++i) {
          const double want = round_to_format(load_f64(x, i) * scale, f);
          ASSERT_EQ(load_f64(q, i), want) << "element " << i << " of " << shape.str() << " (seed " << test::test_seed()
                                           << ")";
        }
        // Dequantised: exactly q / scale, within the format's half ulp of x.
        const Tensor back = Tensor::empty(shape, DType::f32);
        poison(back);
        ops::dequantize_fp8(back, q, s);
        for (int64_t i = 0; i < x.numel(); ++i) {
          ASSERT_EQ(load_f64(back, i), load_f64(q, i) / scale);
          const double a = std::fabs(load_f64(x, i));
          const double bound = std::ldexp(std::max(a, amax * std::ldexp(1.0, -20)), -f.man_bits - 1) +
                               std::ldexp(1.0, -f.man_bits - (1 << (f.exp_bits - 1)) + 1) / scale;
          ASSERT_LE(std::fabs(load_f64(back, i) - load_f64(x, i)), bound) << i;
        }
      }
}

// An inf or NaN anywhere stays visible as NaN (saturating it would hide an
// overflow from the step's checks); the scale falls back to 1.
TEST(Fp8, NonFiniteInputsBecomeNaNCodes) {
  for (const Format& f : {kE4M3, kE5M2}) {
    const Tensor x = test::tensor_from({1.5, INFINITY, -2.0, NAN}, Shape{4}, DType::f32);
    const Tensor q = Tensor::empty(Shape{4}, f.dtype), s = Tensor::empty(Shape{1}, DType::f32);
    ops::quantize_fp8(q, s, x);
    EXPECT_EQ(load_f64(s, 0), 1.0);
    EXPECT_EQ(load_f64(q, 0), 1.5);
    EXPECT_TRUE(std::isnan(load_f64(q, 1)));
    EXPECT_EQ(load_f64(q, 2), -2.0);
    EXPECT_TRUE(std::isnan(load_f64(q, 3)));
  }
}

struct Quantised {
  Tensor q, s;
  std::vector<double> values;  // dequantised, float64
};
Quantised quantised(const Tensor& x, DType format) {
  Quantised r{Tensor::empty(x.shape(), format), Tensor::empty(Shape{1}, DType::f32), {}};
  ops::quantize_fp8(r.q, r.s, x);
  for (int64_t i = 0; i < x.numel(); ++i) r.values.push_back(load_f64(r.q, i) * load_f64(r.s, 0));
  return r;
}

// out (N, O) = a (N, K) b^T (O, K), and the sum of |terms| per element.
void product(const std::vector<double>& a, const std::vector<double>& b, int64_t N, int64_t K, int64_t O,
             std::vector<double>& out, std::vector<double>& mag) {
  out.assign(size_t(N * O), 0.0);
  mag.assign(size_t(N * O), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t k = 0; k < K; ++k) {
        const double t = a[size_t(n * K + k)] * b[size_t(o * K + k)];
        out[size_t(n * O + o)] += t;
        mag[size_t(n * O + o)] += std::fabs(t);
      }
}

void expect_within(const Tensor& got, const std::vector<double>& ref, const std::vector<double>& mag, double rel,
                   const char* what) {
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double tol = rel * mag[size_t(i)] + std::ldexp(std::fabs(ref[size_t(i)]), got.dtype() == DType::bf16 ? -8 : -30);
    ASSERT_LE(std::fabs(load_f64(got, i) - ref[size_t(i)]), tol)
        << what << " element " << i << " (seed " << test::test_seed() << ")";
  }
}

struct LinearCase {
  int64_t N, I, O;
};
const LinearCase kLinearCases[] = {{1, 1, 1}, {5, 16, 3}, {64, 96, 48}, {33, 130, 17}};

TEST(Fp8, LinearForwardIsTheProductOfTheDequantisedOperands) {
  auto rng = make_rng();
  for (const LinearCase& c : kLinearCases)
    for (DType out : {DType::f32, DType::bf16}) {
      const Tensor x = random_tensor(Shape{c.N, c.I}, DType::f32, rng, -4, 4);
      const Tensor w = random_tensor(Shape{c.O, c.I}, DType::f32, rng, -0.1, 0.1);
      const Tensor b = random_tensor(Shape{c.O}, DType::f32, rng);
      const Tensor res = random_tensor(Shape{c.N, c.O}, out, rng);
      const Quantised xq = quantised(x, DType::f8e4m3), wq = quantised(w, DType::f8e4m3);
      std::vector<double> ref, mag;
      product(xq.values, wq.values, c.N, c.I, c.O, ref, mag);
      for (int64_t n = 0; n < c.N; ++n)
        for (int64_t o = 0; o < c.O; ++o) {
          ref[size_t(n * c.O + o)] += load_f64(b, o) + load_f64(res, n * c.O + o);
          mag[size_t(n * c.O + o)] += std::fabs(load_f64(b, o)) + std::fabs(load_f64(res, n * c.O + o));
        }
      const Tensor y = Tensor::empty(Shape{c.N, c.O}, out);
      poison(y);
      ops::fp8_linear_forward(y, xq.q, xq.s, wq.q, wq.s, b, res);
      expect_within(y, ref, mag, 1e-5, "y");
      // Against the unquantised operands: E4M3 keeps 3 mantissa bits, each
      // operand off by at most 2^-4 relative; the product by about twice that.
      std::vector<double> exact, exact_mag;
      product(to_f64(x), to_f64(w), c.N, c.I, c.O, exact, exact_mag);
      for (int64_t n = 0; n < c.N; ++n)
        for (int64_t o = 0; o < c.O; ++o) exact[size_t(n * c.O + o)] += load_f64(b, o) + load_f64(res, n * c.O + o);
      expect_within(y, exact, exact_mag, 0.14, "y against the unquantised operands");
    }
}

TEST(Fp8, LinearBackwardIsTheProductsOfTheDequantisedGradient) {
  auto rng = make_rng();
  for (const LinearCase& c : kLinearCases)
    for (ops::GradWrite write : {ops::GradWrite::overwrite, ops::GradWrite::accumulate}) {
      const Quantised xq = quantised(random_tensor(Shape{c.N, c.I}, DType::f32, rng, -4, 4), DType::f8e4m3);
      const Quantised wq = quantised(random_tensor(Shape{c.O, c.I}, DType::f32, rng, -0.1, 0.1), DType::f8e4m3);
      const Quantised dyq = quantised(random_tensor(Shape{c.N, c.O}, DType::f32, rng, -1e-3, 1e-3), DType::f8e5m2);
      // dx (N, I) = dy (N, O) w (O, I): the product of dy and w^T's rows.
      std::vector<double> wt(size_t(c.I * c.O));
      for (int64_t o = 0; o < c.O; ++o)
        for (int64_t i = 0; i < c.I; ++i) wt[size_t(i * c.O + o)] = wq.values[size_t(o * c.I + i)];
      std::vector<double> dx_ref, dx_mag;
      product(dyq.values, wt, c.N, c.O, c.I, dx_ref, dx_mag);
      // dw (O, I) = dy^T x: rows of dy^T against rows of x^T.
      std::vector<double> dyt(size_t(c.O * c.N)), xt(size_t(c.I * c.N));
      for (int64_t n = 0; n < c.N; ++n) {
        for (int64_t o = 0; o < c.O; ++o) dyt[size_t(o * c.N + n)] = dyq.values[size_t(n * c.O + o)];
        for (int64_t i = 0; i < c.I; ++i) xt[size_t(i * c.N + n)] = xq.values[size_t(n * c.I + i)];
      }
      std::vector<double> dw_ref, dw_mag;
      product(dyt, xt, c.O, c.N, c.I, dw_ref, dw_mag);
      const Tensor dw = random_tensor(Shape{c.O, c.I}, DType::f32, rng, -1e-3, 1e-3);
      if (write == ops::GradWrite::overwrite) {
        poison(dw);
      } else {
        for (int64_t i = 0; i < dw.numel(); ++i) {
          dw_ref[size_t(i)] += load_f64(dw, i);
          dw_mag[size_t(i)] += std::fabs(load_f64(dw, i));
        }
      }
      for (DType dxt : {DType::f32, DType::bf16}) {
        const Tensor dx = Tensor::empty(Shape{c.N, c.I}, dxt);
        poison(dx);
        ops::fp8_linear_backward(dx, Tensor(), dyq.q, dyq.s, Tensor(), Tensor(), wq.q, wq.s);  // x is not read for dx
        expect_within(dx, dx_ref, dx_mag, 1e-5, "dx");
      }
      ops::fp8_linear_backward(Tensor(), dw, dyq.q, dyq.s, xq.q, xq.s, Tensor(), Tensor(), write);  // nor w for dw
      expect_within(dw, dw_ref, dw_mag, 1e-5, "dw");
    }
}

TEST(Fp8, BadArgumentsNameTheOpAndTheArgument) {
  const Tensor x = Tensor::empty(Shape{4, 8}, DType::f32);
  const Tensor s = Tensor::empty(Shape{1}, DType::f32);
  EXPECT_THAT(error_of([&] { ops::quantize_fp8(Tensor::empty(Shape{4, 8}, DType::bf16), s, x); }),
              HasSubstr("quantize_fp8: 'q'"));
  EXPECT_THAT(error_of([&] { ops::quantize_fp8(Tensor::empty(Shape{4, 7}, DType::f8e4m3), s, x); }),
              HasSubstr("quantize_fp8: 'q'"));
  EXPECT_THAT(error_of([&] { ops::quantize_fp8(Tensor::empty(Shape{4, 8}, DType::f8e4m3), Tensor::empty(Shape{2}, DType::f32), x); }),
              HasSubstr("'scale_inv'"));
  const Tensor xq = Tensor::empty(Shape{4, 8}, DType::f8e4m3), wq = Tensor::empty(Shape{3, 9}, DType::f8e4m3);
  EXPECT_THAT(error_of([&] { ops::fp8_linear_forward(Tensor::empty(Shape{4, 3}, DType::f32), xq, s, wq, s, Tensor()); }),
              HasSubstr("do not share their last dimension"));
  EXPECT_THAT(error_of([&] {
                ops::fp8_linear_forward(Tensor::empty(Shape{4, 3}, DType::f32), xq, s,
                                        Tensor::empty(Shape{3, 8}, DType::bf16), s, Tensor());
              }),
              HasSubstr("fp8_linear_forward: 'wq'"));
  // The codes on a GPU and x on the CPU: named before any kernel runs.
  EXPECT_THAT(error_of([&] { ops::quantize_fp8(test::fake_cuda(Shape{4, 8}, DType::f8e4m3), s, x); }),
              HasSubstr("quantize_fp8: 'q' is on cuda:63"));
}

}  // namespace
}  // namespace zt
