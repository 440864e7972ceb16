#include "nn/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>

#include "core/env.h"
#include "core/error.h"
#include "nn/activation_offload.h"
#include "nn/ring_attention.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/device.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/matmul.h"
#include "ops/rope.h"

namespace zt::nn {

std::string_view recompute_name(Recompute r) {
  switch (r) {
    case Recompute::none: return "none";
    case Recompute::selective: return "selective";
    case Recompute::full: return "full";
  }
  return "?";
}

Recompute parse_recompute(std::string_view s) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  ZT_FAIL("unknown recompute policy '", s, "'; valid: none, selective, full");
}

namespace {

std::string layer_prefix(size_t i) { return "layers." + std::to_string(i) + "."; }

Tensor act_tensor(const Shape& s, DType dt, Device dev) { return Tensor::empty(s, dt, dev, MemCategory::activations); }
Tensor stat_tensor(int64_t n, Device dev) { return Tensor::empty(Shape{n}, DType::f32, dev, MemCategory::activations); }

void wait(const comm::WorkHandle& w) {
  if (w) w->wait();
}

// Partial gradients of tensors replicated over a group (norm weights under
// sequence parallelism, shared kv heads): computed into a zeroed buffer of
// their own, then summed over the group and added to the real gradients of
// `set` (written over them where that is the step's first write).
class PartialGrads {
 public:
  PartialGrads(const std::vector<Tensor>& grads, Device device) : grads_(grads) {
    int64_t n = 0;
    for (const Tensor& g : grads_) n += g.defined() ? g.numel() : 0;
    buf_ = Tensor::empty(Shape{std::max<int64_t>(n, 1)}, DType::f32, device, MemCategory::grads);
    ops::fill(buf_, 0.0);
    int64_t at = 0;
    for (const Tensor& g : grads_) {
      views_.push_back(g.defined() ? buf_.flat_view(at, g.shape()) : Tensor());
      at += g.defined() ? g.numel() : 0;
    }
  }
  const Tensor& view(size_t i) const { return views_[i]; }
  void reduce_and_add(comm::ProcessGroup& group, ParamSet& set) {
    group.all_reduce(buf_)->wait();
    for (size_t i = 0; i < grads_.size(); ++i) {
      if (!grads_[i].defined()) continue;
      if (set.claim_grads(grads_[i]) == ops::GradWrite::overwrite)
        ops::copy(grads_[i], views_[i]);
      else
        ops::add(grads_[i], grads_[i], views_[i]);
    }
  }

 private:
  std::vector<Tensor> grads_, views_;
  Tensor buf_;
};

}  // namespace

Transformer::Transformer(const ModelConfig& cfg, DType compute_dtype, Device device, int64_t flat_pad_multiple,
                         TensorParallel tp, ModelPart part)
    : cfg_(cfg), dtype_(compute_dtype), device_(device), tp_(tp), part_(part) {
  cfg_.validate();
  ops::init_device(device_);
  ZT_CHECK(dtype_ == DType::f32 || dtype_ == DType::bf16 || (dtype_ == DType::f16 && device_.is_cuda()),
           "model compute dtype must be f32 or bf16 (or f16 on a CUDA device), got ", dtype_name(dtype_), " on ",
           device_.str());
  head_chunk_elems = default_head_chunk_elems(device_);
  if (part_.last_layer < 0) part_.last_layer = cfg_.n_layer;
  ZT_CHECK(0 <= part_.first_layer && part_.first_layer <= part_.last_layer && part_.last_layer <= cfg_.n_layer,
           "model part: blocks [", part_.first_layer, ", ", part_.last_layer, ") are not within the model's ",
           cfg_.n_layer, " blocks");
  shares_ = nn::tp_shares(cfg_, tp_.size(), tp_.rank(), tp_.experts ? tp_.experts->size() : 1,
                          tp_.experts ? tp_.experts->rank() : 0);
  qkv_form_ = qkv_form(cfg_, shares_, device_);
  cp_qkv_form_ = qkv_form(cfg_, shares_, device_, /*context_parallel=*/true);
  residual_in_products_ = residual_in_products();
  if (part_.embedding) embed_ = ParamSet(embedding_specs(cfg_, shares_), dtype_, device_, flat_pad_multiple);
  blocks_.reserve(size_t(part_.last_layer - part_.first_layer));
  for (int64_t i = part_.first_layer; i < part_.last_layer; ++i) {
    auto [own, experts] = split_expert_specs(block_specs(cfg_, shares_, size_t(i)));
    blocks_.emplace_back(std::move(own), dtype_, device_, flat_pad_multiple);
    if (!experts.empty()) experts_.emplace_back(std::move(experts), dtype_, device_, flat_pad_multiple);
  }
  if (part_.head) {
    std::vector<ParamSpec> head = head_specs(cfg_, shares_);
    if (cfg_.tied_embeddings && !part_.embedding) {
      // The head stage's copy of the tied embedding: the embedding stage owns it.
      ParamSpec copy = embedding_specs(cfg_, shares_).front();
      copy.owner = false;
      for (SlicePiece& pc : copy.pieces) pc.owner = false;
      head.push_back(std::move(copy));
    }
    head_ = ParamSet(std::move(head), dtype_, device_, flat_pad_multiple);
  }
  // Every writer of a gradient claims its writes (ParamSet::claim_grads): a
  // step's first write overwrites, and no zeros are written before it. The
  // embedding's backward, a scatter-add, zeroes its tensors first where it
  // writes first (a tied head's weight gradient, computed in forward, comes
  // before it).
  embed_.set_lazy_grads(true);
  for (ParamSet& b : blocks_) b.set_lazy_grads(true);
  for (ParamSet& e : experts_) e.set_lazy_grads(true);
  head_.set_lazy_grads(true);
  if (shares_.kv_replicas > 1)  // a collective over the tp group: every rank builds the model
    kv_group_ = tp_.group->split(int(shares_.kv_head0), int(tp_.rank()), "tp_kv");
  if (cfg_.arch == Arch::llama3) {
    rope_table_ = Tensor::empty(Shape{cfg_.max_seq_len, cfg_.head_dim() / 2, 2}, DType::f32, device_,
                                MemCategory::params);
    ops::rope_table(rope_table_, cfg_.head_dim(), cfg_.rope_theta, cfg_.rope_scaling);
  }
}

std::vector<comm::ProcessGroup*> Transformer::comm_groups() const {
  std::vector<comm::ProcessGroup*> g;
  if (tp_.group) g.push_back(tp_.group);
  if (kv_group_) g.push_back(kv_group_.get());
  return g;
}

std::vector<ParamSet*> Transformer::param_sets() {
  std::vector<ParamSet*> v;
  for (const ParamSet* s : static_cast<const Transformer&>(*this).param_sets()) v.push_back(const_cast<ParamSet*>(s));
  return v;
}

std::vector<const ParamSet*> Transformer::param_sets() const {
  std::vector<const ParamSet*> v;
  if (part_.embedding) v.push_back(&embed_);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    v.push_back(&blocks_[i]);
    if (!experts_.empty()) v.push_back(&experts_[i]);  // expert_set(i)
  }
  if (part_.head) v.push_back(&head_);
  return v;
}

size_t Transformer::head_weight_set() const { return cfg_.tied_embeddings && part_.embedding ? 0 : head_set(); }

int64_t Transformer::tied_embedding_set() const {
  if (!cfg_.tied_embeddings) return -1;
  if (part_.embedding) return 0;
  return part_.head ? int64_t(head_set()) : -1;
}

int64_t Transformer::num_params() const {
  int64_t n = 0;
  for (const ParamSet* s : param_sets()) n += s->numel();
  return n;
}

void Transformer::init_weights(uint64_t seed) {
  for (ParamSet* s : param_sets()) s->init(seed);
  // Padding rows of the vocabulary never see a token; keep them zero.
  const int64_t V = cfg_.vocab_size;
  const int64_t lo = std::clamp<int64_t>(V - shares_.vocab_start, 0, shares_.vocab_rows);
  if (lo < shares_.vocab_rows)
    for (const char* name : {"embed.wte", "lm_head.weight"})
      for (ParamSet* set : param_sets())
        for (size_t i = 0; i < set->size(); ++i)
          if (set->spec(i).name == name) ops::fill(set->param(i).slice(lo, shares_.vocab_rows), 0.0);
}

void Transformer::zero_grads() {
  for (ParamSet* s : param_sets()) s->zero_grads();
}

void Transformer::begin_grads() {
  for (ParamSet* s : param_sets()) s->begin_grads();
}

void Transformer::finish_grads() {
  for (ParamSet* s : param_sets()) s->finish_grads();
}

void Transformer::grads_ready(size_t set) {
  param_sets()[set]->finish_grads();
  if (on_grads_ready) on_grads_ready(set);
}

ops::GradWrite Transformer::claim_grads(size_t set, std::initializer_list<Tensor> views) {
  ParamSet& s = *param_sets()[set];
  std::optional<ops::GradWrite> write;
  for (const Tensor& v : views) {
    if (!v.defined()) continue;
    const ops::GradWrite w = s.claim_grads(v);
    ZT_ASSERT(!write || *write == w, "claim_grads: one op's gradient outputs disagree on overwriting");
    write = w;
  }
  return write.value_or(ops::GradWrite::accumulate);
}

