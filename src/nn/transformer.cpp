#include "nn/transformer.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"
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

std::vector<ParamSpec> block_specs(const ModelConfig& c, size_t layer) {
  const std::string p = layer_prefix(layer);
  const int64_t C = c.d_model;
  const float std = c.init_std, resid_std = c.init_std / std::sqrt(2.0f * float(c.n_layer));
  std::vector<ParamSpec> s;
  s.push_back({p + "attn_norm.weight", Shape{C}, Init::ones, 0, false});
  if (c.has_bias()) s.push_back({p + "attn_norm.bias", Shape{C}, Init::zeros, 0, false});
  s.push_back({p + "attn.qkv.weight", Shape{c.qkv_width(), C}, Init::normal, std, true});
  if (c.has_bias()) s.push_back({p + "attn.qkv.bias", Shape{c.qkv_width()}, Init::zeros, 0, false});
  s.push_back({p + "attn.proj.weight", Shape{C, C}, Init::normal, resid_std, true});
  if (c.has_bias()) s.push_back({p + "attn.proj.bias", Shape{C}, Init::zeros, 0, false});
  s.push_back({p + "mlp_norm.weight", Shape{C}, Init::ones, 0, false});
  if (c.has_bias()) s.push_back({p + "mlp_norm.bias", Shape{C}, Init::zeros, 0, false});
  s.push_back({p + "mlp.in.weight", Shape{c.mlp_in_width(), C}, Init::normal, std, true});
  if (c.has_bias()) s.push_back({p + "mlp.in.bias", Shape{c.mlp_in_width()}, Init::zeros, 0, false});
  s.push_back({p + "mlp.out.weight", Shape{C, c.d_ff}, Init::normal, resid_std, true});
  if (c.has_bias()) s.push_back({p + "mlp.out.bias", Shape{C}, Init::zeros, 0, false});
  return s;
}

// t itself when it already lives on `device`, else a copy there.
Tensor on_device(const Tensor& t, Device device) {
  return t.device() == device ? t : ops::to_device(t, device, MemCategory::activations);
}

Tensor act_tensor(const Shape& s, DType dt, Device dev) { return Tensor::empty(s, dt, dev, MemCategory::activations); }
Tensor stat_tensor(int64_t n, Device dev) { return Tensor::empty(Shape{n}, DType::f32, dev, MemCategory::activations); }

}  // namespace

Transformer::Transformer(const ModelConfig& cfg, DType compute_dtype, Device device, int64_t flat_pad_multiple)
    : cfg_(cfg), dtype_(compute_dtype), device_(device) {
  cfg_.validate();
  ops::init_device(device_);
  ZT_CHECK(dtype_ == DType::f32 || dtype_ == DType::bf16, "model compute dtype must be f32 or bf16, got ",
           dtype_name(dtype_));
  const int64_t C = cfg_.d_model, Vp = cfg_.padded_vocab();
  std::vector<ParamSpec> emb{{"embed.wte", Shape{Vp, C}, Init::normal, cfg_.init_std, false}};
  if (cfg_.learned_positions())
    emb.push_back({"embed.wpe", Shape{cfg_.max_seq_len, C}, Init::normal, cfg_.init_std, false});
  embed_ = ParamSet(std::move(emb), dtype_, device_, flat_pad_multiple);
  blocks_.reserve(size_t(cfg_.n_layer));
  for (int64_t i = 0; i < cfg_.n_layer; ++i) blocks_.emplace_back(block_specs(cfg_, size_t(i)), dtype_, device_, flat_pad_multiple);
  std::vector<ParamSpec> head{{"final_norm.weight", Shape{C}, Init::ones, 0, false}};
  if (cfg_.has_bias()) head.push_back({"final_norm.bias", Shape{C}, Init::zeros, 0, false});
  if (!cfg_.tied_embeddings) head.push_back({"lm_head.weight", Shape{Vp, C}, Init::normal, cfg_.init_std, true});
  head_ = ParamSet(std::move(head), dtype_, device_, flat_pad_multiple);
  if (cfg_.arch == Arch::llama3) {
    rope_table_ = Tensor::empty(Shape{cfg_.max_seq_len, cfg_.head_dim() / 2, 2}, DType::f32, device_,
                                MemCategory::params);
    ops::rope_table(rope_table_, cfg_.head_dim(), cfg_.rope_theta, cfg_.rope_scaling);
  }
}

