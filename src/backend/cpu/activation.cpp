// CPU GeLU / SwiGLU kernels. Math and gradient rules: see activation.h.
//
// The math is written once on 16-lane f32 vectors (GCC/Clang vector
// extensions, lowered to AVX-512 here and to narrower ISAs elsewhere): the
// compiler's auto-vectoriser turns the clamps below into masked, branchy code
// and cannot keep exp's integer steps in vector registers, while these lower
// to straight-line vector instructions. Every element, including a tile's
// tail (copied into a padded block), goes through the same vector code, so a
// result never depends on its position. Tiles of elements (rows of
// columns for SwiGLU) are spread over OpenMP threads.
//
// Loads and stores: the simd16 primitives in activation.h (bf16 widened
// exactly; stored with float_to_bf16's rounding, checked bitwise by the tests).

// 64-byte vectors by value (simd16 in activation.h) without AVX-512 make GCC
// warn about an ABI change; everything here is internal to one build.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "backend/cpu/activation.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/dtype.h"

namespace zt::cpu {

namespace {

using namespace simd16;

// Polynomials (fitted here: Chebyshev fits, coefficients rounded to f32; max
// relative error over the reduced range with the f32 coefficients ~2e-8, i.e.
// 0.35 ulp, before the rounding of the evaluation itself):
//   e^r on |r| <= ln2/2 and 2^f on |f| <= 1/2, both degree 6.
inline f32x16 exp_poly(f32x16 r) {
  f32x16 p = splat(1.394110848e-03f);
  p = p * r + 8.375125937e-03f;
  p = p * r + 4.166635126e-02f;
  p = p * r + 1.666641533e-01f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}

inline f32x16 exp2_poly(f32x16 f) {
  f32x16 p = splat(1.546144485e-04f);
  p = p * f + 1.340042800e-03f;
  p = p * f + 9.618056938e-03f;
  p = p * f + 5.550327152e-02f;
  p = p * f + 2.402265072e-01f;
  p = p * f + 6.931471825e-01f;
  return p * f + 1.0f;
}

constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
constexpr int32_t kRoundBits = 0x4B400000;

// 2^n for the integer-valued n held in t = n + kRound (|n| <= 126): built
// directly in the exponent field, a normal float.
inline f32x16 pow2_from_rounded(f32x16 t) { return (f32x16)((((i32x16)t - kRoundBits) + 127) << 23); }

// e^z for |z| <= 87.3 (callers clamp), ~1 ulp: z = n ln2 + r with |r| <= ln2/2
// (n ln2_hi is exact: ln2_hi has 16 significant bits and |n| <= 126).
inline f32x16 vexp(f32x16 z) {
  const f32x16 t = z * 1.44269504088896341f + kRound;
  const f32x16 n = t - kRound;
  f32x16 r = z - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723212e-6f;
  return exp_poly(r) * pow2_from_rounded(t);
}

// 2^z for |z| <= 126 (callers clamp), ~1 ulp: z = n + f, |f| <= 1/2 (exact).
inline f32x16 vexp2(f32x16 z) {
  const f32x16 t = z + kRound;
  const f32x16 n = t - kRound;
  return exp2_poly(z - n) * pow2_from_rounded(t);
}

// --- GeLU -----------------------------------------------------------------------

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;
// Beyond |x| = 10, GeLU is x or 0 and gelu' is 1 or 0 far below f32
// resolution (the tail terms are < 1e-35); the math runs on x clamped to
// [-10, 10], which keeps exp's argument within +-87.3 and x^3 finite.
constexpr float kGeluClamp = 10.0f;

// exp(-2u) = 2^z with z = -2 log2(e) u = xc (kA + kB xc^2).
constexpr float kA = -2.302208185f;  // -2 sqrt(2/pi) log2(e)
constexpr float kB = -0.1029432416f;  // -2 sqrt(2/pi) 0.044715 log2(e)

inline f32x16 gelu_v(f32x16 x) {
  const f32x16 xl = vmax(x, splat(-kGeluClamp));  // y(x < -10) = y(-10) ~ -1e-37
  const f32x16 xc = vmin(xl, splat(kGeluClamp));
  const f32x16 e = vexp2(xc * (kA + kB * (xc * xc)));
  return xl / (1.0f + e);
}

inline f32x16 gelu_grad_v(f32x16 x) {
  const f32x16 xc = vmin(vmax(x, splat(-kGeluClamp)), splat(kGeluClamp));
  const f32x16 x2 = xc * xc;
  const f32x16 du = kGeluK + (3.0f * kGeluK * kGeluC) * x2;
  const f32x16 e = vexp2(xc * (kA + kB * x2));
  const f32x16 s = 1.0f / (1.0f + e);
  return s * (1.0f + 2.0f * xc * du * (e * s));
}

// --- SiLU pieces for SwiGLU -------------------------------------------------------

// Beyond |g| = 87, silu is g or 0 and silu' 1 or 0 in f32 (tails < 2e-36); the
// math runs on g clamped to [-87, 87] (and silu's factor g only from below).
constexpr float kSiluClamp = 87.0f;

struct Silu {
  f32x16 silu, dsilu;
};

inline f32x16 silu_v(f32x16 g) {
  const f32x16 gl = vmax(g, splat(-kSiluClamp));
  const f32x16 gc = vmin(gl, splat(kSiluClamp));
  return gl / (1.0f + vexp(-gc));
}

inline Silu silu_and_grad_v(f32x16 g) {
  const f32x16 gl = vmax(g, splat(-kSiluClamp));
  const f32x16 gc = vmin(gl, splat(kSiluClamp));
  const f32x16 e = vexp(-gc);
  const f32x16 s = 1.0f / (1.0f + e);
  return {gl * s, s * (1.0f + gc * (e * s))};
}

// --- tiling -----------------------------------------------------------------------

// Elements per tile: enough to amortise the loop set-up, small enough to
// balance threads on the tensors a model step sees.
constexpr int64_t kTile = 4096;
// Below this many elements the OpenMP fork/join costs more than it saves.
constexpr int64_t kParallelMinElems = int64_t(1) << 15;

// Runs body(begin, end) over [0, n) in tiles of kTile, on threads when n is large.
template <typename Body>
void for_tiles(int64_t n, Body&& body) {
  const int64_t tiles = (n + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (n >= kParallelMinElems)
  for (int64_t t = 0; t < tiles; ++t) body(t * kTile, std::min(n, (t + 1) * kTile));
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

// out[i] = f(a[i]) for i in [i0, i1), on 32-element blocks (each half of a
// block through the same 16-lane f). out may alias a (same index read, then
// write).
template <typename T, typename F>
inline void map1(T* out, const T* a, int64_t i0, int64_t i1, F f) {
  auto g = [&](F32x32 x) __attribute__((always_inline)) { return F32x32{f(x.v0), f(x.v1)}; };
  int64_t i = i0;
  for (; i + kV2 <= i1; i += kV2) store32(out + i, g(load32(a + i)));
  if (i < i1) store32_partial(out + i, g(load32_partial(a + i, i1 - i)), i1 - i);
}

// out[i] = f(a[i], b[i]) for i in [i0, i1). out may alias a or b (same index).
template <typename T, typename F>
inline void map2(T* out, const T* a, const T* b, int64_t i0, int64_t i1, F f) {
  auto g = [&](F32x32 x, F32x32 y) __attribute__((always_inline)) { return F32x32{f(x.v0, y.v0), f(x.v1, y.v1)}; };
  int64_t i = i0;
  for (; i + kV2 <= i1; i += kV2) store32(out + i, g(load32(a + i), load32(b + i)));
  if (i < i1) {
    const int64_t n = i1 - i;
    store32_partial(out + i, g(load32_partial(a + i, n), load32_partial(b + i, n)), n);
  }
}

template <typename T>
void gelu_forward_impl(T* y, const T* x, int64_t n) {
  for_tiles(n, [=](int64_t i0, int64_t i1) { map1(y, x, i0, i1, [](f32x16 v) { return gelu_v(v); }); });
}

template <typename T>
void gelu_backward_impl(T* dx, const T* dy, const T* x, int64_t n) {
  for_tiles(n, [=](int64_t i0, int64_t i1) {
    map2(dx, dy, x, i0, i1, [](f32x16 d, f32x16 v) { return d * gelu_grad_v(v); });
  });
}

template <typename T>
void swiglu_forward_impl(T* y, const T* x, int64_t N, int64_t H) {
  for_row_tiles(N, H, [=](int64_t row, int64_t j0, int64_t j1) {
    const T* gate = x + row * 2 * H;
    map2(y + row * H, gate, gate + H, j0, j1, [](f32x16 g, f32x16 u) { return silu_v(g) * u; });
  });
}

template <typename T>
void swiglu_backward_impl(T* dx, const T* dy, const T* x, int64_t N, int64_t H) {
  for_row_tiles(N, H, [=](int64_t row, int64_t j0, int64_t j1) {
    const T* gate = x + row * 2 * H;
    const T* up = gate + H;
    const T* d = dy + row * H;
    T* dgate = dx + row * 2 * H;
    T* dup = dgate + H;
    // (dgate, dup) for one 32-element block of (gate, up, dy).
    auto step = [](F32x32 g, F32x32 u, F32x32 dyv, F32x32& dg, F32x32& du) {
      const Silu s0 = silu_and_grad_v(g.v0), s1 = silu_and_grad_v(g.v1);
      dg = {dyv.v0 * u.v0 * s0.dsilu, dyv.v1 * u.v1 * s1.dsilu};
      du = {dyv.v0 * s0.silu, dyv.v1 * s1.silu};
    };
    int64_t j = j0;
    for (; j + kV2 <= j1; j += kV2) {
      F32x32 dg, du;
      step(load32(gate + j), load32(up + j), load32(d + j), dg, du);
      store32(dgate + j, dg);
      store32(dup + j, du);
    }
    if (j < j1) {
      const int64_t n = j1 - j;
      F32x32 dg, du;
      step(load32_partial(gate + j, n), load32_partial(up + j, n), load32_partial(d + j, n), dg, du);
      store32_partial(dgate + j, dg, n);
      store32_partial(dup + j, du, n);
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