std::pair<size_t, size_t> Transformer::locate(std::string_view name) const {
  const auto sets = param_sets();
  for (size_t si = 0; si < sets.size(); ++si)
    for (size_t i = 0; i < sets[si]->size(); ++i)
      if (sets[si]->spec(i).name == name) return {si, i};
  ZT_FAIL("the model has no parameter named '", name, "'");
}

Tensor Transformer::param(std::string_view name) const {
  const auto [si, i] = locate(name);
  return param_sets()[si]->param(i);
}

Tensor Transformer::grad(std::string_view name) const {
  const auto [si, i] = locate(name);
  return param_sets()[si]->grad(i);
}

Tensor Transformer::global_param(std::string_view name) const {
  const auto [si, i] = locate(name);
  return gather_global(param_sets()[si]->param(i), cfg_, tp_, std::string(name));
}

Tensor Transformer::global_grad(std::string_view name) const {
  const auto [si, i] = locate(name);
  return gather_global(param_sets()[si]->grad(i), cfg_, tp_, std::string(name));
}

ops::NormKind Transformer::norm_kind() const {
  return cfg_.arch == Arch::gpt2 ? ops::NormKind::layernorm : ops::NormKind::rmsnorm;
}

Transformer::BlockParams Transformer::block_views(size_t layer, bool grads) const {
  const ParamSet& s = blocks_[layer];
  // A forward pass under ZeRO-2 runs while the block's gradient buffer is
  // released: its gradient views are then undefined (and unused).
  if (grads && !s.has_grads()) return BlockParams{};
  ZT_ASSERT(grads || s.has_params(), "block ", layer, "'s weights are not gathered (ZeRO-3 hook missing)");
  const std::string p = layer_prefix(size_t(part_.first_layer) + layer);
  auto get = [&](const char* name) { return grads ? s.grad(s.index(p + name)) : s.param(s.index(p + name)); };
  auto opt = [&](const char* name) { return cfg_.has_bias() ? get(name) : Tensor(); };
  const int64_t D = cfg_.head_dim(), q_rows = shares_.q_heads * D, kv_rows = shares_.kv_heads * D;
  BlockParams b;
  b.ln1_w = get("attn_norm.weight");
  b.ln1_b = opt("attn_norm.bias");
  const Tensor qkv = get("attn.qkv.weight");
  b.wqkv = qkv;
  b.wq = qkv.slice(0, q_rows);
  b.wk = qkv.slice(q_rows, q_rows + kv_rows);
  b.wv = qkv.slice(q_rows + kv_rows, q_rows + 2 * kv_rows);
  if (cfg_.has_bias()) {
    const Tensor qkv_b = get("attn.qkv.bias");
    b.bqkv = qkv_b;
    b.bq = qkv_b.slice(0, q_rows);
    b.bk = qkv_b.slice(q_rows, q_rows + kv_rows);
    b.bv = qkv_b.slice(q_rows + kv_rows, q_rows + 2 * kv_rows);
  }
  b.proj_w = get("attn.proj.weight");
  b.proj_b = opt("attn.proj.bias");
  b.ln2_w = get("mlp_norm.weight");
  b.ln2_b = opt("mlp_norm.bias");
  if (cfg_.moe()) {
    const ParamSet& e = experts_[layer];  // its gradient buffer may be released alone (ZeRO-2)
    auto expert = [&](size_t i) { return grads ? (e.has_grads() ? e.grad(i) : Tensor()) : e.param(i); };
    const Tensor bias = !grads && !router_bias_.empty() ? router_bias_[layer] : Tensor();  // state, no gradient
    b.moe = MoeWeights{get("mlp.router.weight"), expert(0), expert(1), bias};
    if (cfg_.shared_expert()) {  // the shared expert as the block's mlp.in / mlp.out pair
      b.mlp_in_w = get("mlp.shared.in.weight");
      b.mlp_out_w = get("mlp.shared.out.weight");
    }
    return b;
  }
  b.mlp_in_w = get("mlp.in.weight");
  b.mlp_in_b = opt("mlp.in.bias");
  b.mlp_out_w = get("mlp.out.weight");
  b.mlp_out_b = opt("mlp.out.bias");
  return b;
}

void Transformer::set_router_bias(const std::vector<float>& all_layers) {
  if (all_layers.empty()) {
    router_bias_.clear();
    return;
  }
  const size_t E = size_t(cfg_.n_expert);
  ZT_CHECK(cfg_.moe() && all_layers.size() == size_t(cfg_.n_layer) * E, "router biases: ", all_layers.size(),
           " values for a model of ", cfg_.n_layer, " layers x ", cfg_.n_expert,
           " experts (model.n_layer x model.n_expert are wanted)");
  // Every step sets them again: the tensors are made once and written over.
  if (router_bias_.size() != blocks_.size()) {
    router_bias_.clear();
    for (size_t i = 0; i < blocks_.size(); ++i)
      router_bias_.push_back(Tensor::empty(Shape{int64_t(E)}, DType::f32, device_, MemCategory::params));
  }
  const Tensor host = Tensor::empty(Shape{int64_t(E)}, DType::f32);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    std::copy_n(all_layers.begin() + std::ptrdiff_t((size_t(part_.first_layer) + i) * E), E, host.data<float>());
    ops::copy(router_bias_[i], host);  // complete on return: host is reused
  }
}

std::vector<float> Transformer::router_bias() const {
  if (router_bias_.empty()) return {};
  const size_t E = size_t(cfg_.n_expert);
  std::vector<float> all(size_t(cfg_.n_layer) * E, 0.0f);
  for (size_t i = 0; i < router_bias_.size(); ++i) {
    const Tensor host = ops::to_device(router_bias_[i], Device::cpu());
    std::copy_n(host.data<float>(), E, all.begin() + std::ptrdiff_t((size_t(part_.first_layer) + i) * E));
  }
  return all;
}

std::vector<int64_t> Transformer::take_expert_load() {
  const size_t E = size_t(cfg_.n_expert);
  std::vector<int64_t> all(size_t(cfg_.n_layer) * E, 0);
  for (size_t i = 0; i < expert_load_.size(); ++i) all[size_t(part_.first_layer) * E + i] = expert_load_[i];
  expert_load_.clear();
  return all;
}

RowParallelLinear Transformer::shared_out(const BlockParams& p, size_t layer) const {
  const BlockParams g = block_views(layer, true);
  return RowParallelLinear(p.mlp_out_w, Tensor(), g.mlp_out_w, Tensor(), TensorParallel{},
                           fp8 ? LinearPrecision::fp8 : LinearPrecision::compute_dtype);
}

Transformer::BlockLinears Transformer::block_linears(size_t layer, const TensorParallel& m) const {
  const BlockParams p = block_views(layer, false), g = block_views(layer, true);
  const LinearPrecision f = fp8 ? LinearPrecision::fp8 : LinearPrecision::compute_dtype;
  return BlockLinears{ColumnParallelLinear(p.wqkv, p.bqkv, g.wqkv, g.bqkv, f),
                      ColumnParallelLinear(p.wq, p.bq, g.wq, g.bq, f),
                      ColumnParallelLinear(p.wk, p.bk, g.wk, g.bk, f),
                      ColumnParallelLinear(p.wv, p.bv, g.wv, g.bv, f),
                      ColumnParallelLinear(p.mlp_in_w, p.mlp_in_b, g.mlp_in_w, g.mlp_in_b, f),
                      RowParallelLinear(p.proj_w, p.proj_b, g.proj_w, g.proj_b, m, f),
                      RowParallelLinear(p.mlp_out_w, p.mlp_out_b, g.mlp_out_w, g.mlp_out_b, m, f)};
}

Tensor Transformer::head_weight() const {
  if (cfg_.tied_embeddings && part_.embedding) return embed_.param(0);
  return head_.param(head_.index(cfg_.tied_embeddings ? "embed.wte" : "lm_head.weight"));
}

Tensor Transformer::head_grad() const {
  if (cfg_.tied_embeddings && part_.embedding) return embed_.grad(0);
  return head_.grad(head_.index(cfg_.tied_embeddings ? "embed.wte" : "lm_head.weight"));
}

void Transformer::check_batch(const Tensor& tokens, const Tensor& targets) const {
  ZT_CHECK(tokens.defined() && tokens.ndim() == 2 && tokens.dtype() == DType::i32,
           "model input tokens must be a (B, T) i32 tensor, got ", tokens.str());
  ZT_CHECK(tokens.size(1) <= cfg_.max_seq_len, "sequence length ", tokens.size(1),
           " exceeds the model's context (model.max_seq_len = ", cfg_.max_seq_len,
           "); lower train.seq_len or raise model.max_seq_len");
  if (targets.defined())
    ZT_CHECK(targets.shape() == tokens.shape() && targets.dtype() == DType::i32, "targets ", targets.str(),
             " must match tokens ", tokens.str());
}

TensorParallel Transformer::pass_mode(bool sequence_parallel, bool context) const {
  TensorParallel m = tp_;
  m.sequence_parallel = sequence_parallel && tp_.size() > 1;
  m.context = context && context_parallel && context_parallel->size() > 1 ? context_parallel : nullptr;
  return m;
}

namespace {
// The zigzag shard of a context-parallel pass of T local rows.
ContextShard pass_shard(const TensorParallel& m, int64_t T) {
  const int64_t cp = m.context->size();
  return context_shard(T * cp, cp, m.context->rank());
}
}  // namespace

