// The kernels of moe.cu (contracts: ops/moe.h). A header so that the warp
// emulator (tests/cuda_emu) runs them on the CPU.
//
// Routing is one warp per token: lane l holds experts l, l + 32, ... of the
// row; the softmax's max and sum and each of the k top-k rounds are warp
// reductions of a fixed shape (deterministic). The top-k round is an argmax
// over (score, -index) pairs, so ties go to the lower index as on the CPU.
// The row kernels (gather, its backward, combine) are grid-stride loops over
// units of V elements of one row (V = 1, or a 16-byte pack when packs tile
// the rows), summing a token's k slots in slot order in f32 and rounding
// once - the CPU's order, so they give its bits wherever the products
// round alike (the gather's backward, whose terms are the rows themselves,
// always). The combine's backward is one block per token: the k slots'
// dys rows and, per slot, a block reduction of <dout, ys> of a fixed shape.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::moe_kernels {

constexpr int kThreads = 256;          // the row kernels' blocks
constexpr int kRouteWarps = 8;         // tokens per routing block (one warp each)
constexpr int kCombineThreads = 128;   // the combine backward's block (one token)

// Whether (s, i) ranks before (best_s, best_i) in the top-k order: a higher
// score, or the same score at a lower index; best_i < 0 is no candidate.
__device__ __forceinline__ bool ranks_before(float s, int i, float best_s, int best_i) {
  return i >= 0 && (best_i < 0 || s > best_s || (s == best_s && i < best_i));
}

// probs (N, E) = softmax(logits); choice (N, k), weight (N, k); lse (N) or
// null; bias (E) or null (added to the scores for the choice only); the
// weights divided by their sum when Normalize. One warp per token row.
template <bool Normalize>
__global__ void __launch_bounds__(kRouteWarps * 32)
    route_kernel(float* probs, int32_t* choice, float* weight, float* lse, const float* logits, const float* bias,
                 int64_t N, int E, int k) {
  const int lane = int(threadIdx.x & 31);
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + int64_t(threadIdx.x >> 5);
  if (t >= N) return;  // the whole warp: t is the warp's
  const float* l = logits + t * E;
  float* p = probs + t * E;
  int32_t* ch = choice + t * k;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) mx = fmaxf(mx, l[e]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int e = lane; e < E; e += 32) sum += expf(l[e] - mx);
  sum = warp_sum(sum);
  if (lse != nullptr && lane == 0) lse[t] = mx + logf(sum);
  const float inv = 1.0f / sum;
  for (int e = lane; e < E; e += 32) p[e] = expf(l[e] - mx) * inv;
  __syncwarp();  // every lane reads every expert's probability below
  float total = 0.0f;
  for (int j = 0; j < k; ++j) {
    float best_s = -INFINITY;
    int best = -1;
    for (int e = lane; e < E; e += 32) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= ch[i] == e;
      const float s = bias != nullptr ? p[e] + bias[e] : p[e];
      if (!taken && ranks_before(s, e, best_s, best)) {
        best_s = s;
        best = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float os = __shfl_xor_sync(0xffffffffu, best_s, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best, o);
      if (ranks_before(os, oi, best_s, best)) {
        best_s = os;
        best = oi;
      }
    }
    if (lane == 0) {
      ch[j] = int32_t(best);
      weight[t * k + j] = p[best];
    }
    total += p[best];
    __syncwarp();  // ch[j] written before the next round reads it
  }
  if (Normalize && lane == 0)
    for (int j = 0; j < k; ++j) weight[t * k + j] /= total;
}

// dlogits (N, E) from dweight (N, k) through the optional normalisation and
// the softmax, plus aux_dprob (E) at every probability and dlse (N) at each
// row's logsumexp (either may be null). One warp per token row.
template <bool Normalize>
__global__ void __launch_bounds__(kRouteWarps * 32)
    route_backward_kernel(float* dlogits, const float* dweight, const float* probs, const int32_t* choice,
                          const float* weight, const float* aux, const float* dlse, int64_t N, int E, int k) {
  const int lane = int(threadIdx.x & 31);
  const int64_t t = int64_t(blockIdx.x) * kRouteWarps + int64_t(threadIdx.x >> 5);
  if (t >= N) return;
  const float* p = probs + t * E;
  const int32_t* ch = choice + t * k;
  const float* dw = dweight + t * k;
  const float* w = weight + t * k;
  // w_j = p_j / S: dp_j = (dw_j - sum_i dw_i w_i) / S (every lane alike, k small).
  float dot = 0.0f, S = 0.0f;
  for (int j = 0; j < k; ++j) {
    dot += dw[j] * w[j];
    S += p[ch[j]];
  }
  auto dprob = [&](int e) {
    float d = aux != nullptr ? aux[e] : 0.0f;
    for (int j = 0; j < k; ++j)
      if (ch[j] == e) d += Normalize ? (dw[j] - dot) / S : dw[j];
    return d;
  };
  float mean = 0.0f;  // sum_e p_e dp_e
  for (int e = lane; e < E; e += 32) mean += p[e] * dprob(e);
  mean = warp_sum(mean);
  const float dz = dlse != nullptr ? dlse[t] : 0.0f;
  for (int e = lane; e < E; e += 32) dlogits[t * E + e] = p[e] * (dprob(e) - mean) + dz * p[e];
}

