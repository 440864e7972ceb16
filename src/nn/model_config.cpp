#include <cmath>
#include <cstdio>
#include <cstdint>
#include <string>

#include "nn/model_config.h"

#include "core/error.h"

namespace zt::nn {

std::string_view arch_name(Arch a) { return a == Arch::gpt2 ? "gpt2" : "llama3"; }

Arch parse_arch(std::string_view s) {
  if (s == "gpt2") return Arch::gpt2;
  if (s == "llama3" || s == "llama") return Arch::llama3;
  ZT_FAIL("unknown model arch '", s, "'; valid: gpt2, llama3");
}

void ModelConfig::validate() const {
  ZT_CHECK(vocab_size > 0, "model.vocab_size must be positive, got ", vocab_size);
  ZT_CHECK(vocab_multiple > 0, "model.vocab_multiple must be positive, got ", vocab_multiple);
  ZT_CHECK(n_layer > 0, "model.n_layer must be positive, got ", n_layer);
  ZT_CHECK(d_model > 0 && n_head > 0, "model.d_model and model.n_head must be positive");
  ZT_CHECK(d_model % n_head == 0, "model.n_head = ", n_head, " does not divide model.d_model = ", d_model,
           "; pick a head count that divides the width (e.g. ", d_model / 64 > 0 ? d_model / 64 : 1, ")");
  ZT_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0, "model.n_kv_head = ", n_kv_head,
           " does not divide model.n_head = ", n_head, "; grouped-query attention needs n_head % n_kv_head == 0");
  ZT_CHECK(arch == Arch::llama3 || n_kv_head == n_head, "model.n_kv_head = ", n_kv_head, " != n_head = ", n_head,
           ": grouped-query attention is a llama3 feature; set arch = \"llama3\" or n_kv_head = n_head");
  ZT_CHECK(arch == Arch::gpt2 || head_dim() % 2 == 0, "model head_dim = ", head_dim(),
           " is odd; rotary embedding needs an even head dimension");
  ZT_CHECK(d_ff > 0, "model.d_ff must be positive, got ", d_ff);
  ZT_CHECK(max_seq_len > 0, "model.max_seq_len must be positive, got ", max_seq_len);
  ZT_CHECK(norm_eps > 0, "model.norm_eps must be positive");
  ZT_CHECK(init_std > 0, "model.init_std must be positive");
  ZT_CHECK(arch == Arch::gpt2 || rope_theta > 0, "model.rope_theta must be positive");
  ZT_CHECK(n_expert >= 0, "model.n_expert must be >= 0 (0: a dense MLP), got ", n_expert);
  if (moe()) {
    ZT_CHECK(arch == Arch::llama3, "model.n_expert = ", n_expert,
             ": mixture-of-experts blocks are built for arch = \"llama3\" (SwiGLU experts, no biases); set "
             "arch = \"llama3\" or n_expert = 0");
    ZT_CHECK(expert_top_k >= 1 && expert_top_k <= n_expert, "model.expert_top_k = ", expert_top_k,
             " must be in [1, n_expert = ", n_expert, "]");
    ZT_CHECK(router_aux_loss >= 0 && std::isfinite(router_aux_loss), "model.router_aux_loss = ", router_aux_loss,
             " must be a finite number >= 0 (0: no load-balancing loss)");
    ZT_CHECK(router_z_loss >= 0 && std::isfinite(router_z_loss), "model.router_z_loss = ", router_z_loss,
             " must be a finite number >= 0 (0: no router z-loss)");
  }
  ZT_CHECK(router_bias_update_rate >= 0 && std::isfinite(router_bias_update_rate), "model.router_bias_update_rate = ",
           router_bias_update_rate, " must be a finite number >= 0 (0: no balancing bias; DeepSeek-V3 used 1e-3)");
  ZT_CHECK(router_bias_update_rate == 0 || moe(), "model.router_bias_update_rate = ", router_bias_update_rate,
           " balances a mixture of experts, but model.n_expert = 0 (a dense MLP); set model.n_expert > 0 or "
           "router_bias_update_rate = 0");
  ZT_CHECK(expert_capacity_factor >= 0 && std::isfinite(expert_capacity_factor), "model.expert_capacity_factor = ",
           expert_capacity_factor, " must be a finite number >= 0 (0: dropless; 1.0 to 1.25 are usual)");
  ZT_CHECK(expert_capacity_factor == 0 || moe(), "model.expert_capacity_factor = ", expert_capacity_factor,
           " bounds the experts of a mixture, but model.n_expert = 0 (a dense MLP); set model.n_expert > 0 or "
           "expert_capacity_factor = 0");
  ZT_CHECK(shared_expert_ff >= 0, "model.shared_expert_ff must be >= 0 (0: no shared expert), got ", shared_expert_ff);
  ZT_CHECK(shared_expert_ff == 0 || moe(), "model.shared_expert_ff = ", shared_expert_ff,
           " adds a shared expert beside a mixture of experts, but model.n_expert = 0 (a dense MLP); set "
           "model.n_expert > 0 or shared_expert_ff = 0 (a dense model's MLP width is model.d_ff)");
}

