#include "nn/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "ops/device.h"
#include "ops/elementwise.h"

namespace zt::nn {

void check_tensor_parallel(const ModelConfig& c, int64_t tp) {
  ZT_CHECK(tp >= 1, "parallel.tp = ", tp, " must be >= 1");
  if (tp == 1) return;
  ZT_CHECK(c.n_head % tp == 0, "parallel.tp = ", tp, " does not divide model.n_head = ", c.n_head,
           ": tensor parallelism splits the query heads evenly; pick a tp that divides ", c.n_head);
  ZT_CHECK(c.n_kv_head % tp == 0 || tp % c.n_kv_head == 0, "parallel.tp = ", tp, " and model.n_kv_head = ",
           c.n_kv_head, " do not fit: kv heads are split when tp divides them and replicated when they divide tp; "
           "pick a tp that divides or is a multiple of ", c.n_kv_head);
  ZT_CHECK(c.d_ff % tp == 0, "parallel.tp = ", tp, " does not divide model.d_ff = ", c.d_ff,
           ": the MLP's hidden width splits evenly; pick a tp that divides it");
  ZT_CHECK(c.shared_expert_ff % tp == 0, "parallel.tp = ", tp, " does not divide model.shared_expert_ff = ",
           c.shared_expert_ff, ": the shared expert's hidden width splits evenly; pick a tp that divides it");
}

TpShares tp_shares(const ModelConfig& c, int64_t tp, int64_t rank, int64_t ep, int64_t ep_rank) {
  check_tensor_parallel(c, tp);
  ZT_CHECK(ep == 1 || (c.moe() && c.n_expert % ep == 0), "parallel.ep = ", ep, " must divide model.n_expert = ",
           c.n_expert, " (each rank holds n_expert / ep experts of every block); pick an ep that divides it");
  TpShares s;
  s.experts = c.n_expert / ep;
  s.expert0 = ep_rank * s.experts;
  s.tp = tp;
  s.rank = rank;
  s.q_heads = c.n_head / tp;
  if (c.n_kv_head % tp == 0) {
    s.kv_heads = c.n_kv_head / tp;
    s.kv_head0 = rank * s.kv_heads;
  } else {
    s.kv_heads = 1;
    s.kv_replicas = tp / c.n_kv_head;
    s.kv_head0 = rank / s.kv_replicas;
  }
  s.ff = c.d_ff / tp;
  s.shared_ff = c.shared_expert() ? c.shared_expert_ff / tp : 0;
  const int64_t Vp = c.padded_vocab();
  s.vocab_rows = (Vp + tp - 1) / tp;
  s.vocab_start = rank * s.vocab_rows;
  s.vocab_real = std::clamp<int64_t>(Vp - s.vocab_start, 0, s.vocab_rows);
  return s;
}

namespace {

std::string layer_prefix(size_t i) { return "layers." + std::to_string(i) + "."; }

// A whole tensor's spec (the tensor-parallel fields at their defaults).
ParamSpec spec(std::string name, Shape shape, Init init, float std, bool decay) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = shape;
  p.init = init;
  p.std = std;
  p.decay = decay;
  return p;
}

// A tensor replicated over the group: whole on every rank, counted on rank 0.
ParamSpec replicated(ParamSpec p, const TpShares& s) {
  p.owner = s.rank == 0;
  return p;
}

// Rows of a global tensor along dim 0 (or columns along dim 1).
ParamSpec split(ParamSpec p, const Shape& global, int dim, std::vector<SlicePiece> pieces, const TpShares& s) {
  if (s.tp == 1) return p;  // the whole tensor
  p.global_shape = global;
  p.split_dim = dim;
  p.pieces = std::move(pieces);
  return p;
}

// The vocabulary rows of wte / lm_head (Vp, C).
ParamSpec vocab_rows(const std::string& name, const ModelConfig& c, const TpShares& s, float std, bool decay) {
  const int64_t C = c.d_model;
  std::vector<SlicePiece> pieces;
  if (s.vocab_real > 0) pieces.push_back({0, s.vocab_start, s.vocab_real, true});
  ParamSpec p = spec(name, Shape{s.tp == 1 ? c.padded_vocab() : s.vocab_rows, C}, Init::normal, std, decay);
  p = split(std::move(p), Shape{c.padded_vocab(), C}, 0, std::move(pieces), s);
  if (s.tp > 1 && p.pieces.empty()) p.pieces.push_back({0, 0, 0, false});  // all padding: still sliced
  return p;
}

}  // namespace

