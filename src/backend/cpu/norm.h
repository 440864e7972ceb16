// CPU kernels for LayerNorm / RMSNorm (zt::ops::norm_* in src/ops/norm.h).
//
// The tensors are already validated by ops/norm.cpp: x, y, r_in, r_out, dy, dx,
// dx_add share one dtype T in {f32, bf16} and are contiguous (N, C); w, b (C)
// share a dtype in {f32, bf16}; dw, db (C) are f32 or w's dtype; mean, rstd (N)
// are f32. Undefined optional tensors (b, mean for RMSNorm, db, dx_add) are
// passed as undefined Tensors.
//
// Math, per row x (C), LayerNorm / RMSNorm:
//   mean = sum(x) / C                       (LayerNorm only)
//   rstd = 1 / sqrt(sum((x - mean)^2) / C + eps)   |   1 / sqrt(sum(x^2) / C + eps)
//   xhat = (x - mean) * rstd                |   x * rstd
//   y    = xhat * w + b                     |   xhat * w
// Backward, with g = dy * w:
//   dx   = rstd * (g - mean(g) - xhat * mean(g * xhat))   |   rstd * (g - xhat * mean(g * xhat))
//   dw  += sum over rows of dy * xhat;   db += sum over rows of dy
// Arithmetic is f32. The forward's mean is sum(x - x[0]) / C + x[0], formed in
// f64 and kept as two floats mean_hi + mean_lo, so x - mean is accurate to a
// few ulp of itself and the variance is the two-pass sum of (x - mean)^2: a
// large common offset (|mean| >> std) does not cancel. The saved mean is
// mean_hi (f32); the backward recomputes xhat = (x - mean) * rstd from it.
#pragma once

#include "core/tensor.h"

namespace zt::cpu {

// y (N, C) = norm(x (N, C)); mean (N) (LayerNorm only) and rstd (N) saved.
void norm_forward(bool rms, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                  const Tensor& w, const Tensor& b, float eps);

// r_out (N, C) = r_in + x (rounded to T); y = norm(r_out). r_out may alias r_in.
void residual_norm_forward(bool rms, const Tensor& r_out, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                           const Tensor& r_in, const Tensor& x, const Tensor& w, const Tensor& b, float eps);

// dx (N, C) = norm'(x) . dy (+ dx_add); dx may alias dy or dx_add.
// dw (C) += sum_rows(dy * xhat); db (C) += sum_rows(dy) when defined (=, not
// read, when overwrite).
// The parameter-gradient reduction uses a fixed number of row chunks that
// depends only on N, summed in chunk order: bitwise identical results for any
// thread count.
void norm_backward(bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add,
                   bool overwrite = false);

}  // namespace zt::cpu
