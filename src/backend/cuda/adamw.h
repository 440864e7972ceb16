// CUDA fused AdamW step (contract: ops/adamw.h; math as backend/cpu/adamw.h).
#pragma once

#include "backend/cpu/adamw.h"
#include "core/tensor.h"

namespace zt::cuda {

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const cpu::AdamWHyper& p);

}  // namespace zt::cuda
