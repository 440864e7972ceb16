#include <cstdint>

#include "optim/adamw.h"

#include "core/error.h"
#include "ops/adamw.h"
#include "ops/elementwise.h"

namespace zt::optim {

AdamW::AdamW(std::vector<nn::ParamSet*> sets, const AdamWConfig& cfg) : sets_(std::move(sets)), cfg_(cfg) {
  for (nn::ParamSet* s : sets_) {
    const Tensor& p = s->flat();
    const Shape shape{s->numel()};
    if (p.dtype() == DType::f32) {
      master_.emplace_back();
    } else {
      Tensor master = Tensor::empty(shape, DType::f32, p.device(), MemCategory::optimizer);
      ops::cast(master, p);
      master_.push_back(master);
    }
    Tensor m = Tensor::empty(shape, DType::f32, p.device(), MemCategory::optimizer);
    Tensor v = Tensor::empty(shape, DType::f32, p.device(), MemCategory::optimizer);
    ops::fill(m, 0.0);
    ops::fill(v, 0.0);
    m_.push_back(m);
    v_.push_back(v);
  }
}

Tensor AdamW::master(size_t i) const { return master_[i].defined() ? master_[i] : sets_[i]->flat(); }

void AdamW::step(double lr, float grad_scale) {
  ++step_;
  for (size_t si = 0; si < sets_.size(); ++si) {
    const nn::ParamSet& s = *sets_[si];
    const Tensor master_flat = master(si);
    const bool has_copy = master_[si].defined();
    auto decays = [&](size_t i) {
      const nn::ParamSpec& spec = s.spec(i);
      return spec.decay || (cfg_.decay_embeddings && spec.name.starts_with("embed."));
    };
    // Consecutive parameters with the same decay rule are contiguous in the
    // flat buffers: one fused update per run (few kernel launches on a GPU).
    for (size_t i = 0; i < s.size();) {
      const bool decay = decays(i);
      size_t end = i + 1;
      while (end < s.size() && decays(end) == decay) ++end;
      ops::AdamWParams p;
      p.lr = float(lr);
      p.beta1 = float(cfg_.beta1);
      p.beta2 = float(cfg_.beta2);
      p.eps = float(cfg_.eps);
      p.weight_decay = decay ? float(cfg_.weight_decay) : 0.0f;
      p.step = step_;
      p.grad_scale = grad_scale;
      const int64_t off = s.offset(i);
      const int64_t n = s.offset(end - 1) + s.spec(end - 1).shape.numel() - off;
      const Shape flat{n};
      ops::adamw_step(master_flat.flat_view(off, flat), s.grad_flat().flat_view(off, flat),
                      m_[si].flat_view(off, flat), v_[si].flat_view(off, flat),
                      has_copy ? s.flat().flat_view(off, flat) : Tensor(), p);
      i = end;
    }
  }
}

double grad_norm(const std::vector<nn::ParamSet*>& sets) {
  std::vector<Tensor> grads;
  for (const nn::ParamSet* s : sets) grads.push_back(s->grad_flat());
  return ops::global_norm(grads);
}

float clip_scale(double norm, double max_norm) {
  if (max_norm <= 0) return 1.0f;
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? float(coef) : 1.0f;
}

}  // namespace zt::optim
