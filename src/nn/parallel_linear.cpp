// Column- and row-parallel linear layers; see parallel_linear.h.
#include "nn/parallel_linear.h"

#include "core/error.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace zt::nn {

namespace {

// (..., n) viewed as (rows, n).
Tensor as_rows(const Tensor& t) { return t.view(Shape{t.numel() / t.size(-1), t.size(-1)}); }

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(Tensor w, Tensor b, Tensor dw, Tensor db)
    : w_(std::move(w)), b_(std::move(b)), dw_(std::move(dw)), db_(std::move(db)) {}

void ColumnParallelLinear::forward(const Tensor& y, const Tensor& x) const {
  ops::linear_forward(y, x, w_, b_);  // no communication: each rank owns its output rows
}

void ColumnParallelLinear::forward_gelu(const Tensor& act, const Tensor& pre, const Tensor& x) const {
  ops::linear_gelu_forward(act, pre, x, w_, b_);
}

void ColumnParallelLinear::backward_data(const Tensor& dx, const Tensor& dy, bool accumulate_dx) const {
  ops::matmul(as_rows(dx), as_rows(dy), w_, false, false, 1.0f, accumulate_dx ? 1.0f : 0.0f);
}

void ColumnParallelLinear::backward_weights(const Tensor& dy, const Tensor& x, ops::GradWrite write) const {
  if (dw_.defined() || db_.defined()) ops::linear_backward(Tensor(), dw_, db_, dy, x, w_, write);
}

RowParallelLinear::RowParallelLinear(Tensor w, Tensor b, Tensor dw, Tensor db, const TensorParallel& tp)
    : w_(std::move(w)), b_(std::move(b)), dw_(std::move(dw)), db_(std::move(db)), tp_(tp) {}

void RowParallelLinear::forward(const Tensor& y, const Tensor& x, const Tensor& residual) const {
  // The bias and a replicated residual are added once to the group's sum.
  const Tensor bias = tp_.rank() == 0 ? b_ : Tensor();
  if (tp_.size() == 1) return ops::linear_forward(y, x, w_, bias, residual);
  if (!tp_.sequence_parallel) {
    ops::linear_forward(y, x, w_, bias, tp_.rank() == 0 ? residual : Tensor());
    tp_.group->all_reduce(as_rows(y))->wait();
    return;
  }
  // Each rank holds only its rows of the residual: added to its rows of the sum.
  const Tensor xr = as_rows(x);
  Tensor partial = Tensor::empty(Shape{xr.size(0), w_.size(0)}, y.dtype(), y.device(), MemCategory::activations);
  ops::linear_forward(partial, xr, w_, bias);
  tp_.group->reduce_scatter(as_rows(y), partial)->wait();
  if (residual.defined()) ops::add(y, y, residual);
}

void RowParallelLinear::backward(const Tensor& dx, const Tensor& dy, const Tensor& x) const {
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

Tensor RowParallelLinear::backward_data(const Tensor& dx, const Tensor& dy) const {
  const Tensor rows = backward_data_rows(dy);
  ops::matmul(as_rows(dx), rows, w_);  // dx = dy W
  return rows;
}

Tensor RowParallelLinear::backward_data_gelu(const Tensor& dx, const Tensor& dy, const Tensor& pre) const {
  const Tensor rows = backward_data_rows(dy);
  ops::matmul_gelu_backward(as_rows(dx), rows, w_, as_rows(pre));
  return rows;
}

void RowParallelLinear::backward_weights(const Tensor& dy_rows, const Tensor& x, ops::GradWrite write) const {
  if (dw_.defined() || db_.defined()) ops::linear_backward(Tensor(), dw_, db_, dy_rows, as_rows(x), w_, write);
}

}  // namespace zt::nn
