// CUDA mixture-of-experts routing, gather and combine (contracts: ops/moe.h;
// the kernels: moe_kernels.cuh). Host-callable; no CUDA headers. Every
// tensor on the op's GPU, the plan's index tensors (order, where) too: the
// ops layer validates them on the host and uploads them.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cuda {

void moe_route(const Tensor& probs, const Tensor& choice, const Tensor& weight, const Tensor& logits,
               bool normalize, const Tensor& lse, const Tensor& bias);
void moe_route_backward(const Tensor& dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& choice,
                        const Tensor& weight, bool normalize, const Tensor& aux_dprob, const Tensor& dlse);
void moe_gather(const Tensor& xs, const Tensor& x, const Tensor& order, int64_t k);
void moe_gather_backward(const Tensor& dx, const Tensor& dxs, const Tensor& where, int64_t k, bool accumulate);
void moe_combine(const Tensor& out, const Tensor& ys, const Tensor& weight, const Tensor& where,
                 const Tensor& residual);
void moe_combine_backward(const Tensor& dys, const Tensor& dweight, const Tensor& dout, const Tensor& ys,
                          const Tensor& weight, const Tensor& where);

}  // namespace zt::cuda