const Tensor& Transformer::rope_rows(const TensorParallel& m, int64_t T) const {
  if (!m.context) return rope_table_;
  if (cp_rope_rows_ != T) {
    cp_rope_table_ = shard_table_rows(rope_table_, pass_shard(m, T));
    cp_rope_rows_ = T;
  }
  return cp_rope_table_;
}

Tensor Transformer::gather_rows(const TensorParallel& m, const Tensor& shard) const {
  if (!m.sequence_parallel) return shard;
  Tensor full = act_tensor(Shape{shard.size(0) * m.size(), shard.size(1)}, shard.dtype(), device_);
  m.group->all_gather(full, shard)->wait();
  return full;
}

comm::WorkHandle Transformer::start_reduce_rows(const TensorParallel& m, const Tensor& out,
                                                const Tensor& partial) const {
  if (m.size() == 1) return nullptr;
  if (m.sequence_parallel) return m.group->reduce_scatter(out, partial);
  ZT_ASSERT(out.data_ptr() == partial.data_ptr(), "an all-reduce of rows works in place");
  return m.group->all_reduce(partial);
}

Tensor Transformer::embed(const TensorParallel& m, const Tensor& tokens, int64_t pos_offset) const {
  const int64_t B = tokens.size(0), T = tokens.size(1), N = B * T, C = cfg_.d_model;
  Tensor x = act_tensor(Shape{B, T, C}, dtype_, device_);
  // Each rank looks up the tokens of its vocabulary rows; the positions are
  // added once (rank 0), so the group's sum is the embedding.
  Tensor wpe = cfg_.learned_positions() && m.rank() == 0 ? embed_.param(1) : Tensor();
  if (wpe.defined() && m.context) wpe = shard_table_rows(wpe, pass_shard(m, T));  // the rows' positions
  const ops::VocabSlice slice = m.size() > 1 ? ops::VocabSlice{shares_.vocab_start, cfg_.vocab_size} : ops::VocabSlice{};
  ops::embedding_forward(x, tokens, embed_.param(0), wpe, pos_offset, slice);
  const Tensor rows = x.view(Shape{N, C});
  if (m.size() == 1) return rows;
  Tensor out = m.sequence_parallel ? act_tensor(Shape{N / m.size(), C}, dtype_, device_) : rows;
  wait(start_reduce_rows(m, out, rows));
  return out;
}

Tensor Transformer::block_forward(size_t layer, BlockActivations& a, const Tensor& x_in, int64_t B, int64_t T,
                                  const TensorParallel& m, KvCache* cache) const {
  const BlockParams p = block_views(layer, false);
  const BlockLinears lin = block_linears(layer, m);
  const int64_t C = cfg_.d_model, D = cfg_.head_dim(), Hq = shares_.q_heads, Hkv = shares_.kv_heads, N = B * T;
  const int64_t R = x_in.size(0), W = cfg_.mlp_in_width() / shares_.tp, F = shares_.ff;
  const bool layernorm = norm_kind() == ops::NormKind::layernorm;
  const int64_t pos = cache ? cache->length() : 0;  // the rows' first position
  a.x_in = x_in;
  // Attention half: ln1 -> q, k, v -> RoPE -> attention -> proj (+ x_in) -> ln2.
  a.ln1 = act_tensor(Shape{R, C}, dtype_, device_);
  a.ln1_mean = layernorm ? stat_tensor(R, device_) : Tensor();
  a.ln1_rstd = stat_tensor(R, device_);
  ops::norm_forward(norm_kind(), a.ln1, a.ln1_mean, a.ln1_rstd, x_in, p.ln1_w, p.ln1_b, cfg_.norm_eps);
  const Tensor ln1 = gather_rows(m, a.ln1);  // (N, C): the column-parallel input
  auto separate_heads = [&] {
    a.q = act_tensor(Shape{B, T, Hq, D}, dtype_, device_);
    a.k = act_tensor(Shape{B, T, Hkv, D}, dtype_, device_);
    a.v = act_tensor(Shape{B, T, Hkv, D}, dtype_, device_);
  };
  const QkvForm form = form_of(m);
  if (form == QkvForm::three) {
    separate_heads();
    const LinearOperand x = ln1;  // one operand: quantised once under fp8
    lin.q.forward(a.q.view(Shape{N, Hq * D}), x);
    lin.k.forward(a.k.view(Shape{N, Hkv * D}), x);
    lin.v.forward(a.v.view(Shape{N, Hkv * D}), x);
    if (cfg_.arch == Arch::llama3) {
      ops::rope_forward(a.q, a.q, rope_rows(m, T), pos);
      ops::rope_forward(a.k, a.k, rope_rows(m, T), pos);
    }
  } else {
    const int64_t H = Hq + 2 * Hkv;  // heads of the fused product's output
    const Tensor qkv = act_tensor(Shape{B, T, H, D}, dtype_, device_);
    lin.qkv.forward(qkv.view(Shape{N, H * D}), ln1);
    if (form == QkvForm::packed) {
      a.qkv = qkv;  // attention reads its heads in place, Llama's q and k rotated there
      if (cfg_.arch == Arch::llama3) ops::rope_packed_qkv_forward(qkv, Hq, Hkv, rope_rows(m, T), pos);
    } else {  // split: the RoPE pass makes rotated q, k and copied v of it
      separate_heads();
      ops::rope_split_qkv_forward(a.q, a.k, a.v, qkv, rope_rows(m, T), pos);
    }
  }
  if (cache) {  // the rows' keys and values join the cache's, then attention reads them there
    if (a.qkv.defined())
      cache->store_packed(int64_t(layer), a.qkv, Hq);
    else
      cache->store(int64_t(layer), a.k, a.v);
  }
  if (pos > 0)
    cached_attention(layer, a, B, T, *cache);
  else  // no earlier positions: the rows attend to each other alone, as without a cache
    attention_forward(a, B, T, m);
  // Each half's residual connection inside its output product (the
  // product's C), or in passes of its own (residual_in_products).
  Tensor branch;  // the unfused form's output of proj, then of mlp_out
  a.res_mid = act_tensor(Shape{R, C}, dtype_, device_);
  a.ln2 = act_tensor(Shape{R, C}, dtype_, device_);
  a.ln2_mean = layernorm ? stat_tensor(R, device_) : Tensor();
  a.ln2_rstd = stat_tensor(R, device_);
  if (residual_in_products_) {
    lin.proj.forward(a.res_mid, a.att.view(Shape{N, Hq * D}), x_in);
    ops::norm_forward(norm_kind(), a.ln2, a.ln2_mean, a.ln2_rstd, a.res_mid, p.ln2_w, p.ln2_b, cfg_.norm_eps);
  } else {
    branch = act_tensor(Shape{R, C}, dtype_, device_);
    lin.proj.forward(branch, a.att.view(Shape{N, Hq * D}));
    ops::residual_norm_forward(norm_kind(), a.res_mid, a.ln2, a.ln2_mean, a.ln2_rstd, x_in, branch, p.ln2_w,
                               p.ln2_b, cfg_.norm_eps);
  }
  // MLP half: ln2 -> mlp_in -> GeLU / SwiGLU -> mlp_out (+ res_mid).
  const Tensor ln2 = gather_rows(m, a.ln2);
  if (cfg_.moe()) {  // the experts instead (nn/moe.h)
    Tensor x_out = act_tensor(Shape{R, C}, dtype_, device_);
    // Balanced over a sequence's cp ranks; experts over the ep group, their hidden width over tp.
    const ExpertGroup experts{tp_.experts, m.group};
    // What the routed experts' combine adds to: the residual (tp = 1) and
    // the shared expert's output, on all N rows (this rank's columns of it
    // under tensor parallelism: a partial sum, reduced with the experts').
    Tensor base = m.size() == 1 ? a.res_mid : Tensor();
    if (cfg_.shared_expert()) {
      const int64_t Fs = shares_.shared_ff;
      a.mlp_in = act_tensor(Shape{B, T, 2 * Fs}, dtype_, device_);
      a.act = act_tensor(Shape{B, T, Fs}, dtype_, device_);
      lin.mlp_in.forward(a.mlp_in.view(Shape{N, 2 * Fs}), ln2);
      ops::swiglu_forward(a.act, a.mlp_in);
      const Tensor shared = act_tensor(Shape{N, C}, dtype_, device_);
      shared_out(p, layer).forward(shared, a.act.view(Shape{N, Fs}), base);
      base = shared;
    }
    if (m.size() == 1) {
      moe_forward(cfg_, a.moe, x_out, ln2, base, p.moe, SequenceShards{m.context, T}, experts);
      return x_out;
    }
    // This rank's partial output of all N rows, summed over tp (into this
    // rank's rows under sequence parallelism) as a row-parallel product's, then the residual.
    const Tensor partial = act_tensor(Shape{N, C}, dtype_, device_);
    moe_forward(cfg_, a.moe, partial, ln2, base, p.moe, SequenceShards{m.context, T}, experts);
    const Tensor sum = m.sequence_parallel ? x_out : partial;
    wait(start_reduce_rows(m, sum, partial));
    ops::add(x_out, a.res_mid, sum);
    return x_out;
  }
  a.mlp_in = act_tensor(Shape{B, T, W}, dtype_, device_);
  a.act = act_tensor(Shape{B, T, F}, dtype_, device_);
  // GPT-2's GeLU may run inside mlp_in's product, except under selective
  // recompute, which makes act again from mlp_in with gelu_forward: the
  // forward then does so too, so both have the same bits.
  if (cfg_.arch == Arch::gpt2 && recompute != Recompute::selective) {
    lin.mlp_in.forward_gelu(a.act.view(Shape{N, F}), a.mlp_in.view(Shape{N, W}), ln2);
  } else {
    lin.mlp_in.forward(a.mlp_in.view(Shape{N, W}), ln2);
    if (cfg_.arch == Arch::gpt2)
      ops::gelu_forward(a.act, a.mlp_in);
    else
      ops::swiglu_forward(a.act, a.mlp_in);
  }
  Tensor x_out = act_tensor(Shape{R, C}, dtype_, device_);
  if (residual_in_products_) {
    lin.mlp_out.forward(x_out, a.act.view(Shape{N, F}), a.res_mid);
  } else {
    lin.mlp_out.forward(branch, a.act.view(Shape{N, F}));  // reuse: the proj output is dead
    ops::add(x_out, a.res_mid, branch);
  }
  return x_out;
}

