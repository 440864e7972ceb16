#include "train/info.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <sstream>

#include "core/allocator.h"
#include "nn/transformer.h"

namespace zt::train {

int64_t estimate_activation_bytes(const Config& cfg, nn::Recompute policy) {
  const nn::ModelConfig& m = cfg.model;
  const int64_t tokens = cfg.train.micro_batch * cfg.train.seq_len;
  const int64_t s = int64_t(dtype_size(cfg.compute_dtype()));
  const int64_t C = m.d_model, kv = m.n_kv_head * m.head_dim(), F = m.d_ff, Fin = m.mlp_in_width();
  const int64_t stats = m.arch == nn::Arch::gpt2 ? 4 : 2;  // f32 norm statistics per token (mean?, rstd) x 2 norms
  // Per token and block, what BlockActivations keeps (see nn/transformer.h).
  const int64_t full_block = s * (C /*x_in*/ + C /*ln1*/ + C /*q*/ + 2 * kv /*k,v*/ + C /*att*/ + C /*res_mid*/ +
                                  C /*ln2*/ + Fin /*mlp_in*/ + F /*act*/) +
                             4 * (m.n_head /*lse*/ + stats);
  int64_t per_block = full_block;
  if (policy == nn::Recompute::selective) per_block -= s * (C + F) + 4 * m.n_head;
  if (policy == nn::Recompute::full) per_block = s * C;
  int64_t bytes = tokens * per_block * m.n_layer;
  // Head: final residual, d(final norm), norm stats.
  bytes += tokens * (2 * s * C + 4 * stats / 2);
  // At the peak, either the LM head's chunk of logits (while the head runs)
  // or, under full recompute, the one block rebuilt during backward.
  const int64_t vocab = m.padded_vocab();
  const int64_t logits =
      s * vocab * nn::head_chunk_rows(tokens, vocab, nn::default_head_chunk_elems(parse_device(cfg.train.device)));
  return bytes + std::max(logits, policy == nn::Recompute::full ? tokens * full_block : 0);
}

InfoReport make_info(const Config& cfg, bool measure) {
  const nn::ModelConfig& m = cfg.model;
  InfoReport r;
  const int64_t C = m.d_model;
  r.components.push_back({"token embedding (wte)", m.vocab_size * C});
  if (m.learned_positions()) r.components.push_back({"position embedding (wpe)", m.max_seq_len * C});
  const int64_t attn = m.qkv_width() * C + C * C + (m.has_bias() ? m.qkv_width() + C : 0);
  const int64_t mlp = (m.mlp_in_width() + m.d_ff) * C + (m.has_bias() ? m.mlp_in_width() + C : 0);
  const int64_t norms = (m.has_bias() ? 4 : 2) * C;
  r.components.push_back({"attention (all layers)", attn * m.n_layer});
  r.components.push_back({"mlp (all layers)", mlp * m.n_layer});
  r.components.push_back({"norms (all layers + final)", norms * m.n_layer + (m.has_bias() ? 2 : 1) * C});
  if (!m.tied_embeddings) r.components.push_back({"lm head", m.vocab_size * C});
  r.total_params = m.total_params();
  r.non_embedding_params = m.non_embedding_params();
  r.flops_per_token = m.train_flops_per_token(cfg.train.seq_len);
  // Buffers hold padded vocabulary rows; count what is allocated.
  const int64_t padded_extra = (m.padded_vocab() - m.vocab_size) * C * (m.tied_embeddings ? 1 : 2);
  const int64_t n_alloc = r.total_params + padded_extra;
  const bool mixed = cfg.compute_dtype() != DType::f32;
  r.param_bytes = n_alloc * int64_t(dtype_size(cfg.compute_dtype()));
  r.grad_bytes = n_alloc * 4;
  r.optimizer_bytes = n_alloc * (mixed ? 12 : 8);  // m, v (+ f32 master)

  for (nn::Recompute policy : {nn::Recompute::none, nn::Recompute::selective, nn::Recompute::full}) {
    PolicyMemory pm{policy, estimate_activation_bytes(cfg, policy), -1};
    if (measure) {
      nn::Transformer model(m, cfg.compute_dtype());
      model.recompute = policy;
      model.head_chunk_elems = nn::default_head_chunk_elems(parse_device(cfg.train.device));  // as the run will chunk
      model.init_weights(uint64_t(cfg.train.seed));
      const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len;
      Tensor tokens = Tensor::empty(Shape{B, T}, DType::i32), targets = Tensor::empty(Shape{B, T}, DType::i32);
      std::mt19937 gen(1);
      for (int64_t i = 0; i < B * T; ++i) {
        tokens.data<int32_t>()[i] = int32_t(gen() % uint32_t(m.vocab_size));
        targets.data<int32_t>()[i] = int32_t(gen() % uint32_t(m.vocab_size));
      }
      Allocator& alloc = allocator_for(Device::cpu());
      const int64_t before = alloc.stats().current(MemCategory::activations);
      alloc.reset_peak();
      nn::ForwardContext ctx;
      model.forward(ctx, tokens, targets, true, 1.0f / float(B * T));
      model.backward(ctx);
      pm.measured_activation_bytes = alloc.stats().peak(MemCategory::activations) - before;
    }
    r.activations.push_back(pm);
  }
  return r;
}

std::string format_info(const Config& cfg, const InfoReport& r) {
  std::ostringstream os;
  char line[256];
  const double MiB = 1024.0 * 1024.0;
  const nn::ModelConfig& m = cfg.model;
  std::snprintf(line, sizeof line, "model: %s, %s, %lld layers, d_model %lld, %lld heads (%lld kv), d_ff %lld, vocab %lld (padded %lld)\n",
                cfg.model_preset.empty() ? "custom" : cfg.model_preset.c_str(), std::string(nn::arch_name(m.arch)).c_str(),
                (long long)m.n_layer, (long long)m.d_model, (long long)m.n_head, (long long)m.n_kv_head,
                (long long)m.d_ff, (long long)m.vocab_size, (long long)m.padded_vocab());
  os << line << "\nparameters\n";
  for (const auto& c : r.components) {
    std::snprintf(line, sizeof line, "  %-28s %14lld  (%5.1f%%)\n", c.name.c_str(), (long long)c.params,
                  100.0 * double(c.params) / double(r.total_params));
    os << line;
  }
  std::snprintf(line, sizeof line, "  %-28s %14lld\n  %-28s %14lld\n", "total", (long long)r.total_params,
                "non-embedding (N)", (long long)r.non_embedding_params);
  os << line;
  std::snprintf(line, sizeof line,
                "\ntraining FLOPs per token at T=%lld: %.4g (6N + 12 L d T, N = %lld parameters in matmuls: "
                "blocks + LM head)\n",
                (long long)cfg.train.seq_len, r.flops_per_token, (long long)cfg.model.matmul_params());
  os << line;
  std::snprintf(line, sizeof line, "\nmemory (one process, %s)\n  %-28s %10.1f MiB\n  %-28s %10.1f MiB\n  %-28s %10.1f MiB\n",
                cfg.train.dtype.c_str(), "parameters", double(r.param_bytes) / MiB, "gradients (f32)",
                double(r.grad_bytes) / MiB, "optimizer (AdamW m, v[, master])", double(r.optimizer_bytes) / MiB);
  os << line;
  std::snprintf(line, sizeof line, "  activations per micro-batch (%lld x %lld tokens):\n    %-10s %14s %14s\n",
                (long long)cfg.train.micro_batch, (long long)cfg.train.seq_len, "recompute", "estimate MiB",
                "measured MiB");
  os << line;
  for (const auto& a : r.activations) {
    char measured[32] = "-";
    if (a.measured_activation_bytes >= 0)
      std::snprintf(measured, sizeof measured, "%.1f", double(a.measured_activation_bytes) / MiB);
    std::snprintf(line, sizeof line, "    %-10s %14.1f %14s\n", std::string(nn::recompute_name(a.policy)).c_str(),
                  double(a.estimated_activation_bytes) / MiB, measured);
    os << line;
  }
  return os.str();
}

}  // namespace zt::train
