// GeLU (tanh approximation) and SwiGLU (ops/activation.h): forward and
// backward against float64 references written here, the reference
// derivatives against central finite differences, in-place forms, special
// values, and argument validation.
//
// Tolerances (all_close: |got - ref| <= atol + rtol |ref|):
//   f32   rtol 1e-5. The kernels evaluate exp(-2u) (or exp(-g)) in f32: the
//         rounding of the exponent's argument z costs |z| 2^-24 relative, plus
//         ~1 ulp of polynomial and arithmetic. Measured over a dense sweep:
//         GeLU <= 2.1e-6 for |x| <= 6 (the range tested here; 6.5e-6 at
//         |x| <= 10), SiLU <= 1.8e-7: a 5x margin that still catches any
//         wrong term. Forwards: atol 1e-30 only for results that underflow.
//         Backwards: atol 1e-6 (|dy| <= 1): gelu'(x) crosses 0 near x = -0.75
//         and silu'(g) near g = -1.28, where the result is a difference of O(1)
//         terms and only its absolute error (measured <= 5e-8) is meaningful.
//   bf16  rtol 1e-2 against the reference of the bf16-rounded inputs (output
//         rounding is 2^-9 relative), same atol as f32; and separately the
//         bf16 kernels must equal from_float<bf16> of the f32 kernels, bitwise.
#include "ops/activation.h"

#include <cstdint>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "ops/device.h"
#include "test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using ::testing::AllOf;
using test::make_rng;
using test::poison;
using test::random_tensor;
using test::tensor_from;
using test::to_f64;
using Vec = std::vector<double>;

// --- float64 reference -----------------------------------------------------------

const double kK = std::sqrt(2.0 / M_PI), kC = 0.044715;

// GeLU by its definition, 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
// In double this cancels for x << 0 (1 + tanh(u) ~ 2 e^{2u} has lost ~4e-6 of
// its value to rounding by x = -6 and everything by x = -7), so it is only used
// to check the form the references use (TanhAndSigmoidFormsAgree).
double gelu_tanh_form(double x) { return 0.5 * x * (1.0 + std::tanh(kK * (x + kC * x * x * x))); }

// The references: 0.5 (1 + tanh(u)) = s = 1 / (1 + e), e = exp(-2u) (exact
// identity, no cancellation), in long double; 0.5 (1 - tanh(u)^2) = 2 s (1 - s)
// and 1 - s = e s.
double gelu_ref(double xd) {
  const long double x = xd, u = kK * (x + kC * x * x * x), e = std::exp(-2.0L * u);
  return double(x / (1.0L + e));
}
double gelu_grad_ref(double xd) {
  const long double x = xd, u = kK * (x + kC * x * x * x), e = std::exp(-2.0L * u);
  const long double s = 1.0L / (1.0L + e);
  if (std::isinf(e)) return 0.0;  // x -> -inf: s = 0 and e s -> 0
  return double(s + 2.0L * x * s * (e * s) * kK * (1.0L + 3.0L * kC * x * x));
}
double silu_ref(double g) { return double((long double)g / (1.0L + std::exp(-(long double)g))); }
double silu_grad_ref(double gd) {
  const long double g = gd, e = std::exp(-g), s = 1.0L / (1.0L + e);
  if (std::isinf(e)) return 0.0;
  return double(s + g * s * (e * s));
}

// x (N, 2H) rows [gate | up] -> y (N, H).
Vec swiglu_ref(const Vec& x, int64_t N, int64_t H) {
  Vec y(size_t(N * H));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < H; ++j)
      y[size_t(i * H + j)] = silu_ref(x[size_t(i * 2 * H + j)]) * x[size_t(i * 2 * H + H + j)];
  return y;
}
Vec swiglu_grad_ref(const Vec& dy, const Vec& x, int64_t N, int64_t H) {
  Vec dx(size_t(N * 2 * H));
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < H; ++j) {
      const double g = x[size_t(i * 2 * H + j)], u = x[size_t(i * 2 * H + H + j)], d = dy[size_t(i * H + j)];
      dx[size_t(i * 2 * H + j)] = d * u * silu_grad_ref(g);
      dx[size_t(i * 2 * H + H + j)] = d * silu_ref(g);
    }
  return dx;
}

