// Elementwise utilities: casts, add/scale, fills, reductions for the global
// gradient norm, and random initialisation from the counter RNG.
#pragma once

#include <span>

#include "core/rng.h"
#include "core/tensor.h"

namespace zt::ops {

// out = in converted to out's dtype (any dtype pair; float -> int truncates
// toward zero, float formats round as core/dtype.h says). Equal numel required.
void cast(const Tensor& out, const Tensor& in);
// out = a + b (same shape and dtype, f32 or bf16); out may alias a or b.
void add(const Tensor& out, const Tensor& a, const Tensor& b);
// out = alpha * x; out may alias x.
void scale(const Tensor& out, const Tensor& x, float alpha);
// y += alpha * x.
void axpy(const Tensor& y, float alpha, const Tensor& x);
// out[:] = value (float dtypes and integers).
void fill(const Tensor& out, double value);
// sum of x^2, accumulated in f64 (f32, bf16, f16).
double sum_squares(const Tensor& x);
// sqrt of the sum of sum_squares over the tensors: the global L2 norm.
double global_norm(std::span<const Tensor> tensors);
// Random fills from the counter RNG; each call reserves its counters from gen
// (values generated in f32, then cast to out's dtype).
void fill_normal(const Tensor& out, Generator& gen, float mean, float std);
void fill_uniform(const Tensor& out, Generator& gen, float lo, float hi);

}  // namespace zt::ops
