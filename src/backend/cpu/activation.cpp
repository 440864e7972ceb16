// CPU GeLU / SwiGLU kernels. Math and gradient rules: see activation.h.
//
// Every kernel is one contiguous, vectorised loop per tile of elements (or of
// a row's columns for SwiGLU), tiles spread over OpenMP threads. bf16 is
// widened on load and rounded on store inside the same loop; all math is f32.
#include "backend/cpu/activation.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace zt::cpu {

namespace {

// Elements per tile: big enough to amortise the loop set-up, small enough to
// balance threads on the tensors a model step sees.
constexpr int64_t kTile = 4096;
// Below this many elements the OpenMP fork/join costs more than it saves.
constexpr int64_t kParallelMinElems = int64_t(1) << 15;

// e^z for z clamped to [-87, 88] (so 2^n below is a normal float), ~1-2 ulp.
// z = n ln2 + r with |r| <= ln2/2 (n*ln2_hi exact: ln2_hi has 16 significant
// bits and |n| <= 127); e^r by its Taylor series to r^7 (truncation < 6e-9
// relative); the scale 2^n built directly in the exponent field.
inline float exp_clamped(float z) {
  z = z < -87.0f ? -87.0f : z;
  z = z > 88.0f ? 88.0f : z;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = z * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  float r = std::fma(n, -0.693145751953125f, z);
  r = std::fma(n, -1.42860682030941723212e-6f, r);
  float p = 1.0f / 5040.0f;
  p = std::fma(p, r, 1.0f / 720.0f);
  p = std::fma(p, r, 1.0f / 120.0f);
  p = std::fma(p, r, 1.0f / 24.0f);
  p = std::fma(p, r, 1.0f / 6.0f);
  p = std::fma(p, r, 0.5f);
  p = std::fma(p, r, 1.0f);
  p = std::fma(p, r, 1.0f);
  return p * std::bit_cast<float>((ni + 127) << 23);
}

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

// Beyond |x| = 10 GeLU is x or 0 and gelu' is 1 or 0 to far below f32
// resolution (the tail terms are < 1e-35); the math runs on x clamped to
// [-10, 10], which keeps exp's argument in range and x^3 finite.
constexpr float kGeluClamp = 10.0f;

inline float clamp(float v, float lo, float hi) {
  v = v < lo ? lo : v;  // comparisons are false for NaN: NaN passes through
  return v > hi ? hi : v;
}

inline float gelu_f(float x) {
  const float xc = clamp(x, -kGeluClamp, kGeluClamp);
  const float xl = x < -kGeluClamp ? -kGeluClamp : x;  // y(x < -10) = y(-10) ~ -1e-37
  const float u = xc * (kGeluK + (kGeluK * kGeluC) * (xc * xc));
  return xl / (1.0f + exp_clamped(-2.0f * u));
}

inline float gelu_grad_f(float x) {
  const float xc = clamp(x, -kGeluClamp, kGeluClamp);
  const float x2 = xc * xc;
  const float u = xc * (kGeluK + (kGeluK * kGeluC) * x2);
  const float du = kGeluK + (3.0f * kGeluK * kGeluC) * x2;
  const float e = exp_clamped(-2.0f * u);
  const float s = 1.0f / (1.0f + e);
  return s * (1.0f + 2.0f * xc * du * (e * s));
}

// SiLU pieces for a gate value g: beyond |g| = 87 silu is g or 0 and silu' 1
// or 0 in f32 (tails < 2e-36), so the math runs on g clamped to [-87, 87].
constexpr float kSiluClamp = 87.0f;

// Runs body(begin, end) over [0, n) in tiles of kTile, on threads when n is large.
template <typename Body>
void for_tiles(int64_t n, Body&& body) {
  const int64_t tiles = (n + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t t = 0; t < tiles; ++t) body(t * kTile, std::min(n, (t + 1) * kTile));
}

template <typename T>
void gelu_forward_impl(T* y, const T* x, int64_t n) {
  // y may alias x: each element is read, then written at the same index.
  for_tiles(n, [=](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) y[i] = from_float<T>(gelu_f(to_float(x[i])));
  });
}