void Transformer::attention_forward(BlockActivations& a, int64_t B, int64_t T, const TensorParallel& m) const {
  const int64_t D = cfg_.head_dim(), Hq = shares_.q_heads, Hkv = shares_.kv_heads;
  a.att = act_tensor(Shape{B, T, Hq, D}, dtype_, device_);
  a.lse = stat_tensor(B * Hq * T, device_).view(Shape{B, Hq, T});
  if (m.context)
    ring_attention_forward(*m.context, a.att, a.lse, a.q, a.k, a.v);  // q, k, v apart (forward_part checks)
  else if (a.qkv.defined())
    ops::attention_forward_packed(a.att, a.lse, a.qkv, Hq, Hkv);
  else
    ops::attention_forward(a.att, a.lse, a.q, a.k, a.v);
}

void Transformer::cached_attention(size_t layer, BlockActivations& a, int64_t B, int64_t T, KvCache& cache) const {
  const int64_t D = cfg_.head_dim(), Hq = shares_.q_heads, pos = cache.length(), block = int64_t(layer);
  Tensor q = a.q;
  if (a.qkv.defined()) {  // the query heads apart (the keys they meet are the cache's, not qkv's)
    q = act_tensor(Shape{B, T, Hq, D}, dtype_, device_);
    ops::copy_columns(q, 0, a.qkv, 0, Hq * D, B * T);
  }
  a.att = act_tensor(Shape{B, T, Hq, D}, dtype_, device_);
  a.lse = Tensor();  // inference: no backward reads it
  const Tensor lse = stat_tensor(Hq, device_).view(Shape{1, Hq, 1});
  // Row t of each sequence sees positions [0, pos + t]: unmasked attention
  // of that row against the cache's first pos + t + 1 positions (a decode
  // step's one row at once; a longer continuation row by row).
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const Shape row{1, 1, Hq, D};
      ops::attention_forward(a.att.select(b).slice(t, t + 1).view(row), lse, q.select(b).slice(t, t + 1).view(row),
                             cache.keys(block, b, pos + t + 1), cache.values(block, b, pos + t + 1), 0.0f,
                             ops::AttentionMask::none);
    }
}

void Transformer::release_for_policy(BlockActivations& a) const {
  switch (recompute) {
    case Recompute::none: break;
    case Recompute::selective:  // keep matmul inputs/outputs; drop the attention core and activation output
      a.att = Tensor();
      a.lse = Tensor();
      a.act = Tensor();
      if (a.moe.defined()) moe_release_selective(a.moe);
      break;
    case Recompute::full: {
      Tensor x_in = a.x_in;
      const float moe_grad_scale = a.moe.grad_scale;  // the rerun's load-balancing gradient needs it
      a = BlockActivations{};
      a.x_in = x_in;
      a.moe.grad_scale = moe_grad_scale;
      break;
    }
  }
}

void Transformer::recompute_for_backward(size_t layer, BlockActivations& a, int64_t B, int64_t T,
                                         const TensorParallel& m) const {
  switch (recompute) {
    case Recompute::none: break;
    case Recompute::selective: {
      attention_forward(a, B, T, m);
      if (a.moe.defined()) {  // the experts' input rows come from all N rows of ln2 (gathered under SP)
        moe_recompute_selective(a.moe, a.moe.xe.defined() ? a.ln2 : gather_rows(m, a.ln2));
        if (!cfg_.shared_expert()) break;
        a.act = act_tensor(Shape{B, T, shares_.shared_ff}, dtype_, device_);  // the shared expert's
        ops::swiglu_forward(a.act, a.mlp_in);
        break;
      }
      a.act = act_tensor(Shape{B, T, shares_.ff}, dtype_, device_);
      if (cfg_.arch == Arch::gpt2)
        ops::gelu_forward(a.act, a.mlp_in);
      else
        ops::swiglu_forward(a.act, a.mlp_in);
      break;
    }
    case Recompute::full: block_forward(layer, a, a.x_in, B, T, m); break;
  }
}

