// Hugging Face checkpoints of GPT-2 (GPT2LMHeadModel), Llama 3
// (LlamaForCausalLM) and Mixtral (MixtralForCausalLM) to and from
// Zettatron's parameter tensors.
//
// An HF directory holds config.json and either model.safetensors or
// model.safetensors.index.json ({"metadata": {"total_size": N},
// "weight_map": {hf_name: file}}) with shards model-0000i-of-0000K.safetensors.
//
// What the conversion changes (Zettatron names on the left, HF on the right):
//   gpt2   embed.wte (Vp, C)          wte.weight (V, C)          first V rows
//          embed.wpe (T_max, C)       wpe.weight
//          layers.i.attn.qkv.weight   h.i.attn.c_attn.weight     transposed: HF
//          (3C, C) rows q|k|v         (C, 3C) columns q|k|v      Conv1D is (in, out)
//          attn.proj / mlp.in /       attn.c_proj / mlp.c_fc /   transposed
//          mlp.out weights            mlp.c_proj weights
//          norms, biases              ln_1, ln_2, ln_f, *.bias   unchanged
//          (all HF names optionally prefixed "transformer.", as
//          GPT2LMHeadModel.save_pretrained writes them)
//   llama  attn.qkv.weight rows       q_proj | k_proj | v_proj   q and k rows permuted
//          q | k | v                                             per head (RoPE layout)
//          mlp.in.weight rows         gate_proj | up_proj
//          gate | up
//   mixtral (llama blocks with n_expert experts; MixtralForCausalLM)
//          mlp.router.weight (E, C)   block_sparse_moe.gate.weight
//          mlp.experts.in.weight      block_sparse_moe.experts.e.w1 | w3
//          (E, 2F, C) [e] = gate | up (each (F, C))
//          mlp.experts.out.weight     block_sparse_moe.experts.e.w2 (C, F)
//          (E, C, F) [e]
//          attention, norms and the head as llama; routing weights are the
//          top k renormalised (expert_normalize), no sliding window.
// RoPE: Zettatron rotates interleaved pairs (2i, 2i+1) (Meta's layout), HF
// Llama rotates (i, i + D/2) ("rotate_half"). Within each head of D rows:
//   hf row j = meta row 2j, hf row D/2 + j = meta row 2j + 1   (j < D/2)
// which leaves every q.k dot product unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "nn/model_config.h"

namespace zt::train {

struct HfModel {
  nn::ModelConfig config;
  // Zettatron names and shapes (vocabulary rows padded to padded_vocab() with
  // zeros), CPU, f32 (exact from the file's F32/BF16/F16), in model order.
  std::vector<std::pair<std::string, Tensor>> tensors;
  // What write_hf_model needs to reproduce the directory byte for byte (see
  // hf_format.cpp for the fields); a JSON object, so it fits a manifest.
  nlohmann::json layout;
};

// Reads DIR/config.json and DIR/model.safetensors (or the index and its
// shards). Strict: a missing or unexpected tensor, a wrong shape, a dtype
// other than F32/BF16/F16 or a config we cannot represent is a zt::Error that
// names it. Known non-parameter buffers (GPT-2 h.i.attn.bias and
// h.i.attn.masked_bias, Llama rotary_emb.inv_freq) are skipped; the layout
// records how to regenerate them.
HfModel read_hf_model(const std::string& dir);

// Used only when the layout is null (a layout fixes dtypes and files).
struct HfExportOptions {
  DType dtype = DType::f32;     // f32, bf16 or f16
  int64_t max_shard_bytes = 0;  // 0: one file; else shards as save_pretrained cuts them
};

// Writes `tensors` (Zettatron names and shapes, any float dtype, any device)
// as an HF directory into out_dir, which must not exist or be empty.
//   layout null:  config.json (sorted keys, indent 2), safetensors in Python's
//                 layout with metadata {"format": "pt"}, sharded per opt.
//   layout from read_hf_model (cfg must describe the same model): the same
//                 files, names, dtypes, tensor order, metadata and the
//                 original config.json / index text, so an unchanged model
//                 is written back byte for byte.
void write_hf_model(const std::string& out_dir, const nn::ModelConfig& cfg,
                    const std::vector<std::pair<std::string, Tensor>>& tensors, const nlohmann::json& layout,
                    const HfExportOptions& opt = {});

// The ModelConfig an HF config.json describes (`where` names it in errors).
nn::ModelConfig config_from_hf(const nlohmann::json& j, const std::string& where);
// The config.json save_pretrained would write for cfg with weights in dtype.
nlohmann::json hf_config(const nn::ModelConfig& cfg, DType dtype);

}  // namespace zt::train