double out_rtol(DType dt) { return dt == DType::f32 ? 1e-5 : 1e-2; }
constexpr double kFwdAtol = 1e-30, kBwdAtol = 1e-6;

using test::error_of;
using test::fake_cuda;

// --- the reference itself --------------------------------------------------------

TEST(ActivationReference, TanhAndSigmoidFormsAgree) {
  // Where the tanh form is still accurate in double (|x| <= 3: 1 + tanh(u) >= 1.3e-5).
  for (double x = -3.0; x <= 3.0; x += 0.0137)
    EXPECT_NEAR(gelu_ref(x), gelu_tanh_form(x), 1e-10 * (std::fabs(gelu_ref(x)) + 1e-6)) << "x = " << x;
}

TEST(ActivationReference, DerivativesMatchFiniteDifferences) {
  ZT_TEST_TRACE_SEED();
  const double h = 1e-6;
  for (double x = -7.0; x <= 7.0; x += 0.173) {
    EXPECT_NEAR(gelu_grad_ref(x), (gelu_ref(x + h) - gelu_ref(x - h)) / (2 * h), 1e-8) << "gelu' at " << x;
    EXPECT_NEAR(silu_grad_ref(x), (silu_ref(x + h) - silu_ref(x - h)) / (2 * h), 1e-8) << "silu' at " << x;
  }
  // SwiGLU: the whole vector-Jacobian product against differences of L = sum(y dy).
  auto rng = make_rng(11);
  std::uniform_real_distribution<double> U(-3.0, 3.0);
  const int64_t N = 2, H = 3;
  Vec x(size_t(N * 2 * H)), dy(size_t(N * H));
  for (double& v : x) v = U(rng);
  for (double& v : dy) v = U(rng);
  const Vec dx = swiglu_grad_ref(dy, x, N, H);
  auto loss = [&] {
    const Vec y = swiglu_ref(x, N, H);
    double L = 0;
    for (size_t i = 0; i < y.size(); ++i) L += y[i] * dy[i];
    return L;
  };
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    EXPECT_NEAR(dx[i], (lp - lm) / (2 * h), 1e-7) << "dx[" << i << "]";
  }
}

// --- GeLU ------------------------------------------------------------------------

const Shape kShapes[] = {Shape{1}, Shape{7}, Shape{3, 129}, Shape{2, 3, 5}, Shape{}, Shape{64, 1031}};

TEST(Gelu, ForwardMatchesReference) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(12);
  for (DType dt : {DType::f32, DType::bf16})
    for (const Shape& s : kShapes)
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + s.str() + (in_place ? " in place" : ""));
        const Tensor x = random_tensor(s, dt, rng, -6.0, 6.0);
        const Vec xv = to_f64(x);
        Tensor y = in_place ? x : Tensor::empty(s, dt);
        if (!in_place) poison(y);
        ops::gelu_forward(y, x);
        Vec ref(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) ref[i] = gelu_ref(xv[i]);
        EXPECT_TRUE(test::all_close(y, ref, out_rtol(dt), kFwdAtol));
      }
}

TEST(Gelu, BackwardMatchesReference) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(13);
  for (DType dt : {DType::f32, DType::bf16})
    for (const Shape& s : kShapes)
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " " + s.str() + (in_place ? " dx = dy" : ""));
        const Tensor x = random_tensor(s, dt, rng, -6.0, 6.0);
        const Tensor dy = random_tensor(s, dt, rng, -1.0, 1.0);
        const Vec xv = to_f64(x), dyv = to_f64(dy);
        Tensor dx = in_place ? dy : Tensor::empty(s, dt);
        if (!in_place) poison(dx);
        ops::gelu_backward(dx, dy, x);
        Vec ref(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) ref[i] = dyv[i] * gelu_grad_ref(xv[i]);
        EXPECT_TRUE(test::all_close(dx, ref, out_rtol(dt), kBwdAtol));
      }
}