void Transformer::block_backward(size_t layer, BlockActivations& a, const Tensor& dres, int64_t B, int64_t T,
                                 const TensorParallel& m, std::vector<std::function<void()>>* deferred,
                                 std::vector<std::function<void()>>* deferred_experts) {
  // dres (R, C): on entry dL/d x_out, on exit dL/d x_in (updated in place).
  const BlockParams p = block_views(layer, false);
  const BlockParams g = block_views(layer, true);
  const BlockLinears lin = block_linears(layer, m);
  const int64_t C = cfg_.d_model, D = cfg_.head_dim(), Hq = shares_.q_heads, Hkv = shares_.kv_heads, N = B * T;
  const int64_t R = dres.size(0), W = cfg_.mlp_in_width() / shares_.tp, F = shares_.ff;
  const bool sp = m.sequence_parallel;
  // Norm weights see only this rank's rows under sequence parallelism: their
  // gradients are partial sums, reduced over the group at the end.
  std::unique_ptr<PartialGrads> norms;
  if (sp) norms = std::make_unique<PartialGrads>(std::vector<Tensor>{g.ln1_w, g.ln1_b, g.ln2_w, g.ln2_b}, device_);
  const Tensor g_ln1_w = sp ? norms->view(0) : g.ln1_w, g_ln1_b = sp ? norms->view(1) : g.ln1_b;
  const Tensor g_ln2_w = sp ? norms->view(2) : g.ln2_w, g_ln2_b = sp ? norms->view(3) : g.ln2_b;
  // The (N, C) input of a column-parallel layer: kept (R = N), or gathered
  // again from the kept shard while the input gradient is computed.
  auto start_input = [&](const Tensor& kept, Tensor& full) -> comm::WorkHandle {
    if (!sp) {
      full = kept;
      return nullptr;
    }
    full = act_tensor(Shape{N, C}, dtype_, device_);
    return m.group->all_gather(full, kept);
  };
  // Input gradient of the column-parallel layers: summed over the group into
  // d_ln (R, C) while the weight gradients are computed.
  Tensor d_partial = act_tensor(Shape{N, C}, dtype_, device_);
  Tensor d_ln = sp ? act_tensor(Shape{R, C}, dtype_, device_) : d_partial;
  // Weight-gradient work: now, or (zero-bubble schedules) queued for
  // backward_weight with the tensors it reads.
  auto weights = [&](std::function<void()> work) {
    if (deferred)
      deferred->push_back(std::move(work));
    else
      work();
  };
  // What a weight pass keeps of an operand its data product read: the
  // operand itself when the pass runs now (under fp8 its codes, made once);
  // deferred, the tensor alone - a copy when it is dres, which is updated in
  // place below - so no codes are held through the schedule.
  auto later = [&](const LinearOperand& op) -> LinearOperand {
    if (!deferred) return op;
    const Tensor& t = op.tensor();
    if (t.data_ptr() != dres.data_ptr()) return op.fresh();
    Tensor c = act_tensor(t.shape(), t.dtype(), device_);
    ops::copy(c, t);
    return c;
  };

  // MLP half. x_out = res_mid + mlp_out(act(mlp_in(ln2(res_mid)))). GPT-2's
  // GeLU backward is fused into the product that computes its incoming
  // gradient (no (N, F) gradient at the GeLU's output is materialised).
  const bool gelu = cfg_.arch == Arch::gpt2;
  comm::WorkHandle gather, reduce;  // the MLP's input gather and input-gradient reduction (tp > 1)
  if (cfg_.moe()) {  // the experts (nn/moe.h): d_ln <- the gradient at ln2
    auto expert_weights = [&](std::function<void()> work) {
      if (deferred_experts)
        deferred_experts->push_back(std::move(work));
      else
        work();
    };
    // A view's writes are claimed in the set it belongs to: the block's (the router) or its experts'.
    auto claim = [this, layer](const Tensor& view, bool expert) {
      return claim_grads(expert ? expert_set(layer) : block_set(layer), {view});
    };
    // Under tensor parallelism every rank's experts read all N rows: the
    // output gradient and ln2 gathered under SP, the partial input gradient
    // reduced over tp into d_ln (tp = 1: d_ln is d_partial).
    const Tensor dout = gather_rows(m, dres);
    Tensor ln2;
    wait(start_input(a.ln2, ln2));
    moe_backward(cfg_, a.moe, d_partial, dout, ln2, p.moe, weights, expert_weights,
                 [this, layer] { return block_views(layer, true).moe; }, claim, ExpertGroup{tp_.experts, m.group});
    if (cfg_.shared_expert()) {  // its input gradient added to the experts' (this rank's columns' part)
      const int64_t Fs = shares_.shared_ff;
      Tensor d_act = act_tensor(Shape{B, T, Fs}, dtype_, device_);
      const RowParallelLinear out = shared_out(p, layer);
      const LinearOperand dy = later(out.backward_data(d_act.view(Shape{N, Fs}), dout));
      const Tensor act = a.act.view(Shape{N, Fs});
      weights([this, layer, out, dy, act] {
        const BlockParams gn = block_views(layer, true);
        out.with_grads(gn.mlp_out_w, Tensor()).backward_weights(dy, act, claim_grads(block_set(layer), {gn.mlp_out_w}));
      });
      a.act = Tensor();
      const Tensor d_in = a.mlp_in;  // in place over mlp_in, which nothing reads after this
      a.mlp_in = Tensor();
      ops::swiglu_backward(d_in, d_act, d_in);
      d_act = Tensor();
      const LinearOperand dy_in = d_in.view(Shape{N, 2 * Fs});
      lin.mlp_in.backward_data(d_partial, dy_in, true);
      const ColumnParallelLinear in = lin.mlp_in;
      weights([this, layer, in, dy_in = later(dy_in), ln2] {
        const BlockParams gn = block_views(layer, true);
        in.with_grads(gn.mlp_in_w, Tensor()).backward_weights(dy_in, ln2, claim_grads(block_set(layer), {gn.mlp_in_w}));
      });
    }
    wait(start_reduce_rows(m, d_ln, d_partial));
  } else {
    Tensor d_act, d_mlp_in;  // gradients at the activation's output (SwiGLU only) and input
    if (gelu)
      d_mlp_in = act_tensor(Shape{B, T, W}, dtype_, device_);
    else
      d_act = act_tensor(Shape{B, T, F}, dtype_, device_);
    {
      const LinearOperand dy = later(gelu ? lin.mlp_out.backward_data_gelu(d_mlp_in.view(Shape{N, F}), dres,
                                                                            a.mlp_in.view(Shape{N, F}))
                                           : lin.mlp_out.backward_data(d_act.view(Shape{N, F}), dres));
      const Tensor act = a.act.view(Shape{N, F});
      const RowParallelLinear lin_now = lin.mlp_out;
      weights([this, layer, lin_now, dy, act] {
        const BlockParams gn = block_views(layer, true);
        lin_now.with_grads(gn.mlp_out_w, gn.mlp_out_b)
            .backward_weights(dy, act, claim_grads(block_set(layer), {gn.mlp_out_w, gn.mlp_out_b}));
      });
    }
    a.act = Tensor();
    if (!gelu) {
      // In place over mlp_in, which nothing reads after this: its storage
      // lives on as d_mlp_in, so no (N, W) gradient is allocated (and a
      // kernel that reads and writes the same addresses).
      d_mlp_in = a.mlp_in;
      a.mlp_in = Tensor();
      ops::swiglu_backward(d_mlp_in, d_act, d_mlp_in);
      d_act = Tensor();
    }
    Tensor ln2;
    gather = start_input(a.ln2, ln2);
    const LinearOperand dy = d_mlp_in.view(Shape{N, W});
    lin.mlp_in.backward_data(d_partial, dy, false);
    reduce = start_reduce_rows(m, d_ln, d_partial);
    {
      const ColumnParallelLinear lin_now = lin.mlp_in;
      weights([this, layer, lin_now, dy = later(dy), ln2, gather] {
        wait(gather);
        const BlockParams gn = block_views(layer, true);
        lin_now.with_grads(gn.mlp_in_w, gn.mlp_in_b)
            .backward_weights(dy, ln2, claim_grads(block_set(layer), {gn.mlp_in_w, gn.mlp_in_b}));
      });
    }
    wait(gather);
    wait(reduce);
    d_mlp_in = ln2 = Tensor();
  }
  // dres <- dL/d res_mid = norm2 backward + the residual path.
  ops::norm_backward(norm_kind(), dres, g_ln2_w, g_ln2_b, d_ln, a.res_mid, p.ln2_w, a.ln2_mean, a.ln2_rstd, dres,
                     sp ? ops::GradWrite::accumulate : claim_grads(block_set(layer), {g.ln2_w, g.ln2_b}));
  // Attention half. res_mid = x_in + proj(att(q, k, v)).
  Tensor d_att = act_tensor(Shape{B, T, Hq, D}, dtype_, device_);
  {
    const LinearOperand dy = later(lin.proj.backward_data(d_att.view(Shape{N, Hq * D}), dres));
    const Tensor att = a.att.view(Shape{N, Hq * D});
    const RowParallelLinear lin_now = lin.proj;
    weights([this, layer, lin_now, dy, att] {
      const BlockParams gn = block_views(layer, true);
      lin_now.with_grads(gn.proj_w, gn.proj_b)
          .backward_weights(dy, att, claim_grads(block_set(layer), {gn.proj_w, gn.proj_b}));
    });
  }
  const int64_t H = Hq + 2 * Hkv;  // heads of the fused product's output
  Tensor dq, dk, dv, dqkv;
  const QkvForm form = form_of(m);
  if (form == QkvForm::packed) {
    dqkv = act_tensor(Shape{B, T, H, D}, dtype_, device_);
    ops::attention_backward_packed(dqkv, d_att, a.qkv, a.att, a.lse, Hq, Hkv);
    if (cfg_.arch == Arch::llama3) ops::rope_packed_qkv_backward(dqkv, Hq, Hkv, rope_rows(m, T), 0);
  } else {
    dq = act_tensor(Shape{B, T, Hq, D}, dtype_, device_);
    dk = act_tensor(Shape{B, T, Hkv, D}, dtype_, device_);
    dv = act_tensor(Shape{B, T, Hkv, D}, dtype_, device_);
    if (m.context)
      ring_attention_backward(*m.context, dq, dk, dv, d_att, a.q, a.k, a.v, a.att, a.lse);
    else
      ops::attention_backward(dq, dk, dv, d_att, a.q, a.k, a.v, a.att, a.lse);
  }
  d_att = Tensor();
  if (form == QkvForm::split) {
    // The RoPE pass joins the gradients into the fused product's dqkv.
    dqkv = act_tensor(Shape{B, T, H, D}, dtype_, device_);
    ops::rope_split_qkv_backward(dqkv, dq, dk, dv, rope_rows(m, T), 0);
    dq = dk = dv = Tensor();
  }
  Tensor ln1;
  if (dqkv.defined()) {
    // d ln1 = dqkv Wqkv (partial over the group), and its weight and bias gradients.
    const LinearOperand dqkv2 = dqkv.view(Shape{N, H * D});
    gather = start_input(a.ln1, ln1);
    lin.qkv.backward_data(d_partial, dqkv2, false);
    reduce = start_reduce_rows(m, d_ln, d_partial);
    weights([this, layer, lin, dqkv2 = later(dqkv2), ln1, gather] {
      wait(gather);
      const BlockParams gn = block_views(layer, true);
      lin.qkv.with_grads(gn.wqkv, gn.bqkv)
          .backward_weights(dqkv2, ln1, claim_grads(block_set(layer), {gn.wqkv, gn.bqkv}));
    });
  } else {
    if (cfg_.arch == Arch::llama3) {
      ops::rope_backward(dq, dq, rope_rows(m, T), 0);
      ops::rope_backward(dk, dk, rope_rows(m, T), 0);
    }
    const LinearOperand dq2 = dq.view(Shape{N, Hq * D}), dk2 = dk.view(Shape{N, Hkv * D}),
                        dv2 = dv.view(Shape{N, Hkv * D});
    // d ln1 = dq Wq + dk Wk + dv Wv (partial over the group), then each slice's weight and bias gradients.
    gather = start_input(a.ln1, ln1);
    lin.q.backward_data(d_partial, dq2, false);
    lin.k.backward_data(d_partial, dk2, true);
    lin.v.backward_data(d_partial, dv2, true);
    reduce = start_reduce_rows(m, d_ln, d_partial);
    weights([this, layer, lin, dq2 = later(dq2), dk2 = later(dk2), dv2 = later(dv2), ln1, gather] {
      wait(gather);
      const BlockParams gn = block_views(layer, true);
      const size_t set = block_set(layer);
      const LinearOperand x = ln1;  // one operand: quantised once under fp8
      lin.q.with_grads(gn.wq, gn.bq).backward_weights(dq2, x, claim_grads(set, {gn.wq, gn.bq}));
      if (kv_group_) {
        // kv heads shared by several ranks: each holds the part of their
        // gradient its query heads produced; the replicas sum them.
        PartialGrads kv({gn.wk, gn.bk, gn.wv, gn.bv}, device_);
        lin.k.with_grads(kv.view(0), kv.view(1)).backward_weights(dk2, x);
        lin.v.with_grads(kv.view(2), kv.view(3)).backward_weights(dv2, x);
        kv.reduce_and_add(*kv_group_, blocks_[layer]);
      } else {
        lin.k.with_grads(gn.wk, gn.bk).backward_weights(dk2, x, claim_grads(set, {gn.wk, gn.bk}));
        lin.v.with_grads(gn.wv, gn.bv).backward_weights(dv2, x, claim_grads(set, {gn.wv, gn.bv}));
      }
    });
  }
  wait(gather);
  wait(reduce);
  // dres <- dL/d x_in = norm1 backward + the residual path.
  ops::norm_backward(norm_kind(), dres, g_ln1_w, g_ln1_b, d_ln, a.x_in, p.ln1_w, a.ln1_mean, a.ln1_rstd, dres,
                     sp ? ops::GradWrite::accumulate : claim_grads(block_set(layer), {g.ln1_w, g.ln1_b}));
  if (norms) norms->reduce_and_add(*m.group, blocks_[layer]);
}