std::vector<ParamSpec> embedding_specs(const ModelConfig& c, const TpShares& s) {
  std::vector<ParamSpec> e{vocab_rows("embed.wte", c, s, c.init_std, false)};
  if (c.learned_positions())
    e.push_back(replicated(spec("embed.wpe", Shape{c.max_seq_len, c.d_model}, Init::normal, c.init_std, false), s));
  return e;
}

std::vector<ParamSpec> block_specs(const ModelConfig& c, const TpShares& s, size_t layer) {
  const std::string p = layer_prefix(layer);
  const int64_t C = c.d_model, D = c.head_dim(), Hq = c.n_head, Hkv = c.n_kv_head;
  const float std = c.init_std, resid_std = c.init_std / std::sqrt(2.0f * float(c.n_layer));
  // q | k | v rows: this rank's query heads, then its kv heads (once per replica group).
  const int64_t q = s.q_heads * D, kv = s.kv_heads * D;
  const bool kv_owner = s.rank % s.kv_replicas == 0;
  const std::vector<SlicePiece> qkv_pieces{{0, s.rank * q, q, true},
                                           {q, Hq * D + s.kv_head0 * D, kv, kv_owner},
                                           {q + kv, (Hq + Hkv) * D + s.kv_head0 * D, kv, kv_owner}};
  const int64_t F = s.ff, mlp_rows = c.mlp_in_width() / s.tp;
  std::vector<SlicePiece> mlp_pieces{{0, s.rank * F, F, true}};
  if (c.arch == Arch::llama3) mlp_pieces.push_back({F, c.d_ff + s.rank * F, F, true});  // SwiGLU gate | up
  std::vector<ParamSpec> v;
  auto rep = [&](ParamSpec ps) { v.push_back(replicated(std::move(ps), s)); };
  rep(spec(p + "attn_norm.weight", Shape{C}, Init::ones, 0, false));
  if (c.has_bias()) rep(spec(p + "attn_norm.bias", Shape{C}, Init::zeros, 0, false));
  v.push_back(split(spec(p + "attn.qkv.weight", Shape{q + 2 * kv, C}, Init::normal, std, true), Shape{c.qkv_width(), C}, 0,
                    qkv_pieces, s));
  if (c.has_bias())
    v.push_back(split(spec(p + "attn.qkv.bias", Shape{q + 2 * kv}, Init::zeros, 0, false), Shape{c.qkv_width()}, 0,
                      qkv_pieces, s));
  v.push_back(split(spec(p + "attn.proj.weight", Shape{C, q}, Init::normal, resid_std, true), Shape{C, Hq * D}, 1,
                    {{0, s.rank * q, q, true}}, s));
  if (c.has_bias()) rep(spec(p + "attn.proj.bias", Shape{C}, Init::zeros, 0, false));
  rep(spec(p + "mlp_norm.weight", Shape{C}, Init::ones, 0, false));
  if (c.has_bias()) rep(spec(p + "mlp_norm.bias", Shape{C}, Init::zeros, 0, false));
  if (c.moe()) {  // the router (replicated) and the experts (nn/moe.h)
    const int64_t E = c.n_expert, El = s.experts;
    rep(spec(p + "mlp.router.weight", Shape{E, C}, Init::normal, std, true));
    // This rank's experts, a run of the stacked tensors' first dimension
    // (expert parallelism), and of each its hidden columns as a dense MLP's
    // (tensor parallelism: in's gate and up rows, out's columns).
    auto experts = [&](ParamSpec ps, const Shape& global, int dim, std::vector<SlicePiece> hidden) {
      if (s.tp == 1 && El == E) return ps;
      ps.global_shape = global;
      if (s.tp == 1) {
        ps.split_dim = 0;
        ps.pieces = {{0, s.expert0, El, true}};
        return ps;
      }
      ps.split_dim = dim;
      ps.pieces = std::move(hidden);
      ps.dim0_start = s.expert0;
      return ps;
    };
    const Shape in{E, c.mlp_in_width(), C}, out{E, C, c.d_ff};
    v.push_back(experts(spec(p + "mlp.experts.in.weight", Shape{El, mlp_rows, C}, Init::normal, std, true), in, 1,
                        mlp_pieces));
    v.push_back(experts(spec(p + "mlp.experts.out.weight", Shape{El, C, F}, Init::normal, resid_std, true), out, 2,
                        {{0, s.rank * F, F, true}}));
    if (c.shared_expert()) {  // split over tp as a dense SwiGLU MLP: gate | up rows, then out's columns
      const int64_t Fs = s.shared_ff, Fg = c.shared_expert_ff;
      v.push_back(split(spec(p + "mlp.shared.in.weight", Shape{2 * Fs, C}, Init::normal, std, true), Shape{2 * Fg, C},
                        0, {{0, s.rank * Fs, Fs, true}, {Fs, Fg + s.rank * Fs, Fs, true}}, s));
      v.push_back(split(spec(p + "mlp.shared.out.weight", Shape{C, Fs}, Init::normal, resid_std, true), Shape{C, Fg},
                        1, {{0, s.rank * Fs, Fs, true}}, s));
    }
    return v;
  }
  v.push_back(split(spec(p + "mlp.in.weight", Shape{mlp_rows, C}, Init::normal, std, true), Shape{c.mlp_in_width(), C}, 0,
                    mlp_pieces, s));
  if (c.has_bias())
    v.push_back(split(spec(p + "mlp.in.bias", Shape{mlp_rows}, Init::zeros, 0, false), Shape{c.mlp_in_width()}, 0,
                      mlp_pieces, s));
  v.push_back(split(spec(p + "mlp.out.weight", Shape{C, F}, Init::normal, resid_std, true), Shape{C, c.d_ff}, 1,
                    {{0, s.rank * F, F, true}}, s));
  if (c.has_bias()) rep(spec(p + "mlp.out.bias", Shape{C}, Init::zeros, 0, false));
  return v;
}