// dst's V elements = base's + acc (base null: acc alone), each rounded once.
// base may be dst itself (an accumulating output).
template <typename T, int V>
__device__ __forceinline__ void store_sum(T* dst, const T* base, const float (&acc)[V]) {
  Pack<T, V> o;
  if (base != nullptr) {
    const Pack<T, V> b = load_pack<T, V>(base);
#pragma unroll
    for (int v = 0; v < V; ++v) o.v[v] = from_f32<T>(to_f32(b.v[v]) + acc[v]);
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) o.v[v] = from_f32<T>(acc[v]);
  }
  store_pack<T, V>(dst, o);
}

// xs (R, C)[p] = x (N, C)[order[p] / k].
template <typename T, int V>
__global__ void gather_kernel(T* xs, const T* x, const int32_t* order, int64_t R, int64_t k, int64_t C) {
  const int64_t units = R * C / V;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < units; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i * V / C, c = i * V - p * C;
    store_pack<T, V>(xs + i * V, load_pack<T, V>(x + int64_t(order[p] / k) * C + c));
  }
}

// out (N, C)[t] = base[t] + sum_j w_j rows[where[t k + j]] over the kept
// slots (where >= 0), f32 in slot order, one rounding; w_j = weight[t, j],
// or 1 when weight is null (then each term is the row itself: 1 x is exact).
// base null: 0; base may be out. The combine (base: the residual) and the
// gather's backward (rows: dxs; base: dx when accumulating).
template <typename T, int V>
__global__ void weighted_sum_kernel(T* out, const T* rows, const float* weight, const int32_t* where, const T* base,
                                    int64_t N, int64_t k, int64_t C) {
  const int64_t units = N * C / V;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < units; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i * V / C, c = i * V - t * C;
    float acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = where[t * k + j];
      if (p < 0) continue;  // dropped
      const float wj = weight != nullptr ? weight[t * k + j] : 1.0f;
      const Pack<T, V> r = load_pack<T, V>(rows + p * C + c);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] += wj * to_f32(r.v[v]);
    }
    store_sum<T, V>(out + i * V, base != nullptr ? base + i * V : nullptr, acc);
  }
}

// Block t (one token, kCombineThreads threads): for each slot j at p =
// where[t k + j], dys[p] = weight[t, j] dout[t] and dweight[t, j] =
// <dout[t], ys[p]> (each thread's units of the row in order, then a block
// reduction of a fixed shape); a dropped slot (p = -1, the same for the whole
// block) gets dweight 0.
template <typename T, int V>
__global__ void __launch_bounds__(kCombineThreads)
    combine_backward_kernel(T* dys, float* dweight, const T* dout, const T* ys, const float* weight,
                            const int32_t* where, int64_t N, int64_t k, int64_t C) {
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x;
  if (t >= N) return;  // the whole block
  const T* g = dout + t * C;
  for (int64_t j = 0; j < k; ++j) {
    const int64_t p = where[t * k + j];
    if (p < 0) {
      if (threadIdx.x == 0) dweight[t * k + j] = 0.0f;
      continue;
    }
    const float wj = weight[t * k + j];
    const T* y = ys + p * C;
    T* dy = dys + p * C;
    float dot = 0.0f;
    for (int64_t c = int64_t(threadIdx.x) * V; c < C; c += int64_t(blockDim.x) * V) {
      const Pack<T, V> gv = load_pack<T, V>(g + c), yv = load_pack<T, V>(y + c);
      Pack<T, V> o;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const float gc = to_f32(gv.v[v]);
        dot += gc * to_f32(yv.v[v]);
        o.v[v] = from_f32<T>(wj * gc);
      }
      store_pack<T, V>(dy + c, o);
    }
    dot = block_sum(dot, scratch);
    if (threadIdx.x == 0) dweight[t * k + j] = dot;
  }
}

}  // namespace zt::cuda::moe_kernels
