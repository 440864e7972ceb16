// Rotary position embedding (RoPE), Meta's interleaved-pair convention:
// channel pairs (2i, 2i+1) of each head are rotated by angle pos * freq_i,
//   freq_i = theta^(-2i / D),  i = 0 .. D/2-1
// optionally rescaled by Llama 3's long-context rule (RopeScaling). Hugging
// Face checkpoints use the "rotate half" layout; the HF converter permutes
// q/k weights between the two.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::ops {

struct RopeScaling {
  bool enabled = false;
  float factor = 8.0f;            // Llama 3.1: 8
  float low_freq_factor = 1.0f;   // Llama 3.1: 1
  float high_freq_factor = 4.0f;  // Llama 3.1: 4
  int64_t original_max_position = 8192;
};

// The frequency of pair i (with Llama 3 scaling applied when enabled), in f64.
double rope_frequency(int64_t i, int64_t head_dim, double theta, const RopeScaling& scaling);

// table: (T_max, D/2, 2) f32, table[t][i] = (cos(t freq_i), sin(t freq_i)).
void rope_table(const Tensor& table, int64_t head_dim, double theta, const RopeScaling& scaling);

// x, y: (B, T, H, D), f32 or bf16; position of token t is t + pos_offset
// (pos_offset + T <= T_max). y may alias x (be the same tensor, in place;
// a partial overlap is an error).
void rope_forward(const Tensor& y, const Tensor& x, const Tensor& table, int64_t pos_offset = 0);
// The inverse rotation applied to the gradient; dx may alias dy (same rule).
void rope_backward(const Tensor& dx, const Tensor& dy, const Tensor& table, int64_t pos_offset = 0);

// RoPE in place on the fused qkv product's output, qkv (B, T, Hq + 2 Hkv, D)
// with the heads in the qkv weight's row order: its Hq query and Hkv key
// heads rotated, its Hkv value heads untouched (attention reads the heads
// where they are: attention_forward_packed). The query and key heads get
// the bits rope_forward gives them as separate tensors. Hq, Hkv >= 1.
void rope_packed_qkv_forward(const Tensor& qkv, int64_t Hq, int64_t Hkv, const Tensor& table,
                             int64_t pos_offset = 0);
// Its gradient, in place on dqkv (attention_backward_packed's output): the
// inverse rotation of the query and key heads' gradients; dv untouched.
void rope_packed_qkv_backward(const Tensor& dqkv, int64_t Hq, int64_t Hkv, const Tensor& table,
                              int64_t pos_offset = 0);

// The fused qkv product's split: qkv (B, T, Hq + 2 Hkv, D) holds the heads in
// the qkv weight's row order (Hq query heads, Hkv key heads, Hkv value
// heads); q (B, T, Hq, D) and k (B, T, Hkv, D) get its query and key heads
// rotated, v (B, T, Hkv, D) its value heads copied. One pass over qkv: the
// rotation of q and k already reads and writes them, so only v's copy is
// added to what a RoPE in place after three products moves. No two of q, k,
// v, qkv may share a byte.
void rope_split_qkv_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qkv,
                            const Tensor& table, int64_t pos_offset = 0);
// Its gradient: dqkv = (rope_backward(dq) | rope_backward(dk) | dv) along
// the heads, the input gradient of the fused product.
void rope_split_qkv_backward(const Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const Tensor& table, int64_t pos_offset = 0);

}  // namespace zt::ops
