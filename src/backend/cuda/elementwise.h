// CUDA elementwise kernels (same contracts as backend/cpu/elementwise.h; see
// ops/elementwise.h). Host-callable; no CUDA headers.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"

namespace zt::cuda {

void cast(const Tensor& out, const Tensor& in);  // float dtypes among f32/bf16/f16; same-dtype copies of any dtype
void add(const Tensor& out, const Tensor& a, const Tensor& b);
void scale(const Tensor& out, const Tensor& x, float alpha);
void axpy(const Tensor& y, float alpha, const Tensor& x);
void fill(const Tensor& out, double value);
// sum of x^2 in f64; fixed per-block partials summed in order (deterministic).
double sum_squares(const Tensor& x);
// sum over the tensors of sum_squares, one device sync for all of them.
double sum_squares_all(std::span<const Tensor> tensors);
void fill_normal(const Tensor& out, uint64_t seed, uint64_t offset, float mean, float std);
void fill_uniform(const Tensor& out, uint64_t seed, uint64_t offset, float lo, float hi);

}  // namespace zt::cuda
