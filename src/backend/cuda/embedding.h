// CUDA token (+ position) embedding forward and deterministic backward
// (contracts: ops/embedding.h). Host-callable; no CUDA headers.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cuda {

// wte (dwte) holds ids [vocab_start, vocab_start + rows): a tensor-parallel
// vocabulary slice, or the whole table with vocab_start 0. Other ids add
// nothing (forward) and get no gradient (backward).
void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset, int64_t vocab_start = 0);
// host_tokens: a host copy of tokens (the ops layer validates ids on it). The
// positions are grouped by token id on the host (counting sort, position
// order kept), so each dwte row is summed by one block in position order.
void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& host_tokens,
                        int64_t pos_offset, int64_t vocab_start = 0);

}  // namespace zt::cuda