TEST(Gelu, SpecialValues) {
  // Far tails (exp argument clamped), zero, tiny and huge inputs, and NaN.
  const Vec xs = {0.0, -0.0, 1e-30, -1e-30, 1e-3, -1e-3, -0.7518, 10.0, -10.0, 30.0, -30.0, 1e6, -1e6, 3e38, -3e38};
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = tensor_from(xs, Shape{int64_t(xs.size())}, dt);
    const Vec xv = to_f64(x);
    const Tensor y = Tensor::empty(x.shape(), dt), dx = Tensor::empty(x.shape(), dt);
    const Tensor dy = tensor_from(Vec(xs.size(), 1.0), x.shape(), dt);
    poison(y);
    poison(dx);
    ops::gelu_forward(y, x);
    ops::gelu_backward(dx, dy, x);
    Vec ry(xv.size()), rdx(xv.size());
    for (size_t i = 0; i < xv.size(); ++i) {
      ry[i] = gelu_ref(xv[i]);  // long double: x^3 and exp stay finite or go cleanly to inf/0
      rdx[i] = gelu_grad_ref(xv[i]);
    }
    EXPECT_TRUE(test::all_close(y, ry, out_rtol(dt), kFwdAtol));
    EXPECT_TRUE(test::all_close(dx, rdx, out_rtol(dt), kBwdAtol));
    // NaN propagates.
    const Tensor xn = tensor_from({NAN}, Shape{1}, dt), yn = Tensor::empty(Shape{1}, dt);
    ops::gelu_forward(yn, xn);
    EXPECT_TRUE(std::isnan(test::load_f64(yn, 0)));
    ops::gelu_backward(yn, tensor_from({1.0}, Shape{1}, dt), xn);
    EXPECT_TRUE(std::isnan(test::load_f64(yn, 0)));
  }
}

// --- SwiGLU ----------------------------------------------------------------------

const Shape kSwigluShapes[] = {Shape{1, 2}, Shape{1, 14}, Shape{5, 258}, Shape{2, 3, 10}, Shape{2}, Shape{33, 2050},
                               Shape{2, 20000}};

TEST(Swiglu, ForwardMatchesReference) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(14);
  for (DType dt : {DType::f32, DType::bf16})
    for (const Shape& s : kSwigluShapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + s.str());
      const int64_t H = s[-1] / 2, N = s.numel() / (2 * H);
      Shape ys = s;
      ys[-1] = H;
      const Tensor x = random_tensor(s, dt, rng, -8.0, 8.0);
      const Tensor y = Tensor::empty(ys, dt);
      poison(y);
      ops::swiglu_forward(y, x);
      EXPECT_TRUE(test::all_close(y, swiglu_ref(to_f64(x), N, H), out_rtol(dt), kFwdAtol));
    }
}

TEST(Swiglu, BackwardMatchesReference) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(15);
  for (DType dt : {DType::f32, DType::bf16})
    for (const Shape& s : kSwigluShapes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " " + s.str());
      const int64_t H = s[-1] / 2, N = s.numel() / (2 * H);
      Shape ys = s;
      ys[-1] = H;
      const Tensor x = random_tensor(s, dt, rng, -8.0, 8.0);
      const Tensor dy = random_tensor(ys, dt, rng, -1.0, 1.0);
      const Tensor dx = Tensor::empty(s, dt);
      poison(dx);
      ops::swiglu_backward(dx, dy, x);
      EXPECT_TRUE(test::all_close(dx, swiglu_grad_ref(to_f64(dy), to_f64(x), N, H), out_rtol(dt), kBwdAtol));
      // In place (dx = x, as the model calls it): the same bits.
      const Tensor in_place = Tensor::empty(s, dt);
      ops::copy(in_place, x);
      ops::swiglu_backward(in_place, dy, in_place);
      EXPECT_EQ(to_f64(in_place), to_f64(dx)) << "in place";
    }
}

