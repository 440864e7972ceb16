#include <algorithm>
#include <cstdint>

#include "optim/adamw.h"

#include "core/error.h"
#include "core/rng.h"
#include "ops/adamw.h"
#include "ops/device.h"
#include "ops/elementwise.h"

namespace zt::optim {

AdamW::AdamW(std::vector<nn::ParamSet*> sets, const AdamWConfig& cfg, std::vector<OptimShard> shards)
    : sets_(std::move(sets)), cfg_(cfg), shards_(std::move(shards)) {
  if (shards_.empty())
    for (nn::ParamSet* s : sets_) shards_.push_back(OptimShard{0, s->numel(), s->grad_flat(), {}});
  ZT_ASSERT(shards_.size() == sets_.size(), "one optimizer shard per parameter set");
  constexpr uint64_t kRoundingSalt = 0x5354524f554e4453ull;  // keeps these bits apart from the init's
  for (nn::ParamSet* s : sets_)
    rounding_seeds_.push_back(s->size() > 0 ? nn::param_seed(cfg_.seed ^ kRoundingSalt, s->spec(0).name) : 0);
  ZT_CHECK(!cfg_.offload || cfg_.offload_chunk_elems > 0,
           "the optimizer's offload chunk must hold at least one element, got ", cfg_.offload_chunk_elems);
  // Offloaded, the state is made on the host from a host copy of the weights.
  const MemCategory state_category = cfg_.offload ? MemCategory::offload : MemCategory::optimizer;
  int64_t largest = 0;
  for (size_t si = 0; si < sets_.size(); ++si) {
    OptimShard& sh = shards_[si];
    const int64_t n = sh.end - sh.begin;
    if (!sh.param.defined()) sh.param = sets_[si]->flat().flat_view(sh.begin, Shape{n});
    ZT_ASSERT(sh.begin >= 0 && sh.begin <= sh.end && sh.end <= sets_[si]->numel() && sh.grad.numel() == n,
              "optimizer shard [", sh.begin, ", ", sh.end, ") of a set of ", sets_[si]->numel());
    const Tensor& p = sh.param;
    const Device state_device = cfg_.offload ? Device::cpu() : p.device();
    const Shape shape{n};
    largest = std::max(largest, n);
    if (p.dtype() == DType::f32 && !cfg_.offload) {
      master_.emplace_back();
    } else {
      Tensor master = Tensor::empty(shape, DType::f32, state_device, state_category);
      ops::cast(master, ops::on_device(p, state_device, state_category));
      master_.push_back(master);
    }
    Tensor m = Tensor::empty(shape, DType::f32, state_device, state_category);
    Tensor v = Tensor::empty(shape, DType::f32, state_device, state_category);
    ops::fill(m, 0.0);
    ops::fill(v, 0.0);
    m_.push_back(m);
    v_.push_back(v);
  }
  if (cfg_.offload && largest > 0) {
    const DType grad_dtype = shards_.front().grad.dtype(), weight_dtype = shards_.front().param.dtype();
    for (const OptimShard& sh : shards_)
      ZT_ASSERT(sh.grad.dtype() == grad_dtype && sh.param.dtype() == weight_dtype,
                "an offloaded optimizer's sets share their gradient and weight dtypes");
    const Shape chunk{std::min(largest, cfg_.offload_chunk_elems)};
    grad_stage_ = Tensor::empty(chunk, grad_dtype, Device::cpu(), MemCategory::offload);
    weight_stage_ = Tensor::empty(chunk, weight_dtype, Device::cpu(), MemCategory::offload);
  }
}

Tensor AdamW::master(size_t i) const {
  if (master_[i].defined()) return master_[i];
  return shards_[i].param;
}

Tensor AdamW::rounded_weights(size_t i, int64_t offset, const Tensor& values, DType dtype) const {
  ZT_ASSERT(values.device().is_cpu() && values.dtype() == DType::f32, "rounded_weights takes f32 host values");
  Tensor out = Tensor::empty(values.shape(), dtype);
  if (!(cfg_.stochastic_rounding && dtype == DType::bf16 && step_ > 0)) {
    ops::cast(out, values);
    return out;
  }
  bf16_bits_stochastic(values.data<float>(), &out.data<bf16>()->bits, values.numel(), rounding_seeds_[i],
                       uint64_t(step_), uint64_t(offset));
  return out;
}

void AdamW::step(double lr, float grad_scale) {
  ++step_;
  for (size_t si = 0; si < sets_.size(); ++si) {
    const nn::ParamSet& s = *sets_[si];
    const OptimShard& sh = shards_[si];
    const Tensor master_flat = master(si);
    // Weights in a lower precision than the master's: a rounded model copy.
    const bool has_copy = sh.param.dtype() != DType::f32;
    auto decays = [&](size_t i) {
      const nn::ParamSpec& spec = s.spec(i);
      return spec.decay || (cfg_.decay_embeddings && spec.name.starts_with("embed."));
    };
    // The elements [lo, hi) of tensor i that lie in the shard.
    auto lo_of = [&](size_t i) { return std::max(s.offset(i), sh.begin); };
    auto hi_of = [&](size_t i) { return std::min(s.offset(i) + s.spec(i).shape.numel(), sh.end); };
    // One update of the shard's tensors (contiguous in the flat buffers),
    // weight decay off in the spans of those that take none: on a GPU one
    // launch per set, not one per run of tensors with one rule.
    ops::AdamWParams p;
    p.lr = float(lr);
    p.beta1 = float(cfg_.beta1);
    p.beta2 = float(cfg_.beta2);
    p.eps = float(cfg_.eps);
    p.weight_decay = float(cfg_.weight_decay);
    p.step = step_;
    p.grad_scale = grad_scale;
    p.stochastic_rounding = cfg_.stochastic_rounding && has_copy;
    p.rounding_seed = rounding_seeds_[si];
    int64_t lo = -1, hi = -1;  // the set's elements [lo, hi) this shard updates
    for (size_t i = 0; i < s.size(); ++i) {
      const int64_t a = lo_of(i), b = hi_of(i);
      if (b <= a) continue;
      if (lo < 0) lo = a;
      hi = b;
      if (decays(i)) continue;
      if (!p.no_decay.empty() && p.no_decay.back().second == a - lo)
        p.no_decay.back().second = b - lo;  // merged with the previous tensor's span
      else
        p.no_decay.emplace_back(a - lo, b - lo);
    }
    if (lo < 0) continue;
    p.rounding_offset = lo;  // the set's flat offset: the same bits under any ZeRO sharding
    const int64_t off = lo - sh.begin;  // into the shard's state
    const Shape flat{hi - lo};
    if (cfg_.offload) {
      update_offloaded(si, off, hi - lo, p);
      continue;
    }
    ops::adamw_step(master_flat.flat_view(off, flat), sh.grad.flat_view(off, flat), m_[si].flat_view(off, flat),
                    v_[si].flat_view(off, flat), has_copy ? sh.param.flat_view(off, flat) : Tensor(), p);
  }
}

void AdamW::update_offloaded(size_t si, int64_t off, int64_t n, const ops::AdamWParams& p) {
  const OptimShard& sh = shards_[si];
  const int64_t chunk = grad_stage_.numel();
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t c = std::min(chunk, n - c0);
    const Shape shape{c};
    const Tensor grad = grad_stage_.flat_view(0, shape), weights = weight_stage_.flat_view(0, shape);
    ops::copy(grad, sh.grad.flat_view(off + c0, shape));  // complete on the host when it returns
    // This chunk's part of the spans without weight decay, and its elements'
    // own rounding bits (the offset of its first element in the set).
    ops::AdamWParams q = p;
    q.rounding_offset = p.rounding_offset + c0;
    q.no_decay.clear();
    for (const auto& [a, b] : p.no_decay) {
      const int64_t lo = std::max(a, c0), hi = std::min(b, c0 + c);
      if (hi > lo) q.no_decay.emplace_back(lo - c0, hi - c0);
    }
    ops::adamw_step(master_[si].flat_view(off + c0, shape), grad, m_[si].flat_view(off + c0, shape),
                    v_[si].flat_view(off + c0, shape), weights, q);
    // Staged on its way: the host buffer is free again on return.
    ops::copy(sh.param.flat_view(off + c0, shape), weights);
  }
}

double grad_norm(const AdamW& opt) { return grad_norm(opt, std::vector<bool>(opt.num_sets(), true)); }

double grad_norm(const AdamW& opt, const std::vector<bool>& sets) {
  // The runs of each shard this rank counts (all of it without tensor
  // parallelism; replicated tensors on one tp rank only).
  std::vector<Tensor> grads;
  for (size_t i = 0; i < opt.num_sets(); ++i) {
    if (!sets[i]) continue;
    const OptimShard& sh = opt.shard(i);
    for (const auto& [lo, hi] : opt.set(i).norm_ranges()) {
      const int64_t a = std::max(lo, sh.begin), b = std::min(hi, sh.end);
      if (b > a) grads.push_back(sh.grad.flat_view(a - sh.begin, Shape{b - a}));
    }
  }
  return ops::global_norm(grads);
}

float clip_scale(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace zt::optim
