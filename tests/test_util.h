// Shared helpers for kernel tests: fresh random inputs, poisoned outputs,
// float64 views of tensors and tolerance checks that name the worst element.
//
// Inputs come from std::mt19937_64 (independent of Zettatron's own RNG) seeded
// per process from ZT_TEST_SEED or, by default, from std::random_device, so
// every run tests new numbers; the seed is printed in every failure.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace zt::test {

inline uint64_t test_seed() {
  static const uint64_t seed = [] {
    if (const char* s = std::getenv("ZT_TEST_SEED")) return uint64_t(std::strtoull(s, nullptr, 10));
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }();
  return seed;
}

// A generator for one test: the process seed mixed with a per-call-site salt.
inline std::mt19937_64 make_rng(uint64_t salt = 0) {
  return std::mt19937_64(test_seed() ^ (salt * 0x9E3779B97F4A7C15ull));
}

// Adds "ZT_TEST_SEED=<seed>" to every failure message in scope.
#define ZT_TEST_TRACE_SEED() SCOPED_TRACE("reproduce with ZT_TEST_SEED=" + std::to_string(::zt::test::test_seed()))

inline double load_f64(const Tensor& t, int64_t i) {
  const char* p = static_cast<const char*>(t.data_ptr());
  switch (t.dtype()) {
    case DType::f32: return reinterpret_cast<const float*>(p)[i];
    case DType::bf16: return bf16_to_float(reinterpret_cast<const bf16*>(p)[i]);
    case DType::f16: return f16_to_float(reinterpret_cast<const f16*>(p)[i]);
    case DType::f8e4m3: return f8e4m3_to_float(reinterpret_cast<const f8e4m3*>(p)[i]);
    case DType::f8e5m2: return f8e5m2_to_float(reinterpret_cast<const f8e5m2*>(p)[i]);
    case DType::i32: return reinterpret_cast<const int32_t*>(p)[i];
    case DType::i64: return double(reinterpret_cast<const int64_t*>(p)[i]);
    case DType::u16: return reinterpret_cast<const uint16_t*>(p)[i];
    case DType::u32: return reinterpret_cast<const uint32_t*>(p)[i];
  }
  return NAN;
}

inline void store_f64(const Tensor& t, int64_t i, double v) {
  char* p = static_cast<char*>(t.data_ptr());
  switch (t.dtype()) {
    case DType::f32: reinterpret_cast<float*>(p)[i] = float(v); break;
    case DType::bf16: reinterpret_cast<bf16*>(p)[i] = float_to_bf16(float(v)); break;
    case DType::f16: reinterpret_cast<f16*>(p)[i] = float_to_f16(float(v)); break;
    case DType::f8e4m3: reinterpret_cast<f8e4m3*>(p)[i] = float_to_f8e4m3(float(v)); break;
    case DType::f8e5m2: reinterpret_cast<f8e5m2*>(p)[i] = float_to_f8e5m2(float(v)); break;
    case DType::i32: reinterpret_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::i64: reinterpret_cast<int64_t*>(p)[i] = int64_t(v); break;
    case DType::u16: reinterpret_cast<uint16_t*>(p)[i] = uint16_t(v); break;
    case DType::u32: reinterpret_cast<uint32_t*>(p)[i] = uint32_t(v); break;
  }
}

// The tensor's elements as float64 (exactly the stored values).
inline std::vector<double> to_f64(const Tensor& t) {
  std::vector<double> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[size_t(i)] = load_f64(t, i);
  return out;
}

// A CPU tensor with values uniform in [lo, hi), rounded to dtype.
inline Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937_64& rng, double lo = -1.0,
                            double hi = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) store_f64(t, i, dist(rng));
  return t;
}

// A CPU tensor from float64 values, rounded to dtype.
inline Tensor tensor_from(const std::vector<double>& values, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) store_f64(t, i, values[size_t(i)]);
  return t;
}

// Heads [h0, h0 + n) of x (B, T, H, D) on the host, copied into a (B, T, n, D)
// tensor: q, k or v apart from a fused qkv product's output.
inline Tensor heads_of(const Tensor& x, int64_t h0, int64_t n) {
  const int64_t BT = x.size(0) * x.size(1), H = x.size(2), row = x.size(3) * int64_t(dtype_size(x.dtype()));
  Tensor out = Tensor::empty(Shape{x.size(0), x.size(1), n, x.size(3)}, x.dtype());
  for (int64_t t = 0; t < BT; ++t)
    std::memcpy(static_cast<char*>(out.data_ptr()) + t * n * row,
                static_cast<const char*>(x.data_ptr()) + (t * H + h0) * row, size_t(n * row));
  return out;
}

