// CPU fused AdamW step (contract: ops/adamw.h).
#pragma once

#include <cstdint>
#include <span>
#include <utility>

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
  // Elements [first, second) without weight decay: sorted, disjoint, within
  // the buffers (ops::AdamWParams::no_decay, validated). Each run of one rule
  // is its own pass here: the bits of a call per run.
  std::span<const std::pair<int64_t, int64_t>> no_decay = {};
};
void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const AdamWHyper& p);

}  // namespace zt::cpu
