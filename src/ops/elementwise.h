// Elementwise utilities: casts, add/scale, fills, reductions for the global
// gradient norm, and random initialisation from the counter RNG.
#pragma once

#include <span>

#include "core/rng.h"
#include "core/tensor.h"

namespace zt::ops {

// out = in converted to out's dtype, any dtype pair, equal numel (shapes may
// differ). Every result is the correctly rounded / nearest representable value:
//   float -> float: one RNE rounding as core/dtype.h says (bf16/f16 overflow
//                   to inf, fp8 saturates, NaN stays NaN).
//   int -> float:   correctly rounded (RNE) from the exact integer.
//   float -> int:   truncation toward zero, saturating at the integer range;
//                   NaN -> 0.
//   int -> int:     saturating at the target range.
//   same dtype:     a bit copy (a no-op when out is in).
// out may be exactly in (same address) when the element sizes are equal;
// any other overlap is an error.
void cast(const Tensor& out, const Tensor& in);
// out = a + b (same shape and dtype: f32, bf16 or f16); out may alias a or b
// exactly (any partial overlap is an error).
void add(const Tensor& out, const Tensor& a, const Tensor& b);
// out = alpha * x (same shape and dtype: f32, bf16 or f16); out may alias x.
void scale(const Tensor& out, const Tensor& x, float alpha);
// y += alpha * x (f32/bf16/f16, dtypes may differ, equal numel), one rounding
// of fma(alpha, x, y) to y's dtype. y may alias x exactly.
void axpy(const Tensor& y, float alpha, const Tensor& x);
// out[:] = value, for every dtype. Float dtypes: value correctly rounded from
// the double. Integer dtypes: value must be an integer in the type's range.
void fill(const Tensor& out, double value);
// sum of x^2, accumulated in f64 (x: f32, bf16, f16). Fixed chunking, chunk
// sums added in order: the result does not depend on the thread count.
double sum_squares(const Tensor& x);
// sqrt of the sum of sum_squares over the tensors, in order: the global L2
// norm. All tensors on one device; an empty span gives 0.
double global_norm(std::span<const Tensor> tensors);
// Random fills from the counter RNG; each call reserves ceil(numel / 4)
// counters from gen (gen.reserve(numel)) so successive calls draw fresh
// numbers, and element i is mean + std * philox_normal_at(seed, offset, i)
// (resp. lo + (hi - lo) * philox_uniform_at(...)) computed in f32, then
// rounded to out's dtype (any float dtype). std >= 0 and lo <= hi, finite.
// A call that fails validation reserves nothing.
void fill_normal(const Tensor& out, Generator& gen, float mean, float std);
void fill_uniform(const Tensor& out, Generator& gen, float lo, float hi);

}  // namespace zt::ops