void Transformer::chunk_loss(const Tensor& losses, const Tensor& logits, const Tensor& targets, bool grad,
                             float grad_scale) const {
  const int64_t V = cfg_.vocab_size;
  if (tp_.size() == 1) return ops::softmax_cross_entropy(losses, grad ? logits : Tensor(), logits, targets, V, grad_scale);
  // Vocabulary-parallel: the row max, then the exp sums and target logits,
  // reduced over the group; no rank holds a whole row.
  const int64_t n = logits.size(0), v0 = shares_.vocab_start;
  Tensor row_max = stat_tensor(n, device_), sums = stat_tensor(2 * n, device_);
  ops::vocab_parallel_ce_max(row_max, logits, v0, V);
  tp_.group->all_reduce(row_max, comm::ReduceOp::max)->wait();
  const Tensor sum_exp = sums.slice(0, n), target_logit = sums.slice(n, 2 * n);
  ops::vocab_parallel_ce_sums(sum_exp, target_logit, logits, row_max, targets, v0, V);
  tp_.group->all_reduce(sums)->wait();
  ops::vocab_parallel_ce_finish(losses, grad ? logits : Tensor(), logits, row_max, sum_exp, target_logit, targets, v0,
                                V, grad_scale);
}

void Transformer::head_loss(ForwardContext& ctx, const Tensor& lnf_rows, bool train, const TensorParallel& m) {
  const int64_t B = ctx.B, T = ctx.T, C = cfg_.d_model, N = B * T, R = lnf_rows.size(0);
  const int64_t Vl = shares_.vocab_rows;
  const float grad_scale = ctx.grad_scale;
  // The caller's targets, on the host: counted there, and the loss op
  // validates them there and uploads what its kernel reads.
  const Tensor targets = ops::on_device(ctx.targets, Device::cpu());
  const Tensor lnf = gather_rows(m, lnf_rows);  // (N, C)
  // Fused (train without head_keeps_dlogits): each chunk's backward runs at
  // once. Kept: every chunk's dlogits stay in ctx.dlogits for head_backward.
  const bool keep = train && head_keeps_dlogits;
  const bool fused = train && !keep;
  // d lnf is a partial sum over the vocabulary slices under tensor parallelism.
  Tensor d_lnf = fused ? act_tensor(Shape{N, C}, dtype_, device_) : Tensor();
  if (fused && on_grads_needed) on_grads_needed(head_weight_set());
  const Tensor w_head = head_weight(), g_head = fused ? head_grad() : Tensor();
  const Tensor flat_targets = targets.view(Shape{N});
  const int64_t chunk = head_chunk_rows(N);
  Tensor logits = act_tensor(Shape{keep ? N : chunk, Vl}, dtype_, device_);
  Tensor losses = stat_tensor(N, device_);  // per token; 0 for ignored targets
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t n = std::min(chunk, N - r0);
    const Tensor lg = keep ? logits.slice(r0, r0 + n) : logits.slice(0, n);
    const Tensor ls = losses.slice(r0, r0 + n), tg = flat_targets.slice(r0, r0 + n);
    const Tensor x_rows = lnf.slice(r0, r0 + n);
    ops::linear_forward(lg, x_rows, w_head, Tensor());
    chunk_loss(ls, lg, tg, train, grad_scale);
    if (fused)  // the first chunk's weight gradient overwrites (a lazy step's first write), the others add
      ops::linear_backward(d_lnf.slice(r0, r0 + n), g_head, Tensor(), lg, x_rows, w_head,
                           claim_grads(head_weight_set(), {g_head}));
  }
  if (keep) {
    ctx.dlogits = logits;
    ctx.head_in = lnf;
  } else if (train) {
    ctx.d_lnf = m.sequence_parallel ? act_tensor(Shape{R, C}, dtype_, device_) : d_lnf;
    wait(start_reduce_rows(m, ctx.d_lnf, d_lnf));
  }
  ctx.token_losses = losses;
  const int32_t* t = targets.data<int32_t>();
  ctx.loss_tokens = std::count_if(t, t + N, [](int32_t x) { return x >= 0; });
  // The sum reads the losses on the host: on a GPU a copy that waits for the
  // forward, which defer_loss_sum leaves to the caller (sum_token_losses).
  if (!defer_loss_sum) ctx.loss_sum = sum_token_losses(losses);
}

double sum_token_losses(const Tensor& token_losses) {
  const Tensor host = ops::on_device(token_losses, Device::cpu());
  const float* l = host.data<float>();
  double sum = 0.0;  // f64, in token order; ignored tokens add their loss of 0 exactly
  for (int64_t i = 0; i < host.numel(); ++i) sum += double(l[i]);
  return sum;
}

Tensor Transformer::part_input(const TensorParallel& m, const Tensor& input, const Tensor& tokens,
                               int64_t rows, int64_t pos_offset) const {
  if (part_.embedding) {
    need(0);
    Tensor x = embed(m, tokens, pos_offset);
    done(0);
    return x;
  }
  const int64_t C = cfg_.d_model;
  ZT_CHECK(input.defined() && input.shape() == (Shape{rows, C}) && input.dtype() == dtype_, "stage input must be ",
           dtype_name(dtype_), " (", rows, ", ", C, ") (the previous stage's output), got ", input.str());
  return ops::on_device(input, device_);
}

double Transformer::forward(ForwardContext& ctx, const Tensor& tokens, const Tensor& targets, bool train,
                            float grad_scale) {
  ZT_CHECK(whole(), "Transformer::forward runs the whole model; a pipeline stage runs forward_part");
  forward_part(ctx, Tensor(), tokens, targets, train, grad_scale);
  if (defer_loss_sum) ctx.loss_sum = sum_token_losses(ctx.token_losses);
  return ctx.loss_sum;
}

Tensor Transformer::forward_part(ForwardContext& ctx, const Tensor& input, const Tensor& tokens,
                                 const Tensor& targets, bool train, float grad_scale) {
  check_batch(tokens, targets);
  ZT_CHECK(targets.defined(), "forward needs targets (use logits() for inference)");
  const int64_t B = tokens.size(0), T = tokens.size(1), C = cfg_.d_model, N = B * T;
  ZT_CHECK(!tp_.sequence_parallel || N % tp_.size() == 0, "sequence parallelism shards the ", N,
           " tokens of a micro-batch (micro_batch x seq_len) over tp = ", tp_.size(),
           " ranks: make micro_batch x seq_len a multiple of tp");
  const TensorParallel m = pass_mode(tp_.sequence_parallel, true);
  if (m.context) {
    const int64_t cp = m.context->size();
    ZT_CHECK(T % 2 == 0 && T * cp <= cfg_.max_seq_len, "context parallelism: a rank's ", T, " tokens of each "
             "sequence must be its two equal zigzag chunks of a sequence of cp x ", T, " = ", T * cp,
             " <= model.max_seq_len = ", cfg_.max_seq_len, " tokens; set train.seq_len to a multiple of 2 cp within it");
  }
  ctx = ForwardContext{};
  ctx.B = B;
  ctx.T = T;
  ctx.train = train;
  ctx.sequence_parallel = m.sequence_parallel;
  ctx.context_parallel = m.context != nullptr;
  ctx.grad_scale = grad_scale;
  // Batches arrive from the host loader and stay there: the ops validate the
  // ids on the host and upload what their kernels read (no wait for the
  // GPU). A copy, so the caller may refill its buffers before backward.
  ctx.tokens = Tensor::empty(tokens.shape(), DType::i32, Device::cpu(), MemCategory::activations);
  ops::copy(ctx.tokens, tokens);
  ctx.blocks.resize(blocks_.size());
  const int64_t rows = m.sequence_parallel ? N / m.size() : N;
  Tensor x = part_input(m, input, ctx.tokens, rows);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    for (size_t s : block_sets(i)) need(s);
    ctx.blocks[i].moe.grad_scale = grad_scale;
    Tensor y = block_forward(i, ctx.blocks[i], x, B, T, m);
    if (ctx.blocks[i].moe.defined()) {
      ctx.aux_loss += ctx.blocks[i].moe.aux_loss;
      const std::vector<int64_t> load = moe_expert_load(ctx.blocks[i].moe);
      if (train) {
        if (expert_load_.empty()) expert_load_.assign(blocks_.size() * load.size(), 0);
        for (size_t e = 0; e < load.size(); ++e) expert_load_[i * load.size() + e] += load[e];
      }
      // The routing call's (under cp the micro-batch's, as one process counts them).
      const MoeActivations& moe = ctx.blocks[i].moe;
      ctx.expert_dropped_max = std::max(ctx.expert_dropped_max, moe.dropped_share);
      const double mean = moe.load_tokens * double(cfg_.expert_top_k) / double(moe.load.size());
      if (mean > 0)
        ctx.expert_load_max = std::max(ctx.expert_load_max, *std::max_element(moe.load.begin(), moe.load.end()) / mean);
    }
    for (size_t s : block_sets(i)) done(s);
    if (train) {
      release_for_policy(ctx.blocks[i]);
      if (offload_activations) offloaded_bytes_ += offload_block(ctx.blocks[i], device_);
    } else
      ctx.blocks[i] = BlockActivations{};
    x = y;
  }
  if (!part_.head) return x;  // ctx.loss_sum = 0: the head stage has the loss
  need(head_set());
  if (head_weight_set() != head_set()) need(head_weight_set());
  // Final norm, then the LM head in row chunks fused with the loss (and its backward).
  const int64_t R = x.size(0);
  const bool layernorm = norm_kind() == ops::NormKind::layernorm;
  const Tensor fw = head_.param(0), fb = cfg_.has_bias() ? head_.param(1) : Tensor();
  Tensor lnf_rows = act_tensor(Shape{R, C}, dtype_, device_);
  ctx.lnf_mean = layernorm ? stat_tensor(R, device_) : Tensor();
  ctx.lnf_rstd = stat_tensor(R, device_);
  ops::norm_forward(norm_kind(), lnf_rows, ctx.lnf_mean, ctx.lnf_rstd, x, fw, fb, cfg_.norm_eps);
  ctx.targets = targets;
  if (train && !head_keeps_dlogits) ctx.head_start = ops::DeviceMark(device_);  // the head's backward runs fused
  head_loss(ctx, lnf_rows, train, m);
  done(head_set());
  if (head_weight_set() != head_set()) done(head_weight_set());
  if (train) {
    ctx.x_final = x;
  } else {
    ctx.lnf_mean = ctx.lnf_rstd = Tensor();
  }
  return Tensor();
}