TEST(Swiglu, FarTails) {
  // exp(-g) clamped for g << 0: silu -> -0, silu' -> 0; g >> 0: silu -> g.
  const Vec xs = {-3e38, -100.0, -30.0, 0.0, 30.0, 100.0, 3e38, NAN,  // gate (8)
                  2.0,   2.0,    2.0,   -2.0, 2.0,  0.5,   0.5,  1.0};  // up (8)
  for (DType dt : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = tensor_from(xs, Shape{1, 16}, dt);
    const Vec xv = to_f64(x);
    const Tensor y = Tensor::empty(Shape{1, 8}, dt), dx = Tensor::empty(Shape{1, 16}, dt);
    const Tensor dy = tensor_from(Vec(8, 1.0), Shape{1, 8}, dt);
    poison(y);
    poison(dx);
    ops::swiglu_forward(y, x);
    ops::swiglu_backward(dx, dy, x);
    // The double reference overflows/NaNs at +-3e38 too (g * e^-g): use the limits.
    Vec ry = swiglu_ref(xv, 1, 8), rdx = swiglu_grad_ref(to_f64(dy), xv, 1, 8);
    ry[0] = -0.0;  // silu(-3e38) * 2
    rdx[0] = 0.0, rdx[8] = 0.0;
    ry[6] = xv[6] * 0.5, rdx[6] = 0.5, rdx[14] = xv[6];
    // NaN gate: NaN in y and both gradients.
    EXPECT_TRUE(std::isnan(test::load_f64(y, 7)));
    EXPECT_TRUE(std::isnan(test::load_f64(dx, 7)));
    EXPECT_TRUE(std::isnan(test::load_f64(dx, 15)));
    ry[7] = 0, rdx[7] = 0, rdx[15] = 0;
    test::store_f64(y, 7, 0.0);
    test::store_f64(dx, 7, 0.0);
    test::store_f64(dx, 15, 0.0);
    EXPECT_TRUE(test::all_close(y, ry, out_rtol(dt), kFwdAtol));
    EXPECT_TRUE(test::all_close(dx, rdx, out_rtol(dt), kBwdAtol));
  }
}

// The bf16 kernels do the f32 kernels' math on the widened inputs and round
// once on store: bitwise equal to from_float<bf16> of the f32 result (checks
// the vectorised bf16 rounding: nearest-even, NaN kept quiet).
TEST(Activation, Bf16IsTheRoundedF32Result) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(16);
  const Shape xs{37, 2 * 53}, ys{37, 53};  // odd sizes: vector body and padded tail
  Tensor xb = random_tensor(xs, DType::bf16, rng, -6.0, 6.0);
  Tensor dyb = random_tensor(ys, DType::bf16, rng, -1.0, 1.0);
  test::store_f64(xb, 5, NAN);
  test::store_f64(xb, 6, INFINITY);
  test::store_f64(xb, 7, -INFINITY);
  test::store_f64(xb, 60, NAN);  // row 0 (H = 53): gates 0..52, up values 53..105
  for (int64_t i = 70; i < 90; ++i) test::store_f64(xb, i, 1e-39 * double(i - 69));  // subnormal up values
  for (int64_t i = 120; i < 124; ++i) test::store_f64(xb, i, -1e-38);  // subnormal gelu outputs
  const Tensor xf = tensor_from(to_f64(xb), xs, DType::f32), dyf = tensor_from(to_f64(dyb), ys, DType::f32);
  auto check = [](const char* what, const Tensor& got_bf16, const Tensor& f32, bool expect_subnormal = true) {
    SCOPED_TRACE(what);
    const bf16* g = got_bf16.data<bf16>();
    const float* f = f32.data<float>();
    int64_t bad = 0, subnormal = 0;
    for (int64_t i = 0; i < f32.numel(); ++i) subnormal += std::fpclassify(f[i]) == FP_SUBNORMAL;
    if (expect_subnormal) {
      EXPECT_GT(subnormal, 0) << "the inputs should produce some subnormal results";
    }
    for (int64_t i = 0; i < f32.numel(); ++i)
      if (g[i].bits != from_float<bf16>(f[i]).bits && ++bad <= 3)
        ADD_FAILURE() << "element " << i << ": bf16 kernel " << g[i].bits << ", rounded f32 kernel "
                      << from_float<bf16>(f[i]).bits << " (f32 value " << f[i] << ")";
    EXPECT_EQ(bad, 0);
  };
  {
    Tensor yb = Tensor::empty(xs, DType::bf16), yf = Tensor::empty(xs, DType::f32);
    ops::gelu_forward(yb, xb);
    ops::gelu_forward(yf, xf);
    check("gelu_forward", yb, yf);
    Tensor gb = Tensor::empty(xs, DType::bf16), gf = Tensor::empty(xs, DType::f32);
    ops::gelu_backward(gb, xb, xb);  // dy = x: any values will do
    ops::gelu_backward(gf, xf, xf);
    check("gelu_backward", gb, gf);
  }
  {
    // Exact rounding ties: for gates g >= 88 silu(g) = g exactly, so y = g u is
    // the exact product of two 8-bit significands, often halfway between two
    // bf16 values (ties go to even).
    Vec tie_x;
    for (int g = 88; g < 120; ++g) {
      for (int m = 0; m < 128; ++m) tie_x.push_back(g);
      for (int m = 0; m < 128; ++m) tie_x.push_back(1.0 + m / 128.0);
    }
    const int64_t rows = 120 - 88;
    const Tensor tb = tensor_from(tie_x, Shape{rows, 256}, DType::bf16);
    const Tensor tf = tensor_from(tie_x, Shape{rows, 256}, DType::f32);
    Tensor yb = Tensor::empty(Shape{rows, 128}, DType::bf16), yf = Tensor::empty(Shape{rows, 128}, DType::f32);
    ops::swiglu_forward(yb, tb);
    ops::swiglu_forward(yf, tf);
    int64_t ties = 0;
    for (int64_t i = 0; i < yf.numel(); ++i) ties += (std::bit_cast<uint32_t>(yf.data<float>()[i]) & 0xffffu) == 0x8000u;
    EXPECT_GT(ties, 100);
    check("swiglu_forward ties", yb, yf, false);
  }
  {
    Tensor yb = Tensor::empty(ys, DType::bf16), yf = Tensor::empty(ys, DType::f32);
    ops::swiglu_forward(yb, xb);
    ops::swiglu_forward(yf, xf);
    check("swiglu_forward", yb, yf);
    Tensor gb = Tensor::empty(xs, DType::bf16), gf = Tensor::empty(xs, DType::f32);
    ops::swiglu_backward(gb, dyb, xb);
    ops::swiglu_backward(gf, dyf, xf);
    check("swiglu_backward", gb, gf);
  }
}

