// CPU kernels for the pointwise activations (zt::ops::gelu_*, swiglu_* in
// src/ops/activation.h). Arguments are already validated by
// ops/activation.cpp: one dtype T in {f32, bf16} for all tensors, contiguous.
//
// GeLU (tanh approximation), with u = sqrt(2/pi) (x + 0.044715 x^3):
//   y = 0.5 x (1 + tanh(u)) = x * s,   s = sigmoid(2u) = 1 / (1 + e),  e = exp(-2u)
//   dy/dx = s + x s (1 - s) 2 du/dx = s (1 + 2 x du/dx e s),
//   du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
// The sigmoid form avoids the cancellation of 1 + tanh(u) for x << 0 (the
// result keeps its relative accuracy all the way down), and 1 - s = e s.
//
// SwiGLU on rows [gate (H) | up (H)] -> y (H):
//   y = silu(g) u,   silu(g) = g s,  s = sigmoid(g) = 1 / (1 + exp(-g))
//   dgate = dy u silu'(g),  silu'(g) = s (1 + g (1 - s)) = s (1 + g e s)
//   dup   = dy silu(g)
//
// e (GeLU) is 2^z with z = -2 log2(e) u folded into the cubic's coefficients;
// exp(-g) (SiLU) is e^x. Both are simd.h's exp2 / exp (within 1 ulp for exact
// arguments); the rounding of the argument itself (|z| 2^-24 relative)
// dominates for large |x|. The arguments stay in range because the math runs
// on x clamped to [-10, 10] for GeLU and g clamped to [-87, 87] for SiLU:
// beyond those the functions and derivatives equal their limits (x or 0, 1 or
// 0) to within 1e-35. NaN inputs propagate.
#pragma once

#include "core/tensor.h"

namespace zt::cpu {

// y = gelu(x), elementwise over all elements; y may alias x.
void gelu_forward(const Tensor& y, const Tensor& x);
// dx = gelu'(x) * dy; dx may alias dy.
void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);
// x (N, 2H) -> y (N, H), with H = y's last dim.
void swiglu_forward(const Tensor& y, const Tensor& x);
// dy (N, H), x (N, 2H) -> dx (N, 2H); dx does not overlap x or dy.
void swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);

}  // namespace zt::cpu
