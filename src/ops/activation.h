// Pointwise activations. Dtypes f32 or bf16 (all arguments equal); math in f32.
#pragma once

#include "core/tensor.h"

namespace zt::ops {

// GeLU, tanh approximation (GPT-2):
//   y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// Any shape; y may alias x (the same tensor; no partial overlap).
void gelu_forward(const Tensor& y, const Tensor& x);
// dx = gelu'(x) * dy; dx may alias dy (the same tensor), not x.
void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);

// SwiGLU on the fused gate/up projection output (Llama MLP):
//   x: (..., 2H), each row [gate (H) | up (H)]      y: (..., H)
//   y = silu(gate) * up,   silu(g) = g * sigmoid(g)
// y must not overlap x.
void swiglu_forward(const Tensor& y, const Tensor& x);
// dy: (..., H); dx: (..., 2H) = [dy * up * silu'(gate) | dy * silu(gate)];
// dx may be x itself (in place: the model's backward, as x is not read after
// it), and must not otherwise overlap x, nor overlap dy.
void swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);

}  // namespace zt::ops
