// cuDNN's fused flash attention (SDPA) as backend graphs: causal or unmasked, grouped-query,
// forward with softmax statistics and a deterministic backward. Host-only graph
// construction (no GPU needed), so plans can be checked ahead of time on the
// CPU; attention_cudnn.cpp runs them on a GPU.
//
// Our layouts, as cuDNN (b, h, s, d) views with strides:
//   q, out, dq, dout (B, T, Hq, D);  k, v, dk, dv (B, Tk, Hkv, D), or q, k, v
//   (and dq, dk, dv) as heads of one (B, T, Hq + 2 Hkv, D) tensor (qkv_row);
//   lse (B, Hq, T) f32: the natural-log sum of exp of the scaled, masked
//   scores, which is exactly cuDNN's softmax "stats".
// cuDNN recognises a fused attention by the shape of the graph: matmul, scale,
// causal mask (row index >= column index, else -inf), softmax (max, subtract,
// exp, sum, divide; log-sum-exp to stats), matmul - the pattern cuDNN's own
// frontend emits. The backward is the variant whose dQ is a plain matmul
// output (no f32 atomic accumulator): deterministic on Hopper.
#pragma once

#include <memory>

#include "backend/cuda/cudnn_graph.h"

namespace zt::cuda::cudnn {

struct SdpaShape {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, D = 0;
  cudnnDataType_t io = CUDNN_DATA_BFLOAT16;  // q, k, v, out and gradients (bf16 or f16)
  float scale = 1.0f;                        // applied to q.k
  // Elements from one token's q to the next's, the same for k, v and the
  // backward's dq, dk, dv: 0 for separate tensors (H D each); (Hq + 2 Hkv) D
  // when they are the heads of one fused qkv product's output, read and
  // written in place.
  int64_t qkv_row = 0;
  // Causal (query t sees keys s <= t, Tk = T), or every query sees all Tk
  // keys (a block of context parallelism's ring: no mask nodes).
  bool causal = true;
  int64_t Tk = 0;  // keys when not causal (0: T)
  int64_t keys() const { return Tk > 0 ? Tk : T; }
};

struct SdpaForwardGraph {
  std::shared_ptr<Graph> graph;
  Uid q, k, v, out, lse;
};

// How the backward forms dq = ds k, the sum over key tiles for each query.
enum class SdpaBackward {
  // dq a plain product output: cuDNN keeps ds (B x Hq x T^2 io elements) in
  // its workspace and runs dq as a second pass. The same bits every run.
  deterministic,
  // Each key tile adds its share into an f32 accumulator (dq_accum) with
  // atomics, then cuDNN rounds it into dq: no (T, T) workspace, no second
  // pass over ds, but the order of the additions (so dq's last bits) varies
  // from run to run.
  atomic,
};

struct SdpaBackwardGraph {
  std::shared_ptr<Graph> graph;
  Uid q, k, v, out, dout, lse, dq, dk, dv;
  Uid row_sums;  // (B, Hq, T) f32 scratch the caller provides: dout . out per row
  // SdpaBackward::atomic only (else kNoTensor): (B, Hq, T, D) f32 the caller
  // provides; cuDNN 9.6 and later zero it themselves, older versions need it
  // zero-filled before each execution (as cuDNN's frontend does).
  Uid dq_accum = kNoTensor;
};

SdpaForwardGraph sdpa_forward_graph(const SdpaShape& shape);
SdpaBackwardGraph sdpa_backward_graph(const SdpaShape& shape, SdpaBackward algorithm = SdpaBackward::deterministic);

}  // namespace zt::cuda::cudnn
