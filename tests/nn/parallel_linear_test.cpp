// Column- and row-parallel linear layers at tensor-parallel size 1: they must
// equal the plain linear layer (forward and every gradient), the row-parallel
// forward must add a residual, and column-parallel dx accumulation must add.
// Larger groups: tests/parallel/tp_test.cpp (mpirun).
#include <gtest/gtest.h>

#include <cstring>
#include <gmock/gmock.h>

#include "nn/parallel_linear.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/op_profile.h"
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

int64_t quantize_calls() {
  int64_t n = 0;
  for (const ops::OpTotal& t : ops::take_op_profile())
    if (t.name == "quantize_fp8") n += t.calls;
  return n;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// Under fp8 a LinearOperand read by several products is quantised once: two
// layers reading one input (q and k), a layer's input and weight gradients
// reading one dy, a row-parallel layer's weight gradient reading the dy its
// data product returned, and a fresh() copy quantised again - with the same
// bits as every product quantising its own operands.
TEST(ParallelLinear, Fp8OperandsSharedByProductsAreQuantisedOnce) {
  auto rng = test::make_rng(6);
  const int64_t N = 24, in = 16, out = 8;
  const Layer a = make_layer(out, in, rng), b = make_layer(out, in, rng);
  const Tensor x = random_tensor(Shape{N, in}, DType::f32, rng), dy = random_tensor(Shape{N, out}, DType::f32, rng);
  struct Result {
    Tensor ya, yb, dx, dwa, dx_row, dw_row;
    int64_t quantised = 0;
  };
  auto run = [&](bool shared) {
    Result r{Tensor::empty(Shape{N, out}, DType::f32), Tensor::empty(Shape{N, out}, DType::f32),
             Tensor::empty(Shape{N, in}, DType::f32),  clone(a.dw),
             Tensor::empty(Shape{N, in}, DType::f32),  clone(b.dw)};
    for (const Tensor& t : {r.ya, r.yb, r.dx, r.dx_row}) test::poison(t);
    const ColumnParallelLinear la(a.w, a.b, r.dwa, Tensor(), LinearPrecision::fp8),
        lb(b.w, b.b, Tensor(), Tensor(), LinearPrecision::fp8);
    const RowParallelLinear row(b.w, Tensor(), r.dw_row, Tensor(), TensorParallel{}, LinearPrecision::fp8);
    ops::enable_op_profile(true);
    (void)ops::take_op_profile();
    const LinearOperand xs = x, dys = dy;
    la.forward(r.ya, shared ? xs : LinearOperand(x));
    lb.forward(r.yb, shared ? xs : LinearOperand(x));
    la.backward_data(r.dx, shared ? dys : LinearOperand(dy), false);
    la.backward_weights(shared ? dys : LinearOperand(dy), shared ? xs : LinearOperand(x));
    const LinearOperand rows = row.backward_data(r.dx_row, dy);
    row.backward_weights(shared ? rows : rows.fresh(), x);
    r.quantised = quantize_calls();
    ops::enable_op_profile(false);
    return r;
  };
  const Result own = run(false), shared = run(true);
  // Each product its operands: 2 + 2 forward, 2 + 2 for a's backward, 2 + 2 for the row layer's.
  EXPECT_EQ(own.quantised, 12);
  // x once, each weight once a product (3), dy once for a, the row layer's
  // dy once and its weight and input.
  EXPECT_EQ(shared.quantised, 8);
  EXPECT_TRUE(same_bits(shared.ya, own.ya));
  EXPECT_TRUE(same_bits(shared.yb, own.yb));
  EXPECT_TRUE(same_bits(shared.dx, own.dx));
  EXPECT_TRUE(same_bits(shared.dwa, own.dwa));
  EXPECT_TRUE(same_bits(shared.dx_row, own.dx_row));
  EXPECT_TRUE(same_bits(shared.dw_row, own.dw_row));
  // And the products ran on fp8: y is not the f32 product.
  const Tensor y_f32 = Tensor::empty(Shape{N, out}, DType::f32);
  ops::linear_forward(y_f32, x, a.w, a.b);
  EXPECT_FALSE(same_bits(y_f32, own.ya));
  EXPECT_TRUE(test::all_close(own.ya, to_f64(y_f32), 0.15, 0.15));
}

}  // namespace
}  // namespace zt::nn
