// CUDA fused AdamW step (contract: ops/adamw.h; math as backend/cpu/adamw.h).
#pragma once

#include "backend/cpu/adamw.h"
#include "core/tensor.h"

namespace zt::cuda {

// One launch per adamw_kernels::kMaxNoDecaySpans of p.no_decay's spans.
void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const cpu::AdamWHyper& p);

}  // namespace zt::cuda