// --- argument validation -----------------------------------------------------------

TEST(ActivationArgs, GeluRejectsBadArguments) {
  const Tensor x = Tensor::empty(Shape{4, 6}, DType::f32), y = Tensor::empty(Shape{4, 6}, DType::f32);
  const Tensor dy = Tensor::empty(Shape{4, 6}, DType::f32);
  EXPECT_THAT(error_of([&] { ops::gelu_forward(Tensor::empty(Shape{4, 5}, DType::f32), x); }),
              HasSubstr("gelu_forward: 'y' has shape (4, 5) but (4, 6) is required"));
  EXPECT_THAT(error_of([&] { ops::gelu_forward(Tensor::empty(Shape{4, 6}, DType::bf16), x); }),
              HasSubstr("gelu_forward: 'y' is bf16 but 'x' is f32"));
  EXPECT_THAT(error_of([&] { ops::gelu_forward(y, Tensor::empty(Shape{4, 6}, DType::i32)); }),
              HasSubstr("gelu_forward: 'x' has dtype i32"));
  EXPECT_THAT(error_of([&] {
                ops::gelu_forward(Tensor::empty(Shape{4, 6}, DType::f16), Tensor::empty(Shape{4, 6}, DType::f16));
              }),
              HasSubstr("gelu_forward: 'x' is f16 on the CPU, whose kernels compute in f32 or bf16"));
  EXPECT_THAT(error_of([&] { ops::gelu_forward(fake_cuda(Shape{4, 6}, DType::f32), x); }),
              HasSubstr("gelu_forward: 'y' is on cuda:63"));
  EXPECT_THAT(error_of([&] { ops::gelu_forward(fake_cuda(Shape{2}, DType::f32), fake_cuda(Shape{2}, DType::f32)); }),
              AllOf(HasSubstr("gelu_forward: "), HasSubstr("cuda:63")));
  EXPECT_THAT(error_of([&] { ops::gelu_forward(y, Tensor()); }), HasSubstr("gelu_forward: argument 'x' is required"));
  {  // partial overlap of y and x
    const Tensor big = Tensor::empty(Shape{5, 6}, DType::f32);
    EXPECT_THAT(error_of([&] { ops::gelu_forward(big.slice(1, 5), big.slice(0, 4)); }),
                HasSubstr("'y' f32(4, 6) on cpu partially overlaps 'x'"));
  }
  EXPECT_THAT(error_of([&] { ops::gelu_backward(y, Tensor::empty(Shape{6, 4}, DType::f32), x); }),
              HasSubstr("gelu_backward: 'dy' has shape (6, 4)"));
  EXPECT_THAT(error_of([&] { ops::gelu_backward(y, Tensor::empty(Shape{4, 6}, DType::bf16), x); }),
              HasSubstr("gelu_backward: 'dy' is bf16 but 'x' is f32"));
  EXPECT_THAT(error_of([&] { ops::gelu_backward(y, fake_cuda(Shape{4, 6}, DType::f32), x); }),
              HasSubstr("gelu_backward: 'dy' is on cuda:63"));
  EXPECT_THAT(error_of([&] { ops::gelu_backward(x, dy, x); }), HasSubstr("gelu_backward: 'dx'"));
}