void Transformer::backward(ForwardContext& ctx) {
  ZT_CHECK(whole(), "Transformer::backward runs the whole model; a pipeline stage runs backward_part");
  backward_part(ctx, Tensor());
}

Tensor Transformer::backward_part(ForwardContext& ctx, const Tensor& d_output) {
  return backward_pass(ctx, d_output, false);
}

Tensor Transformer::backward_input(ForwardContext& ctx, const Tensor& d_output) {
  return backward_pass(ctx, d_output, true);
}

void Transformer::backward_weight(ForwardContext& ctx) {
  ZT_CHECK(ctx.weights_pending, "backward_weight needs a context that backward_input ran on (and not yet this)");
  for (DeferredWeights& d : ctx.deferred) {
    // ZeRO-2 may have reduced and released the set's gradient buffer since
    // backward_input (another micro-batch's weight pass): the work writes
    // into the one current now.
    if (on_grads_needed && !d.work.empty()) on_grads_needed(d.set);
    for (auto& work : d.work) work();
    d.work.clear();
    grads_ready(d.set);
  }
  ctx = ForwardContext{};
}

int64_t default_head_chunk_elems(Device device) {
  return env_whole_number("ZT_HEAD_CHUNK_ELEMS", 1, "logits per LM-head chunk")
      .value_or(device.is_cpu() ? (int64_t(1) << 26) : (int64_t(1) << 28));
}

QkvForm qkv_form(const ModelConfig& cfg, const TpShares& shares, Device device, bool context_parallel) {
  // Read at each model's construction (not once per process), so a test can
  // build every form in one process.
  const char* what =
      "0: q, k and v as three products; 1: as one whose heads attention reads in place (Llama's q and k rotated "
      "there), also on the CPU; 2: as one, Llama's split into q, k and v by the RoPE pass (GPT-2's as 1); unset: "
      "1 on a GPU, on the CPU 2 for Llama and 0 for GPT-2";
  const std::optional<int64_t> asked = env_whole_number("ZT_FUSED_QKV", 0, what);
  ZT_CHECK(!asked || *asked <= 2, "ZT_FUSED_QKV = '", *asked, "' is not 0, 1 or 2 (", what,
           "); unset it for the default");
  // On the CPU attention copies a packed tensor's heads out (and the
  // gradients back): the split's one pass does that and the rotation at once.
  const int64_t form = asked.value_or(device.is_cuda() ? 1 : cfg.arch == Arch::llama3 ? 2 : 0);
  if (shares.kv_replicas > 1 || form == 0) return QkvForm::three;
  const bool llama = cfg.arch == Arch::llama3;
  if (context_parallel) return llama ? QkvForm::split : QkvForm::three;  // the ring takes q, k, v apart
  return form == 2 && llama ? QkvForm::split : QkvForm::packed;
}

bool residual_in_products() {
  // Read at each model's construction, as qkv_form.
  return env_switch("ZT_FUSED_RESIDUAL",
                    "1 or unset: a block half adds its residual connection inside its output product; 0: in the "
                    "residual norm and an add of their own",
                    true);
}

int64_t head_chunk_rows(int64_t rows, int64_t vocab_rows, int64_t chunk_elems) {
  if (rows <= 0) return 1;
  const int64_t most = std::max<int64_t>(1, chunk_elems / std::max<int64_t>(1, vocab_rows));
  const int64_t chunks = (rows + most - 1) / most;
  return (rows + chunks - 1) / chunks;
}

int64_t Transformer::head_chunk_rows(int64_t N) const {
  return nn::head_chunk_rows(N, shares_.vocab_rows, head_chunk_elems);
}

Tensor Transformer::head_backward(ForwardContext& ctx, const TensorParallel& m,
                                  std::vector<std::function<void()>>* weight_work) {
  const int64_t C = cfg_.d_model;
  if (ctx.dlogits.defined()) {
    // head_keeps_dlogits: d lnf = dlogits W (partial over the vocabulary
    // slices), in the chunks forward used, then dW += dlogits^T lnf.
    const int64_t N = ctx.dlogits.size(0), chunk = head_chunk_rows(N);
    need(head_weight_set());
    const Tensor w_head = head_weight();
    Tensor d_lnf = act_tensor(Shape{N, C}, dtype_, device_);
    for (int64_t r0 = 0; r0 < N; r0 += chunk) {
      const int64_t r1 = std::min(N, r0 + chunk);
      ops::linear_backward(d_lnf.slice(r0, r1), Tensor(), Tensor(), ctx.dlogits.slice(r0, r1),
                           ctx.head_in.slice(r0, r1), w_head);
    }
    done(head_weight_set());
    if (on_grads_needed) on_grads_needed(head_weight_set());
    auto work = [this, w_head, dl = ctx.dlogits, x = ctx.head_in, N, chunk] {
      const Tensor g_head = head_grad();  // the buffer current when the work runs
      for (int64_t r0 = 0; r0 < N; r0 += chunk) {
        const int64_t r1 = std::min(N, r0 + chunk);
        ops::linear_backward(Tensor(), g_head, Tensor(), dl.slice(r0, r1), x.slice(r0, r1), w_head,
                             claim_grads(head_weight_set(), {g_head}));
      }
    };
    if (weight_work)
      weight_work->push_back(std::move(work));
    else
      work();
    ctx.dlogits = ctx.head_in = Tensor();
    ctx.d_lnf = m.sequence_parallel ? act_tensor(Shape{ctx.x_final.size(0), C}, dtype_, device_) : d_lnf;
    wait(start_reduce_rows(m, ctx.d_lnf, d_lnf));
  }
  if (on_grads_needed) on_grads_needed(head_set());
  need(head_set());
  const Tensor fw = head_.param(0);
  const Tensor gfw = head_.grad(0), gfb = cfg_.has_bias() ? head_.grad(1) : Tensor();
  const int64_t R = ctx.x_final.size(0);
  Tensor dres = act_tensor(Shape{R, C}, dtype_, device_);
  {
    std::unique_ptr<PartialGrads> norm;  // this rank's rows only under sequence parallelism
    if (m.sequence_parallel) norm = std::make_unique<PartialGrads>(std::vector<Tensor>{gfw, gfb}, device_);
    ops::norm_backward(norm_kind(), dres, norm ? norm->view(0) : gfw, norm ? norm->view(1) : gfb, ctx.d_lnf,
                       ctx.x_final, fw, ctx.lnf_mean, ctx.lnf_rstd, Tensor(),
                       norm ? ops::GradWrite::accumulate : claim_grads(head_set(), {gfw, gfb}));
    if (norm) norm->reduce_and_add(*m.group, head_);
  }
  ctx.d_lnf = ctx.x_final = ctx.lnf_mean = ctx.lnf_rstd = Tensor();
  done(head_set());
  // The head's gradients are complete, unless its weight gradient was
  // deferred (the caller reports the set then). An untied lm_head's were
  // accumulated in forward when fused with the loss; a tied one's belong to
  // the embeddings on a whole model.
  if (!weight_work) grads_ready(head_set());
  return dres;
}