template <typename T>
void gelu_backward_impl(T* dx, const T* dy, const T* __restrict x, int64_t n) {
  // dx may alias dy (same index read-then-write).
  for_tiles(n, [=](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) dx[i] = from_float<T>(to_float(dy[i]) * gelu_grad_f(to_float(x[i])));
  });
}

// Runs body(row, j0, j1) over the (N, H) index space in tiles of columns.
template <typename Body>
void for_row_tiles(int64_t N, int64_t H, Body&& body) {
  const int64_t per_row = (H + kTile - 1) / kTile;
  const int64_t tiles = N * per_row;
#pragma omp parallel for schedule(static) if (N * H >= kParallelMinElems)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t row = t / per_row, j0 = (t % per_row) * kTile;
    body(row, j0, std::min(H, j0 + kTile));
  }
}

template <typename T>
void swiglu_forward_impl(T* __restrict y, const T* __restrict x, int64_t N, int64_t H) {
  for_row_tiles(N, H, [=](int64_t row, int64_t j0, int64_t j1) {
    const T* __restrict gate = x + row * 2 * H;
    const T* __restrict up = gate + H;
    T* __restrict out = y + row * H;
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) {
      const float g = to_float(gate[j]);
      const float gc = clamp(g, -kSiluClamp, kSiluClamp);
      const float gl = g < -kSiluClamp ? -kSiluClamp : g;
      out[j] = from_float<T>(gl / (1.0f + exp_clamped(-gc)) * to_float(up[j]));
    }
  });
}

template <typename T>
void swiglu_backward_impl(T* __restrict dx, const T* __restrict dy, const T* __restrict x, int64_t N, int64_t H) {
  for_row_tiles(N, H, [=](int64_t row, int64_t j0, int64_t j1) {
    const T* __restrict gate = x + row * 2 * H;
    const T* __restrict up = gate + H;
    const T* __restrict d = dy + row * H;
    T* __restrict dgate = dx + row * 2 * H;
    T* __restrict dup = dgate + H;
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) {
      const float g = to_float(gate[j]), u = to_float(up[j]), dyj = to_float(d[j]);
      const float gc = clamp(g, -kSiluClamp, kSiluClamp);
      const float gl = g < -kSiluClamp ? -kSiluClamp : g;
      const float e = exp_clamped(-gc);
      const float s = 1.0f / (1.0f + e);
      const float silu = gl * s;
      const float dsilu = s * (1.0f + gc * (e * s));
      dgate[j] = from_float<T>(dyj * u * dsilu);
      dup[j] = from_float<T>(dyj * silu);
    }
  });
}

}  // namespace

void gelu_forward(const Tensor& y, const Tensor& x) {
  if (x.dtype() == DType::f32)
    gelu_forward_impl(y.data<float>(), x.data<float>(), x.numel());
  else
    gelu_forward_impl(y.data<bf16>(), x.data<bf16>(), x.numel());
}

void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  if (x.dtype() == DType::f32)
    gelu_backward_impl(dx.data<float>(), dy.data<float>(), x.data<float>(), x.numel());
  else
    gelu_backward_impl(dx.data<bf16>(), dy.data<bf16>(), x.data<bf16>(), x.numel());
}

void swiglu_forward(const Tensor& y, const Tensor& x) {
  const int64_t H = y.ndim() > 0 ? y.size(-1) : 0;
  const int64_t N = H > 0 ? y.numel() / H : 0;
  if (N == 0) return;
  if (x.dtype() == DType::f32)
    swiglu_forward_impl(y.data<float>(), x.data<float>(), N, H);
  else
    swiglu_forward_impl(y.data<bf16>(), x.data<bf16>(), N, H);
}

void swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const int64_t H = dy.ndim() > 0 ? dy.size(-1) : 0;
  const int64_t N = H > 0 ? dy.numel() / H : 0;
  if (N == 0) return;
  if (x.dtype() == DType::f32)
    swiglu_backward_impl(dx.data<float>(), dy.data<float>(), x.data<float>(), N, H);
  else
    swiglu_backward_impl(dx.data<bf16>(), dy.data<bf16>(), x.data<bf16>(), N, H);
}

}  // namespace zt::cpu
