// ModelConfig: the shape of a decoder-only transformer, GPT-2 or Llama 3 style.
//
//   gpt2:   learned positions, LayerNorm, GeLU(tanh) MLP of width d_ff, biases,
//           tied input/output embeddings.
//   llama3: RoPE (theta, optional Llama 3 scaling), RMSNorm, SwiGLU MLP of width
//           d_ff, grouped-query attention (n_kv_head <= n_head), no biases; the
//           output head is tied or not per preset (Llama 3.2 1B/3B tie, 8B does not).
//   mixture of experts (llama3 only, n_expert > 0): each block's MLP is
//           n_expert SwiGLU experts of width d_ff and a router (Mixtral, Switch):
//           a token goes to its expert_top_k most probable experts, their
//           outputs weighted by those probabilities (renormalised to sum 1 when
//           expert_normalize, as Mixtral; as they are otherwise, as Qwen-MoE).
//           router_aux_loss scales the Switch load-balancing loss
//           n_expert * sum_e f_e P_e (f_e: share of the routed slots expert e
//           got, P_e: its mean probability), added to the training objective;
//           router_z_loss scales ST-MoE's router z-loss, the mean over tokens
//           of logsumexp(router logits)^2 (keeps the logits small).
//           shared_expert_ff > 0 adds a shared expert (DeepSeekMoE, Qwen-MoE):
//           a SwiGLU MLP of that width every token goes through beside its
//           routed experts (DeepSeekMoE's n shared experts of width F are one
//           of width n F), its output added unweighted.
//           router_bias_update_rate > 0 balances the experts without a loss
//           (DeepSeek-V3's auxiliary-loss-free balancing): each block keeps
//           a bias per expert, added to the routing probabilities for the
//           top-k choice only (the weights stay the probabilities), and
//           after every optimizer step moves each bias by the rate towards
//           balance: + rate where the expert got fewer than the mean of the
//           step's routed slots, - rate where more (the trainer's, over
//           every rank's tokens). The biases are model state: checkpoints,
//           final weights and generation keep them.
//           expert_capacity_factor = c > 0 bounds each expert's slots in a
//           routing call of N tokens to ceil(c N k / E), the first come
//           kept and the rest dropped (nn/moe.h); 0: dropless.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ops/rope.h"

namespace zt::nn {

enum class Arch { gpt2, llama3 };
std::string_view arch_name(Arch a);
Arch parse_arch(std::string_view s);

struct ModelConfig {
  Arch arch = Arch::gpt2;
  int64_t vocab_size = 50257;     // real vocabulary (token ids < vocab_size)
  int64_t vocab_multiple = 128;   // embedding rows are padded up to a multiple of this
  int64_t n_layer = 12;
  int64_t d_model = 768;          // C
  int64_t n_head = 12;            // query heads
  int64_t n_kv_head = 12;         // key/value heads (GQA); == n_head for GPT-2
  int64_t d_ff = 3072;            // MLP hidden width (SwiGLU: width of gate and of up)
  int64_t max_seq_len = 1024;     // T_max: positions (GPT-2) / RoPE table length
  float norm_eps = 1e-5f;
  double rope_theta = 500000.0;   // llama3 only
  ops::RopeScaling rope_scaling;  // llama3 only
  bool tied_embeddings = true;    // lm_head shares wte
  float init_std = 0.02f;         // N(0, init_std); residual projections / sqrt(2 n_layer)
  int64_t n_expert = 0;           // E: experts per block's MLP (0: a dense MLP)
  int64_t expert_top_k = 2;       // k: experts each token is routed to (n_expert > 0)
  bool expert_normalize = true;   // the k routing weights divided by their sum
  float router_aux_loss = 0.01f;  // load-balancing loss coefficient (0: none)
  float router_z_loss = 0.0f;     // router z-loss coefficient (0: none; ST-MoE used 1e-3)
  int64_t shared_expert_ff = 0;   // Fs: the shared expert's hidden width (0: none; n_expert > 0)
  float router_bias_update_rate = 0.0f;  // per-step move of each expert's routing bias (0: none; DeepSeek-V3 1e-3)
  float expert_capacity_factor = 0.0f;   // c: an expert takes at most ceil(c N k / E) of N tokens' slots (0: dropless)

  int64_t head_dim() const { return d_model / n_head; }
  bool moe() const { return n_expert > 0; }
  bool shared_expert() const { return moe() && shared_expert_ff > 0; }
  int64_t padded_vocab() const { return (vocab_size + vocab_multiple - 1) / vocab_multiple * vocab_multiple; }
  bool has_bias() const { return arch == Arch::gpt2; }
  bool learned_positions() const { return arch == Arch::gpt2; }
  // Output width of the first MLP matmul (of each expert's, under MoE): d_ff
  // (GeLU) or 2 d_ff (SwiGLU gate|up).
  int64_t mlp_in_width() const { return arch == Arch::llama3 ? 2 * d_ff : d_ff; }
  // Output width of the fused q|k|v projection.
  int64_t qkv_width() const { return (n_head + 2 * n_kv_head) * head_dim(); }

  // Throws zt::Error naming the first inconsistent setting and the fix.
  void validate() const;

  // Parameter counts (real vocabulary rows, not padding).
  int64_t params_per_block() const;
  int64_t embedding_params() const;  // wte (+ wpe) (+ lm_head when untied)
  int64_t non_embedding_params() const;
  int64_t total_params() const { return embedding_params() + non_embedding_params(); }
  // Parameters of one block's MLP: the dense MLP's, or the router's, every
  // expert's and the shared expert's (params_per_block counts them in).
  int64_t mlp_params() const;
  // Of those, the ones a token's products use: all (dense), or the router's,
  // k experts' and the shared expert's (MoE).
  int64_t active_mlp_params() const;
  // Parameters a token's products use: the blocks and the LM head (tied or
  // not); lookup-only tables (wpe, and wte as input when untied) are not.
  // Under MoE a token uses the router and k of the E experts only (the
  // active parameters, which set the FLOPs).
  int64_t matmul_params() const;
  // Parameters a token uses, lookup tables included: matmul_params() and
  // the lookup-only embeddings (all of them for a dense model).
  int64_t active_params() const { return matmul_params() + embedding_params() - vocab_size * d_model; }
  // Training FLOPs per token at sequence length T: 6 N + 12 L d T (PaLM,
  // appendix B) with N = matmul_params(). Counting the LM head matters for
  // small models, where it is most of the work (nanoGPT and llm.c count it too).
  double train_flops_per_token(int64_t T) const;
};

// One line on a mixture-of-experts model's experts and routing (for logs
// and `zettatron info`): "" for a dense model.
std::string moe_summary(const ModelConfig& c);

// Named shapes: gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b, llama3-1b, llama3-3b,
// llama3-8b, and the tiny test models gpt2-tiny, llama3-tiny. Unknown names
// throw zt::Error listing the valid ones.
ModelConfig model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

}  // namespace zt::nn
