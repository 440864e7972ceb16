// The simple exact attention kernels of attention.cu (contract:
// ops/attention.h). A header so that the warp emulator (tests/cuda_emu) runs
// them on the CPU.
//
// One warp per query row (forward, dq) or per key row (dk, dv), lanes
// splitting the head dimension, online softmax in f32, probabilities
// recomputed from the saved logsumexp in backward. Deterministic: every
// output element is written once by one warp summing in a fixed order (no
// atomics). O(T) memory; CUDA-core math.
//
// Layouts: q, out, dq (B, T, Hq, D); k, v, dk, dv (B, Tk, Hkv, D); lse,
// delta (B, Hq, T) f32. Causal: Tk = T, query t sees keys s <= t. Unmasked
// (a block of context parallelism's ring): every query sees all Tk keys.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::simple_kernels {

constexpr int kMaxPerLane = 8;  // D <= 256
constexpr int kWarpsPerBlock = 4;

struct Dims {
  int64_t B, T, Hq, Hkv, D;
  int64_t Tk;   // keys (T when causal)
  bool causal;
  // The keys query t sees: [0, last_key(t)].
  __device__ __forceinline__ int64_t last_key(int64_t t) const { return causal ? t : Tk - 1; }
  // The first query that sees key s.
  __device__ __forceinline__ int64_t first_query(int64_t s) const { return causal ? s : 0; }
};

// Loads row[d] for d = lane + 32 i into regs (0 beyond D).
template <typename T>
__device__ __forceinline__ void load_row(float (&r)[kMaxPerLane], const T* row, int64_t D, int lane) {
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    r[i] = d < D ? to_f32(row[d]) : 0.0f;
  }
}

template <typename T>
__device__ __forceinline__ float dot_row(const float (&a)[kMaxPerLane], const T* row, int64_t D, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t d = lane + 32 * i;
    if (d < D) s += a[i] * to_f32(row[d]);
  }
  return warp_sum(s);
}

// One warp per (b, h, t).
template <typename T>
__global__ void attn_fwd_kernel(T* out, float* lse, const T* q, const T* k, const T* v, Dims d, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5);  // over (b, h, t)
  if (row >= d.B * d.Hq * d.T) return;
  const int64_t t = row % d.T, h = (row / d.T) % d.Hq, b = row / (d.T * d.Hq);
  const int64_t g = h / (d.Hq / d.Hkv);
  float qr[kMaxPerLane], acc[kMaxPerLane];
  load_row(qr, q + ((b * d.T + t) * d.Hq + h) * d.D, d.D, lane);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int64_t s = 0; s <= d.last_key(t); ++s) {
    const int64_t kv = ((b * d.Tk + s) * d.Hkv + g) * d.D;
    const float score = scale * dot_row(qr, k + kv, d.D, lane);
    const float m_new = fmaxf(m, score);
    const float corr = __expf(m - m_new), p = __expf(score - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t dd = lane + 32 * i;
      acc[i] = acc[i] * corr + (dd < d.D ? p * to_f32(v[kv + dd]) : 0.0f);
    }
    m = m_new;
  }
  T* o = out + ((b * d.T + t) * d.Hq + h) * d.D;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t dd = lane + 32 * i;
    if (dd < d.D) o[dd] = from_f32<T>(acc[i] / l);
  }
  if (lane == 0) lse[(b * d.Hq + h) * d.T + t] = m + logf(l);
}

// delta[b, h, t] = dout_t . out_t  (f32)
template <typename T>
__global__ void attn_delta_kernel(float* delta, const T* dout, const T* out, Dims d) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5);
  if (row >= d.B * d.Hq * d.T) return;
  const int64_t t = row % d.T, h = (row / d.T) % d.Hq, b = row / (d.T * d.Hq);
  const int64_t off = ((b * d.T + t) * d.Hq + h) * d.D;
  float o[kMaxPerLane];
  load_row(o, out + off, d.D, lane);
  const float s = dot_row(o, dout + off, d.D, lane);
  if (lane == 0) delta[row] = s;
}

// dq_t = scale * sum_{s seen by t} P_ts (dP_ts - delta_t) k_s; one warp per (b, h, t).
template <typename T>
__global__ void attn_dq_kernel(T* dq, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                               const float* delta, Dims d, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5);
  if (row >= d.B * d.Hq * d.T) return;
  const int64_t t = row % d.T, h = (row / d.T) % d.Hq, b = row / (d.T * d.Hq);
  const int64_t g = h / (d.Hq / d.Hkv);
  const int64_t off = ((b * d.T + t) * d.Hq + h) * d.D;
  float qr[kMaxPerLane], dor[kMaxPerLane], acc[kMaxPerLane];
  load_row(qr, q + off, d.D, lane);
  load_row(dor, dout + off, d.D, lane);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.0f;
  const float L = lse[row], dl = delta[row];
  for (int64_t s = 0; s <= d.last_key(t); ++s) {
    const int64_t kv = ((b * d.Tk + s) * d.Hkv + g) * d.D;
    const float p = __expf(scale * dot_row(qr, k + kv, d.D, lane) - L);
    const float ds = p * (dot_row(dor, v + kv, d.D, lane) - dl);
#pragma unroll
    for (int i = 0; i < kMaxPerLane; ++i) {
      const int64_t dd = lane + 32 * i;
      if (dd < d.D) acc[i] += ds * to_f32(k[kv + dd]);
    }
  }
  T* o = dq + off;
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t dd = lane + 32 * i;
    if (dd < d.D) o[dd] = from_f32<T>(scale * acc[i]);
  }
}

// dk_s = scale * sum_{h in group, t seeing s} dS_ts q_t;  dv_s = sum P_ts dout_t.
// One warp per (b, g, s), s < Tk.
template <typename T>
__global__ void attn_dkdv_kernel(T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const float* lse,
                                 const float* delta, Dims d, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kWarpsPerBlock) + (threadIdx.x >> 5);
  if (row >= d.B * d.Hkv * d.Tk) return;
  const int64_t s = row % d.Tk, g = (row / d.Tk) % d.Hkv, b = row / (d.Tk * d.Hkv);
  const int64_t group = d.Hq / d.Hkv;
  const int64_t kv = ((b * d.Tk + s) * d.Hkv + g) * d.D;
  float kr[kMaxPerLane], vr[kMaxPerLane], ak[kMaxPerLane], av[kMaxPerLane];
  load_row(kr, k + kv, d.D, lane);
  load_row(vr, v + kv, d.D, lane);
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) ak[i] = av[i] = 0.0f;
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (int64_t t = d.first_query(s); t < d.T; ++t) {
      const int64_t qo = ((b * d.T + t) * d.Hq + h) * d.D;
      const int64_t li = (b * d.Hq + h) * d.T + t;
      const float p = __expf(scale * dot_row(kr, q + qo, d.D, lane) - lse[li]);
      const float ds = p * (dot_row(vr, dout + qo, d.D, lane) - delta[li]);
#pragma unroll
      for (int i = 0; i < kMaxPerLane; ++i) {
        const int64_t dd = lane + 32 * i;
        if (dd < d.D) {
          ak[i] += ds * to_f32(q[qo + dd]);
          av[i] += p * to_f32(dout[qo + dd]);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxPerLane; ++i) {
    const int64_t dd = lane + 32 * i;
    if (dd < d.D) {
      dk[kv + dd] = from_f32<T>(scale * ak[i]);
      dv[kv + dd] = from_f32<T>(av[i]);
    }
  }
}

}  // namespace zt::cuda::simple_kernels
