// CPU kernels of rotary position embedding (see ops/rope.h for the contract).
// Arguments are validated by zt::ops.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cpu {

// table: (T_max, D/2, 2) f32, table[t][i] = (cos(t freqs[i]), sin(t freqs[i]))
// with the angle, cos and sin in f64, rounded once. freqs: D/2 values.
void rope_table(const Tensor& table, const double* freqs);

// x, y: (B, T, H, D) of one dtype (f32 or bf16); y may be x itself.
// Rotates every channel pair (2i, 2i+1) of row (b, t, h) by the angle of
// position t + pos_offset: y = R x, or y = R^T x (the inverse) when `inverse`.
void rope_rotate(const Tensor& y, const Tensor& x, const Tensor& table, int64_t pos_offset, bool inverse);

// qkv (B, T, Hq + 2 Hkv, D): its first Hq + Hkv heads (query, key) rotated
// in place (R^T when `inverse`), its value heads untouched.
void rope_packed_qkv(const Tensor& qkv, int64_t Hq, int64_t Hkv, const Tensor& table, int64_t pos_offset,
                     bool inverse);

// qkv (B, T, Hq + 2 Hkv, D) and its heads q (B, T, Hq, D), k, v (B, T, Hkv,
// D), one dtype, disjoint. Forward: q and k = qkv's first Hq and next Hkv
// heads rotated, v = its last Hkv heads. Backward: qkv = (R^T dq | R^T dk | dv).
// An undefined table rotates nothing: attention's plain split and join of a
// fused product's heads (ops/attention.h, attention_forward_packed).
void rope_split_qkv(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& table,
                    int64_t pos_offset, bool backward);

}  // namespace zt::cpu
