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

// y = rotation of x (inverse: the transposed rotation); names for messages.
void rope_apply(const char* op, const char* y_name, const Tensor& y, const char* x_name, const Tensor& x,
                const Tensor& table, int64_t pos_offset, bool inverse) {
  const OpScope scope(op, y);
  check_ndim(op, x_name, x, 4);
  const int64_t T = x.size(1), D = x.size(3);
  ZT_CHECK(D % 2 == 0, op, ": '", x_name, "' has shape ", x.shape().str(), " but the head dim (last) is ", D,
           "; RoPE rotates channel pairs, so it must be even");
  check_compute_dtype(op, x_name, x);
  check_shape(op, y_name, y, x.shape());
  check_same_dtype(op, y_name, y, x_name, x);
  check_ndim(op, "table", table, 3);
  check_shape(op, "table", table, Shape{table.size(0), D / 2, 2});
  check_dtype(op, "table", table, {DType::f32});
  check_device(op, x.device(), {{x_name, &x}, {y_name, &y}, {"table", &table}});
  ZT_CHECK(pos_offset >= 0 && pos_offset + T <= table.size(0), op, ": positions ", pos_offset, "..", pos_offset + T - 1,
           " (pos_offset ", pos_offset, ", T ", T, ") are outside 'table' ", table.shape().str(),
           "; build the table with T_max >= pos_offset + T");
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

}  // namespace zt::ops