int64_t ModelConfig::mlp_params() const {
  const int64_t expert = mlp_in_width() * d_model + d_ff * d_model;
  return moe() ? n_expert * d_model + n_expert * expert + 3 * shared_expert_ff * d_model : expert;
}

int64_t ModelConfig::params_per_block() const {
  const int64_t C = d_model;
  const int64_t attn = qkv_width() * C + C * C;
  const int64_t norms = has_bias() ? 4 * C : 2 * C;
  const int64_t biases = has_bias() ? qkv_width() + C + mlp_in_width() + C : 0;
  return attn + mlp_params() + norms + biases;
}

int64_t ModelConfig::active_mlp_params() const {
  const int64_t expert = mlp_in_width() * d_model + d_ff * d_model;
  return moe() ? n_expert * d_model + expert_top_k * expert + 3 * shared_expert_ff * d_model : expert;
}

int64_t ModelConfig::matmul_params() const {
  return non_embedding_params() - n_layer * (mlp_params() - active_mlp_params()) + vocab_size * d_model;
}

int64_t ModelConfig::embedding_params() const {
  int64_t n = vocab_size * d_model;
  if (learned_positions()) n += max_seq_len * d_model;
  if (!tied_embeddings) n += vocab_size * d_model;
  return n;
}

int64_t ModelConfig::non_embedding_params() const {
  const int64_t final_norm = has_bias() ? 2 * d_model : d_model;
  return n_layer * params_per_block() + final_norm;
}

double ModelConfig::train_flops_per_token(int64_t T) const {
  return 6.0 * double(matmul_params()) + 12.0 * double(n_layer) * double(d_model) * double(T);
}

std::string moe_summary(const ModelConfig& c) {
  if (!c.moe()) return "";
  char line[512];
  char part[96];
  std::string extras;  // the optional balancing and capacity settings
  if (c.router_bias_update_rate > 0) {
    std::snprintf(part, sizeof part, ", balancing bias +-%g a step", double(c.router_bias_update_rate));
    extras += part;
  }
  if (c.expert_capacity_factor > 0) {
    std::snprintf(part, sizeof part, ", capacity %g x the mean load (slots over it dropped)",
                  double(c.expert_capacity_factor));
    extras += part;
  }
  std::snprintf(line, sizeof line,
                "mixture of experts: %lld experts of width %lld per block, each token to its top %lld (%s)%s, "
                "load-balancing loss x %g, z-loss x %g%s; %.2fM of %.2fM parameters active per token",
                (long long)c.n_expert, (long long)c.d_ff, (long long)c.expert_top_k,
                c.expert_normalize ? "weights renormalised" : "softmax weights",
                c.shared_expert() ? (" and a shared expert of width " + std::to_string(c.shared_expert_ff)).c_str() : "",
                double(c.router_aux_loss),
                double(c.router_z_loss), extras.c_str(), double(c.active_params()) / 1e6, double(c.total_params()) / 1e6);
  return line;
}

