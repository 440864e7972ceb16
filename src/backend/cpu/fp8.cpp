#include "backend/cpu/fp8.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace zt::cpu {

namespace {

// The max of |x| as the max of the magnitudes' bit patterns: for
// non-negative floats the integer order is the numeric order, and inf and
// every NaN lie above all finite values - an integer max that vectorises,
// with the non-finite case read off the result.
template <typename T>
float abs_max_of(const T* x, int64_t n) {
  uint32_t m = 0;
#pragma omp parallel for reduction(max : m) schedule(static) if (n >= (int64_t(1) << 16))
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::bit_cast<uint32_t>(to_float(x[i])) & 0x7fffffffu);
  return m >= 0x7f800000u ? INFINITY : std::bit_cast<float>(m);
}

template <typename Q, typename T>
void encode(Q* q, const T* x, int64_t n, float scale) {
#pragma omp parallel for schedule(static) if (n >= (int64_t(1) << 14))
  for (int64_t i = 0; i < n; ++i) {
    const float v = to_float(x[i]);
    // A non-finite input stays non-finite (NaN): saturating an inf to the
    // format's max would hide an overflow from the step's finiteness check.
    q[i] = from_float<Q>(std::isfinite(v) ? v * scale : NAN);
  }
}

template <typename Q>
void encode_from(const Tensor& q, const Tensor& x, float scale) {
  Q* out = q.data<Q>();
  if (x.dtype() == DType::f32)
    encode(out, x.data<float>(), x.numel(), scale);
  else
    encode(out, x.data<bf16>(), x.numel(), scale);
}

}  // namespace

float abs_max(const Tensor& x) {
  if (x.dtype() == DType::f32) return abs_max_of(x.data<float>(), x.numel());
  return abs_max_of(x.data<bf16>(), x.numel());
}

void encode_fp8(const Tensor& q, const Tensor& x, float scale) {
  if (q.dtype() == DType::f8e4m3)
    encode_from<f8e4m3>(q, x, scale);
  else
    encode_from<f8e5m2>(q, x, scale);
}

}  // namespace zt::cpu
