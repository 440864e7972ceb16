#include "nn/moe.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include "core/error.h"
#include "ops/activation.h"
#include "ops/device.h"
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

// Expert parallelism: in's runs of in_rows[r] rows go to rank r, out
// receives out_rows[r] rows from rank r (rows of C elements, rank order).
void exchange_rows(comm::ProcessGroup& g, const Tensor& out, const std::vector<int64_t>& out_rows, const Tensor& in,
                   const std::vector<int64_t>& in_rows) {
  const int64_t C = in.size(1);
  std::vector<int64_t> oc(out_rows.size()), ic(in_rows.size());
  for (size_t r = 0; r < oc.size(); ++r) oc[r] = out_rows[r] * C;
  for (size_t r = 0; r < ic.size(); ++r) ic[r] = in_rows[r] * C;
  g.all_to_allv(out.flat_view(0, Shape{out.numel()}), oc, in.flat_view(0, Shape{in.numel()}), ic)->wait();
}

// out (R, C)[p] = in (R, C)[perm[p]].
Tensor permute_rows(const Tensor& in, const Tensor& perm) {
  const Tensor out = act_tensor(in.shape(), in.dtype(), in.device());
  ops::moe_gather(out, in, perm, 1);
  return out;
}

// Expert parallelism's plan: which of this rank's sorted rows go where
// (send_rows), what arrives (recv_rows), and the expert-major order of what
// arrives. Every rank's per-expert slot counts are gathered (E doubles each,
// exact) so each owner knows how its received rows split by expert.
void plan_exchange(MoeActivations& a, comm::ProcessGroup& g, int64_t E) {
  const int64_t P = g.size(), me = g.rank(), El = E / P;
  std::vector<double> mine(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) mine[size_t(e)] = double(a.offsets[size_t(e + 1)] - a.offsets[size_t(e)]);
  const std::vector<double> counts = comm::all_gather_doubles(g, mine);  // (P, E)
  auto count = [&](int64_t src, int64_t j) { return int64_t(counts[size_t(src * E + me * El + j)]); };
  a.send_rows.assign(size_t(P), 0);
  a.recv_rows.assign(size_t(P), 0);
  for (int64_t r = 0; r < P; ++r) {
    a.send_rows[size_t(r)] = a.offsets[size_t((r + 1) * El)] - a.offsets[size_t(r * El)];
    for (int64_t j = 0; j < El; ++j) a.recv_rows[size_t(r)] += count(r, j);
  }
  int64_t R = 0;
  std::vector<int64_t> source_start(static_cast<size_t>(P));  // first received row of each source
  for (int64_t r = 0; r < P; ++r) {
    source_start[size_t(r)] = R;
    R += a.recv_rows[size_t(r)];
  }
  a.to_expert_major = act_tensor(Shape{R}, DType::i32, Device::cpu());  // plans live on the host (ops/moe.h)
  a.to_source_major = act_tensor(Shape{R}, DType::i32, Device::cpu());
  int32_t* to_e = a.to_expert_major.data<int32_t>();
  int32_t* to_s = a.to_source_major.data<int32_t>();
  a.local_offsets.assign(size_t(El + 1), 0);
  std::vector<int64_t> within(static_cast<size_t>(P), 0);  // rows of each source's block already placed
  int64_t p = 0;
  for (int64_t j = 0; j < El; ++j) {
    for (int64_t r = 0; r < P; ++r)
      for (int64_t i = 0; i < count(r, j); ++i, ++p) {
        const int64_t src = source_start[size_t(r)] + within[size_t(r)]++;
        to_e[p] = int32_t(src);
        to_s[src] = int32_t(p);
      }
    a.local_offsets[size_t(j + 1)] = p;
  }
}

}  // namespace

