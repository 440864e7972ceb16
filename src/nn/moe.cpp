#include "nn/moe.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/error.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/moe.h"

namespace zt::nn {

namespace {

Tensor act_tensor(const Shape& s, DType dt, Device dev) { return Tensor::empty(s, dt, dev, MemCategory::activations); }

// Expert e's run of sorted rows of t (N k, ...).
Tensor rows_of(const Tensor& t, const std::vector<int64_t>& offsets, int64_t e) {
  return t.slice(offsets[size_t(e)], offsets[size_t(e + 1)]);
}

}  // namespace

void moe_forward(const ModelConfig& cfg, MoeActivations& a, const Tensor& out, const Tensor& x,
                 const Tensor& residual, const MoeWeights& w, comm::ProcessGroup* balance_group) {
  const int64_t N = x.size(0), C = x.size(1), E = cfg.n_expert, k = cfg.expert_top_k, F = cfg.d_ff;
  const DType dt = x.dtype();
  const Device dev = x.device();
  ZT_CHECK(dev.is_cpu(), "mixture-of-experts blocks run on the CPU only so far (model.n_expert = ", E,
           " on ", dev.str(), "); set model.n_expert = 0 or train on the CPU");
  const Tensor logits = act_tensor(Shape{N, E}, DType::f32, dev);
  ops::linear_forward(logits, x, w.router, Tensor());
  a.probs = act_tensor(Shape{N, E}, DType::f32, dev);
  a.choice = act_tensor(Shape{N, k}, DType::i32, dev);
  a.weight = act_tensor(Shape{N, k}, DType::f32, dev);
  ops::moe_route(a.probs, a.choice, a.weight, logits, cfg.expert_normalize);
  a.order = act_tensor(Shape{N * k}, DType::i32, dev);
  a.where = act_tensor(Shape{N * k}, DType::i32, dev);
  ops::moe_dispatch_plan(a.order, a.where, a.offsets, a.choice, E);
  a.xs = act_tensor(Shape{N * k, C}, dt, dev);
  ops::moe_gather(a.xs, x, a.order, k);
  a.h = act_tensor(Shape{N * k, 2 * F}, dt, dev);
  a.act = act_tensor(Shape{N * k, F}, dt, dev);
  a.ys = act_tensor(Shape{N * k, C}, dt, dev);
  for (int64_t e = 0; e < E; ++e)
    if (a.offsets[size_t(e + 1)] > a.offsets[size_t(e)])
      ops::linear_forward(rows_of(a.h, a.offsets, e), rows_of(a.xs, a.offsets, e), w.experts_in.select(e), Tensor());
  ops::swiglu_forward(a.act, a.h);
  for (int64_t e = 0; e < E; ++e)
    if (a.offsets[size_t(e + 1)] > a.offsets[size_t(e)])
      ops::linear_forward(rows_of(a.ys, a.offsets, e), rows_of(a.act, a.offsets, e), w.experts_out.select(e),
                          Tensor());
  ops::moe_combine(out, a.ys, a.weight, a.where, residual);
  // aux = coef E sum_e f_e P_e in f64: per expert its slots and its
  // probabilities' sum in token order, then (context parallelism) summed
  // over the group in rank order - the same bits on every rank.
  a.aux_loss = 0.0;
  std::vector<double> sums(size_t(2 * E + 1), 0.0);  // [slots (E) | probability sums (E) | tokens]
  const float* p = a.probs.data<float>();
  for (int64_t e = 0; e < E; ++e) {
    sums[size_t(e)] = double(a.offsets[size_t(e + 1)] - a.offsets[size_t(e)]);
    for (int64_t t = 0; t < N; ++t) sums[size_t(E + e)] += p[t * E + e];
  }
  sums[size_t(2 * E)] = double(N);
  if (balance_group && balance_group->size() > 1) {
    const std::vector<double> all = comm::all_gather_doubles(*balance_group, sums);
    std::fill(sums.begin(), sums.end(), 0.0);
    for (size_t r = 0; r < size_t(balance_group->size()); ++r)
      for (size_t i = 0; i < sums.size(); ++i) sums[i] += all[r * sums.size() + i];
  }
  a.load.assign(sums.begin(), sums.begin() + E);
  a.load_tokens = sums[size_t(2 * E)];
  if (cfg.router_aux_loss > 0 && a.load_tokens > 0) {
    for (int64_t e = 0; e < E; ++e)
      a.aux_loss += sums[size_t(e)] / (a.load_tokens * double(k)) * sums[size_t(E + e)] / a.load_tokens;
    a.aux_loss *= double(cfg.router_aux_loss) * double(E);
  }
}

void moe_release_selective(MoeActivations& a) {
  a.xs = Tensor();
  a.act = Tensor();
}

void moe_recompute_selective(MoeActivations& a, const Tensor& x) {
  const int64_t NK = a.order.numel(), k = NK / x.size(0);
  a.xs = act_tensor(Shape{NK, x.size(1)}, x.dtype(), x.device());
  ops::moe_gather(a.xs, x, a.order, k);
  a.act = act_tensor(Shape{NK, a.h.size(1) / 2}, x.dtype(), x.device());
  ops::swiglu_forward(a.act, a.h);
}

void moe_backward(const ModelConfig& cfg, MoeActivations& a, const Tensor& dx, const Tensor& dout, const Tensor& x,
                  const MoeWeights& w, const std::function<void(std::function<void()>)>& weights,
                  std::function<MoeWeights()> grads, std::function<ops::GradWrite(const Tensor&)> claim) {
  const int64_t N = x.size(0), C = x.size(1), E = cfg.n_expert, k = cfg.expert_top_k, F = cfg.d_ff;
  const DType dt = x.dtype();
  const Device dev = x.device();
  const std::vector<int64_t> offsets = a.offsets;
  auto rows = [offsets](const Tensor& t, int64_t e) { return rows_of(t, offsets, e); };
  auto busy = [offsets](int64_t e) { return offsets[size_t(e + 1)] > offsets[size_t(e)]; };
  // The combine: dys = weight * dout per slot, dweight = <dout, ys>.
  const Tensor dys = act_tensor(Shape{N * k, C}, dt, dev);
  const Tensor dweight = act_tensor(Shape{N, k}, DType::f32, dev);
  ops::moe_combine_backward(dys, dweight, dout, a.ys, a.weight, a.where);
  a.ys = Tensor();
  // The experts' second products and SwiGLU (in place over h: nothing reads h after it).
  const Tensor dact = act_tensor(Shape{N * k, F}, dt, dev);
  for (int64_t e = 0; e < E; ++e)
    if (busy(e))
      ops::linear_backward(rows(dact, e), Tensor(), Tensor(), rows(dys, e), rows(a.act, e), w.experts_out.select(e));
  const Tensor dh = a.h;
  a.h = Tensor();
  ops::swiglu_backward(dh, dact, dh);
  {
    const Tensor act = a.act;
    weights([=] {
      const Tensor g = grads().experts_out;
      for (int64_t e = 0; e < E; ++e)
        if (busy(e)) {
          const Tensor ge = g.select(e);
          ops::linear_backward(Tensor(), ge, Tensor(), rows(dys, e), rows(act, e), w.experts_out.select(e), claim(ge));
        }
    });
  }
  a.act = Tensor();
  // The experts' first products, then their inputs' gradients summed back per token.
  const Tensor dxs = act_tensor(Shape{N * k, C}, dt, dev);
  for (int64_t e = 0; e < E; ++e)
    if (busy(e))
      ops::linear_backward(rows(dxs, e), Tensor(), Tensor(), rows(dh, e), rows(a.xs, e), w.experts_in.select(e));
  {
    const Tensor xs = a.xs;
    weights([=] {
      const Tensor g = grads().experts_in;
      for (int64_t e = 0; e < E; ++e)
        if (busy(e)) {
          const Tensor ge = g.select(e);
          ops::linear_backward(Tensor(), ge, Tensor(), rows(dh, e), rows(xs, e), w.experts_in.select(e), claim(ge));
        }
    });
  }
  a.xs = Tensor();
  ops::moe_gather_backward(dx, dxs, a.where, k, false);
  // The router: its weights' gradient and the load-balancing loss's, through
  // the softmax; dx += dlogits Wr.
  Tensor aux;
  if (cfg.router_aux_loss > 0 && a.load_tokens > 0) {  // grad_scale coef E f_e (the balancing group's f_e)
    aux = Tensor::empty(Shape{E}, DType::f32, dev, MemCategory::workspace);
    float* g = aux.data<float>();
    for (int64_t e = 0; e < E; ++e)
      g[e] = float(double(a.grad_scale) * double(cfg.router_aux_loss) * double(E) * a.load[size_t(e)] /
                   (a.load_tokens * double(k)));
  }
  const Tensor dlogits = act_tensor(Shape{N, E}, DType::f32, dev);
  ops::moe_route_backward(dlogits, dweight, a.probs, a.choice, a.weight, cfg.expert_normalize, aux);
  Tensor dl = dlogits;
  if (dt != DType::f32) {  // the products take one dtype: the router's gradient rounded to it
    dl = act_tensor(Shape{N, E}, dt, dev);
    ops::cast(dl, dlogits);
  }
  ops::matmul(dx, dl, w.router, false, false, 1.0f, 1.0f);
  weights([=] {
    const Tensor g = grads().router;
    ops::linear_backward(Tensor(), g, Tensor(), dl, x, w.router, claim(g));
  });
  a = MoeActivations{};
}

std::vector<int64_t> moe_expert_load(const MoeActivations& a) {
  std::vector<int64_t> load;
  for (size_t e = 0; e + 1 < a.offsets.size(); ++e) load.push_back(a.offsets[e + 1] - a.offsets[e]);
  return load;
}

}  // namespace zt::nn