std::vector<ParamSet*> Transformer::param_sets() {
  std::vector<ParamSet*> v{&embed_};
  for (auto& b : blocks_) v.push_back(&b);
  v.push_back(&head_);
  return v;
}

std::vector<const ParamSet*> Transformer::param_sets() const {
  std::vector<const ParamSet*> v{&embed_};
  for (auto& b : blocks_) v.push_back(&b);
  v.push_back(&head_);
  return v;
}

int64_t Transformer::num_params() const {
  int64_t n = 0;
  for (const ParamSet* s : param_sets()) n += s->numel();
  return n;
}

void Transformer::init_weights(uint64_t seed) {
  for (ParamSet* s : param_sets()) s->init(seed);
  // Padding rows of the vocabulary never see a token; keep them zero.
  const int64_t V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
  if (Vp > V) {
    ops::fill(param("embed.wte").slice(V, Vp), 0.0);
    if (!cfg_.tied_embeddings) ops::fill(param("lm_head.weight").slice(V, Vp), 0.0);
  }
}

void Transformer::zero_grads() {
  for (ParamSet* s : param_sets()) s->zero_grads();
}

Tensor Transformer::param(std::string_view name) const {
  for (const ParamSet* s : param_sets())
    for (size_t i = 0; i < s->size(); ++i)
      if (s->spec(i).name == name) return s->param(i);
  ZT_FAIL("the model has no parameter named '", name, "'");
}

Tensor Transformer::grad(std::string_view name) const {
  for (const ParamSet* s : param_sets())
    for (size_t i = 0; i < s->size(); ++i)
      if (s->spec(i).name == name) return s->grad(i);
  ZT_FAIL("the model has no parameter named '", name, "'");
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
  const std::string p = layer_prefix(layer);
  auto get = [&](const char* name) { return grads ? s.grad(s.index(p + name)) : s.param(s.index(p + name)); };
  auto opt = [&](const char* name) { return cfg_.has_bias() ? get(name) : Tensor(); };
  const int64_t D = cfg_.head_dim(), q_rows = cfg_.n_head * D, kv_rows = cfg_.n_kv_head * D;
  BlockParams b;
  b.ln1_w = get("attn_norm.weight");
  b.ln1_b = opt("attn_norm.bias");
  const Tensor qkv = get("attn.qkv.weight");
  b.wq = qkv.slice(0, q_rows);
  b.wk = qkv.slice(q_rows, q_rows + kv_rows);
  b.wv = qkv.slice(q_rows + kv_rows, q_rows + 2 * kv_rows);
  if (cfg_.has_bias()) {
    const Tensor qkv_b = get("attn.qkv.bias");
    b.bq = qkv_b.slice(0, q_rows);
    b.bk = qkv_b.slice(q_rows, q_rows + kv_rows);
    b.bv = qkv_b.slice(q_rows + kv_rows, q_rows + 2 * kv_rows);
  }
  b.proj_w = get("attn.proj.weight");
  b.proj_b = opt("attn.proj.bias");
  b.ln2_w = get("mlp_norm.weight");
  b.ln2_b = opt("mlp_norm.bias");
  b.mlp_in_w = get("mlp.in.weight");
  b.mlp_in_b = opt("mlp.in.bias");
  b.mlp_out_w = get("mlp.out.weight");
  b.mlp_out_b = opt("mlp.out.bias");
  return b;
}

Transformer::BlockLinears Transformer::block_linears(size_t layer) const {
  const BlockParams p = block_views(layer, false), g = block_views(layer, true);
  return BlockLinears{ColumnParallelLinear(p.wq, p.bq, g.wq, g.bq), ColumnParallelLinear(p.wk, p.bk, g.wk, g.bk),
                      ColumnParallelLinear(p.wv, p.bv, g.wv, g.bv),
                      ColumnParallelLinear(p.mlp_in_w, p.mlp_in_b, g.mlp_in_w, g.mlp_in_b),
                      RowParallelLinear(p.proj_w, p.proj_b, g.proj_w, g.proj_b),
                      RowParallelLinear(p.mlp_out_w, p.mlp_out_b, g.mlp_out_w, g.mlp_out_b)};
}

