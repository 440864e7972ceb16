// Inputs of the op benchmarks: tensors of uniform values from a seeded
// generator (ops::fill_uniform), the same every run.
#pragma once

#include <cstdint>

#include "core/rng.h"
#include "core/tensor.h"
#include "ops/elementwise.h"

namespace zt::bench {

// A host tensor of `shape` with values uniform in [lo, hi), drawn with `seed`.
inline Tensor uniform_tensor(const Shape& shape, DType dtype, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, dtype);
  Generator gen(seed);
  ops::fill_uniform(t, gen, lo, hi);
  return t;
}

}  // namespace zt::bench
