// CPU fused AdamW step (contract: ops/adamw.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cpu {

// master, m, v: f32; grad: f32/bf16; model_copy: bf16/f16/f32 or undefined;
// all of equal numel and disjoint. Arguments already validated.
// Hyper-parameters as in ops::AdamWParams (step >= 1).
struct AdamWHyper {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;
  float grad_scale;
  bool stochastic_rounding = false;  // bf16 model copy only (ops/adamw.h)
  uint64_t rounding_seed = 0;
  int64_t rounding_offset = 0;
};
void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const AdamWHyper& p);

}  // namespace zt::cpu