namespace {

ModelConfig gpt2(int64_t layers, int64_t width, int64_t heads) {
  ModelConfig c;
  c.arch = Arch::gpt2;
  c.vocab_size = 50257;
  c.n_layer = layers;
  c.d_model = width;
  c.n_head = heads;
  c.n_kv_head = heads;
  c.d_ff = 4 * width;
  c.max_seq_len = 1024;
  c.tied_embeddings = true;
  return c;
}

ModelConfig llama3(int64_t layers, int64_t width, int64_t heads, int64_t kv_heads, int64_t ff, bool tied) {
  ModelConfig c;
  c.arch = Arch::llama3;
  c.vocab_size = 128256;
  c.n_layer = layers;
  c.d_model = width;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.d_ff = ff;
  c.max_seq_len = 8192;
  c.norm_eps = 1e-5f;
  c.rope_theta = 500000.0;
  c.rope_scaling.enabled = true;  // Llama 3.1+/3.2 long-context frequency rule
  c.tied_embeddings = tied;
  return c;
}

struct Preset {
  const char* name;
  ModelConfig (*make)();
};

const Preset kPresets[] = {
    {"gpt2-124m", [] { return gpt2(12, 768, 12); }},
    {"gpt2-350m", [] { return gpt2(24, 1024, 16); }},
    {"gpt2-774m", [] { return gpt2(36, 1280, 20); }},
    {"gpt2-1.5b", [] { return gpt2(48, 1600, 25); }},
    {"llama3-1b", [] { return llama3(16, 2048, 32, 8, 8192, true); }},
    {"llama3-3b", [] { return llama3(28, 3072, 24, 8, 8192, true); }},
    {"llama3-8b", [] { return llama3(32, 4096, 32, 8, 14336, false); }},
    // Mixtral 8x7B's shape (Llama's blocks with 8 experts, top 2; its own
    // vocabulary and RoPE base): 46.7B parameters, 12.9B active.
    {"mixtral-8x7b",
     [] {
       ModelConfig c = llama3(32, 4096, 32, 8, 14336, false);
       c.vocab_size = 32000;
       c.max_seq_len = 32768;
       c.rope_theta = 1e6;
       c.rope_scaling.enabled = false;
       c.n_expert = 8;
       c.expert_top_k = 2;
       c.router_aux_loss = 0.02f;
       return c;
     }},
    {"gpt2-tiny",
     [] {
       ModelConfig c = gpt2(2, 64, 4);
       c.vocab_size = 512;
       c.max_seq_len = 64;
       return c;
     }},
    {"llama3-tiny",
     [] {
       ModelConfig c = llama3(2, 64, 4, 2, 160, false);
       c.vocab_size = 512;
       c.max_seq_len = 64;
       c.rope_theta = 10000.0;
       c.rope_scaling.original_max_position = 16;  // makes the scaling rule bite at tiny sizes
       return c;
     }},
    {"llama3-moe-tiny",
     [] {
       ModelConfig c = llama3(2, 64, 4, 2, 96, false);
       c.vocab_size = 512;
       c.max_seq_len = 64;
       c.rope_theta = 10000.0;
       c.rope_scaling.enabled = false;  // as Mixtral (its HF form has no Llama 3 scaling)
       c.n_expert = 4;
       c.expert_top_k = 2;
       return c;
     }},
};

}  // namespace

ModelConfig model_preset(std::string_view name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return p.make();
  std::string valid;
  for (const Preset& p : kPresets) valid += std::string(valid.empty() ? "" : ", ") + p.name;
  ZT_FAIL("unknown model preset '", name, "'; valid presets: ", valid);
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

}  // namespace zt::nn
