// CPU token + position embedding (contract: ops/embedding.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cpu {

// out: (B, T, C); tokens: (B, T) i32 in [0, V); wte: (V, C); wpe: (T_max, C)
// or undefined; T + pos_offset <= T_max. Arguments already validated.
void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset);

// dwte: (V, C) or undefined; dwpe: (T_max, C) or undefined; dout: (B, T, C).
// Accumulates (+=). Arguments already validated.
void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                        int64_t pos_offset);

}  // namespace zt::cpu
