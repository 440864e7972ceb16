// Autoregressive sampling from a Transformer (temperature, top-k).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "nn/transformer.h"

namespace zt::train {

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;  // 0: the most likely token (greedy; ties to the lowest id)
  int64_t top_k = 40;        // 0: sample from the whole vocabulary
  double top_p = 1.0;        // nucleus: of those, the most likely whose probabilities reach top_p (1: all)
  uint64_t seed = 0;         // sampling RNG (Philox stream)
  int64_t stop_token = -1;   // stop after emitting this token (-1: never)
};

// The token drawn from one position's logits (the first `vocab` of them) at
// `step` of the Philox stream of `seed`: the top_k most likely, of those the
// fewest most likely whose probabilities (softmax at the temperature, f64)
// sum to top_p of theirs, one drawn in proportion to its probability.
int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& opt, uint64_t seed, int64_t step);

// The logits of each sequence's last position of (B, T) i32 tokens:
// (B, padded vocabulary) f32 on the host (generate passes B = 1).
using LastLogitsFn = std::function<Tensor(const Tensor& tokens)>;

// The logits of each sequence's last position of tokens (B, T) i32 that
// continue the sequences fed since the last restart (restart: from an empty
// cache), as (B, padded vocabulary) f32 on the host: a model's or a
// pipeline's forward over its KV caches.
using DecodeFn = std::function<Tensor(const Tensor& tokens, bool restart)>;

// Called with each token a sample draws as it is drawn (up to and with its
// stop token): sample index, token.
using TokenFn = std::function<void(int64_t sample, uint32_t token)>;

// Returns prompt + generated tokens. Each token sees the last max_seq_len
// tokens before it. The model keeps their keys and values (nn/kv_cache.h):
// the prompt runs once, then each new token alone - until the sequence
// outgrows the context, after which every step runs the last max_seq_len
// tokens afresh (positions past the model's are not defined). Under tensor
// parallelism every rank of the group calls it and gets the same tokens.
std::vector<uint32_t> generate(nn::Transformer& model, const std::vector<uint32_t>& prompt,
                               const SamplingOptions& opt);
// `count` samples of the prompt at once (one cache of count sequences, the
// products over count rows): sample i is drawn with seed opt.seed + i and
// ends at its own stop token - the tokens `count` calls of generate() with
// those seeds give, to rounding.
std::vector<std::vector<uint32_t>> generate_samples(nn::Transformer& model, const std::vector<uint32_t>& prompt,
                                                    const SamplingOptions& opt, int64_t count,
                                                    const TokenFn& on_token = {});
// The positions a KV cache for sampling `prompt` needs: those the steps run
// (prompt and the tokens drawn but the last), at most max_seq_len.
int64_t kv_cache_positions(const nn::ModelConfig& cfg, const std::vector<uint32_t>& prompt,
                           const SamplingOptions& opt);
// The same over any cached forward of `count` sequences (a pipeline's,
// where each rank holds its stages' caches: every rank calls it and gets the
// same tokens).
std::vector<std::vector<uint32_t>> generate_samples(const DecodeFn& decode, const nn::ModelConfig& cfg,
                                                    const std::vector<uint32_t>& prompt, const SamplingOptions& opt,
                                                    int64_t count, const TokenFn& on_token = {});
// The same over any forward pass, given each step's window - the last
// max_seq_len tokens - whole, no cache (for comparison; a pipeline's too).
std::vector<uint32_t> generate(const LastLogitsFn& last_logits, const nn::ModelConfig& cfg,
                               const std::vector<uint32_t>& prompt, const SamplingOptions& opt);
// The model's last logits of each whole window, no cache kept (the second
// form above then runs every step's window again: for comparison).
LastLogitsFn window_last_logits(nn::Transformer& model);

}  // namespace zt::train
