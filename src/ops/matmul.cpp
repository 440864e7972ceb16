// matmul, linear_forward, linear_backward: argument validation and dispatch.
//
//   matmul:          out = alpha * op(a) @ op(b) + beta * out (+ bias over rows)
//   linear_forward:  y (N, OC) = x (N, C) @ W^T + b [+ residual]   (x (..., C) flattened to N rows)
//   linear_backward: dx = dy @ W (overwritten), dW += dy^T @ x, db += sum_rows(dy)
// (gradient of y = x W^T + b: dL/dx = dL/dy W, dL/dW = dL/dy^T x, dL/db = column sums of dL/dy).
// No output may overlap an input: sgemm cannot run in place.
#include "ops/matmul.h"

#include <climits>
#include <cstdint>

#include "backend/cpu/matmul.h"
#include "ops/activation.h"
#include "ops/check.h"
#include "ops/elementwise.h"
#include "ops/op_profile.h"

#if ZT_WITH_CUDA
#include "backend/cuda/matmul.h"
#endif

namespace zt::ops {

namespace {

// {f32} for f32 inputs, {f32, bf16} for bf16 ones: out (and grads) may be f32
// or the inputs' dtype.
void check_out_dtype(const char* op, const char* name, const Tensor& t, DType in) {
  if (in == DType::f32) {
    check_dtype(op, name, t, {DType::f32});
  } else {
    check_dtype(op, name, t, {DType::f32, in});
  }
}

void check_blas_dim(const char* op, const char* what, int64_t v) {
  ZT_CHECK(v <= int64_t(INT_MAX), op, ": ", what, " = ", v, " exceeds the BLAS limit of ", INT_MAX);
}

// Shape with the last dim replaced.
Shape with_last(const Shape& s, int64_t last) {
  Shape r = s;
  r[-1] = last;
  return r;
}

}  // namespace

void matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, float alpha, float beta,
            const Tensor& bias) {
  const char* op = "matmul";
  OpScope scope(op, out);
  check_defined(op, "out", out);
  check_defined(op, "a", a);
  check_defined(op, "b", b);
  check_device(op, out.device(), {{"out", &out}, {"a", &a}, {"b", &b}, {"bias", &bias}});
  ZT_CHECK(a.ndim() >= 2, op, ": 'a' has shape ", a.shape().str(),
           " but at least 2 dimensions (..., M, K) are required");
  ZT_CHECK(b.ndim() >= 2, op, ": 'b' has shape ", b.shape().str(),
           " but at least 2 dimensions (..., K, N) are required");
  check_compute_dtype(op, "a", a);
  check_same_dtype(op, "a", a, "b", b);
  check_out_dtype(op, "out", out, a.dtype());
  if (bias.defined()) check_out_dtype(op, "bias", bias, out.dtype());

  const int64_t M = trans_a ? a.size(-1) : a.size(-2);
  const int64_t K = trans_a ? a.size(-2) : a.size(-1);
  const int64_t Kb = trans_b ? b.size(-1) : b.size(-2);
  const int64_t N = trans_b ? b.size(-2) : b.size(-1);
  ZT_CHECK(K == Kb, op, ": inner dimensions do not match: op(a) is (", M, ", ", K, ") from 'a' ", a.shape().str(),
           trans_a ? " transposed" : "", " but op(b) is (", Kb, ", ", N, ") from 'b' ", b.shape().str(),
           trans_b ? " transposed" : "", "; need op(a) (M, K) and op(b) (K, N)");

  const int nbatch = a.ndim() - 2;
  const bool b_shared = b.ndim() == 2;
  if (!b_shared) {
    bool same = b.ndim() == a.ndim();
    for (int i = 0; same && i < nbatch; ++i) same = a.size(i) == b.size(i);
    ZT_CHECK(same, op, ": 'b' has shape ", b.shape().str(), " but its batch dims must equal those of 'a' ",
             a.shape().str(), ", or 'b' must be 2-D (shared by every batch entry)");
  }
  Shape expect(a.shape().begin(), a.shape().begin() + nbatch);
  expect.push_back(M);
  expect.push_back(N);
  check_shape(op, "out", out, expect);
  if (bias.defined()) check_shape(op, "bias", bias, Shape{N});
  check_disjoint(op, "out", out, "a", a);
  check_disjoint(op, "out", out, "b", b);
  check_disjoint(op, "out", out, "bias", bias);
  check_blas_dim(op, "M", M);
  check_blas_dim(op, "N", N);
  check_blas_dim(op, "K", K);

  cpu::GemmDesc d;
  d.batch = a.shape().prod(0, nbatch);
  d.M = M, d.N = N, d.K = K;
  d.trans_a = trans_a, d.trans_b = trans_b, d.b_shared = b_shared;
  d.alpha = alpha, d.beta = beta;
  scope.add_flops(2.0 * double(d.batch) * double(M) * double(N) * double(K));
  if (out.device().is_cpu()) return cpu::matmul(out, a, b, bias, d);
#if ZT_WITH_CUDA
  if (use_cuda(op, out.device())) return cuda::matmul(out, a, b, bias, d);
#endif
  no_backend(op, out.device());
}

