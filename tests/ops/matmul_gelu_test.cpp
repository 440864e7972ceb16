// ops::matmul_gelu_backward: out = gelu'(pre) * (a @ b). On the CPU it is
// defined as matmul then gelu_backward (the same bits as calling the two, so
// the trainer's CPU results do not change); both are checked here against a
// float64 reference of the exact inputs, and bad arguments name the problem.
// The fused CUDA epilogue is checked against this CPU op in tests/cuda; so is
// ops::linear_gelu_forward's GELU_AUX one (ZT_CUDA_GELU_EPILOGUE=1).
#include "ops/matmul.h"

#include <cmath>
#include <string>
#include <vector>

#include "ops/activation.h"
#include "test_util.h"

namespace zt {
namespace {

using test::make_rng;
using test::poison;
using test::random_tensor;
using test::to_f64;

// d/dx of the tanh-form GeLU, in float64.
double gelu_grad(double x) {
  const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
  const double t = std::tanh(k * (x + c * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * c * x * x);
}

TEST(MatmulGeluBackwardTest, IsTheProductThenTheGeluBackward) {
  auto rng = make_rng(61);
  for (const DType dt : {DType::f32, DType::bf16}) {
    for (const auto& [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 33, 40}, {64, 96, 130}}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << M << "x" << K << "x" << N);
      const Tensor a = random_tensor(Shape{M, K}, dt, rng), b = random_tensor(Shape{K, N}, dt, rng);
      const Tensor pre = random_tensor(Shape{M, N}, dt, rng, -4.0, 4.0);
      Tensor out = Tensor::empty(Shape{M, N}, dt);
      poison(out);
      ops::matmul_gelu_backward(out, a, b, pre);
      // The definition, op by op: the same bits.
      Tensor prod = Tensor::empty(Shape{M, N}, dt), two = Tensor::empty(Shape{M, N}, dt);
      ops::matmul(prod, a, b);
      ops::gelu_backward(two, prod, pre);
      EXPECT_EQ(to_f64(out), to_f64(two));
      // Against float64 of the exact inputs: the product's rounding to dt dominates.
      const std::vector<double> av = to_f64(a), bv = to_f64(b), pv = to_f64(pre);
      std::vector<double> ref(size_t(M * N));
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
          double s = 0;
          for (int64_t k = 0; k < K; ++k) s += av[size_t(m * K + k)] * bv[size_t(k * N + n)];
          ref[size_t(m * N + n)] = gelu_grad(pv[size_t(m * N + n)]) * s;
        }
      EXPECT_TRUE(test::rel_error_within(out, ref, dt == DType::f32 ? 1e-5 : 1e-2, "out"));
    }
  }
}

TEST(MatmulGeluBackwardTest, BadArgumentsNameTheProblem) {
  auto rng = make_rng(62);
  const Tensor a = random_tensor(Shape{4, 8}, DType::f32, rng), b = random_tensor(Shape{8, 16}, DType::f32, rng);
  const Tensor pre = random_tensor(Shape{4, 16}, DType::f32, rng);
  Tensor out = Tensor::empty(Shape{4, 16}, DType::f32);
  EXPECT_NE(test::error_of([&] { ops::matmul_gelu_backward(out, a, b, Tensor::empty(Shape{4, 15}, DType::f32)); })
                .find("matmul_gelu_backward: 'pre'"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { ops::matmul_gelu_backward(out, a, random_tensor(Shape{9, 16}, DType::f32, rng), pre); })
                .find("inner dimensions do not match"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { ops::matmul_gelu_backward(out, a, b, random_tensor(Shape{4, 16}, DType::bf16, rng)); })
                .find("matmul_gelu_backward"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { ops::matmul_gelu_backward(pre, a, b, pre); }).find("'out'"), std::string::npos)
      << "out may not be pre";
}

// The tanh-form GeLU, in float64.
double gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI), c = 0.044715;
  return 0.5 * x * (1.0 + std::tanh(k * (x + c * x * x * x)));
}

// ops::linear_gelu_forward: pre = x W^T + b and act = gelu(pre). On the CPU
// linear_forward then gelu_forward (their bits); both outputs against
// float64 of the exact inputs, with and without a bias, rows in a batch.
TEST(LinearGeluForwardTest, IsTheLinearThenTheGelu) {
  auto rng = make_rng(63);
  for (const DType dt : {DType::f32, DType::bf16}) {
    for (const bool bias : {true, false}) {
      for (const auto& [R, C, OC] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {6, 33, 40}, {64, 96, 136}}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << R << "x" << C << "x" << OC
                                        << (bias ? " bias" : ""));
        const Tensor x = random_tensor(Shape{2, R, C}, dt, rng), w = random_tensor(Shape{OC, C}, dt, rng);
        const Tensor b = bias ? random_tensor(Shape{OC}, dt, rng) : Tensor();
        Tensor act = Tensor::empty(Shape{2, R, OC}, dt), pre = Tensor::empty(Shape{2, R, OC}, dt);
        poison(act);
        poison(pre);
        ops::linear_gelu_forward(act, pre, x, w, b);
        Tensor pre2 = Tensor::empty(Shape{2, R, OC}, dt), act2 = Tensor::empty(Shape{2, R, OC}, dt);
        ops::linear_forward(pre2, x, w, b);
        ops::gelu_forward(act2, pre2);
        EXPECT_EQ(to_f64(pre), to_f64(pre2));
        EXPECT_EQ(to_f64(act), to_f64(act2));
        const std::vector<double> xv = to_f64(x), wv = to_f64(w), bv = bias ? to_f64(b) : std::vector<double>();
        std::vector<double> want_pre(size_t(2 * R * OC)), want_act(want_pre.size());
        for (int64_t r = 0; r < 2 * R; ++r)
          for (int64_t o = 0; o < OC; ++o) {
            double s = bias ? bv[size_t(o)] : 0.0;
            for (int64_t c = 0; c < C; ++c) s += xv[size_t(r * C + c)] * wv[size_t(o * C + c)];
            want_pre[size_t(r * OC + o)] = s;
            want_act[size_t(r * OC + o)] = gelu(s);
          }
        const double tol = dt == DType::f32 ? 1e-5 : 1e-2;
        EXPECT_TRUE(test::rel_error_within(pre, want_pre, tol, "pre"));
        EXPECT_TRUE(test::rel_error_within(act, want_act, tol, "act"));
      }
    }
  }
}

TEST(LinearGeluForwardTest, BadArgumentsNameTheProblem) {
  auto rng = make_rng(64);
  const Tensor x = random_tensor(Shape{4, 8}, DType::f32, rng), w = random_tensor(Shape{16, 8}, DType::f32, rng);
  Tensor pre = Tensor::empty(Shape{4, 16}, DType::f32), act = Tensor::empty(Shape{4, 16}, DType::f32);
  EXPECT_NE(test::error_of([&] { ops::linear_gelu_forward(Tensor::empty(Shape{4, 15}, DType::f32), pre, x, w, {}); })
                .find("linear_gelu_forward: 'act'"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { ops::linear_gelu_forward(pre, pre, x, w, {}); }).find("'act'"), std::string::npos)
      << "act may not be pre";
  EXPECT_NE(test::error_of([&] {
              ops::linear_gelu_forward(act, pre, x, random_tensor(Shape{16, 9}, DType::f32, rng), {});
            }).find("linear_forward: 'w'"),
            std::string::npos)
      << "the linear's own check, on the CPU";
}

}  // namespace
}  // namespace zt
