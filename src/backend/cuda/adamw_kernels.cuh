// The kernel of adamw.cu: one grid-stride pass that updates the f32 master,
// m and v and writes the rounded model copy (to nearest, or for bf16
// stochastically with the CPU's random bits: core/rng.h); the bias
// corrections are computed once per step in f64 on the host (adamw_consts),
// as the CPU does.
// A header so that the warp emulator (tests/cuda_emu) runs it on the CPU.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cpu/adamw.h"
#include "backend/cuda/cuda_common.cuh"
#include "core/rng.h"

namespace zt::cuda::adamw_kernels {

constexpr int kThreads = 256;

// The step's constants, passed by value: inv_bc1 = 1 / (1 - beta1^step),
// inv_sqrt_bc2 = 1 / sqrt(1 - beta2^step).
struct Consts {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, grad_scale, inv_bc1, inv_sqrt_bc2, eps, lr, weight_decay;
  bool stochastic;  // bf16 copies only (ops/adamw.h)
  uint64_t rounding_seed, rounding_stream, rounding_offset;
};

// Host side: the bias corrections in f64, rounded once to f32.
inline Consts adamw_consts(const cpu::AdamWHyper& h) {
  const double bc1 = 1.0 - std::pow(double(h.beta1), double(h.step));
  const double bc2 = 1.0 - std::pow(double(h.beta2), double(h.step));
  return Consts{h.beta1,
                1.0f - h.beta1,
                h.beta2,
                1.0f - h.beta2,
                h.grad_scale,
                float(1.0 / bc1),
                float(1.0 / std::sqrt(bc2)),
                h.eps,
                h.lr,
                h.weight_decay,
                h.stochastic_rounding,
                h.rounding_seed,
                uint64_t(h.step),
                uint64_t(h.rounding_offset)};
}

// Up to kMaxNoDecaySpans element ranges [begin, end) of one launch that take
// no weight decay (sorted, disjoint; norm gains and biases among a set's
// weights), passed by value: a launch updates every run of a parameter set.
constexpr int kMaxNoDecaySpans = 16;
struct NoDecay {
  int count = 0;
  int64_t begin[kMaxNoDecaySpans] = {}, end[kMaxNoDecaySpans] = {};
};
// One launch's share of a call: elements [lo, hi) and the spans among them
// (relative to lo). A call's spans go kMaxNoDecaySpans to a launch: part j
// runs from its first span's begin (0 for the first part) to the next part's.
struct LaunchPart {
  int64_t lo, hi;
  NoDecay nd;
};
inline std::vector<LaunchPart> launch_parts(int64_t n, std::span<const std::pair<int64_t, int64_t>> no_decay) {
  std::vector<LaunchPart> parts;
  for (size_t first = 0; first == 0 || first < no_decay.size(); first += kMaxNoDecaySpans) {
    const size_t last = std::min(no_decay.size(), first + kMaxNoDecaySpans);
    LaunchPart part{first == 0 ? 0 : no_decay[first].first, last < no_decay.size() ? no_decay[last].first : n, {}};
    for (size_t i = first; i < last; ++i, ++part.nd.count) {
      part.nd.begin[part.nd.count] = no_decay[i].first - part.lo;
      part.nd.end[part.nd.count] = no_decay[i].second - part.lo;
    }
    parts.push_back(part);
  }
  return parts;
}

__device__ __forceinline__ bool decays(int64_t i, const NoDecay& nd) {
  for (int s = 0; s < nd.count; ++s)
    if (i >= nd.begin[s] && i < nd.end[s]) return false;
  return true;
}

// One element's update: p, m, v in place (registers), the model copy's
// value returned. An element without decay computes update + 0 * p: the bits
// of a launch with weight_decay 0.
template <typename C>
__device__ __forceinline__ C adamw_element(float& p, float g, float& m, float& v, int64_t i, const Consts& k,
                                           const NoDecay& nd) {
  const float gi = g * k.grad_scale;
  m = k.beta1 * m + k.one_minus_beta1 * gi;
  v = k.beta2 * v + k.one_minus_beta2 * (gi * gi);
  const float update = (m * k.inv_bc1) / (sqrtf(v) * k.inv_sqrt_bc2 + k.eps);
  const float wd = decays(i, nd) ? k.weight_decay : 0.0f;
  p = p - k.lr * (update + wd * p);
  if constexpr (std::is_same_v<C, __nv_bfloat16>) {
    if (k.stochastic) {
      __nv_bfloat16_raw raw;
      raw.x = bf16_bits_stochastic_at(p, k.rounding_seed, k.rounding_stream, k.rounding_offset + uint64_t(i));
      return __nv_bfloat16(raw);
    }
  }
  return from_f32<C>(p);
}

// p, m, v: (n) f32, updated in place; g: (n) G; copy: (n) C or null. V
// consecutive elements per thread and stream in one load or store each (V =
// 4: 16 bytes of f32, 8 of bf16; the launch checked that every pointer is
// aligned to its pack), the last n % V an element at a time; V = 1 an element
// per load. The same arithmetic per element at any V: the same bits.
template <typename G, typename C, int V>
__global__ void adamw_kernel(float* p, const G* g, float* m, float* v, C* copy, int64_t n, Consts k, NoDecay nd) {
  const int64_t packs = n / V, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < packs; j += stride) {
    Pack<float, V> pp = load_pack<float, V>(p + j * V), mp = load_pack<float, V>(m + j * V),
                   vp = load_pack<float, V>(v + j * V);
    const Pack<G, V> gp = load_pack<G, V>(g + j * V);
    Pack<C, V> cp;
#pragma unroll
    for (int e = 0; e < V; ++e) cp.v[e] = adamw_element<C>(pp.v[e], to_f32(gp.v[e]), mp.v[e], vp.v[e], j * V + e, k, nd);
    store_pack<float, V>(p + j * V, pp);
    store_pack<float, V>(m + j * V, mp);
    store_pack<float, V>(v + j * V, vp);
    if (copy != nullptr) store_pack<C, V>(copy + j * V, cp);
  }
  if constexpr (V > 1) {  // the tail: n % V elements, one a thread
    const int64_t i = packs * V + blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
    if (i < n) {
      float pi = p[i], mi = m[i], vi = v[i];
      const C ci = adamw_element<C>(pi, to_f32(g[i]), mi, vi, i, k, nd);
      p[i] = pi;
      m[i] = mi;
      v[i] = vi;
      if (copy != nullptr) copy[i] = ci;
    }
  }
}

// Whether a pack of V elements of each stream is one aligned load: every
// pointer a multiple of its pack's size (a null copy aligns).
template <int V, typename G, typename C>
inline bool adamw_packs_fit(const float* p, const G* g, const float* m, const float* v, const C* copy) {
  auto aligned = [](const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; };
  return aligned(p, 4 * V) && aligned(m, 4 * V) && aligned(v, 4 * V) && aligned(g, sizeof(G) * V) &&
         aligned(copy, sizeof(C) * V);
}

}  // namespace zt::cuda::adamw_kernels