void moe_forward(const ModelConfig& cfg, MoeActivations& a, const Tensor& out, const Tensor& x,
                 const Tensor& residual, const MoeWeights& w, const SequenceShards& sequences,
                 const ExpertGroup& experts) {
  const int64_t N = x.size(0), C = x.size(1), E = cfg.n_expert, k = cfg.expert_top_k;
  const DType dt = x.dtype();
  const Device dev = x.device();
  const bool ep = experts.parallel(), shared = sequences.parallel();
  const int64_t El = w.experts_in.size(0), Fl = w.experts_out.size(2);
  ZT_CHECK(El * (ep ? experts.group->size() : 1) == E, "moe_forward: ", El, " local experts over ",
           ep ? experts.group->size() : 1, " ranks is not model.n_expert = ", E);
  const int64_t P = shared ? sequences.group->size() : 1, len = sequences.local_len;
  ZT_CHECK(!shared || (len > 0 && len % 2 == 0 && N % len == 0), "moe_forward: ", N, " rows are not whole "
           "sequences of ", len, " zigzag rows (two equal chunks each) on this cp rank");
  const Tensor logits = act_tensor(Shape{N, E}, DType::f32, dev);
  ops::linear_forward(logits, x, w.router, Tensor());
  a.probs = act_tensor(Shape{N, E}, DType::f32, dev);
  a.choice = act_tensor(Shape{N, k}, DType::i32, dev);
  a.weight = act_tensor(Shape{N, k}, DType::f32, dev);
  if (cfg.router_z_loss > 0) a.router_lse = act_tensor(Shape{N}, DType::f32, dev);  // z_t, from the softmax
  ops::moe_route(a.probs, a.choice, a.weight, logits, cfg.expert_normalize, a.router_lse, w.router_bias);
  // The routing on the host (the step waits for it here: the experts' row
  // counts size their products and exchanges).
  const Tensor choice = ops::on_device(a.choice, Device::cpu(), MemCategory::workspace);
  // A capacity under context parallelism counts the micro-batch's slots
  // (every cp rank's, in token order), so each rank sends how many slots of
  // each expert its runs - its two chunks of each sequence, in order - hold.
  const int64_t capacity = expert_capacity(cfg, N * P);
  const int64_t runs = shared && capacity >= 0 ? 2 * (N / len) : 0, run_slots = runs ? len / 2 * k : 0;

  // The balancing loss's sums in f64, then (context parallelism) summed over
  // the group in rank order - the same bits on every rank:
  // [slots (E) | probability sums (E) | tokens | sum of z_t^2 | slots per run and expert (runs E)]
  std::vector<double> sums(size_t(2 * E + 2 + runs * E), 0.0);
  const int32_t* ch = choice.data<int32_t>();
  for (int64_t s = 0; s < N * k; ++s) {
    ZT_CHECK(ch[s] >= 0 && ch[s] < E, "moe_forward: slot ", s, " (token ", s / k, ") chose expert ", ch[s],
             ", outside [0, E) with E = ", E);
    sums[size_t(ch[s])] += 1.0;  // the router's choice, before any drop
    if (runs) sums[size_t(2 * E + 2 + (s / run_slots) * E + ch[s])] += 1.0;
  }
  // A GPU's probabilities and logsumexps come to the host (N (E + 1) floats,
  // after the routing has already been waited for), only where a loss reads them.
  if (cfg.router_aux_loss > 0) {
    const Tensor probs = ops::on_device(a.probs, Device::cpu(), MemCategory::workspace);
    const float* p = probs.data<float>();
    for (int64_t e = 0; e < E; ++e)
      for (int64_t t = 0; t < N; ++t) sums[size_t(E + e)] += p[t * E + e];
  }
  sums[size_t(2 * E)] = double(N);
  if (a.router_lse.defined()) {
    const Tensor lse = ops::on_device(a.router_lse, Device::cpu(), MemCategory::workspace);
    const float* z = lse.data<float>();
    for (int64_t t = 0; t < N; ++t) sums[size_t(2 * E + 1)] += double(z[t]) * double(z[t]);
  }
  ops::SlotRuns order_in_batch;
  if (shared) {
    const std::vector<double> all = comm::all_gather_doubles(*sequences.group, sums);
    const size_t width = sums.size();
    std::fill(sums.begin(), sums.begin() + 2 * E + 2, 0.0);
    for (size_t r = 0; r < size_t(P); ++r)
      for (size_t i = 0; i < size_t(2 * E + 2); ++i) sums[i] += all[r * width + i];
    if (runs) {
      // Sequence b's chunk q (of 2P) is run 2b of rank q (q < P), else run
      // 2b + 1 of rank 2P - 1 - q (nn/ring_attention.h); the micro-batch's
      // slot order is (b, q, token, choice). Each local run's slots ahead
      // of it: every run before it in that order.
      const int64_t B = N / len, r = sequences.group->rank();
      const auto count = [&](int64_t b, int64_t q, int64_t e) {
        const int64_t rank = q < P ? q : 2 * P - 1 - q, run = 2 * b + (q < P ? 0 : 1);
        return int64_t(all[size_t(rank) * width + size_t(2 * E + 2 + run * E + e)]);
      };
      order_in_batch.start.resize(size_t(runs));
      order_in_batch.ahead.assign(size_t(runs * E), 0);
      std::vector<int64_t> ahead(size_t(E), 0);  // of (b, q) in the walk below
      for (int64_t b = 0; b < B; ++b)
        for (int64_t q = 0; q < 2 * P; ++q) {
          const int64_t run = q == r ? 2 * b : q == 2 * P - 1 - r ? 2 * b + 1 : -1;
          if (run >= 0) {
            order_in_batch.start[size_t(run)] = run * run_slots;
            std::copy(ahead.begin(), ahead.end(), order_in_batch.ahead.begin() + run * E);
          }
          for (int64_t e = 0; e < E; ++e) ahead[size_t(e)] += count(b, q, e);
        }
    }
  }

  a.order = act_tensor(Shape{N * k}, DType::i32, Device::cpu());  // the plan, on the host (ops/moe.h)
  a.where = act_tensor(Shape{N * k}, DType::i32, Device::cpu());
  ops::moe_dispatch_plan(a.order, a.where, a.offsets, choice, E, capacity, &a.routed,
                         runs ? &order_in_batch : nullptr);
  const int64_t kept = a.offsets[size_t(E)];  // the sorted rows: N k less what the experts dropped
  a.xs = act_tensor(Shape{kept, C}, dt, dev);
  ops::moe_gather(a.xs, x, a.order.slice(0, kept), k);
  a.ys = act_tensor(Shape{kept, C}, dt, dev);
  Tensor ye;  // the local experts' outputs, in xe's order
  if (ep) {
    plan_exchange(a, *experts.group, E);
    const Tensor received = act_tensor(Shape{a.to_expert_major.numel(), C}, dt, dev);
    exchange_rows(*experts.group, received, a.recv_rows, a.xs, a.send_rows);
    a.xs = Tensor();  // sent: the owners keep what they compute on
    a.xe = permute_rows(received, a.to_expert_major);
    ye = act_tensor(a.xe.shape(), dt, dev);
  } else {
    a.xe = a.xs;
    a.local_offsets = a.offsets;
    ye = a.ys;
  }
  const int64_t R = a.xe.size(0);
  const std::vector<int64_t>& lo = a.local_offsets;
  a.h = act_tensor(Shape{R, 2 * Fl}, dt, dev);  // this rank's hidden columns (F / tp)
  a.act = act_tensor(Shape{R, Fl}, dt, dev);
  for (int64_t j = 0; j < El; ++j)
    if (lo[size_t(j + 1)] > lo[size_t(j)])
      ops::linear_forward(rows_of(a.h, lo, j), rows_of(a.xe, lo, j), w.experts_in.select(j), Tensor());
  ops::swiglu_forward(a.act, a.h);
  for (int64_t j = 0; j < El; ++j)
    if (lo[size_t(j + 1)] > lo[size_t(j)])
      ops::linear_forward(rows_of(ye, lo, j), rows_of(a.act, lo, j), w.experts_out.select(j), Tensor());
  if (ep) exchange_rows(*experts.group, a.ys, a.send_rows, permute_rows(ye, a.to_source_major), a.recv_rows);
  ops::moe_combine(out, a.ys, a.weight, a.where, residual);
  // aux = coef E sum_e f_e P_e.
  a.aux_loss = 0.0;
  a.load.assign(sums.begin(), sums.begin() + E);
  a.load_tokens = sums[size_t(2 * E)];
  // Each expert drops what the call asked of it past its capacity (first
  // come): the call's share, the same on every rank of the group.
  if (capacity >= 0 && a.load_tokens > 0) {
    double dropped = 0.0;
    for (int64_t e = 0; e < E; ++e) dropped += std::max(0.0, sums[size_t(e)] - double(capacity));
    a.dropped_share = dropped / (a.load_tokens * double(k));
  }
  if (cfg.router_aux_loss > 0 && a.load_tokens > 0) {
    for (int64_t e = 0; e < E; ++e)
      a.aux_loss += sums[size_t(e)] / (a.load_tokens * double(k)) * sums[size_t(E + e)] / a.load_tokens;
    a.aux_loss *= double(cfg.router_aux_loss) * double(E);
  }
  if (cfg.router_z_loss > 0 && a.load_tokens > 0)
    a.aux_loss += double(cfg.router_z_loss) * sums[size_t(2 * E + 1)] / a.load_tokens;
}

