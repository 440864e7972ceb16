// An input of linear products: a tensor and, under fp8 (ops/fp8.h), its
// codes made on the first product that reads it and shared by every copy -
// so the products reading one tensor quantise it once: q, k and v their
// input ln1, a layer's input and weight gradients their output gradient dy.
//
// The codes (E4M3 for inputs, E5M2 for gradients; the tensor's shape, one
// byte an element, and a 1-element f32 scale_inv) live in the workspace
// until the last copy goes. A copy made with fresh() keeps only the tensor:
// a deferred weight pass (zero-bubble schedules) quantises again when it
// runs rather than hold the codes through the schedule.
//
// The codes are of the tensor as it was when they were made: a caller that
// writes the tensor afterwards must not read them again (the block's
// backward writes dres in place only after the products that read it).
#pragma once

#include <memory>

#include "core/tensor.h"

namespace zt::nn {

// A tensor's fp8 codes q (its shape) and scale_inv (1) f32: values q * scale_inv.
struct Fp8Codes {
  Tensor q, scale_inv;
};

class LinearOperand {
 public:
  LinearOperand() = default;
  // Implicit: a plain tensor is an operand whose codes no other product shares.
  LinearOperand(Tensor t);  // NOLINT(google-explicit-constructor)

  const Tensor& tensor() const { return t_; }
  // The codes in `format` (f8e4m3 or f8e5m2), viewed as tensor()'s shape;
  // made on the first call of any copy. One operand takes one format.
  Fp8Codes codes(DType format) const;
  // The same operand viewed as (rows, last dimension), sharing the codes.
  LinearOperand rows() const;
  // A copy without the codes (made again if it is quantised).
  LinearOperand fresh() const { return LinearOperand(t_); }

 private:
  struct Shared {
    Fp8Codes codes;  // flat (numel) once made
  };
  Tensor t_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace zt::nn
