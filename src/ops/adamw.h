// AdamW (Loshchilov & Hutter) with decoupled weight decay, one fused pass.
//
//   g  = grad * grad_scale            (clipping and loss-scale unscaling)
//   m  = beta1 m + (1 - beta1) g
//   v  = beta2 v + (1 - beta2) g^2
//   p -= lr * ( (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps) + weight_decay * p )
//   model_copy = round(p)  when defined (the low-precision weights the model computes with)
//
// master, m, v: (n) f32; grad: (n) f32 or bf16; model_copy: (n) bf16, f16 or
// f32, or undefined. Any shapes of equal numel are accepted; the buffers must
// not overlap. The model copy is the updated master rounded to nearest even
// (bitwise core/dtype.h's conversion), or, with stochastic_rounding (bf16
// copies only), rounded stochastically (core/rng.h's
// float_to_bf16_bits_stochastic): element k of the call uses the random word
// philox_word_at(rounding_seed, step, rounding_offset + k), so the bits depend
// on an element's position in the caller's buffer (rounding_offset: where this
// call's first element sits), never on the split into calls or threads, and
// the copy is unbiased: E[copy] = master. Requires step >= 1, beta1 and beta2
// in [0, 1), eps >= 0, lr >= 0, weight_decay >= 0, all finite.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace zt::ops {

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // 1-based step number, for bias correction
  float grad_scale = 1.0f;
  bool stochastic_rounding = false;  // of a bf16 model copy (else nearest even)
  uint64_t rounding_seed = 0;
  int64_t rounding_offset = 0;
  // Element ranges [first, second) of the buffers that take no weight decay
  // (norm gains, biases, ...): sorted, disjoint, within the buffers. One call
  // then updates parameters with both rules (on a GPU one launch, not one per
  // run of tensors); each element's bits are those of a call on its run alone.
  std::vector<std::pair<int64_t, int64_t>> no_decay;
};

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const AdamWParams& p);

}  // namespace zt::ops
