// LayerNorm and RMSNorm over the last dimension, and their fused residual form.
//
//   LayerNorm: y = (x - mean) * rstd * w + b,  rstd = 1 / sqrt(var(x) + eps)
//   RMSNorm:   y = x * rstd * w,               rstd = 1 / sqrt(mean(x^2) + eps)
// (var is the biased variance, as in PyTorch.) Statistics are computed in f32.
//
// Shapes: x, y (..., C) seen as (N, C), C >= 1; w, b (C); mean, rstd (N) f32,
// saved for the backward pass (mean is undefined for RMSNorm).
// Dtypes: x, y, w, b f32 or bf16 (x and y equal; b has w's dtype); grads
// dw/db f32 or w's dtype. eps finite and >= 0.
// Aliasing: only the in-place forms named below; otherwise outputs must not
// overlap any other argument.
#pragma once

#include "core/tensor.h"
#include "ops/grad_write.h"

namespace zt::ops {

enum class NormKind { layernorm, rmsnorm };

// b may be undefined (no bias); for RMSNorm b and mean must be undefined.
// y must not overlap x (no in-place form).
void norm_forward(NormKind kind, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                  const Tensor& w, const Tensor& b, float eps);

// dx  = d(norm)/dx . dy  (+ dx_add when defined: fused residual gradient)
//       dx is overwritten and may alias dx_add or dy.
// dw += sum_rows(dy * xhat);  db += sum_rows(dy)  (db undefined to skip; must
//       be undefined for RMSNorm; GradWrite::overwrite: =, dw and db not
//       read). dw/db are bitwise deterministic: the result does not depend
//       on the number of threads.
void norm_backward(NormKind kind, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                   const Tensor& dx_add = {}, GradWrite weights = GradWrite::accumulate);

// Fused residual add + norm (one pass over memory):
//   r_out = r_in + x;   y = norm(r_out)
// r_out may alias r_in. The backward is norm_backward on r_out with
// dx_add = the gradient flowing into r_out from later layers; its dx is the
// gradient of both r_in and x.
void residual_norm_forward(NormKind kind, const Tensor& r_out, const Tensor& y, const Tensor& mean,
                           const Tensor& rstd, const Tensor& r_in, const Tensor& x, const Tensor& w,
                           const Tensor& b, float eps);

}  // namespace zt::ops