Tensor Transformer::head_weight() const {
  return cfg_.tied_embeddings ? embed_.param(0) : head_.param(head_.index("lm_head.weight"));
}

Tensor Transformer::head_grad() const {
  return cfg_.tied_embeddings ? embed_.grad(0) : head_.grad(head_.index("lm_head.weight"));
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

Tensor Transformer::embed(const Tensor& tokens) const {
  const int64_t B = tokens.size(0), T = tokens.size(1);
  Tensor x = act_tensor(Shape{B, T, cfg_.d_model}, dtype_, device_);
  const Tensor wpe = cfg_.learned_positions() ? embed_.param(1) : Tensor();
  ops::embedding_forward(x, tokens, embed_.param(0), wpe, 0);
  return x;
}

Tensor Transformer::block_forward(size_t layer, BlockActivations& a, const Tensor& x_in, int64_t B,
                                  int64_t T) const {
  const BlockParams p = block_views(layer, false);
  const BlockLinears lin = block_linears(layer);
  const int64_t C = cfg_.d_model, D = cfg_.head_dim(), Hq = cfg_.n_head, Hkv = cfg_.n_kv_head;
  const bool layernorm = norm_kind() == ops::NormKind::layernorm;
  a.x_in = x_in;
  // Attention half: ln1 -> q, k, v -> RoPE -> attention -> proj, residual add fused into ln2.
  a.ln1 = act_tensor(Shape{B, T, C}, dtype_, device_);
  a.ln1_mean = layernorm ? stat_tensor(B * T, device_) : Tensor();
  a.ln1_rstd = stat_tensor(B * T, device_);
  ops::norm_forward(norm_kind(), a.ln1, a.ln1_mean, a.ln1_rstd, x_in, p.ln1_w, p.ln1_b, cfg_.norm_eps);
  a.q = act_tensor(Shape{B, T, Hq, D}, dtype_, device_);
  a.k = act_tensor(Shape{B, T, Hkv, D}, dtype_, device_);
  a.v = act_tensor(Shape{B, T, Hkv, D}, dtype_, device_);
  lin.q.forward(a.q.view(Shape{B, T, Hq * D}), a.ln1);
  lin.k.forward(a.k.view(Shape{B, T, Hkv * D}), a.ln1);
  lin.v.forward(a.v.view(Shape{B, T, Hkv * D}), a.ln1);
  if (cfg_.arch == Arch::llama3) {
    ops::rope_forward(a.q, a.q, rope_table_, 0);
    ops::rope_forward(a.k, a.k, rope_table_, 0);
  }
  a.att = act_tensor(Shape{B, T, Hq, D}, dtype_, device_);
  a.lse = stat_tensor(B * Hq * T, device_).view(Shape{B, Hq, T});
  ops::attention_forward(a.att, a.lse, a.q, a.k, a.v);
  Tensor branch = act_tensor(Shape{B, T, C}, dtype_, device_);
  lin.proj.forward(branch, a.att.view(Shape{B, T, C}));
  a.res_mid = act_tensor(Shape{B, T, C}, dtype_, device_);
  a.ln2 = act_tensor(Shape{B, T, C}, dtype_, device_);
  a.ln2_mean = layernorm ? stat_tensor(B * T, device_) : Tensor();
  a.ln2_rstd = stat_tensor(B * T, device_);
  ops::residual_norm_forward(norm_kind(), a.res_mid, a.ln2, a.ln2_mean, a.ln2_rstd, x_in, branch, p.ln2_w,
                             p.ln2_b, cfg_.norm_eps);
  // MLP half: ln2 -> mlp_in -> GeLU / SwiGLU -> mlp_out, plus the residual.
  a.mlp_in = act_tensor(Shape{B, T, cfg_.mlp_in_width()}, dtype_, device_);
  lin.mlp_in.forward(a.mlp_in, a.ln2);
  a.act = act_tensor(Shape{B, T, cfg_.d_ff}, dtype_, device_);
  if (cfg_.arch == Arch::gpt2)
    ops::gelu_forward(a.act, a.mlp_in);
  else
    ops::swiglu_forward(a.act, a.mlp_in);
  lin.mlp_out.forward(branch, a.act);  // reuse: the proj output is dead
  Tensor x_out = act_tensor(Shape{B, T, C}, dtype_, device_);
  ops::add(x_out, a.res_mid, branch);
  return x_out;
}

void Transformer::release_for_policy(BlockActivations& a) const {
  switch (recompute) {
    case Recompute::none: break;
    case Recompute::selective:  // keep matmul inputs/outputs; drop the attention core and activation output
      a.att = Tensor();
      a.lse = Tensor();
      a.act = Tensor();
      break;
    case Recompute::full: {
      Tensor x_in = a.x_in;
      a = BlockActivations{};
      a.x_in = x_in;
      break;
    }
  }
}

void Transformer::recompute_for_backward(size_t layer, BlockActivations& a, int64_t B, int64_t T) const {
  switch (recompute) {
    case Recompute::none: break;
    case Recompute::selective: {
      const int64_t D = cfg_.head_dim(), Hq = cfg_.n_head;
      a.att = act_tensor(Shape{B, T, Hq, D}, dtype_, device_);
      a.lse = stat_tensor(B * Hq * T, device_).view(Shape{B, Hq, T});
      ops::attention_forward(a.att, a.lse, a.q, a.k, a.v);
      a.act = act_tensor(Shape{B, T, cfg_.d_ff}, dtype_, device_);
      if (cfg_.arch == Arch::gpt2)
        ops::gelu_forward(a.act, a.mlp_in);
      else
        ops::swiglu_forward(a.act, a.mlp_in);
      break;
    }
    case Recompute::full: block_forward(layer, a, a.x_in, B, T); break;
  }
}

void Transformer::block_backward(size_t layer, BlockActivations& a, const Tensor& dres, int64_t B, int64_t T) {
  // dres (B, T, C): on entry dL/d x_out, on exit dL/d x_in (updated in place).
  const BlockParams p = block_views(layer, false);
  const BlockParams g = block_views(layer, true);
  const BlockLinears lin = block_linears(layer);
  const int64_t C = cfg_.d_model, D = cfg_.head_dim(), Hq = cfg_.n_head, Hkv = cfg_.n_kv_head;
  // MLP half. x_out = res_mid + mlp_out(act(mlp_in(ln2(res_mid)))).
  Tensor d_act = act_tensor(Shape{B, T, cfg_.d_ff}, dtype_, device_);
  lin.mlp_out.backward(d_act, dres, a.act);
  a.act = Tensor();
  Tensor d_mlp_in = act_tensor(Shape{B, T, cfg_.mlp_in_width()}, dtype_, device_);
  if (cfg_.arch == Arch::gpt2)
    ops::gelu_backward(d_mlp_in, d_act, a.mlp_in);
  else
    ops::swiglu_backward(d_mlp_in, d_act, a.mlp_in);
  d_act = Tensor();
  Tensor d_ln = act_tensor(Shape{B, T, C}, dtype_, device_);
  lin.mlp_in.backward(d_ln, d_mlp_in, a.ln2, false);
  d_mlp_in = Tensor();
  // dres <- dL/d res_mid = norm2 backward + the residual path.
  ops::norm_backward(norm_kind(), dres, g.ln2_w, g.ln2_b, d_ln, a.res_mid, p.ln2_w, a.ln2_mean, a.ln2_rstd, dres);
  // Attention half. res_mid = x_in + proj(att(q, k, v)).
  Tensor d_att = act_tensor(Shape{B, T, Hq, D}, dtype_, device_);
  lin.proj.backward(d_att.view(Shape{B, T, C}), dres, a.att.view(Shape{B, T, C}));
  Tensor dq = act_tensor(Shape{B, T, Hq, D}, dtype_, device_);
  Tensor dk = act_tensor(Shape{B, T, Hkv, D}, dtype_, device_);
  Tensor dv = act_tensor(Shape{B, T, Hkv, D}, dtype_, device_);
  ops::attention_backward(dq, dk, dv, d_att, a.q, a.k, a.v, a.att, a.lse);
  d_att = Tensor();
  if (cfg_.arch == Arch::llama3) {
    ops::rope_backward(dq, dq, rope_table_, 0);
    ops::rope_backward(dk, dk, rope_table_, 0);
  }
  // d ln1 = dq Wq + dk Wk + dv Wv (accumulated), and each slice's weight and bias gradients.
  lin.q.backward(d_ln, dq.view(Shape{B, T, Hq * D}), a.ln1, false);
  lin.k.backward(d_ln, dk.view(Shape{B, T, Hkv * D}), a.ln1, true);
  lin.v.backward(d_ln, dv.view(Shape{B, T, Hkv * D}), a.ln1, true);
  // dres <- dL/d x_in = norm1 backward + the residual path.
  ops::norm_backward(norm_kind(), dres, g.ln1_w, g.ln1_b, d_ln, a.x_in, p.ln1_w, a.ln1_mean, a.ln1_rstd, dres);
}

double Transformer::forward(ForwardContext& ctx, const Tensor& tokens, const Tensor& targets, bool train,
                            float grad_scale) {
  check_batch(tokens, targets);
  ZT_CHECK(targets.defined(), "forward needs targets (use logits() for inference)");
  const int64_t B = tokens.size(0), T = tokens.size(1), C = cfg_.d_model, N = B * T;
  const int64_t V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
  ctx = ForwardContext{};
  ctx.B = B;
  ctx.T = T;
  ctx.train = train;
  ctx.grad_scale = grad_scale;
  // Batches arrive from the host loader; kernels read them on the model's device.
  const Tensor dev_tokens = on_device(tokens, device_), dev_targets = on_device(targets, device_);
  ctx.tokens = dev_tokens;
  ctx.blocks.resize(size_t(cfg_.n_layer));
  need(0);
  Tensor x = embed(dev_tokens);
  done(0);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    need(i + 1);
    Tensor y = block_forward(i, ctx.blocks[i], x, B, T);
    done(i + 1);
    if (train)
      release_for_policy(ctx.blocks[i]);
    else
      ctx.blocks[i] = BlockActivations{};
    x = y;
  }
  need(head_set());
  if (cfg_.tied_embeddings) need(0);
  // Final norm, then the LM head in row chunks fused with the loss (and its backward).
  const bool layernorm = norm_kind() == ops::NormKind::layernorm;
  const Tensor fw = head_.param(0), fb = cfg_.has_bias() ? head_.param(1) : Tensor();
  Tensor lnf = act_tensor(Shape{N, C}, dtype_, device_);
  ctx.lnf_mean = layernorm ? stat_tensor(N, device_) : Tensor();
  ctx.lnf_rstd = stat_tensor(N, device_);
  ops::norm_forward(norm_kind(), lnf, ctx.lnf_mean, ctx.lnf_rstd, x.view(Shape{N, C}), fw, fb, cfg_.norm_eps);
  if (train) ctx.d_lnf = act_tensor(Shape{N, C}, dtype_, device_);
  if (train && on_grads_needed) on_grads_needed(cfg_.tied_embeddings ? 0 : blocks_.size() + 1);
  const Tensor w_head = head_weight(), g_head = train ? head_grad() : Tensor();
  const Tensor flat_targets = dev_targets.view(Shape{N});
  // Logit rows per chunk: 4M elements keep a CPU chunk in cache; a GPU wants
  // large GEMMs and has the memory (256M elements: 512 MiB in bf16).
  const int64_t chunk_elems = device_.is_cpu() ? (int64_t(1) << 22) : (int64_t(1) << 28);
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(N, chunk_elems / Vp));
  Tensor logits = act_tensor(Shape{chunk, Vp}, dtype_, device_);
  Tensor losses = stat_tensor(N, device_);  // per token; 0 for ignored targets
  for (int64_t r0 = 0; r0 < N; r0 += chunk) {
    const int64_t n = std::min(chunk, N - r0);
    const Tensor lg = logits.slice(0, n), ls = losses.slice(r0, r0 + n), tg = flat_targets.slice(r0, r0 + n);
    const Tensor x_rows = lnf.slice(r0, r0 + n);
    ops::linear_forward(lg, x_rows, w_head, Tensor());
    ops::softmax_cross_entropy(ls, train ? lg : Tensor(), lg, tg, V, grad_scale);
    if (train) ops::linear_backward(ctx.d_lnf.slice(r0, r0 + n), g_head, Tensor(), lg, x_rows, w_head);
  }
  done(head_set());
  if (cfg_.tied_embeddings) done(0);
  // Summed on the host in f64 in token order (N floats: one small copy per
  // micro-batch on a GPU), over the tokens that have a target.
  const Tensor host_losses = on_device(losses, Device::cpu()), host_targets = on_device(targets, Device::cpu());
  const float* l = host_losses.data<float>();
  const int32_t* t = host_targets.data<int32_t>();
  double loss_sum = 0.0;
  int64_t counted = 0;
  for (int64_t i = 0; i < N; ++i)
    if (t[i] >= 0) {
      loss_sum += double(l[i]);
      ++counted;
    }
  ctx.loss_sum = loss_sum;
  ctx.loss_tokens = counted;
  if (train) {
    ctx.x_final = x.view(Shape{N, C});
  } else {
    ctx.lnf_mean = ctx.lnf_rstd = Tensor();
  }
  return loss_sum;
}

