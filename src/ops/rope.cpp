// Rotary position embedding: frequencies (with Llama 3 scaling), argument
// validation and device dispatch. The rotation and its gradient rule are in
// backend/cpu/rope.cpp; the contract in ops/rope.h.
//
// Llama 3 scaling of freq (wavelength w = 2 pi / freq, L = original_max_position):
//   w < L / high_freq_factor  -> freq                    (high frequencies kept)
//   w > L / low_freq_factor   -> freq / factor           (low frequencies slowed)
//   otherwise, smooth = (L / w - low_freq_factor) / (high_freq_factor - low_freq_factor),
//                           -> (1 - smooth) freq / factor + smooth freq
#include "ops/rope.h"

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

#include "backend/cpu/rope.h"
#include "ops/check.h"
#include "ops/op_profile.h"
#if ZT_WITH_CUDA
#include "backend/cuda/rope.h"
#endif

namespace zt::ops {
namespace {

void check_head_dim(const char* op, int64_t head_dim) {
  ZT_CHECK(head_dim > 0 && head_dim % 2 == 0, op, ": head_dim is ", head_dim,
           " but RoPE rotates channel pairs, so it must be positive and even");
}

void check_theta(const char* op, double theta) {
  ZT_CHECK(std::isfinite(theta) && theta > 0.0, op, ": theta is ", theta, " but it must be positive and finite");
}

void check_scaling(const char* op, const RopeScaling& s) {
  if (!s.enabled) return;
  ZT_CHECK(std::isfinite(s.factor) && s.factor > 0.0f, op, ": scaling.factor is ", s.factor,
           " but it must be positive");
  ZT_CHECK(s.low_freq_factor > 0.0f && s.high_freq_factor > s.low_freq_factor, op, ": scaling.low_freq_factor is ",
           s.low_freq_factor, " and scaling.high_freq_factor is ", s.high_freq_factor,
           " but 0 < low_freq_factor < high_freq_factor is required");
  ZT_CHECK(s.original_max_position > 0, op, ": scaling.original_max_position is ", s.original_max_position,
           " but it must be positive");
}

double frequency(int64_t i, int64_t head_dim, double theta, const RopeScaling& s) {
  const double freq = std::pow(theta, -2.0 * double(i) / double(head_dim));
  if (!s.enabled) return freq;
  const double orig = double(s.original_max_position);
  const double low = double(s.low_freq_factor), high = double(s.high_freq_factor), factor = double(s.factor);
  const double wavelen = 2.0 * std::numbers::pi / freq;
  if (wavelen < orig / high) return freq;
  if (wavelen > orig / low) return freq / factor;
  const double smooth = (orig / wavelen - low) / (high - low);
  return (1.0 - smooth) * freq / factor + smooth * freq;
}

// The table holds (cos, sin) of D / 2 pairs at positions pos_offset ..
// pos_offset + T - 1.
void check_table(const char* op, const Tensor& table, int64_t T, int64_t D, int64_t pos_offset) {
  check_ndim(op, "table", table, 3);
  check_shape(op, "table", table, Shape{table.size(0), D / 2, 2});
  check_dtype(op, "table", table, {DType::f32});
  ZT_CHECK(pos_offset >= 0 && pos_offset + T <= table.size(0), op, ": positions ", pos_offset, "..", pos_offset + T - 1,
           " (pos_offset ", pos_offset, ", T ", T, ") are outside 'table' ", table.shape().str(),
           "; build the table with T_max >= pos_offset + T");
}

// x (B, T, H, D) with an even head dim D, in a compute dtype.
void check_heads(const char* op, const char* x_name, const Tensor& x) {
  check_ndim(op, x_name, x, 4);
  ZT_CHECK(x.size(3) % 2 == 0, op, ": '", x_name, "' has shape ", x.shape().str(), " but the head dim (last) is ",
           x.size(3), "; RoPE rotates channel pairs, so it must be even");
  check_compute_dtype(op, x_name, x);
}

// y = rotation of x (inverse: the transposed rotation); names for messages.
void rope_apply(const char* op, const char* y_name, const Tensor& y, const char* x_name, const Tensor& x,
                const Tensor& table, int64_t pos_offset, bool inverse) {
  const OpScope scope(op, y);
  check_heads(op, x_name, x);
  check_shape(op, y_name, y, x.shape());
  check_same_dtype(op, y_name, y, x_name, x);
  check_device(op, x.device(), {{x_name, &x}, {y_name, &y}, {"table", &table}});
  check_table(op, table, x.size(1), x.size(3), pos_offset);
  check_alias_or_disjoint(op, y_name, y, x_name, x);
  check_disjoint(op, y_name, y, "table", table);
  if (x.device().is_cpu()) {
    cpu::rope_rotate(y, x, table, pos_offset, inverse);
#if ZT_WITH_CUDA
  } else if (use_cuda(op, x.device())) {
    cuda::rope_rotate(y, x, table, pos_offset, inverse);
#endif
  } else {
    no_backend(op, x.device());
  }
}

// RoPE in place on the query and key heads of a fused product's output
// (inverse: its gradient).
void rope_packed_apply(const char* op, const char* qkv_name, const Tensor& qkv, int64_t Hq, int64_t Hkv,
                       const Tensor& table, int64_t pos_offset, bool inverse) {
  const OpScope scope(op, qkv);
  check_heads(op, qkv_name, qkv);
  ZT_CHECK(Hq >= 1 && Hkv >= 1, op, ": Hq is ", Hq, " and Hkv is ", Hkv,
           " but a fused product holds at least one query and one key-value head");
  ZT_CHECK(qkv.size(2) == Hq + 2 * Hkv, op, ": '", qkv_name, "' has shape ", qkv.shape().str(), " but Hq ", Hq,
           " query and 2 x Hkv ", Hkv, " key and value heads make ", Hq + 2 * Hkv, " heads a token (dim 2)");
  check_device(op, qkv.device(), {{qkv_name, &qkv}, {"table", &table}});
  check_table(op, table, qkv.size(1), qkv.size(3), pos_offset);
  check_disjoint(op, qkv_name, qkv, "table", table);
  if (qkv.device().is_cpu()) {
    cpu::rope_packed_qkv(qkv, Hq, Hkv, table, pos_offset, inverse);
#if ZT_WITH_CUDA
  } else if (use_cuda(op, qkv.device())) {
    cuda::rope_packed_qkv(qkv, Hq, Hkv, table, pos_offset, inverse);
#endif
  } else {
    no_backend(op, qkv.device());
  }
}

// The split of the fused qkv product (backward: its gradient's join); the
// names are the gradients' in the backward.
void rope_split_apply(const char* op, const char* qkv_name, const Tensor& qkv, const char* q_name, const Tensor& q,
                      const char* k_name, const Tensor& k, const char* v_name, const Tensor& v, const Tensor& table,
                      int64_t pos_offset, bool backward) {
  const OpScope scope(op, backward ? qkv : q);
  check_heads(op, q_name, q);
  check_heads(op, k_name, k);
  const int64_t B = q.size(0), T = q.size(1), Hq = q.size(2), D = q.size(3), Hkv = k.size(2);
  check_shape(op, k_name, k, Shape{B, T, Hkv, D});
  check_shape(op, v_name, v, k.shape());
  check_shape(op, qkv_name, qkv, Shape{B, T, Hq + 2 * Hkv, D});
  check_same_dtype(op, k_name, k, q_name, q);
  check_same_dtype(op, v_name, v, q_name, q);
  check_same_dtype(op, qkv_name, qkv, q_name, q);
  check_device(op, q.device(), {{qkv_name, &qkv}, {q_name, &q}, {k_name, &k}, {v_name, &v}, {"table", &table}});
  check_table(op, table, T, D, pos_offset);
  check_all_disjoint(op, {{qkv_name, &qkv}, {q_name, &q}, {k_name, &k}, {v_name, &v}, {"table", &table}});
  if (q.device().is_cpu()) {
    cpu::rope_split_qkv(qkv, q, k, v, table, pos_offset, backward);
#if ZT_WITH_CUDA
  } else if (use_cuda(op, q.device())) {
    cuda::rope_split_qkv(qkv, q, k, v, table, pos_offset, backward);
#endif
  } else {
    no_backend(op, q.device());
  }
}

}  // namespace

double rope_frequency(int64_t i, int64_t head_dim, double theta, const RopeScaling& scaling) {
  const char* op = "rope_frequency";
  check_head_dim(op, head_dim);
  ZT_CHECK(i >= 0 && i < head_dim / 2, op, ": pair index ", i, " is outside 0..", head_dim / 2 - 1, " for head_dim ",
           head_dim);
  check_theta(op, theta);
  check_scaling(op, scaling);
  return frequency(i, head_dim, theta, scaling);
}

void rope_table(const Tensor& table, int64_t head_dim, double theta, const RopeScaling& scaling) {
  const char* op = "rope_table";
  check_head_dim(op, head_dim);
  check_theta(op, theta);
  check_scaling(op, scaling);
  check_ndim(op, "table", table, 3);
  check_shape(op, "table", table, Shape{table.size(0), head_dim / 2, 2});
  check_dtype(op, "table", table, {DType::f32});
  std::vector<double> freqs(size_t(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) freqs[size_t(i)] = frequency(i, head_dim, theta, scaling);
  if (table.device().is_cpu()) {
    cpu::rope_table(table, freqs.data());
#if ZT_WITH_CUDA
  } else if (use_cuda(op, table.device())) {
    cuda::rope_table(table, freqs.data());
#endif
  } else {
    no_backend(op, table.device());
  }
}

void rope_forward(const Tensor& y, const Tensor& x, const Tensor& table, int64_t pos_offset) {
  rope_apply("rope_forward", "y", y, "x", x, table, pos_offset, /*inverse=*/false);
}

void rope_backward(const Tensor& dx, const Tensor& dy, const Tensor& table, int64_t pos_offset) {
  rope_apply("rope_backward", "dx", dx, "dy", dy, table, pos_offset, /*inverse=*/true);
}

void rope_packed_qkv_forward(const Tensor& qkv, int64_t Hq, int64_t Hkv, const Tensor& table, int64_t pos_offset) {
  rope_packed_apply("rope_packed_qkv_forward", "qkv", qkv, Hq, Hkv, table, pos_offset, /*inverse=*/false);
}

void rope_packed_qkv_backward(const Tensor& dqkv, int64_t Hq, int64_t Hkv, const Tensor& table,
                              int64_t pos_offset) {
  rope_packed_apply("rope_packed_qkv_backward", "dqkv", dqkv, Hq, Hkv, table, pos_offset, /*inverse=*/true);
}

void rope_split_qkv_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& qkv,
                            const Tensor& table, int64_t pos_offset) {
  rope_split_apply("rope_split_qkv_forward", "qkv", qkv, "q", q, "k", k, "v", v, table, pos_offset,
                   /*backward=*/false);
}

void rope_split_qkv_backward(const Tensor& dqkv, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                             const Tensor& table, int64_t pos_offset) {
  rope_split_apply("rope_split_qkv_backward", "dqkv", dqkv, "dq", dq, "dk", dk, "dv", dv, table, pos_offset,
                   /*backward=*/true);
}

}  // namespace zt::ops
