// Column- and row-parallel linear layers; see parallel_linear.h. With a group
// of size 1 they reduce to ops::linear_forward / linear_backward.
#include "nn/parallel_linear.h"

#include "core/error.h"
#include "ops/matmul.h"

namespace zt::nn {

namespace {

void check_group(const TensorParallelGroup& g, const char* layer) {
  ZT_CHECK(g.size >= 1 && g.rank >= 0 && g.rank < g.size, layer, ": tensor-parallel rank ", g.rank,
           " is outside a group of size ", g.size);
  ZT_CHECK(g.size == 1, layer, ": tensor parallelism of size ", g.size,
           " needs the tensor-parallel collectives, which this build does not have yet; set parallel.tp = 1");
}

// (..., n) viewed as (rows, n).
Tensor as_rows(const Tensor& t) { return t.view(Shape{t.numel() / t.size(-1), t.size(-1)}); }

}  // namespace

ColumnParallelLinear::ColumnParallelLinear(Tensor w, Tensor b, Tensor dw, Tensor db, TensorParallelGroup group)
    : w_(std::move(w)), b_(std::move(b)), dw_(std::move(dw)), db_(std::move(db)), group_(group) {
  check_group(group_, "column-parallel linear");
}

void ColumnParallelLinear::forward(const Tensor& y, const Tensor& x) const {
  ops::linear_forward(y, x, w_, b_);  // no communication: each rank owns its output rows
}

void ColumnParallelLinear::backward(const Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate_dx) const {
  if (dx.defined())
    ops::matmul(as_rows(dx), as_rows(dy), w_, false, false, 1.0f, accumulate_dx ? 1.0f : 0.0f);
  // (tp > 1: all-reduce dx over the group here - each rank holds a partial sum.)
  if (dw_.defined() || db_.defined()) ops::linear_backward(Tensor(), dw_, db_, dy, x, w_);
}

RowParallelLinear::RowParallelLinear(Tensor w, Tensor b, Tensor dw, Tensor db, TensorParallelGroup group)
    : w_(std::move(w)), b_(std::move(b)), dw_(std::move(dw)), db_(std::move(db)), group_(group) {
  check_group(group_, "row-parallel linear");
}

void RowParallelLinear::forward(const Tensor& y, const Tensor& x) const {
  // (tp > 1: x W^T without the bias, all-reduce y, then add the bias once.)
  ops::linear_forward(y, x, w_, b_);
}

void RowParallelLinear::backward(const Tensor& dx, const Tensor& dy, const Tensor& x) const {
  // dy is replicated across the group (the forward all-reduce's backward is the identity).
  ops::linear_backward(dx, dw_, db_, dy, x, w_);
}

}  // namespace zt::nn