namespace {

// linear_forward's argument checks (y = x W^T + b + residual); returns x's
// rows.
int64_t check_linear(const char* op, const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                     const Tensor& residual) {
  check_defined(op, "y", y);
  check_defined(op, "x", x);
  check_ndim(op, "w", w, 2);
  check_device(op, y.device(), {{"y", &y}, {"x", &x}, {"w", &w}, {"b", &b}, {"residual", &residual}});
  ZT_CHECK(x.ndim() >= 1, op, ": 'x' has shape ", x.shape().str(), " but (..., C) is required");
  check_compute_dtype(op, "x", x);
  check_same_dtype(op, "x", x, "w", w);
  check_out_dtype(op, "y", y, x.dtype());
  if (b.defined()) check_out_dtype(op, "b", b, y.dtype());
  const int64_t C = x.size(-1), OC = w.size(0);
  ZT_CHECK(w.size(1) == C, op, ": 'w' has shape ", w.shape().str(), " but (OC, ", C,
           ") is required: its second dim must equal the last dim of 'x' ", x.shape().str());
  check_shape(op, "y", y, with_last(x.shape(), OC));
  if (b.defined()) check_shape(op, "b", b, Shape{OC});
  check_disjoint(op, "y", y, "x", x);
  check_disjoint(op, "y", y, "w", w);
  check_disjoint(op, "y", y, "b", b);
  if (residual.defined()) {
    check_same_dtype(op, "residual", residual, "y", y);
    check_shape(op, "residual", residual, y.shape());
    check_disjoint_from(op, "residual", residual, {{"y", &y}, {"x", &x}, {"w", &w}, {"b", &b}});
  }
  const int64_t N = x.shape().prod(0, x.ndim() - 1);
  check_blas_dim(op, "rows of x", N);
  check_blas_dim(op, "C", C);
  check_blas_dim(op, "OC", OC);
  return N;
}

}  // namespace

void linear_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& residual) {
  const char* op = "linear_forward";
  OpScope scope(op, y);
  const int64_t N = check_linear(op, y, x, w, b, residual);
  const int64_t C = x.size(-1), OC = w.size(0);
  cpu::GemmDesc d;
  d.M = N, d.N = OC, d.K = C, d.trans_b = true, d.b_shared = true;
  d.beta = residual.defined() ? 1.0f : 0.0f;  // y = 1 * residual + x W^T + b
  scope.add_flops(2.0 * double(N) * double(C) * double(OC));
  const Tensor y2 = y.view(Shape{N, OC}), x2 = x.view(Shape{N, C});
  const Tensor c = residual.defined() ? residual.view(Shape{N, OC}) : Tensor();
  if (y.device().is_cpu()) return cpu::matmul(y2, x2, w, b, d, c);
#if ZT_WITH_CUDA
  if (use_cuda(op, y.device())) return cuda::matmul(y2, x2, w, b, d, c);
#endif
  no_backend(op, y.device());
}

void linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, GradWrite weights) {
  const char* op = "linear_backward";
  OpScope scope(op, dy);
  check_defined(op, "dy", dy);
  check_defined(op, "x", x);
  check_ndim(op, "w", w, 2);
  const Device dev = dy.device();
  check_device(op, dev, {{"dx", &dx}, {"dw", &dw}, {"db", &db}, {"dy", &dy}, {"x", &x}, {"w", &w}});
  ZT_CHECK(x.ndim() >= 1, op, ": 'x' has shape ", x.shape().str(), " but (..., C) is required");
  check_compute_dtype(op, "dy", dy);
  check_same_dtype(op, "dy", dy, "x", x);
  check_same_dtype(op, "dy", dy, "w", w);
  if (dx.defined()) check_out_dtype(op, "dx", dx, dy.dtype());
  if (dw.defined()) check_out_dtype(op, "dw", dw, w.dtype());
  if (db.defined()) check_out_dtype(op, "db", db, w.dtype());
  const int64_t C = x.size(-1), OC = w.size(0);
  ZT_CHECK(w.size(1) == C, op, ": 'w' has shape ", w.shape().str(), " but (OC, ", C,
           ") is required: its second dim must equal the last dim of 'x' ", x.shape().str());
  check_shape(op, "dy", dy, with_last(x.shape(), OC));
  if (dx.defined()) check_shape(op, "dx", dx, x.shape());
  if (dw.defined()) check_shape(op, "dw", dw, w.shape());
  if (db.defined()) check_shape(op, "db", db, Shape{OC});
  check_all_disjoint(op, {{"dx", &dx}, {"dw", &dw}, {"db", &db}});
  for (const auto& [out_name, o] : {NamedTensor{"dx", &dx}, {"dw", &dw}, {"db", &db}})
    check_disjoint_from(op, out_name, *o, {{"dy", &dy}, {"x", &x}, {"w", &w}});
  const int64_t N = x.shape().prod(0, x.ndim() - 1);
  check_blas_dim(op, "rows of x", N);
  check_blas_dim(op, "C", C);
  check_blas_dim(op, "OC", OC);

  scope.add_flops(2.0 * double(N) * double(C) * double(OC) * (int(dx.defined()) + int(dw.defined())));
  const Tensor dx2 = dx.defined() ? dx.view(Shape{N, C}) : Tensor();
  const bool overwrite = weights == GradWrite::overwrite && N > 0;
  if (weights == GradWrite::overwrite && N == 0) {  // no rows: the sums written are zeros
    if (dw.defined()) fill(dw, 0.0);
    if (db.defined()) fill(db, 0.0);
  }
  if (dev.is_cpu())
    return cpu::linear_backward(dx2, dw, db, dy.view(Shape{N, OC}), x.view(Shape{N, C}), w, overwrite);
#if ZT_WITH_CUDA
  if (use_cuda(op, dev))
    return cuda::linear_backward(dx2, dw, db, dy.view(Shape{N, OC}), x.view(Shape{N, C}), w, overwrite);
#endif
  no_backend(op, dev);
}

void matmul_gelu_backward(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& pre) {
  const char* op = "matmul_gelu_backward";
  OpScope scope(op, out);
  check_defined(op, "out", out);
  check_ndim(op, "a", a, 2);
  check_ndim(op, "b", b, 2);
  check_device(op, out.device(), {{"a", &a}, {"b", &b}, {"pre", &pre}});
  check_compute_dtype(op, "a", a);
  check_same_dtype(op, "a", a, "b", b);
  check_same_dtype(op, "a", a, "out", out);
  check_same_dtype(op, "a", a, "pre", pre);
  ZT_CHECK(a.size(1) == b.size(0), op, ": inner dimensions do not match: 'a' is ", a.shape().str(), " and 'b' ",
           b.shape().str(), "; need a (M, K) and b (K, N)");
  check_shape(op, "out", out, Shape{a.size(0), b.size(1)});
  check_shape(op, "pre", pre, out.shape());
  check_disjoint(op, "out", out, "pre", pre);
  scope.add_flops(2.0 * double(a.size(0)) * double(a.size(1)) * double(b.size(1)));
#if ZT_WITH_CUDA
  // One fused product where cuBLASLt has an algorithm; matmul() below checks the rest.
  if (use_cuda(op, out.device())) {
    check_disjoint(op, "out", out, "a", a);
    check_disjoint(op, "out", out, "b", b);
    if (cuda::matmul_gelu_backward(out, a, b, pre)) return;
  }
#endif
  matmul(out, a, b);
  gelu_backward(out, out, pre);
}

void linear_gelu_forward(const Tensor& act, const Tensor& pre, const Tensor& x, const Tensor& w, const Tensor& b) {
  const char* op = "linear_gelu_forward";
  check_defined(op, "act", act);
  check_defined(op, "pre", pre);
  check_device(op, pre.device(), {{"act", &act}, {"x", &x}, {"w", &w}, {"b", &b}});
  check_same_dtype(op, "pre", pre, "act", act);
  check_shape(op, "act", act, pre.shape());
  check_disjoint_from(op, "act", act, {{"pre", &pre}, {"x", &x}, {"w", &w}, {"b", &b}});
#if ZT_WITH_CUDA
  if (use_cuda(op, pre.device()) && cuda::gelu_epilogue_on()) {
    const int64_t N = check_linear(op, pre, x, w, b, Tensor());  // linear_forward's messages
    OpScope scope(op, pre);
    if (cuda::linear_gelu_forward(act, pre, x, w, b)) {
      // (counted once: a refusal's linear_forward counts its own)
      scope.add_flops(2.0 * double(N) * double(x.size(-1)) * double(w.size(0)));
      return;
    }
  }
#endif
  linear_forward(pre, x, w, b);
  gelu_forward(act, pre);
}

}  // namespace zt::ops
