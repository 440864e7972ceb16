// CPU token + position embedding (contract: ops/embedding.h).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cpu {

// out: (B, T, C); tokens: (B, T) i32 in [0, V); wte: (V, C); wpe: (T_max, C)
// or undefined; T + pos_offset <= T_max. Arguments already validated.
// sliced: wte holds vocabulary rows [vocab_start, vocab_start + rows); other
// tokens contribute nothing (ops/embedding.h, VocabSlice).
void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset, int64_t vocab_start = 0, bool sliced = false);

// dwte: (V, C) or undefined; dwpe: (T_max, C) or undefined; dout: (B, T, C).
// Accumulates (+=). Arguments already validated.
void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                        int64_t pos_offset, int64_t vocab_start = 0, bool sliced = false);

}  // namespace zt::cpu