std::vector<ParamSpec> head_specs(const ModelConfig& c, const TpShares& s) {
  std::vector<ParamSpec> h;
  h.push_back(replicated(spec("final_norm.weight", Shape{c.d_model}, Init::ones, 0, false), s));
  if (c.has_bias()) h.push_back(replicated(spec("final_norm.bias", Shape{c.d_model}, Init::zeros, 0, false), s));
  if (!c.tied_embeddings) h.push_back(vocab_rows("lm_head.weight", c, s, c.init_std, true));
  return h;
}

bool is_expert_param(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

std::pair<std::vector<ParamSpec>, std::vector<ParamSpec>> split_expert_specs(std::vector<ParamSpec> specs) {
  std::pair<std::vector<ParamSpec>, std::vector<ParamSpec>> out;
  for (ParamSpec& p : specs) (is_expert_param(p.name) ? out.second : out.first).push_back(std::move(p));
  return out;
}

ParamSpec param_spec(const ModelConfig& c, const TpShares& s, const std::string& name) {
  std::vector<ParamSpec> specs;
  if (name.rfind("embed.", 0) == 0) {
    specs = embedding_specs(c, s);
  } else if (name.rfind("layers.", 0) == 0) {
    specs = block_specs(c, s, size_t(std::stoll(name.substr(7))));
  } else {
    specs = head_specs(c, s);
  }
  for (ParamSpec& p : specs)
    if (p.name == name) return p;
  ZT_FAIL("the model has no parameter named '", name, "'");
}

Tensor gather_global(const Tensor& local, const ModelConfig& cfg, const TensorParallel& tp, const std::string& name) {
  // Experts are split over the ep group and their hidden width over tp; everything else over tp.
  const bool expert = tp.experts && is_expert_param(name);
  const int64_t ep = expert ? tp.experts->size() : 1, ep_rank = expert ? tp.experts->rank() : 0;
  const int64_t T = tp.size();
  auto spec_of = [&](int64_t tp_rank, int64_t ep_index) {
    return param_spec(cfg, tp_shares(cfg, T, tp_rank, ep, ep_index), name);
  };
  const ParamSpec mine = spec_of(tp.rank(), ep_rank);
  Tensor global = Tensor::empty(mine.global(), local.dtype(), local.device());
  if (T * ep == 1 || !mine.sliced()) {
    ops::copy(global, local);  // replicated: every rank holds the same values
    return global;
  }
  // Every holder's tensor, (tp rank, ep rank) major to minor: gathered over
  // the ep group, then those over tp (all ranks' local tensors have one shape).
  const int64_t n = local.numel();
  Tensor all = local.flat_view(0, Shape{n});
  auto gather = [&](comm::ProcessGroup& g) {
    Tensor out = Tensor::empty(Shape{g.size() * all.numel()}, local.dtype(), local.device(), MemCategory::comm);
    g.all_gather(out, all)->wait();
    all = out;
  };
  if (ep > 1) gather(*tp.experts);
  if (T > 1) gather(*tp.group);
  ops::fill(global, 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t q = 0; q < ep; ++q)
      copy_pieces(spec_of(t, q), all.flat_view((t * ep + q) * n, local.shape()), global, false);
  return global;
}

}  // namespace zt::nn
