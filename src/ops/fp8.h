// Per-tensor scaled fp8 ("current scaling"): a tensor held as fp8 codes q
// (same shape) and one f32 scale_inv, its values q * scale_inv. E4M3 (max
// 448, 3 mantissa bits) for the forward's operands, E5M2 (max 57344, 2
// bits, the wider range) for gradients, as the fp8 training recipes do.
//
// The scale is a power of two chosen from the tensor's absolute maximum so
// that amax * scale lands in (max/2, max] of the format: scaling and
// unscaling are exact, the codes' own rounding is the only error, and the
// largest value uses the format's top binade. Products run on the
// dequantised values with f32 accumulation - the numerics of an fp8 GEMM
// with f32 accumulation (cuBLASLt's on Hopper); the CPU computes them in
// f32 (its sgemm), so fp8 there is about its numerics, not its speed.
#pragma once

#include "core/tensor.h"
#include "ops/grad_write.h"

namespace zt::ops {

// The power-of-two scale for a tensor of absolute maximum `amax` in `format`
// (f8e4m3 or f8e5m2): 2^floor(log2(max / amax)), within [2^-126, 2^127];
// 1 for amax = 0 or a non-finite amax.
float fp8_scale(float amax, DType format);

// q <- x * scale in q's format (f8e4m3 or f8e5m2), scale = fp8_scale(max |x|);
// scale_inv (1) f32 <- 1 / scale. x: f32 or bf16, q x's shape. A non-finite
// element of x becomes a NaN code (and the scale 1): the loss and gradient
// checks downstream still see it. q must not share memory with x or scale_inv.
void quantize_fp8(const Tensor& q, const Tensor& scale_inv, const Tensor& x);
// out (f32 or bf16) <- q * scale_inv.
void dequantize_fp8(const Tensor& out, const Tensor& q, const Tensor& scale_inv);

// The linear layer on quantised operands, PyTorch's weight layout:
//   y (..., O) = [residual +] (xq sx) (..., I) (wq sw)^T (O, I) [+ b (O)]
// in one f32 accumulator, y rounded once (f32 or bf16; residual y's shape
// and dtype; b f32 or y's dtype). xq and wq: f8e4m3 or f8e5m2.
void fp8_linear_forward(const Tensor& y, const Tensor& xq, const Tensor& x_scale_inv, const Tensor& wq,
                        const Tensor& w_scale_inv, const Tensor& b, const Tensor& residual = {});
// Its backward on a quantised output gradient dyq (..., O):
//   dx (..., I)  = (dyq sdy) (wq sw)            (overwritten; f32 or bf16)
//   dw (O, I)   += (dyq sdy)^T (xq sx)         (f32; GradWrite::overwrite: =)
// Either may be undefined to skip it; xq (and its scale) is read only for
// dw and wq only for dx, and may be undefined when that one is skipped.
void fp8_linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& dyq, const Tensor& dy_scale_inv,
                         const Tensor& xq, const Tensor& x_scale_inv, const Tensor& wq, const Tensor& w_scale_inv,
                         GradWrite weights = GradWrite::accumulate);

}  // namespace zt::ops