Tensor Transformer::backward_pass(ForwardContext& ctx, const Tensor& d_output, bool defer) {
  ZT_CHECK(ctx.train && (!part_.head || ctx.d_lnf.defined() || ctx.dlogits.defined()),
           "backward needs a context from a training forward pass");
  const int64_t B = ctx.B, T = ctx.T, C = cfg_.d_model;
  const TensorParallel m = pass_mode(ctx.sequence_parallel, ctx.context_parallel);
  Tensor dres;
  if (!part_.head) {
    const int64_t rows = m.sequence_parallel ? B * T / m.size() : B * T;
    ZT_CHECK(d_output.defined() && d_output.shape() == (Shape{rows, C}) && d_output.dtype() == dtype_,
             "stage output gradient must be ", dtype_name(dtype_), " (", rows, ", ", C, ") (from the next stage), got ",
             d_output.str());
    dres = act_tensor(Shape{rows, C}, dtype_, device_);  // updated in place below; the caller's buffer stays
    ops::copy(dres, d_output);
  }
  // Deferred: each set's weight-gradient work, run by backward_weight.
  std::vector<DeferredWeights> deferred;
  // A whole model's tied head writes the embeddings' gradient: its weight
  // work runs with theirs, first (the order the fused head gives).
  std::vector<std::function<void()>> tied_head_work;
  if (part_.head) {
    std::vector<std::function<void()>> head_work;
    dres = head_backward(ctx, m, defer ? &head_work : nullptr);
    if (defer) {
      const bool tied = head_weight_set() != head_set();
      deferred.push_back(DeferredWeights{head_set(), {}});
      (tied ? tied_head_work : deferred.back().work) = std::move(head_work);
    }
  }
  for (size_t i = blocks_.size(); i-- > 0;) {
    const std::vector<size_t> sets = block_sets(i);
    for (size_t s : sets) need(s);
    for (size_t s : sets)  // before recompute: the block's linears view its gradients
      if (on_grads_needed) on_grads_needed(s);
    restore_block(ctx.blocks[i], device_);  // a no-op unless its forward offloaded it
    recompute_for_backward(i, ctx.blocks[i], B, T, m);
    DeferredWeights d{block_set(i), {}}, de{sets.back(), {}};
    block_backward(i, ctx.blocks[i], dres, B, T, m, defer ? &d.work : nullptr, defer ? &de.work : nullptr);
    for (size_t s : sets) done(s);
    ctx.blocks[i] = BlockActivations{};
    if (defer) {
      if (sets.size() > 1) deferred.push_back(std::move(de));  // the experts' set, reported first
      deferred.push_back(std::move(d));
    } else {
      for (size_t k = sets.size(); k-- > 0;) grads_ready(sets[k]);
    }
  }
  Tensor d_input;
  if (part_.embedding) {
    if (on_grads_needed) on_grads_needed(0);
    // Every token's gradient row (all rows under sequence parallelism) for this rank's vocabulary rows.
    const Tensor d_emb = gather_rows(m, dres).view(Shape{B, T, C});
    const ops::VocabSlice slice = m.size() > 1 ? ops::VocabSlice{shares_.vocab_start, cfg_.vocab_size} : ops::VocabSlice{};
    const Tensor tokens = ctx.tokens;
    const std::optional<ContextShard> shard =
        m.context ? std::optional<ContextShard>(pass_shard(m, T)) : std::nullopt;
    // The embedding's backward is its weight gradient: deferred too.
    auto work = [this, d_emb, tokens, slice, shard] {
      const Tensor g_wte = embed_.grad(0), g_wpe = cfg_.learned_positions() ? embed_.grad(1) : Tensor();
      for (const Tensor& g : {g_wte, g_wpe})  // a scatter-add: zeros first where it writes first
        if (embed_.claim_grads(g) == ops::GradWrite::overwrite) ops::fill(g, 0.0);
      if (shard && g_wpe.defined()) {  // the rows' positions' gradient, added at those positions
        const Tensor g_rows = Tensor::empty(Shape{shard->local_len(), g_wpe.size(1)}, DType::f32, device_,
                                            MemCategory::workspace);
        ops::fill(g_rows, 0.0);
        ops::embedding_backward(g_wte, g_rows, d_emb, tokens, 0, slice);
        add_shard_table_rows(g_wpe, g_rows, *shard);
      } else {
        ops::embedding_backward(g_wte, g_wpe, d_emb, tokens, 0, slice);
      }
    };
    if (defer) {
      tied_head_work.push_back(std::move(work));
      deferred.push_back(DeferredWeights{0, std::move(tied_head_work)});
    } else {
      work();
      grads_ready(0);
    }
  } else {
    d_input = dres;
  }
  ctx = ForwardContext{};
  if (defer) {
    ctx.deferred = std::move(deferred);
    ctx.weights_pending = true;
  }
  return d_input;
}

void Transformer::logits(const Tensor& out, const Tensor& tokens) {
  ZT_CHECK(whole(), "logits() needs the whole model (not one pipeline stage): a pipeline runs logits_part per stage");
  logits_part(out, Tensor(), tokens);
}

void Transformer::last_logits(const Tensor& out, const Tensor& tokens) {
  ZT_CHECK(whole(), "last_logits() needs the whole model (not one pipeline stage): a pipeline runs logits_part per "
                    "stage");
  logits_part(out, Tensor(), tokens, true);
}

void Transformer::last_logits(const Tensor& out, const Tensor& tokens, KvCache& cache) {
  ZT_CHECK(whole(), "last_logits() needs the whole model (not one pipeline stage): a pipeline runs logits_part per "
                    "stage, each with its own cache");
  logits_part(out, Tensor(), tokens, true, &cache);
}

KvCache Transformer::make_kv_cache(int64_t batch, int64_t capacity) const {
  ZT_CHECK(capacity >= 0 && capacity <= cfg_.max_seq_len, "a KV cache holds up to model.max_seq_len = ",
           cfg_.max_seq_len, " positions (the model has no position past them); asked for ", capacity);
  return KvCache(int64_t(blocks_.size()), batch, capacity > 0 ? capacity : cfg_.max_seq_len, shares_.kv_heads,
                 cfg_.head_dim(), dtype_, device_);
}

Tensor Transformer::logits_part(const Tensor& out, const Tensor& input, const Tensor& tokens, bool last_only,
                                KvCache* cache) {
  check_batch(tokens, Tensor());
  const int64_t B = tokens.size(0), T = tokens.size(1), C = cfg_.d_model, Vp = cfg_.padded_vocab();
  const Shape out_shape = last_only ? Shape{B, Vp} : Shape{B, T, Vp};
  ZT_CHECK(!part_.head || (out.defined() && out.shape() == out_shape && out.dtype() == DType::f32),
           "logits output must be f32 ", out_shape.str(), " (B", last_only ? "" : ", T", ", padded_vocab), got ",
           out.str());
  int64_t N = B * T;
  const int64_t pos = cache ? cache->length() : 0;
  if (cache) {
    ZT_CHECK(cache->blocks() == int64_t(blocks_.size()) && cache->batch() == B &&
                 cache->kv_heads() == shares_.kv_heads && cache->head_dim() == cfg_.head_dim() &&
                 cache->dtype() == dtype_ && cache->device() == device_,
             "this KV cache (", cache->blocks(), " blocks, ", cache->batch(), " sequences, ", cache->kv_heads(),
             " kv heads of ", cache->head_dim(), ", ", dtype_name(cache->dtype()), " on ", cache->device().str(),
             ") is not this model's for ", B, " sequences (", blocks_.size(), " blocks, ", shares_.kv_heads,
             " kv heads of ", cfg_.head_dim(), ", ", dtype_name(dtype_), " on ", device_.str(),
             "): make it with make_kv_cache(", B, ")");
    ZT_CHECK(pos + T <= cache->capacity(), "the KV cache holds ", pos, " of its ", cache->capacity(),
             " positions; ", T, " more tokens do not fit: clear() it and run the last ", cache->capacity(),
             " tokens again");
  }
  const TensorParallel m = pass_mode(false);  // any number of tokens: the rows stay whole
  Tensor x = part_input(m, input, tokens, N, pos);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    BlockActivations a;
    for (size_t s : block_sets(i)) need(s);
    x = block_forward(i, a, x, B, T, m, cache);
    for (size_t s : block_sets(i)) done(s);
  }
  if (cache) cache->advance(T);
  if (!part_.head) return x;
  if (last_only) {  // the head's rows: each sequence's last
    const Tensor rows = x.view(Shape{B, T, C});
    Tensor last = act_tensor(Shape{B, C}, x.dtype(), device_);
    for (int64_t b = 0; b < B; ++b) ops::copy(last.slice(b, b + 1), rows.select(b).slice(T - 1, T));
    x = last;
    N = B;
  }
  const bool layernorm = norm_kind() == ops::NormKind::layernorm;
  Tensor lnf = act_tensor(Shape{N, C}, dtype_, device_);
  Tensor mean = layernorm ? stat_tensor(N, device_) : Tensor(), rstd = stat_tensor(N, device_);
  need(head_set());
  if (head_weight_set() != head_set()) need(head_weight_set());
  ops::norm_forward(norm_kind(), lnf, mean, rstd, x, head_.param(0), cfg_.has_bias() ? head_.param(1) : Tensor(),
                    cfg_.norm_eps);
  const Tensor out_rows = out.view(Shape{N, Vp});
  if (m.size() == 1) {
    ops::linear_forward(out_rows, lnf, head_weight(), Tensor());
  } else {
    // Every rank's vocabulary columns, gathered and placed side by side.
    const int64_t Vl = shares_.vocab_rows, p = m.size();
    Tensor mine = act_tensor(Shape{N, Vl}, DType::f32, device_);
    ops::linear_forward(mine, lnf, head_weight(), Tensor());
    Tensor all = act_tensor(Shape{p * N * Vl}, DType::f32, device_);
    m.group->all_gather(all, mine.view(Shape{N * Vl}))->wait();
    for (int64_t r = 0; r < p; ++r) {
      const int64_t cols = std::clamp<int64_t>(Vp - r * Vl, 0, Vl);
      for (int64_t n = 0; cols > 0 && n < N; ++n)
        ops::copy(out_rows.flat_view(n * Vp + r * Vl, Shape{cols}), all.flat_view((r * N + n) * Vl, Shape{cols}));
    }
  }
  done(head_set());
  if (head_weight_set() != head_set()) done(head_weight_set());
  return Tensor();
}

}  // namespace zt::nn
