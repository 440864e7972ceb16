// CUDA fused AdamW step (contract: ops/adamw.h; math as backend/cpu/adamw.h).
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "backend/cpu/adamw.h"
#include "core/tensor.h"

namespace zt::cuda {

// no_decay: element ranges [first, second) without weight decay, sorted and
// disjoint (ops::AdamWParams::no_decay, validated). One launch per
// adamw_kernels::kMaxNoDecaySpans of them.
void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const cpu::AdamWHyper& p,
                std::span<const std::pair<int64_t, int64_t>> no_decay);

}  // namespace zt::cuda
