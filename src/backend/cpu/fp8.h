// CPU per-tensor fp8 quantisation (contract: ops/fp8.h). Arguments already
// validated. The amax is a max (exact in any order), the codes one pass
// element by element: the results do not depend on the thread count.
#pragma once

#include "core/tensor.h"

namespace zt::cpu {

// max |x| over x (f32 or bf16); NaN or inf anywhere: +inf.
float abs_max(const Tensor& x);
// q[i] = x[i] * scale rounded to q's fp8 format (saturating); a non-finite
// x[i] becomes a NaN code.
void encode_fp8(const Tensor& q, const Tensor& x, float scale);

}  // namespace zt::cpu