TEST(ActivationArgs, SwigluRejectsBadArguments) {
  const Tensor x = Tensor::empty(Shape{4, 6}, DType::f32), y = Tensor::empty(Shape{4, 3}, DType::f32);
  const Tensor dx = Tensor::empty(Shape{4, 6}, DType::f32);
  EXPECT_THAT(error_of([&] { ops::swiglu_forward(y, Tensor::empty(Shape{4, 5}, DType::f32)); }),
              HasSubstr("swiglu_forward: 'x' has shape (4, 5) but (..., 2H)"));
  EXPECT_THAT(error_of([&] { ops::swiglu_forward(Tensor::empty(Shape{4, 6}, DType::f32), x); }),
              HasSubstr("swiglu_forward: 'y' has shape (4, 6) but (4, 3) is required"));
  EXPECT_THAT(error_of([&] { ops::swiglu_forward(Tensor::empty(Shape{4, 3}, DType::bf16), x); }),
              HasSubstr("swiglu_forward: 'y' is bf16 but 'x' is f32"));
  EXPECT_THAT(error_of([&] { ops::swiglu_forward(fake_cuda(Shape{4, 3}, DType::f32), x); }),
              HasSubstr("swiglu_forward: 'y' is on cuda:63"));
  EXPECT_THAT(error_of([&] { ops::swiglu_forward(x.flatten().flat_view(0, Shape{4, 3}), x); }),
              HasSubstr("swiglu_forward: 'y' f32(4, 3) on cpu overlaps 'x'"));
  EXPECT_THAT(error_of([&] { ops::swiglu_backward(dx, Tensor::empty(Shape{4, 6}, DType::f32), x); }),
              HasSubstr("swiglu_backward: 'dy' has shape (4, 6) but (4, 3) is required"));
  EXPECT_THAT(error_of([&] { ops::swiglu_backward(Tensor::empty(Shape{4, 6}, DType::bf16), y, x); }),
              HasSubstr("swiglu_backward: 'dx' is bf16 but 'x' is f32"));
  EXPECT_THAT(error_of([&] { ops::swiglu_backward(dx, fake_cuda(Shape{4, 3}, DType::f32), x); }),
              HasSubstr("swiglu_backward: 'dy' is on cuda:63"));
  {  // dx over x shifted by a row: only in place may they share bytes
    const Tensor both = Tensor::empty(Shape{30}, DType::f32);
    const Tensor x2 = both.flat_view(0, Shape{4, 6}), dx2 = both.flat_view(6, Shape{4, 6});
    EXPECT_THAT(error_of([&] { ops::swiglu_backward(dx2, y, x2); }),
                HasSubstr("swiglu_backward: 'dx' f32(4, 6) on cpu partially overlaps 'x'"));
  }
  EXPECT_THAT(error_of([&] { ops::swiglu_backward(dx, dx.flatten().flat_view(0, Shape{4, 3}), x); }),
              HasSubstr("swiglu_backward: 'dx' f32(4, 6) on cpu overlaps 'dy'"));
}

}  // namespace
}  // namespace zt
