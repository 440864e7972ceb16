// Rotary position embedding on the CPU, Meta's interleaved-pair convention.
//
// Forward, pair i of a head at position p (angle a = p freq_i, c = cos a,
// s = sin a):
//   y[2i]   = x[2i] c - x[2i+1] s
//   y[2i+1] = x[2i] s + x[2i+1] c          (y = R x, R a rotation)
// Gradient: the map is linear and orthogonal, so dx = R^T dy, the rotation
// by -a:
//   dx[2i]   =  dy[2i] c + dy[2i+1] s
//   dx[2i+1] = -dy[2i] s + dy[2i+1] c
// Both are one kernel with the sign of s flipped. Math in f32 (bf16 widened,
// rounded once); in place is safe since each pair is read before it is
// written. Parallel over (b, t) rows; memory-bound.
#include "backend/cpu/rope.h"

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace zt::cpu {

void rope_table(const Tensor& table, const double* freqs) {
  const int64_t T_max = table.size(0), half = table.size(1);
  float* tp = table.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T_max; ++t) {
    float* row = tp + t * half * 2;
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(t) * freqs[i];
      row[2 * i] = float(std::cos(a));
      row[2 * i + 1] = float(std::sin(a));
    }
  }
}

namespace {

template <typename T>
void rotate_impl(const Tensor& y, const Tensor& x, const Tensor& table, int64_t pos_offset, bool inverse) {
  const int64_t B = x.size(0), T_ = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  const T* xp = x.data<T>();
  T* yp = y.data<T>();  // may equal xp
  const float* tp = table.data<float>();
  const float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t t = bt % T_;
    const float* cs = tp + (t + pos_offset) * half * 2;  // (cos, sin) pairs
    for (int64_t h = 0; h < H; ++h) {
      const T* src = xp + (bt * H + h) * D;
      T* dst = yp + (bt * H + h) * D;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float c = cs[2 * i], s = sign * cs[2 * i + 1];
        const float x0 = to_float(src[2 * i]), x1 = to_float(src[2 * i + 1]);
        dst[2 * i] = from_float<T>(x0 * c - x1 * s);
        dst[2 * i + 1] = from_float<T>(x0 * s + x1 * c);
      }
    }
  }
}

}  // namespace

void rope_rotate(const Tensor& y, const Tensor& x, const Tensor& table, int64_t pos_offset, bool inverse) {
  if (x.dtype() == DType::bf16) {
    rotate_impl<bf16>(y, x, table, pos_offset, inverse);
  } else {
    rotate_impl<float>(y, x, table, pos_offset, inverse);
  }
}

}  // namespace zt::cpu
