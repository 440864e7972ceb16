// The two halves of a Megatron-style tensor-parallel layer pair.
//
//   ColumnParallelLinear  W (out, in) split by OUTPUT rows: rank r holds its
//                         rows and computes its slice of y = x W^T + b from
//                         the whole input x without communication. In
//                         backward its dx = dy W is a partial sum over the
//                         group; several column-parallel layers reading one
//                         input (q, k, v) add their partials and the caller
//                         reduces once (all-reduce, or reduce-scatter under
//                         sequence parallelism) - backward_data and
//                         backward_weights are separate so that reduction
//                         runs while the weight gradients are computed.
//   RowParallelLinear     W (out, in) split by INPUT columns: rank r consumes
//                         the slice of x its column-parallel partner produced
//                         and computes a partial y that the group all-reduces
//                         (reduce-scatter into row shards under sequence
//                         parallelism); the bias is added once, by rank 0.
//
// Attention uses qkv (column) -> proj (row); the MLP uses in (column) -> out
// (row): one reduction per half in each direction. With a group of size 1
// these are plain linear layers.
//
// Each layer holds views of this rank's weight shard and of its gradient
// buffer (flat ParamSet buffers): constructing one is free.
//
// LinearPrecision::fp8 runs every product on per-tensor-scaled fp8 operands
// (ops/fp8.h), quantised as they are used: E4M3 inputs and weights, E5M2
// output gradients; the bias gradient from the unquantised gradient, and the
// results in the compute dtype. An input or output gradient passed as one
// LinearOperand to several products is quantised once (q, k and v's input;
// the dy of backward_data and backward_weights: RowParallelLinear's
// backward_data returns it). Under tensor parallelism each rank scales its
// own shard.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "nn/linear_operand.h"
#include "nn/tensor_parallel.h"
#include "ops/grad_write.h"

namespace zt::nn {

// How a layer's products compute: on their operands' compute dtype, or on
// per-tensor-scaled fp8 (train.fp8).
enum class LinearPrecision { compute_dtype, fp8 };

class ColumnParallelLinear {
 public:
  // w (out_local, in), b (out_local) or undefined; dw/db their gradients
  // (f32 or w's dtype; undefined to skip).
  ColumnParallelLinear(Tensor w, Tensor b, Tensor dw, Tensor db,
                       LinearPrecision precision = LinearPrecision::compute_dtype);
  // y (..., out_local) = x (..., in) W^T + b.
  void forward(const Tensor& y, const LinearOperand& x) const;
  // The same into pre, and act = gelu(pre) (ops::linear_gelu_forward: one
  // product on a GPU with ZT_CUDA_GELU_EPILOGUE=1).
  void forward_gelu(const Tensor& act, const Tensor& pre, const LinearOperand& x) const;
  // dx (..., in) = dy W: overwritten, or accumulated (+=) when accumulate_dx.
  void backward_data(const Tensor& dx, const LinearOperand& dy, bool accumulate_dx) const;
  // dw += dy^T x, db += sum_rows(dy) (GradWrite::overwrite: =).
  void backward_weights(const LinearOperand& dy, const LinearOperand& x,
                        ops::GradWrite write = ops::GradWrite::accumulate) const;
  // The same layer writing its gradients to other views (a deferred weight
  // pass writes to the buffers current when it runs).
  ColumnParallelLinear with_grads(Tensor dw, Tensor db) const {
    return ColumnParallelLinear(w_, b_, std::move(dw), std::move(db), precision_);
  }

 private:
  Tensor w_, b_, dw_, db_;
  LinearPrecision precision_;
};

class RowParallelLinear {
 public:
  // w (out, in_local), b (out) or undefined (replicated over the group).
  RowParallelLinear(Tensor w, Tensor b, Tensor dw, Tensor db, const TensorParallel& tp,
                    LinearPrecision precision = LinearPrecision::compute_dtype);
  // y = x (N, in_local) W^T summed over the group, + b: (N, out), or this
  // rank's rows (N/tp, out) of it under sequence parallelism. A residual
  // (y's shape) is added to y: inside the product (one rank's, before the
  // all-reduce, as the bias), or after the reduce-scatter under sequence
  // parallelism.
  void forward(const Tensor& y, const LinearOperand& x, const Tensor& residual = {}) const;
  // dy as forward's y (replicated, or this rank's rows under sequence
  // parallelism: gathered here). dx (N, in_local) = dy W (overwritten);
  // dw += dy^T x; db += sum_rows(dy) over all N rows (every rank's db is
  // then the whole gradient, as the bias is replicated).
  void backward(const Tensor& dx, const Tensor& dy, const Tensor& x) const;
  // The same in two parts (zero-bubble schedules run the second later):
  // backward_data returns the (N, out) gradient backward_weights needs (dy
  // itself, or the rows gathered under sequence parallelism; under fp8 with
  // the codes its product made).
  LinearOperand backward_data(const Tensor& dx, const Tensor& dy) const;
  // backward_data followed by the backward of the GeLU whose output this
  // layer read: dx = gelu'(pre) * (dy W), pre the GeLU's input (N, in_local).
  // One fused product where the backend has one (ops::matmul_gelu_backward).
  LinearOperand backward_data_gelu(const Tensor& dx, const Tensor& dy, const Tensor& pre) const;
  void backward_weights(const LinearOperand& dy_rows, const LinearOperand& x,
                        ops::GradWrite write = ops::GradWrite::accumulate) const;
  RowParallelLinear with_grads(Tensor dw, Tensor db) const {
    return RowParallelLinear(w_, b_, std::move(dw), std::move(db), tp_, precision_);
  }

 private:
  Tensor backward_data_rows(const Tensor& dy) const;  // (N, out): dy, or gathered
  Tensor w_, b_, dw_, db_;
  TensorParallel tp_;
  LinearPrecision precision_;
};

}  // namespace zt::nn
