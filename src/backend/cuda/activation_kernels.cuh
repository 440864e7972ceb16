// The kernels of activation.cu: GeLU (tanh approximation) and SwiGLU,
// forward and backward, grid-stride pointwise loops in f32 with one rounding
// per output, over packs of 16 bytes where they fit, U packs a thread an
// iteration. A header so that the
// warp emulator (tests/cuda_emu) runs them on the CPU.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::activation_kernels {

constexpr int kThreads = 256;
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float sigmoidf(float g) { return 1.0f / (1.0f + __expf(-g)); }

// The multiplies and adds below are rounded intrinsics, which nvcc may not
// contract into FMAs: a pack's arithmetic is then the same instructions in
// every launch shape training races (U packs a thread, any grid), whatever
// the compiler does with the unrolled copies - the same bits by
// construction, as the norms' and the classifier's (and the warp emulator
// rounds where the GPU does). sigmoidf has no multiply feeding an add.
__device__ __forceinline__ float gelu_inner(float v) {  // k (v + c v^3)
  return __fmul_rn(kGeluK, __fadd_rn(v, __fmul_rn(__fmul_rn(__fmul_rn(kGeluC, v), v), v)));
}

// The grid strides over packs of V consecutive elements (V = 1, or
// kPack16<T> when the launch checked that packs fit: 16-byte memory
// instructions); the arithmetic is per element either way. Each thread takes
// U packs an iteration - i0, i0 + stride, ..., i0 + (U - 1) stride - all
// loaded before any is computed or stored, so U packs' loads are in flight
// per thread even where the output overwrites an input (SwiGLU's backward in
// place, whose stores the compiler may not move its next loads above). A
// pack's arithmetic does not depend on U or the grid: every launch shape
// (activation.cu's race) writes the same bits.
// (The warp emulator's host compiler cannot see that a pack is read only
// where it was loaded, and warns; initialising them would change the
// device code.)
#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
template <int U, typename Load, typename Compute>
__device__ __forceinline__ void for_each_pack(int64_t packs, Load&& load, Compute&& compute) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i0 = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i0 < packs; i0 += U * stride) {
    decltype(load(int64_t(0))) held[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * stride < packs) held[u] = load(i0 + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (i0 + u * stride < packs) compute(i0 + u * stride, held[u]);
  }
}
#if defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC diagnostic pop
#endif

template <typename T, int V, int U = 1>
__global__ void gelu_fwd_kernel(T* y, const T* x, int64_t n) {
  for_each_pack<U>(
      n / V, [&](int64_t i) { return load_pack<T, V>(x + i * V); },
      [&](int64_t i, const Pack<T, V>& xv) {
        Pack<T, V> yv;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float v = to_f32(xv.v[k]);
          yv.v[k] = from_f32<T>(__fmul_rn(__fmul_rn(0.5f, v), __fadd_rn(1.0f, tanhf(gelu_inner(v)))));
        }
        store_pack<T, V>(y + i * V, yv);
      });
}

// x and dy's packs i.
template <typename T, int V>
struct TwoPacks {
  Pack<T, V> a, b;
};

// d/dx [0.5 x (1 + tanh u)] = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u',  u' = k (1 + 3 c x^2)
template <typename T, int V, int U = 1>
__global__ void gelu_bwd_kernel(T* dx, const T* dy, const T* x, int64_t n) {
  for_each_pack<U>(
      n / V, [&](int64_t i) { return TwoPacks<T, V>{load_pack<T, V>(x + i * V), load_pack<T, V>(dy + i * V)}; },
      [&](int64_t i, const TwoPacks<T, V>& in) {
        Pack<T, V> dxv;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float v = to_f32(in.a.v[k]);
          const float t = tanhf(gelu_inner(v));
          const float du = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * kGeluC, v), v));  // u' / k
          const float slope = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, v), __fsub_rn(1.0f, __fmul_rn(t, t))), kGeluK);
          const float d = __fadd_rn(__fmul_rn(0.5f, __fadd_rn(1.0f, t)), __fmul_rn(slope, du));
          dxv.v[k] = from_f32<T>(__fmul_rn(d, to_f32(in.b.v[k])));
        }
        store_pack<T, V>(dx + i * V, dxv);
      });
}

// x rows [gate (H) | up (H)], y rows (H). Pack i covers row r, columns
// [h, h + V): one division per pack, not per element.
template <typename T, int V, int U = 1>
__global__ void swiglu_fwd_kernel(T* y, const T* x, int64_t rows, int64_t H) {
  const int64_t per_row = H / V;
  for_each_pack<U>(
      rows * per_row,
      [&](int64_t i) {
        const int64_t r = i / per_row, h = (i - r * per_row) * V;
        return TwoPacks<T, V>{load_pack<T, V>(x + r * 2 * H + h), load_pack<T, V>(x + r * 2 * H + H + h)};
      },
      [&](int64_t i, const TwoPacks<T, V>& gu) {
        const int64_t r = i / per_row, h = (i - r * per_row) * V;
        Pack<T, V> out;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float gf = to_f32(gu.a.v[k]);
          out.v[k] = from_f32<T>(__fmul_rn(__fmul_rn(gf, sigmoidf(gf)), to_f32(gu.b.v[k])));
        }
        store_pack<T, V>(y + r * H + h, out);
      });
}

// The gate, up and dy packs of SwiGLU's backward.
template <typename T, int V>
struct ThreePacks {
  Pack<T, V> g, u, d;
};

// dgate = dy * up * silu'(g), silu'(g) = s (1 + g (1 - s)); dup = dy * silu(g)
template <typename T, int V, int U = 1>
__global__ void swiglu_bwd_kernel(T* dx, const T* dy, const T* x, int64_t rows, int64_t H) {
  const int64_t per_row = H / V;
  for_each_pack<U>(
      rows * per_row,
      [&](int64_t i) {
        const int64_t r = i / per_row, h = (i - r * per_row) * V;
        return ThreePacks<T, V>{load_pack<T, V>(x + r * 2 * H + h), load_pack<T, V>(x + r * 2 * H + H + h),
                                load_pack<T, V>(dy + r * H + h)};
      },
      [&](int64_t i, const ThreePacks<T, V>& in) {
        const int64_t r = i / per_row, h = (i - r * per_row) * V;
        Pack<T, V> dg, du;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const float gf = to_f32(in.g.v[k]), df = to_f32(in.d.v[k]);
          const float s = sigmoidf(gf);
          const float slope = __fadd_rn(1.0f, __fmul_rn(gf, __fsub_rn(1.0f, s)));  // silu'(g) / s
          dg.v[k] = from_f32<T>(__fmul_rn(__fmul_rn(__fmul_rn(df, to_f32(in.u.v[k])), s), slope));
          du.v[k] = from_f32<T>(__fmul_rn(__fmul_rn(df, gf), s));
        }
        store_pack<T, V>(dx + r * 2 * H + h, dg);
        store_pack<T, V>(dx + r * 2 * H + H + h, du);
      });
}

}  // namespace zt::cuda::activation_kernels
