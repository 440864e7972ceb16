// CPU fused AdamW: one vectorised, OpenMP-parallel pass over memory that reads
// (master, m, v, grad) and writes (master, m, v[, model_copy]) once each:
//   g  = grad * grad_scale
//   m  = beta1 m + (1 - beta1) g
//   v  = beta2 v + (1 - beta2) g^2
//   p -= lr * ( (m / bc1) / (sqrt(v) / sqrt(bc2) + eps) + weight_decay * p )
//   model_copy = round_to_nearest_even(p)   (bitwise core/dtype.h rounding)
//                or, stochastic rounding to bf16, core/rng.h's
//                bf16_bits_stochastic_at(p, seed, step, offset + i), a block at a time
//                after its update
// with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step computed in f64 once per call,
// and weight_decay 0 in the caller's no_decay spans (a pass per run of one rule).
#include "backend/cpu/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/elementwise.h"
#include "core/rng.h"

namespace zt::cpu {

namespace {

struct Consts {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, grad_scale;
  float inv_bc1, inv_sqrt_bc2, eps, lr, weight_decay;
  uint64_t rounding_seed, rounding_stream, rounding_offset;  // stochastic rounding
};

struct NoCopy {};
// A bf16 model copy rounded stochastically.
struct StochasticBf16 {};

// Blocks of kBlock elements: pass 1 updates m and v and stages v for the
// square root, sqrt_inplace takes the roots (see elementwise.h for why), pass
// 2 updates p and writes the copy. Everything a block touches twice is in L1.
constexpr int64_t kBlock = 512;

template <typename G, typename C>
void adamw_kernel(float* __restrict p, const G* __restrict g, float* __restrict m, float* __restrict v,
                  C* __restrict copy, int64_t n, const Consts k) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks >= 8)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    alignas(64) float root[kBlock];
    const int64_t b0 = blk * kBlock, len = std::min(kBlock, n - b0);
    float* __restrict pb = p + b0;
    const G* __restrict gb = g + b0;
    float* __restrict mb = m + b0;
    float* __restrict vb = v + b0;
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      const float gi = load_f32(gb[i]) * k.grad_scale;
      mb[i] = k.beta1 * mb[i] + k.one_minus_beta1 * gi;
      const float vi = k.beta2 * vb[i] + k.one_minus_beta2 * (gi * gi);
      vb[i] = vi;
      root[i] = vi;
    }
    sqrt_inplace(root, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) {
      const float update = (mb[i] * k.inv_bc1) / (root[i] * k.inv_sqrt_bc2 + k.eps);
      const float pi = pb[i] - k.lr * (update + k.weight_decay * pb[i]);
      pb[i] = pi;
      if constexpr (!std::is_same_v<C, NoCopy> && !std::is_same_v<C, StochasticBf16>) copy[b0 + i] = store_as<C>(pi);
    }
    if constexpr (std::is_same_v<C, StochasticBf16>)  // the block's copy, once its masters are final
      bf16_bits_stochastic(pb, &reinterpret_cast<bf16*>(copy)[b0].bits, len, k.rounding_seed, k.rounding_stream,
                           k.rounding_offset + uint64_t(b0));
  }
}

template <typename G>
void with_copy(const Tensor& master, const G* g, const Tensor& m, const Tensor& v, const Tensor& copy,
               bool stochastic, const Consts& k) {
  float* p = master.data<float>();
  const int64_t n = master.numel();
  if (!copy.defined()) return adamw_kernel<G, NoCopy>(p, g, m.data<float>(), v.data<float>(), nullptr, n, k);
  if (stochastic) {
    auto* c = reinterpret_cast<StochasticBf16*>(copy.data<bf16>());
    return adamw_kernel(p, g, m.data<float>(), v.data<float>(), c, n, k);
  }
  switch (copy.dtype()) {
    case DType::bf16: return adamw_kernel(p, g, m.data<float>(), v.data<float>(), copy.data<bf16>(), n, k);
    case DType::f16: return adamw_kernel(p, g, m.data<float>(), v.data<float>(), copy.data<f16>(), n, k);
    case DType::f32: return adamw_kernel(p, g, m.data<float>(), v.data<float>(), copy.data<float>(), n, k);
    default: ZT_ASSERT(false, "adamw_step: model copy dtype ", dtype_name(copy.dtype()));
  }
}

}  // namespace

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const AdamWHyper& p) {
  const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
  const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
  const Consts k{p.beta1,         float(1.0 - double(p.beta1)),
                 p.beta2,         float(1.0 - double(p.beta2)),
                 p.grad_scale,    float(1.0 / bc1),
                 float(1.0 / std::sqrt(bc2)), p.eps,
                 p.lr,            p.weight_decay,
                 p.rounding_seed, uint64_t(p.step),  // stochastic rounding: stream = step
                 uint64_t(p.rounding_offset)};
  ZT_ASSERT(grad.dtype() == DType::f32 || grad.dtype() == DType::bf16, "adamw_step: grad dtype ",
            dtype_name(grad.dtype()));
  // Elements [begin, end) with decay on or off: their own pass, their own offset for the rounding bits.
  auto run = [&](int64_t begin, int64_t end, bool decays) {
    if (end <= begin) return;
    Consts kr = k;
    kr.weight_decay = decays ? p.weight_decay : 0.0f;
    kr.rounding_offset = k.rounding_offset + uint64_t(begin);
    const Shape len{end - begin};
    auto part = [&](const Tensor& t) { return t.defined() ? t.flat_view(begin, len) : Tensor(); };
    const Tensor g = part(grad);
    if (g.dtype() == DType::f32)
      with_copy(part(master), g.data<float>(), part(m), part(v), part(model_copy), p.stochastic_rounding, kr);
    else
      with_copy(part(master), g.data<bf16>(), part(m), part(v), part(model_copy), p.stochastic_rounding, kr);
  };
  int64_t at = 0;
  for (const auto& [begin, end] : p.no_decay) {
    run(at, begin, true);
    run(begin, end, false);
    at = end;
  }
  run(at, master.numel(), true);
}

}  // namespace zt::cpu
