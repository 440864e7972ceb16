// Scaled-dot-product attention with grouped-query heads, computed
// flash-style: tiles of queries against tiles of keys with an online softmax,
// so memory is O(T) per head (no T x T matrix is ever stored).
//
//   q: (B, T, Hq, D)   k, v: (B, Tk, Hkv, D)   Hq % Hkv == 0
//   query head h attends with kv head h / (Hq / Hkv)
//   mask causal (the default): Tk == T and query t sees keys s <= t
//   mask none: every query sees all Tk >= 1 keys - a block of keys wholly in
//     the queries' past, as context parallelism's ring hands them over
//     (nn/ring_attention.h)
//   out: (B, T, Hq, D)
//   lse: (B, Hq, T) f32: logsumexp over the keys t sees of scale * q_t . k_s
//   scale: 1/sqrt(D) when scale <= 0 (must be finite)
// Dtypes: q, k, v, out (and the grads) all f32 or all bf16; math in f32.
// Aliasing: no output may overlap an input or another output.
// Deterministic: results do not depend on the number of threads. On a GPU
// the backward repeats bit for bit while deterministic() holds (the
// default); with it off, cuDNN's backward sums dq with atomics
// (core/determinism.h).
#pragma once

#include "core/tensor.h"

namespace zt::ops {

enum class AttentionMask { causal, none };

// The scale a call with scale <= 0 uses: 1/sqrt(D).
float default_attention_scale(int64_t D);

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       float scale = 0.0f, AttentionMask mask = AttentionMask::causal);

// Recomputes the probabilities from lse (nothing T x T is saved):
//   dq (B, T, Hq, D), dk and dv (B, Tk, Hkv, D): overwritten.
// out and lse may be those of a softmax over more keys than k holds (the
// merged result of several blocks): then dq, dk, dv are this block's terms
// of the whole gradient, which sums over the blocks.
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        float scale = 0.0f, AttentionMask mask = AttentionMask::causal);

// q, k, v as the heads of qkv (B, T, Hq + 2 Hkv, D): a fused qkv product's
// output, heads in the weight's row order (Hq query, Hkv key, Hkv value).
// The backward writes dq, dk, dv as the same heads of dqkv (its input
// gradient). The same numbers as the calls above on the heads copied apart:
// on a GPU cuDNN reads and writes them in place (strides), every other
// kernel (and the CPU) runs on copies.
void attention_forward_packed(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t Hq, int64_t Hkv,
                              float scale = 0.0f);
void attention_backward_packed(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                               const Tensor& lse, int64_t Hq, int64_t Hkv, float scale = 0.0f);

// Context parallelism's merge of one key block's attention into a running
// result (nn/ring_attention.h): at rows [row0, row0 + n) of
//   out (B, T, H, D) f32 and lse (B, H, T) f32, from
//   part (B, n, H, D) (f32 or bf16) and part_lse (B, H, n) f32:
//   lse' = log(e^lse + e^part_lse)
//   out' = e^(lse - lse') out + e^(part_lse - lse') part
// in f32. A running lse of -inf (nothing merged yet) takes the block as it
// is. The other rows are left alone; part must not overlap out or lse.
void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& part, const Tensor& part_lse, int64_t row0);

}  // namespace zt::ops
