// CUDA GeLU (tanh) and SwiGLU, forward and backward (contracts: ops/activation.h).
#pragma once

#include "core/tensor.h"

namespace zt::cuda {

void gelu_forward(const Tensor& y, const Tensor& x);
void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);
void swiglu_forward(const Tensor& y, const Tensor& x);
void swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x);

}  // namespace zt::cuda
