// The two halves of a Megatron-style tensor-parallel layer pair.
//
//   ColumnParallelLinear  W (out, in) split by OUTPUT rows: rank r holds rows
//                         [r*out/tp, (r+1)*out/tp) and computes its slice of
//                         y = x W^T + b without communication; in backward its
//                         dx is a partial sum the group all-reduces (a
//                         reduce-scatter under sequence parallelism).
//   RowParallelLinear     W (out, in) split by INPUT columns: rank r consumes
//                         the slice of x its column-parallel partner produced
//                         and computes a partial y that the group all-reduces
//                         (reduce-scatter under SP); the bias is added once.
//
// Attention uses qkv (column) -> proj (row); the MLP uses in (column) -> out
// (row): one all-reduce per half in each direction. The group has size 1 in
// this build (no tensor-parallel collectives yet), so the layers are plain
// linear layers and the communication points are marked where they go.
//
// Each layer holds views of this rank's weight shard and of its gradient
// buffer (flat ParamSet buffers): constructing one is free.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::nn {

// This rank's place in its tensor-parallel group.
struct TensorParallelGroup {
  int64_t size = 1;
  int64_t rank = 0;
};

class ColumnParallelLinear {
 public:
  // w (out_local, in), b (out_local) or undefined; dw/db their gradients
  // (f32 or w's dtype; undefined to skip).
  ColumnParallelLinear(Tensor w, Tensor b, Tensor dw, Tensor db, TensorParallelGroup group = {});
  // y (..., out_local) = x (..., in) W^T + b.
  void forward(const Tensor& y, const Tensor& x) const;
  // dx (..., in) = dy W: overwritten, or accumulated (+=) when accumulate_dx
  // (several column-parallel layers reading the same input, as q, k and v do).
  // dw += dy^T x, db += sum_rows(dy).
  void backward(const Tensor& dx, const Tensor& dy, const Tensor& x, bool accumulate_dx) const;

 private:
  Tensor w_, b_, dw_, db_;
  TensorParallelGroup group_;
};

class RowParallelLinear {
 public:
  // w (out, in_local), b (out) or undefined.
  RowParallelLinear(Tensor w, Tensor b, Tensor dw, Tensor db, TensorParallelGroup group = {});
  // y (..., out) = x (..., in_local) W^T (summed over the group) + b.
  void forward(const Tensor& y, const Tensor& x) const;
  // dx (..., in_local) = dy W (overwritten); dw += dy^T x; db += sum_rows(dy).
  void backward(const Tensor& dx, const Tensor& dy, const Tensor& x) const;

 private:
  Tensor w_, b_, dw_, db_;
  TensorParallelGroup group_;
};

}  // namespace zt::nn
