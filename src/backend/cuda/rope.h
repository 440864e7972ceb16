// CUDA rotary embedding (contracts: ops/rope.h). Host-callable; no CUDA headers.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cuda {

// The (T_max, D/2, 2) cos/sin table, computed on the host in f64 exactly as
// the CPU does and copied (bitwise equal tables on both backends).
void rope_table(const Tensor& table, const double* freqs);
void rope_rotate(const Tensor& y, const Tensor& x, const Tensor& table, int64_t pos_offset, bool inverse);
// As cpu::rope_packed_qkv: the query and key heads of qkv rotated in place,
// one launch over them (the value heads get no thread).
void rope_packed_qkv(const Tensor& qkv, int64_t Hq, int64_t Hkv, const Tensor& table, int64_t pos_offset,
                     bool inverse);
// As cpu::rope_split_qkv (backend/cpu/rope.h) with a table: one launch over
// qkv.
void rope_split_qkv(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& table,
                    int64_t pos_offset, bool backward);

}  // namespace zt::cuda
