// Token (+ learned position) embedding.
//   tokens: (B, T) i32, each in [0, V); on out's device or on the host (ids
//           are validated on the host before any write: host tokens save a
//           device-to-host copy and its wait)
//   wte: (V, C)   wpe: (T_max, C) or undefined   out: (B, T, C)
// Dtypes: wte, wpe, out f32 or bf16 (equal); grads f32 or dout's dtype.
// pos_offset >= 0 and pos_offset + T <= T_max. Outputs must not overlap inputs.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::ops {

// Tensor parallelism splits the vocabulary: wte (or dwte) holds rows
// [start, start + wte.size(0)) of a vocabulary of `vocab` ids (rows past the
// vocabulary may be padding). Tokens outside the slice contribute a zero wte
// term (forward) and no gradient (backward); every id must still lie in
// [0, vocab). vocab < 0: wte is the whole vocabulary.
struct VocabSlice {
  int64_t start = 0;
  int64_t vocab = -1;
  bool partial() const { return vocab >= 0; }
};

// out[b, t] = wte[tokens[b, t]] + wpe[t + pos_offset]  (wpe term only if defined)
// A token id outside [0, V) is an error naming the id and its position.
void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset = 0, VocabSlice slice = {});

// dwte[v] += sum of dout[b, t] over positions with tokens[b, t] == v
// dwpe[t + pos_offset] += sum_b dout[b, t]      (either may be undefined)
// Deterministic: the summation order does not depend on the thread count
// (each row of dwte/dwpe is summed in f32 in position order, then added with
// one rounding). Token ids are validated (against dwte's V) before writing.
void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                        int64_t pos_offset = 0, VocabSlice slice = {});

}  // namespace zt::ops
