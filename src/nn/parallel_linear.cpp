// Column- and row-parallel linear layers; see parallel_linear.h.
#include "nn/parallel_linear.h"

#include "core/error.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/fp8.h"
#include "ops/matmul.h"

namespace zt::nn {

namespace {

// (..., n) viewed as (rows, n).
Tensor as_rows(const Tensor& t) { return t.view(Shape{t.numel() / t.size(-1), t.size(-1)}); }

// The weight's codes, in the workspace while a product runs.
Fp8Codes weight_codes(const Tensor& w) { return LinearOperand(w).codes(DType::f8e4m3); }

// The three products of a linear layer in either precision; x and dy are
// quantised by their first product (LinearOperand: E4M3 inputs, E5M2
// gradients) and their codes read by the others.
// y = [residual +] x W^T [+ b]
void product_forward(LinearPrecision p, const Tensor& y, const LinearOperand& x, const Tensor& w, const Tensor& b,
                     const Tensor& residual = {}) {
  if (p == LinearPrecision::compute_dtype) return ops::linear_forward(y, x.tensor(), w, b, residual);
  const Fp8Codes xq = x.codes(DType::f8e4m3), wq = weight_codes(w);
  ops::fp8_linear_forward(y, xq.q, xq.scale_inv, wq.q, wq.scale_inv, b, residual);
}

// dx (rows, in) = dy (rows, out) W, or += it when accumulate.
void product_data(LinearPrecision p, const Tensor& dx, const LinearOperand& dy, const Tensor& w, bool accumulate) {
  if (p == LinearPrecision::compute_dtype)
    return ops::matmul(dx, dy.tensor(), w, false, false, 1.0f, accumulate ? 1.0f : 0.0f);
  const Fp8Codes dyq = dy.codes(DType::f8e5m2), wq = weight_codes(w);
  if (!accumulate) return ops::fp8_linear_backward(dx, Tensor(), dyq.q, dyq.scale_inv, {}, {}, wq.q, wq.scale_inv);
  const Tensor part = Tensor::empty(dx.shape(), DType::f32, dx.device(), MemCategory::workspace);
  ops::fp8_linear_backward(part, Tensor(), dyq.q, dyq.scale_inv, {}, {}, wq.q, wq.scale_inv);
  ops::axpy(dx, 1.0f, part);
}

// dw (+)= dy^T x, db (+)= sum_rows(dy) (undefined: skipped). Under fp8 the
// bias gradient comes from the unquantised dy.
void product_weights(LinearPrecision p, const Tensor& dw, const Tensor& db, const LinearOperand& dy,
                     const LinearOperand& x, const Tensor& w, ops::GradWrite write) {
  if (!dw.defined() && !db.defined()) return;
  if (p == LinearPrecision::compute_dtype)
    return ops::linear_backward(Tensor(), dw, db, dy.tensor(), x.tensor(), w, write);
  if (db.defined()) ops::linear_backward(Tensor(), Tensor(), db, dy.tensor(), x.tensor(), w, write);
  if (!dw.defined()) return;
  ZT_CHECK(dw.dtype() == DType::f32, "fp8 layers accumulate f32 weight gradients, got ", dtype_name(dw.dtype()));
  const Fp8Codes dyq = dy.codes(DType::f8e5m2), xq = x.codes(DType::f8e4m3);
  ops::fp8_linear_backward(Tensor(), dw, dyq.q, dyq.scale_inv, xq.q, xq.scale_inv, {}, {}, write);
}

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(Tensor w, Tensor b, Tensor dw, Tensor db, LinearPrecision precision)
    : w_(std::move(w)), b_(std::move(b)), dw_(std::move(dw)), db_(std::move(db)), precision_(precision) {}

void ColumnParallelLinear::forward(const Tensor& y, const LinearOperand& x) const {
  product_forward(precision_, y, x, w_, b_);  // no communication: each rank owns its output rows
}

void ColumnParallelLinear::forward_gelu(const Tensor& act, const Tensor& pre, const LinearOperand& x) const {
  if (precision_ == LinearPrecision::compute_dtype) return ops::linear_gelu_forward(act, pre, x.tensor(), w_, b_);
  product_forward(precision_, pre, x, w_, b_);
  ops::gelu_forward(act, pre);
}

void ColumnParallelLinear::backward_data(const Tensor& dx, const LinearOperand& dy, bool accumulate_dx) const {
  product_data(precision_, as_rows(dx), dy.rows(), w_, accumulate_dx);
}

void ColumnParallelLinear::backward_weights(const LinearOperand& dy, const LinearOperand& x,
                                            ops::GradWrite write) const {
  product_weights(precision_, dw_, db_, dy.rows(), x.rows(), w_, write);
}

RowParallelLinear::RowParallelLinear(Tensor w, Tensor b, Tensor dw, Tensor db, const TensorParallel& tp,
                                     LinearPrecision precision)
    : w_(std::move(w)), b_(std::move(b)), dw_(std::move(dw)), db_(std::move(db)), tp_(tp), precision_(precision) {}

void RowParallelLinear::forward(const Tensor& y, const LinearOperand& x, const Tensor& residual) const {
  // The bias and a replicated residual are added once to the group's sum.
  const Tensor bias = tp_.rank() == 0 ? b_ : Tensor();
  if (tp_.size() == 1) return product_forward(precision_, y, x, w_, bias, residual);
  if (!tp_.sequence_parallel) {
    product_forward(precision_, y, x, w_, bias, tp_.rank() == 0 ? residual : Tensor());
    tp_.group->all_reduce(as_rows(y))->wait();
    return;
  }
  // Each rank holds only its rows of the residual: added to its rows of the sum.
  const LinearOperand xr = x.rows();
  Tensor partial =
      Tensor::empty(Shape{xr.tensor().size(0), w_.size(0)}, y.dtype(), y.device(), MemCategory::activations);
  product_forward(precision_, partial, xr, w_, bias);
  tp_.group->reduce_scatter(as_rows(y), partial)->wait();
  if (residual.defined()) ops::add(y, y, residual);
}

void RowParallelLinear::backward(const Tensor& dx, const Tensor& dy, const Tensor& x) const {
  if (precision_ == LinearPrecision::fp8) {
    const LinearOperand rows = backward_data(dx, dy);
    return backward_weights(rows, x);
  }
  if (tp_.size() == 1 || !tp_.sequence_parallel) return ops::linear_backward(dx, dw_, db_, dy, x, w_);
  ops::linear_backward(as_rows(dx), dw_, db_, backward_data_rows(dy), as_rows(x), w_);
}

Tensor RowParallelLinear::backward_data_rows(const Tensor& dy) const {
  const Tensor dyr = as_rows(dy);
  if (tp_.size() == 1 || !tp_.sequence_parallel) return dyr;
  Tensor full = Tensor::empty(Shape{dyr.size(0) * tp_.size(), dyr.size(1)}, dy.dtype(), dy.device(),
                              MemCategory::activations);
  tp_.group->all_gather(full, dyr)->wait();
  return full;
}

LinearOperand RowParallelLinear::backward_data(const Tensor& dx, const Tensor& dy) const {
  const LinearOperand rows = backward_data_rows(dy);
  product_data(precision_, as_rows(dx), rows, w_, false);  // dx = dy W
  return rows;
}

LinearOperand RowParallelLinear::backward_data_gelu(const Tensor& dx, const Tensor& dy, const Tensor& pre) const {
  const LinearOperand rows = backward_data_rows(dy);
  if (precision_ == LinearPrecision::compute_dtype) {
    ops::matmul_gelu_backward(as_rows(dx), rows.tensor(), w_, as_rows(pre));
    return rows;
  }
  // The product rounded to dx's dtype, then the GeLU's backward (as the
  // unfused compute-dtype path).
  const Tensor product = Tensor::empty(as_rows(dx).shape(), dx.dtype(), dx.device(), MemCategory::workspace);
  product_data(precision_, product, rows, w_, false);
  ops::gelu_backward(as_rows(dx), product, as_rows(pre));
  return rows;
}

void RowParallelLinear::backward_weights(const LinearOperand& dy_rows, const LinearOperand& x,
                                         ops::GradWrite write) const {
  product_weights(precision_, dw_, db_, dy_rows.rows(), x.rows(), w_, write);
}

}  // namespace zt::nn
