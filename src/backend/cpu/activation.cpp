// CPU GeLU / SwiGLU kernels. Math and gradient rules: see activation.h.
//
// The math is written once on simd.h's f32 vectors (the target's widest): the
// compiler's auto-vectoriser turns the clamps below into masked, branchy code
// and cannot keep exp's integer steps in vector registers, while these lower
// to straight-line vector instructions. Every element, including a tile's
// tail (copied into a padded block), goes through the same vector code, so a
// result never depends on its position. Tiles of elements (rows of
// columns for SwiGLU) are spread over OpenMP threads.
//
// Loads and stores: simd.h's pair primitives (bf16 widened exactly; stored
// with float_to_bf16's rounding, checked bitwise by the tests).

#include "backend/cpu/activation.h"

#include <algorithm>
#include <cstdint>

#include "backend/cpu/simd.h"
#include "core/dtype.h"

namespace zt::cpu {

namespace {

using namespace simd;

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

inline f32v gelu_v(f32v x) {
  const f32v xl = vmax(x, splat(-kGeluClamp));  // y(x < -10) = y(-10) ~ -1e-37
  const f32v xc = vmin(xl, splat(kGeluClamp));
  const f32v e = exp2(xc * (kA + kB * (xc * xc)));
  return xl / (1.0f + e);
}

inline f32v gelu_grad_v(f32v x) {
  const f32v xc = vmin(vmax(x, splat(-kGeluClamp)), splat(kGeluClamp));
  const f32v x2 = xc * xc;
  const f32v du = kGeluK + (3.0f * kGeluK * kGeluC) * x2;
  const f32v e = exp2(xc * (kA + kB * x2));
  const f32v s = 1.0f / (1.0f + e);
  return s * (1.0f + 2.0f * xc * du * (e * s));
}

// --- SiLU pieces for SwiGLU -------------------------------------------------------

// Beyond |g| = 87, silu is g or 0 and silu' 1 or 0 in f32 (tails < 2e-36); the
// math runs on g clamped to [-87, 87] (and silu's factor g only from below).
constexpr float kSiluClamp = 87.0f;

struct Silu {
  f32v silu, dsilu;
};

inline f32v silu_v(f32v g) {
  const f32v gl = vmax(g, splat(-kSiluClamp));
  const f32v gc = vmin(gl, splat(kSiluClamp));
  return gl / (1.0f + exp(-gc));
}

inline Silu silu_and_grad_v(f32v g) {
  const f32v gl = vmax(g, splat(-kSiluClamp));
  const f32v gc = vmin(gl, splat(kSiluClamp));
  const f32v e = exp(-gc);
  const f32v s = 1.0f / (1.0f + e);
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

// out[i] = f(a[i]) for i in [i0, i1), on kV2-element blocks (each half of a
// block through the same kV-lane f). out may alias a (same index read, then
// write).
template <typename T, typename F>
inline void map1(T* out, const T* a, int64_t i0, int64_t i1, F f) {
  auto g = [&](Pair x) __attribute__((always_inline)) { return Pair{f(x.v0), f(x.v1)}; };
  int64_t i = i0;
  for (; i + kV2 <= i1; i += kV2) store_pair(out + i, g(load_pair(a + i)));
  if (i < i1) store_pair_partial(out + i, g(load_pair_partial(a + i, i1 - i)), i1 - i);
}

// out[i] = f(a[i], b[i]) for i in [i0, i1). out may alias a or b (same index).
template <typename T, typename F>
inline void map2(T* out, const T* a, const T* b, int64_t i0, int64_t i1, F f) {
  auto g = [&](Pair x, Pair y) __attribute__((always_inline)) { return Pair{f(x.v0, y.v0), f(x.v1, y.v1)}; };
  int64_t i = i0;
  for (; i + kV2 <= i1; i += kV2) store_pair(out + i, g(load_pair(a + i), load_pair(b + i)));
  if (i < i1) {
    const int64_t n = i1 - i;
    store_pair_partial(out + i, g(load_pair_partial(a + i, n), load_pair_partial(b + i, n)), n);
  }
}

template <typename T>
void gelu_forward_impl(T* y, const T* x, int64_t n) {
  for_tiles(n, [=](int64_t i0, int64_t i1) { map1(y, x, i0, i1, [](f32v v) { return gelu_v(v); }); });
}

template <typename T>
void gelu_backward_impl(T* dx, const T* dy, const T* x, int64_t n) {
  for_tiles(n, [=](int64_t i0, int64_t i1) {
    map2(dx, dy, x, i0, i1, [](f32v d, f32v v) { return d * gelu_grad_v(v); });
  });
}

template <typename T>
void swiglu_forward_impl(T* y, const T* x, int64_t N, int64_t H) {
  for_row_tiles(N, H, [=](int64_t row, int64_t j0, int64_t j1) {
    const T* gate = x + row * 2 * H;
    map2(y + row * H, gate, gate + H, j0, j1, [](f32v g, f32v u) { return silu_v(g) * u; });
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
    // (dgate, dup) for one kV2-element block of (gate, up, dy).
    auto step = [](Pair g, Pair u, Pair dyv, Pair& dg, Pair& du) {
      const Silu s0 = silu_and_grad_v(g.v0), s1 = silu_and_grad_v(g.v1);
      dg = {dyv.v0 * u.v0 * s0.dsilu, dyv.v1 * u.v1 * s1.dsilu};
      du = {dyv.v0 * s0.silu, dyv.v1 * s1.silu};
    };
    int64_t j = j0;
    for (; j + kV2 <= j1; j += kV2) {
      Pair dg, du;
      step(load_pair(gate + j), load_pair(up + j), load_pair(d + j), dg, du);
      store_pair(dgate + j, dg);
      store_pair(dup + j, du);
    }
    if (j < j1) {
      const int64_t n = j1 - j;
      Pair dg, du;
      step(load_pair_partial(gate + j, n), load_pair_partial(up + j, n), load_pair_partial(d + j, n), dg, du);
      store_pair_partial(dgate + j, dg, n);
      store_pair_partial(dup + j, du, n);
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
