// Autoregressive sampling from a Transformer (temperature, top-k).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "nn/transformer.h"

namespace zt::train {

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;
  int64_t top_k = 40;        // 0: sample from the whole vocabulary
  uint64_t seed = 0;         // sampling RNG (Philox stream)
  int64_t stop_token = -1;   // stop after emitting this token (-1: never)
};

// The logits of the last position of a (1, T) i32 token row: (padded
// vocabulary) f32 on the host.
using LastLogitsFn = std::function<Tensor(const Tensor& tokens)>;

// Returns prompt + generated tokens. Each token sees the last max_seq_len
// tokens before it. The model keeps their keys and values (nn/kv_cache.h):
// the prompt runs once, then each new token alone - until the sequence
// outgrows the context, after which every step runs the last max_seq_len
// tokens afresh (positions past the model's are not defined). Under tensor
// parallelism every rank of the group calls it and gets the same tokens.
std::vector<uint32_t> generate(nn::Transformer& model, const std::vector<uint32_t>& prompt,
                               const SamplingOptions& opt);
// The same over any forward pass, given each step's window - the last
// max_seq_len tokens - whole (a pipeline's, where each rank holds one stage:
// every rank calls it and gets the same tokens).
std::vector<uint32_t> generate(const LastLogitsFn& last_logits, const nn::ModelConfig& cfg,
                               const std::vector<uint32_t>& prompt, const SamplingOptions& opt);
// The model's last logits of each whole window, no cache kept (the second
// form above then runs every step's window again: for comparison).
LastLogitsFn window_last_logits(nn::Transformer& model);

}  // namespace zt::train