// The heads of (B, T, H_i, D) host tensors side by side in one (B, T, sum H_i, D).
inline Tensor heads_joined(std::initializer_list<Tensor> parts) {
  const Tensor& first = *parts.begin();
  const int64_t BT = first.size(0) * first.size(1), row = first.size(3) * int64_t(dtype_size(first.dtype()));
  int64_t H = 0;
  for (const Tensor& p : parts) H += p.size(2);
  Tensor out = Tensor::empty(Shape{first.size(0), first.size(1), H, first.size(3)}, first.dtype());
  int64_t h0 = 0;
  for (const Tensor& p : parts) {
    for (int64_t t = 0; t < BT; ++t)
      std::memcpy(static_cast<char*>(out.data_ptr()) + (t * H + h0) * row,
                  static_cast<const char*>(p.data_ptr()) + t * p.size(2) * row, size_t(p.size(2) * row));
    h0 += p.size(2);
  }
  return out;
}

// Token ids uniform in [0, vocab), i32.
inline Tensor random_tokens(const Shape& shape, int64_t vocab, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape, DType::i32);
  std::uniform_int_distribution<int64_t> dist(0, vocab - 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = int32_t(dist(rng));
  return t;
}

// Columns [first, end) of a (B, T) i32 token tensor: (B, end - first).
inline Tensor token_columns(const Tensor& tokens, int64_t first, int64_t end) {
  const int64_t B = tokens.size(0), T = tokens.size(1), n = end - first;
  Tensor out = Tensor::empty(Shape{B, n}, DType::i32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < n; ++t) out.data<int32_t>()[b * n + t] = tokens.data<int32_t>()[b * T + first + t];
  return out;
}

// Fills an output with NaN (float dtypes) or 0xA5 bytes (integers), so an
// element the kernel fails to write is caught.
inline void poison(const Tensor& t) {
  if (dtype_is_float(t.dtype())) {
    for (int64_t i = 0; i < t.numel(); ++i) store_f64(t, i, NAN);
  } else {
    std::memset(t.data_ptr(), 0xA5, t.nbytes());
  }
}

// Every element finite and |got - ref| <= atol + rtol * |ref|; on failure the
// message names the worst element, its index and the seed.
inline ::testing::AssertionResult all_close(const Tensor& got, const std::vector<double>& ref, double rtol,
                                            double atol) {
  if (size_t(got.numel()) != ref.size())
    return ::testing::AssertionFailure() << "size mismatch: got " << got.numel() << " ref " << ref.size();
  int64_t worst = -1, bad = 0;
  double worst_excess = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = load_f64(got, i), r = ref[size_t(i)];
    const double tol = atol + rtol * std::fabs(r);
    const double err = std::fabs(g - r);
    const bool ok = std::isfinite(g) && err <= tol;
    if (!ok) {
      ++bad;
      const double excess = std::isfinite(g) ? err / tol : INFINITY;
      if (worst < 0 || excess > worst_excess) {
        worst = i;
        worst_excess = excess;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.numel() << " elements of " << got.str()
                                       << " outside tolerance (rtol " << rtol << ", atol " << atol
                                       << "); worst at flat index " << worst << ": got " << load_f64(got, worst)
                                       << ", reference " << ref[size_t(worst)] << " (seed " << test_seed() << ")";
}

// Relative error in the max norm: max|got - ref| / max|ref|. Used where
// individual elements may be near zero but the scale of the tensor is known.
inline double max_rel_error(const Tensor& got, const std::vector<double>& ref) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = load_f64(got, i);
    if (!std::isfinite(g)) return INFINITY;
    num = std::max(num, std::fabs(g - ref[size_t(i)]));
    den = std::max(den, std::fabs(ref[size_t(i)]));
  }
  return den > 0 ? num / den : num;
}

// Relative error in the 2-norm: ||got - ref|| / ||ref|| (||got - ref|| when
// ref is all zeros; infinite when got holds a NaN or an infinity). Host
// tensors of equal numel.
inline double rel_l2_error(const Tensor& got, const Tensor& ref) {
  const std::vector<double> g = to_f64(got), r = to_f64(ref);
  double num = 0, den = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    num += (g[i] - r[i]) * (g[i] - r[i]);
    den += r[i] * r[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// max_rel_error(got, ref) <= limit, or a failure naming `what`, the error
// and the seed.
inline ::testing::AssertionResult rel_error_within(const Tensor& got, const std::vector<double>& ref, double limit,
                                                   const char* what) {
  const double err = max_rel_error(got, ref);
  if (err <= limit) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": relative error " << err << " > " << limit << " (seed "
                                       << test_seed() << ")";
}

// The message of the zt::Error that fn throws (a marker string if none).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no zt::Error thrown>";
}

// A tensor that claims to live on cuda:63 (never dereferenced; no machine has
// 64 GPUs, so even a CUDA build fails cleanly before touching it): for checking
// that ops reject arguments on the wrong device.
inline Tensor fake_cuda(const Shape& s, DType dt) {
  static std::array<char, 64> dummy;
  return Tensor::wrap(dummy.data(), s, dt, Device::cuda(63));
}

}  // namespace zt::test
