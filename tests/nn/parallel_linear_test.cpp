// Column- and row-parallel linear layers at tensor-parallel size 1: they must
// equal the plain linear layer (forward and every gradient), the row-parallel
// forward must add a residual, and column-parallel dx accumulation must add.
// Larger groups: tests/parallel/tp_test.cpp (mpirun).
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include "nn/parallel_linear.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "test_util.h"

namespace zt::nn {
namespace {

using test::random_tensor;
using test::to_f64;

struct Layer {
  Tensor w, b, dw, db;
};

Layer make_layer(int64_t out, int64_t in, std::mt19937_64& rng) {
  Layer l{random_tensor(Shape{out, in}, DType::f32, rng), random_tensor(Shape{out}, DType::f32, rng),
          random_tensor(Shape{out, in}, DType::f32, rng), random_tensor(Shape{out}, DType::f32, rng)};
  return l;
}

Tensor clone(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  ops::cast(c, t);
  return c;
}

TEST(ParallelLinear, SizeOneGroupsEqualThePlainLinearLayer) {
  auto rng = test::make_rng(3);
  const int64_t B = 3, T = 5, in = 12, out = 7;
  const Layer l = make_layer(out, in, rng);
  const Tensor x = random_tensor(Shape{B, T, in}, DType::f32, rng);
  const Tensor dy = random_tensor(Shape{B, T, out}, DType::f32, rng);
  // Reference: ops::linear_* on copies of the gradient buffers.
  const Tensor y_ref = Tensor::empty(Shape{B, T, out}, DType::f32), dx_ref = Tensor::empty(Shape{B, T, in}, DType::f32);
  const Tensor dw_ref = clone(l.dw), db_ref = clone(l.db);
  ops::linear_forward(y_ref, x, l.w, l.b);
  ops::linear_backward(dx_ref, dw_ref, db_ref, dy, x, l.w);
  for (int kind = 0; kind < 2; ++kind) {
    const Tensor dw = clone(l.dw), db = clone(l.db);
    const Tensor y = Tensor::empty(Shape{B, T, out}, DType::f32), dx = Tensor::empty(Shape{B, T, in}, DType::f32);
    test::poison(y);
    test::poison(dx);
    if (kind == 0) {
      ColumnParallelLinear layer(l.w, l.b, dw, db);
      layer.forward(y, x);
      layer.backward_data(dx, dy, false);
      layer.backward_weights(dy, x);
    } else {
      RowParallelLinear layer(l.w, l.b, dw, db, TensorParallel{});
      layer.forward(y, x);
      layer.backward(dx, dy, x);
    }
    EXPECT_TRUE(test::all_close(y, to_f64(y_ref), 1e-6, 1e-6)) << kind;
    EXPECT_TRUE(test::all_close(dx, to_f64(dx_ref), 1e-6, 1e-6)) << kind;
    EXPECT_TRUE(test::all_close(dw, to_f64(dw_ref), 1e-6, 1e-6)) << kind;
    EXPECT_TRUE(test::all_close(db, to_f64(db_ref), 1e-6, 1e-6)) << kind;
  }
}

TEST(ParallelLinear, RowParallelForwardAddsTheResidual) {
  auto rng = test::make_rng(5);
  const int64_t N = 6, in = 9, out = 4;
  const Layer l = make_layer(out, in, rng);
  const Tensor x = random_tensor(Shape{N, in}, DType::f32, rng);
  const Tensor residual = random_tensor(Shape{N, out}, DType::f32, rng);
  const Tensor y = Tensor::empty(Shape{N, out}, DType::f32);
  test::poison(y);
  RowParallelLinear(l.w, l.b, Tensor(), Tensor(), TensorParallel{}).forward(y, x, residual);
  std::vector<double> ref = to_f64(residual);
  const std::vector<double> w = to_f64(l.w), b = to_f64(l.b), xv = to_f64(x);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out; ++o) {
      ref[size_t(n * out + o)] += b[size_t(o)];
      for (int64_t i = 0; i < in; ++i) ref[size_t(n * out + o)] += xv[size_t(n * in + i)] * w[size_t(o * in + i)];
    }
  EXPECT_TRUE(test::all_close(y, ref, 1e-5, 1e-6));
}

TEST(ParallelLinear, ColumnParallelBackwardAccumulatesDxWhenAsked) {
  auto rng = test::make_rng(4);
  const int64_t N = 6, in = 9, out = 4;
  const Layer l = make_layer(out, in, rng);
  const Tensor x = random_tensor(Shape{N, in}, DType::f32, rng), dy = random_tensor(Shape{N, out}, DType::f32, rng);
  const Tensor dx0 = random_tensor(Shape{N, in}, DType::f32, rng), dx = clone(dx0);
  ColumnParallelLinear(l.w, l.b, Tensor(), Tensor()).backward_data(dx, dy, true);
  std::vector<double> ref = to_f64(dx0);
  const std::vector<double> w = to_f64(l.w), g = to_f64(dy);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < in; ++i)
      for (int64_t o = 0; o < out; ++o) ref[size_t(n * in + i)] += g[size_t(n * out + o)] * w[size_t(o * in + i)];
  EXPECT_TRUE(test::all_close(dx, ref, 1e-5, 1e-6));
}

}  // namespace
}  // namespace zt::nn
