// Matrix multiplication and the linear layer.
//
// Dtypes: a and b share a dtype, f32 or bf16. out is f32, or the inputs' dtype.
// bf16 operands are widened to f32 and accumulated in f32 (OpenBLAS sgemm on
// the CPU; cuBLASLt with f32 compute on CUDA).
#pragma once

#include "core/tensor.h"
#include "ops/grad_write.h"

namespace zt::ops {

// out = alpha * op(a) @ op(b) + beta * out   (+ bias broadcast over rows)
//   a:   (..., M, K), or (..., K, M) when trans_a
//   b:   (..., K, N), or (..., N, K) when trans_b; or 2-D, shared by every batch
//   out: (..., M, N)   batch dims ("...") of a and out are equal
//   bias: (N) or undefined; f32 or out's dtype
// beta = 0 never reads out (it may hold NaN); beta = 1 accumulates (grads).
// out must not share memory with a, b or bias (no in-place matmul).
void matmul(const Tensor& out, const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
            float alpha = 1.0f, float beta = 0.0f, const Tensor& bias = {});

// Linear layer y = x W^T + b, PyTorch's weight layout.
//   x: (..., C)   w: (OC, C)   b: (OC) or undefined   y: (..., OC)
// x and w share a dtype (f32 or bf16); y is f32 or x's dtype; b is f32 or y's.
// y must not share memory with x, w or b.
//
// With a residual (y's shape and dtype): y = residual + x W^T + b, the
// residual added in the product's f32 accumulator and y rounded once - a
// transformer block's residual connection without a pass of its own (on
// CUDA cuBLASLt reads it as the product's C, D = y). residual must not share
// memory with y, x, w or b.
void linear_forward(const Tensor& y, const Tensor& x, const Tensor& w, const Tensor& b,
                    const Tensor& residual = {});

// Backward of linear_forward. Each output may be undefined to skip it.
//   dx  = dy W          (overwritten)            (..., C)
//   dw += dy^T x        (accumulated; f32 or w's dtype)   (OC, C)
//   db += sum_rows(dy)  (accumulated; f32 or w's dtype)   (OC)
// GradWrite::overwrite writes dw and db without reading them (=, not +=).
// dy, x and w share a dtype; dx is f32 or that dtype. No output may share
// memory with an input or another output. db's summation order depends only
// on the shape (the same bits for every thread count).
void linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, GradWrite weights = GradWrite::accumulate);

// The gradient through a GeLU after a product, fused where the backend can:
//   out = gelu'(pre) * (a @ b)        (GeLU backward, tanh form, of activation_gelu)
//   a: (M, K)   b: (K, N)   pre, out: (M, N) - pre is the GeLU's input
// a, b, pre and out share a dtype (f32 or bf16). On CUDA one cuBLASLt product
// with the DGELU epilogue (f32 accumulator times gelu'(pre), one rounding);
// elsewhere, or when cuBLASLt has no algorithm for it, matmul then
// gelu_backward (the product rounded to out's dtype first): the same bits as
// calling the two. out must not share memory with a, b or pre.
void matmul_gelu_backward(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& pre);

// A linear layer and the GeLU after it:
//   pre = x W^T + b,  act = gelu(pre)   (tanh form, of activation_gelu)
//   x: (..., C)   w: (OC, C)   b: (OC) or undefined   pre, act: (..., OC)
// one dtype (f32 or bf16). linear_forward then gelu_forward (their bits),
// except on CUDA with ZT_CUDA_GELU_EPILOGUE=1, where one cuBLASLt product
// writes both (its GELU_AUX epilogue: its GeLU's bits, within bf16 rounding
// of these) where it has an algorithm. act and pre must not share memory
// with each other or the inputs.
void linear_gelu_forward(const Tensor& act, const Tensor& pre, const Tensor& x, const Tensor& w, const Tensor& b);

}  // namespace zt::ops