void Transformer::backward(ForwardContext& ctx) {
  ZT_CHECK(ctx.train && ctx.d_lnf.defined(), "backward needs a context from a training forward pass");
  const int64_t B = ctx.B, T = ctx.T, C = cfg_.d_model, N = B * T;
  if (on_grads_needed) on_grads_needed(blocks_.size() + 1);
  need(head_set());
  const Tensor fw = head_.param(0);
  const Tensor gfw = head_.grad(0), gfb = cfg_.has_bias() ? head_.grad(1) : Tensor();
  Tensor dres = act_tensor(Shape{B, T, C}, dtype_, device_);
  ops::norm_backward(norm_kind(), dres.view(Shape{N, C}), gfw, gfb, ctx.d_lnf, ctx.x_final, fw, ctx.lnf_mean,
                     ctx.lnf_rstd);
  ctx.d_lnf = ctx.x_final = ctx.lnf_mean = ctx.lnf_rstd = Tensor();
  done(head_set());
  // The head's gradients are complete (an untied lm_head's were accumulated
  // in forward, fused with the loss; a tied one's belong to the embeddings).
  if (on_grads_ready) on_grads_ready(blocks_.size() + 1);
  for (size_t i = blocks_.size(); i-- > 0;) {
    need(i + 1);
    if (on_grads_needed) on_grads_needed(i + 1);  // before recompute: the block's linears view its gradients
    recompute_for_backward(i, ctx.blocks[i], B, T);
    block_backward(i, ctx.blocks[i], dres, B, T);
    done(i + 1);
    ctx.blocks[i] = BlockActivations{};
    if (on_grads_ready) on_grads_ready(i + 1);
  }
  if (on_grads_needed) on_grads_needed(0);
  const Tensor g_wpe = cfg_.learned_positions() ? embed_.grad(1) : Tensor();
  ops::embedding_backward(embed_.grad(0), g_wpe, dres, ctx.tokens, 0);
  if (on_grads_ready) on_grads_ready(0);
  ctx = ForwardContext{};
}