void moe_release_selective(MoeActivations& a) {
  if (a.xs.defined() && a.xe.data_ptr() == a.xs.data_ptr()) a.xe = Tensor();  // xs itself: cheap to gather again
  a.xs = Tensor();
  a.act = Tensor();
}

void moe_recompute_selective(MoeActivations& a, const Tensor& x) {
  if (!a.xe.defined()) {
    const int64_t k = a.order.numel() / x.size(0), kept = a.offsets.back();
    a.xs = act_tensor(Shape{kept, x.size(1)}, x.dtype(), x.device());
    ops::moe_gather(a.xs, x, a.order.slice(0, kept), k);
    a.xe = a.xs;
  }
  a.act = act_tensor(Shape{a.h.size(0), a.h.size(1) / 2}, x.dtype(), x.device());
  ops::swiglu_forward(a.act, a.h);
}

void moe_backward(const ModelConfig& cfg, MoeActivations& a, const Tensor& dx, const Tensor& dout, const Tensor& x,
                  const MoeWeights& w, const WeightWork& weights, const WeightWork& expert_weights,
                  std::function<MoeWeights()> grads, std::function<ops::GradWrite(const Tensor&, bool expert)> claim,
                  const ExpertGroup& experts) {
  const int64_t N = x.size(0), C = x.size(1), E = cfg.n_expert, k = cfg.expert_top_k;
  const DType dt = x.dtype();
  const Device dev = x.device();
  const bool ep = experts.parallel(), tp = experts.tensor_parallel();
  const int64_t El = w.experts_in.size(0), R = a.xe.size(0), F = w.experts_out.size(2);  // F: this rank's columns
  const std::vector<int64_t> lo = a.local_offsets;
  auto rows = [lo](const Tensor& t, int64_t j) { return rows_of(t, lo, j); };
  auto busy = [lo](int64_t j) { return lo[size_t(j + 1)] > lo[size_t(j)]; };
  // One weight (experts_in or experts_out) of every local expert with rows:
  // its gradient += dy_j^T in_j, each expert's slice claimed apart.
  auto expert_grads = [&](Tensor MoeWeights::*weight, const Tensor& dy, const Tensor& in) {
    expert_weights([=] {
      const Tensor g = grads().*weight, wt = w.*weight;
      for (int64_t j = 0; j < El; ++j)
        if (busy(j)) {
          const Tensor gj = g.select(j);
          ops::linear_backward(Tensor(), gj, Tensor(), rows(dy, j), rows(in, j), wt.select(j), claim(gj, true));
        }
    });
  };
  // The combine: dys = weight * dout per kept slot, dweight = <dout, ys>.
  const int64_t kept = a.ys.size(0);
  const Tensor dys = act_tensor(Shape{kept, C}, dt, dev);
  const Tensor dweight = act_tensor(Shape{N, k}, DType::f32, dev);
  ops::moe_combine_backward(dys, dweight, dout, a.ys, a.weight, a.where);
  a.ys = Tensor();
  // Tensor parallelism: ys was this rank's part of each output, so is each dot.
  if (tp) experts.tensor->all_reduce(dweight)->wait();
  // The outputs' gradients to the experts' owners, expert-major there.
  Tensor dye = dys;
  if (ep) {
    const Tensor received = act_tensor(Shape{R, C}, dt, dev);
    exchange_rows(*experts.group, received, a.recv_rows, dys, a.send_rows);
    dye = permute_rows(received, a.to_expert_major);
  }
  // The experts' second products and SwiGLU (in place over h: nothing reads h after it).
  const Tensor dact = act_tensor(Shape{R, F}, dt, dev);
  for (int64_t j = 0; j < El; ++j)
    if (busy(j)) ops::linear_backward(rows(dact, j), Tensor(), Tensor(), rows(dye, j), rows(a.act, j), w.experts_out.select(j));
  const Tensor dh = a.h;
  a.h = Tensor();
  ops::swiglu_backward(dh, dact, dh);
  expert_grads(&MoeWeights::experts_out, dye, a.act);
  a.act = Tensor();
  // The experts' first products; their inputs' gradients go home and are summed per token.
  const Tensor dxe = act_tensor(Shape{R, C}, dt, dev);
  for (int64_t j = 0; j < El; ++j)
    if (busy(j)) ops::linear_backward(rows(dxe, j), Tensor(), Tensor(), rows(dh, j), rows(a.xe, j), w.experts_in.select(j));
  expert_grads(&MoeWeights::experts_in, dh, a.xe);
  a.xe = a.xs = Tensor();
  Tensor dxs = dxe;
  if (ep) {
    dxs = act_tensor(Shape{kept, C}, dt, dev);
    exchange_rows(*experts.group, dxs, a.send_rows, permute_rows(dxe, a.to_source_major), a.recv_rows);
  }
  ops::moe_gather_backward(dx, dxs, a.where, k, false);
  // The router: its weights' gradient and the load-balancing loss's, through
  // the softmax; dx += dlogits Wr.
  Tensor aux;
  if (cfg.router_aux_loss > 0 && a.load_tokens > 0) {  // grad_scale coef E f_e (the balancing group's f_e)
    aux = Tensor::empty(Shape{E}, DType::f32, Device::cpu(), MemCategory::workspace);
    float* g = aux.data<float>();
    for (int64_t e = 0; e < E; ++e)
      g[e] = float(double(a.grad_scale) * double(cfg.router_aux_loss) * double(E) * a.load[size_t(e)] /
                   (a.load_tokens * double(k)));
    aux = ops::on_device(aux, dev, MemCategory::workspace);
  }
  Tensor dlse;  // the z-loss: d(coef z_t^2) / d z_t = 2 coef z_t, times grad_scale
  if (a.router_lse.defined()) {
    dlse = Tensor::empty(Shape{N}, DType::f32, dev, MemCategory::workspace);
    ops::scale(dlse, a.router_lse, 2.0f * a.grad_scale * cfg.router_z_loss);
  }
  const Tensor dlogits = act_tensor(Shape{N, E}, DType::f32, dev);
  ops::moe_route_backward(dlogits, dweight, a.probs, a.choice, a.weight, cfg.expert_normalize, aux, dlse);
  Tensor dl = dlogits;
  if (dt != DType::f32) {  // the products take one dtype: the router's gradient rounded to it
    dl = act_tensor(Shape{N, E}, dt, dev);
    ops::cast(dl, dlogits);
  }
  // The router's input gradient, the same on every tp rank: added once.
  if (!tp || experts.tensor->rank() == 0) ops::matmul(dx, dl, w.router, false, false, 1.0f, 1.0f);
  weights([=] {
    const Tensor g = grads().router;
    ops::linear_backward(Tensor(), g, Tensor(), dl, x, w.router, claim(g, false));
  });
  a = MoeActivations{};
}

std::vector<int64_t> moe_expert_load(const MoeActivations& a) { return a.routed; }

int64_t expert_capacity(const ModelConfig& cfg, int64_t N) {
  if (cfg.expert_capacity_factor <= 0) return -1;
  return int64_t(std::ceil(double(cfg.expert_capacity_factor) * double(N * cfg.expert_top_k) / double(cfg.n_expert)));
}

void move_router_bias(std::vector<float>& bias, const std::vector<int64_t>& load, int64_t E, float rate) {
  ZT_CHECK(E > 0 && bias.size() == load.size() && bias.size() % size_t(E) == 0, "move_router_bias: ", bias.size(),
           " biases and ", load.size(), " loads are not the same whole number of blocks of ", E, " experts");
  for (size_t l = 0; l < bias.size() / size_t(E); ++l) {
    const int64_t* n = &load[l * size_t(E)];
    int64_t total = 0;
    for (int64_t e = 0; e < E; ++e) total += n[e];
    for (int64_t e = 0; e < E && total > 0; ++e) {
      const int64_t over = E * n[e] - total;  // > 0: busier than the mean
      if (over != 0) bias[l * size_t(E) + size_t(e)] += over > 0 ? -rate : rate;
    }
  }
}

}  // namespace zt::nn
