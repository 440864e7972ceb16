// CPU mixture-of-experts routing, dispatch and combine (contract:
// ops/moe.h). Arguments already validated. Every loop runs over tokens or
// sorted rows, each written by one thread in a fixed order: the results do
// not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace zt::cpu {

void moe_route(const Tensor& probs, const Tensor& choice, const Tensor& weight, const Tensor& logits,
               bool normalize, const Tensor& lse, const Tensor& bias);
void moe_route_backward(const Tensor& dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& choice,
                        const Tensor& weight, bool normalize, const Tensor& aux_dprob, const Tensor& dlse);
void moe_dispatch_plan(const Tensor& order, const Tensor& where, std::vector<int64_t>& offsets,
                       const Tensor& choice, int64_t E, int64_t capacity, std::vector<int64_t>* routed,
                       const std::vector<int64_t>& run_start, const std::vector<int64_t>& run_ahead);
void moe_gather(const Tensor& xs, const Tensor& x, const Tensor& order, int64_t k);
void moe_gather_backward(const Tensor& dx, const Tensor& dxs, const Tensor& where, int64_t k, bool accumulate);
void moe_combine(const Tensor& out, const Tensor& ys, const Tensor& weight, const Tensor& where,
                 const Tensor& residual);
void moe_combine_backward(const Tensor& dys, const Tensor& dweight, const Tensor& dout, const Tensor& ys,
                          const Tensor& weight, const Tensor& where);

}  // namespace zt::cpu
