// CPU kernels of grouped-query attention (see ops/attention.h for the
// contract). Arguments are validated by zt::ops; `scale` is already resolved
// (> 0).
//
//   q, dq, out, dout: (B, T, Hq, D)   k, v, dk, dv: (B, Tk, Hkv, D)   lse: (B, Hq, T) f32
//   causal: Tk == T, query t sees keys s <= t; else every query sees all Tk keys (Tk > 0).
//   All of q, k, v, out, dout, dq, dk, dv share one dtype: f32 or bf16.
#pragma once

#include "core/tensor.h"

namespace zt::cpu {

// out = softmax(scale q k^T (+ causal mask)) v per (batch, query head);
// lse = logsumexp of the (masked) scaled scores.
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       float scale, bool causal = true);

// How the backward is split into parallel tasks. `fused`: one task per
// (batch, kv head), 5 tile products per (query tile, key tile) pair. `split`:
// dk/dv per (batch, kv head, key tile), then dq per (batch, query head, query
// tile), 7 products per pair but more tasks. `automatic` picks split when
// B * Hkv tasks would leave threads idle. All give bit-identical results.
enum class BackwardSchedule { automatic, fused, split };

// dq, dk, dv overwritten. Deterministic: the result does not depend on the
// number of OpenMP threads or the schedule. out and lse are those of the
// whole softmax: a block's share of the gradient when they were merged
// over several key blocks (parallel/ring_attention.h).
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale,
                        bool causal = true, BackwardSchedule schedule = BackwardSchedule::automatic);

// The same with q, k, v as the heads of qkv (B, T, Hq + 2 Hkv, D), dq, dk,
// dv written into dqkv of that shape (ops/attention.h): on copies of the
// heads, split before and joined after (backend/cpu/rope.h, rope_split_qkv).
void attention_forward_packed(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t Hq, int64_t Hkv,
                              float scale);
void attention_backward_packed(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                               const Tensor& lse, int64_t Hq, int64_t Hkv, float scale);

// ops::attention_merge: out (B, T, H, D) f32, lse (B, H, T) f32 at rows
// [row0, row0 + n) merged with part (B, n, H, D) f32 or bf16 and part_lse
// (B, H, n) f32.
void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& part, const Tensor& part_lse, int64_t row0);

}  // namespace zt::cpu