void Transformer::logits(const Tensor& out, const Tensor& tokens) {
  check_batch(tokens, Tensor());
  const int64_t B = tokens.size(0), T = tokens.size(1), C = cfg_.d_model, N = B * T;
  ZT_CHECK(out.defined() && out.shape() == (Shape{B, T, cfg_.padded_vocab()}) && out.dtype() == DType::f32,
           "logits output must be f32 (B, T, padded_vocab) = (", B, ", ", T, ", ", cfg_.padded_vocab(), "), got ",
           out.str());
  need(0);
  Tensor x = embed(on_device(tokens, device_));
  done(0);
  for (size_t i = 0; i < blocks_.size(); ++i) {
    BlockActivations a;
    need(i + 1);
    x = block_forward(i, a, x, B, T);
    done(i + 1);
  }
  const bool layernorm = norm_kind() == ops::NormKind::layernorm;
  Tensor lnf = act_tensor(Shape{N, C}, dtype_, device_);
  Tensor mean = layernorm ? stat_tensor(N, device_) : Tensor(), rstd = stat_tensor(N, device_);
  need(head_set());
  if (cfg_.tied_embeddings) need(0);
  ops::norm_forward(norm_kind(), lnf, mean, rstd, x.view(Shape{N, C}), head_.param(0),
                    cfg_.has_bias() ? head_.param(1) : Tensor(), cfg_.norm_eps);
  ops::linear_forward(out.view(Shape{N, cfg_.padded_vocab()}), lnf, head_weight(), Tensor());
  done(head_set());
  if (cfg_.tied_embeddings) done(0);
}

}  // namespace zt::nn
