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
    for (size_t i = 0; i < s.size(); ++i) {
      const nn::ParamSpec& spec = s.spec(i);
      const bool decay = spec.decay || (cfg_.decay_embeddings && spec.name.starts_with("embed."));
      ops::AdamWParams p;
      p.lr = float(lr);
      p.beta1 = float(cfg_.beta1);
      p.beta2 = float(cfg_.beta2);
      p.eps = float(cfg_.eps);
      p.weight_decay = decay ? float(cfg_.weight_decay) : 0.0f;
      p.step = step_;
      p.grad_scale = grad_scale;
      const int64_t off = s.offset(i), n = spec.shape.numel();
      const Shape flat{n};
      ops::adamw_step(master_flat.flat_view(off, flat), s.grad_flat().flat_view(off, flat),
                      m_[si].flat_view(off, flat), v_[si].flat_view(off, flat),
                      has_copy ? s.flat().flat_view(off, flat) : Tensor(), p);
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
