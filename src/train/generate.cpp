#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "ops/device.h"

namespace zt::train {
namespace {

// The logits of each sequence's last position given the tokens before it:
// (sequences, padded vocabulary) f32 on the host. The sequences are of one
// length.
using NextLogitsFn = std::function<Tensor(const std::vector<std::vector<uint32_t>>& seqs)>;

// Tokens [first, end) of each sequence as a (B, T) i32 tensor on the host.
Tensor token_rows(const std::vector<std::vector<uint32_t>>& seqs, size_t first) {
  const int64_t B = int64_t(seqs.size()), T = int64_t(seqs.front().size() - first);
  Tensor tokens = Tensor::empty(Shape{B, T}, DType::i32);
  int32_t* out = tokens.data<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) out[b * T + t] = int32_t(seqs[size_t(b)][first + size_t(t)]);
  return tokens;
}

// The window each step sees: the last max_seq_len tokens of a sequence of n.
size_t window_start(size_t n, const nn::ModelConfig& cfg) {
  return n > size_t(cfg.max_seq_len) ? n - size_t(cfg.max_seq_len) : 0;
}

// sample_token with scratch for the vocabulary's order (V entries).
int64_t pick_token(const float* logits, int64_t V, const SamplingOptions& opt, uint64_t seed, int64_t step,
                   std::vector<int64_t>& order) {
  auto before = [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (opt.temperature == 0) {  // greedy
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (before(v, best)) best = v;
    return best;
  }
  order.resize(size_t(V));
  std::iota(order.begin(), order.end(), 0);
  const int64_t k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
  std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
  const double max_logit = logits[order[0]];
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0;
  for (int64_t i = 0; i < k; ++i) sum += p[size_t(i)] = std::exp((logits[order[size_t(i)]] - max_logit) / opt.temperature);
  // Nucleus: the fewest most likely whose share reaches top_p.
  int64_t kept = k;
  if (opt.top_p < 1) {
    double acc = 0;
    for (int64_t i = 0; i < k; ++i) {
      acc += p[size_t(i)];
      if (acc >= opt.top_p * sum) {
        kept = i + 1;
        sum = acc;
        break;
      }
    }
  }
  const double u = double(philox_uniform_at(seed, 0, uint64_t(step))) * sum;
  double acc = 0;
  for (int64_t i = 0; i < kept; ++i) {
    acc += p[size_t(i)];
    if (u < acc) return order[size_t(i)];
  }
  return order[size_t(kept - 1)];
}

// `count` samples of the prompt, sample i drawn with seed opt.seed + i. The
// sequences advance together: one that stopped goes on being fed (so all
// stay of one length) but its tokens after the stop are dropped.
std::vector<std::vector<uint32_t>> sample(const NextLogitsFn& next_logits, const nn::ModelConfig& cfg,
                                          const std::vector<uint32_t>& prompt, const SamplingOptions& opt,
                                          int64_t count, const TokenFn& on_token = {}) {
  ZT_CHECK(!prompt.empty(), "generate: the prompt must contain at least one token");
  ZT_CHECK(opt.temperature >= 0 && std::isfinite(opt.temperature), "generate: temperature must be >= 0 (0: greedy), got ",
           opt.temperature);
  ZT_CHECK(opt.top_p > 0 && opt.top_p <= 1, "generate: top_p must be in (0, 1], got ", opt.top_p);
  ZT_CHECK(count >= 1, "generate: count must be at least 1, got ", count);
  std::vector<std::vector<uint32_t>> seqs(size_t(count), prompt);
  std::vector<size_t> ends(size_t(count), 0);  // 0: not stopped; else the length up to the stop token
  const int64_t V = cfg.vocab_size, Vp = cfg.padded_vocab();
  std::vector<int64_t> order;
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    const Tensor logits = next_logits(seqs);
    ZT_CHECK(logits.numel() == count * Vp && logits.dtype() == DType::f32 && logits.device().is_cpu(),
             "generate: the logits function must return the last position's ", Vp, " f32 logits of each of ", count,
             " sequences on the host, got ", logits.str());
    bool all_stopped = true;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t pick = pick_token(logits.data<float>() + i * Vp, V, opt, opt.seed + uint64_t(i), step, order);
      std::vector<uint32_t>& seq = seqs[size_t(i)];
      seq.push_back(uint32_t(pick));
      if (ends[size_t(i)] != 0) continue;  // stopped: fed on, not reported
      if (on_token) on_token(i, uint32_t(pick));
      if (opt.stop_token >= 0 && pick == opt.stop_token) ends[size_t(i)] = seq.size();
      all_stopped = all_stopped && ends[size_t(i)] != 0;
    }
    if (all_stopped) break;
  }
  for (int64_t i = 0; i < count; ++i)
    if (ends[size_t(i)] != 0) seqs[size_t(i)].resize(ends[size_t(i)]);
  return seqs;
}

}  // namespace

int64_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& opt, uint64_t seed, int64_t step) {
  std::vector<int64_t> order;
  return pick_token(logits, vocab, opt, seed, step, order);
}

int64_t kv_cache_positions(const nn::ModelConfig& cfg, const std::vector<uint32_t>& prompt,
                           const SamplingOptions& opt) {
  // The last token drawn never runs: prompt + max_new_tokens - 1 positions.
  const int64_t needed = int64_t(prompt.size()) + std::max<int64_t>(opt.max_new_tokens - 1, 0);
  return std::clamp<int64_t>(needed, 1, cfg.max_seq_len);
}

std::vector<std::vector<uint32_t>> generate_samples(const DecodeFn& decode, const nn::ModelConfig& cfg,
                                                    const std::vector<uint32_t>& prompt, const SamplingOptions& opt,
                                                    int64_t count, const TokenFn& on_token) {
  // The caches hold each sequence's first `cached` tokens (0: none, or a
  // window past its first). While they hold all but the last and it fits,
  // the last token alone runs; else the window runs from empty caches.
  size_t cached = 0;
  const NextLogitsFn next_logits = [&](const std::vector<std::vector<uint32_t>>& seqs) {
    const size_t n = seqs.front().size();
    if (cached > 0 && cached + 1 == n && n <= size_t(cfg.max_seq_len)) {
      cached = n;
      return decode(token_rows(seqs, n - 1), false);
    }
    const size_t first = window_start(n, cfg);
    cached = first == 0 ? n : 0;
    return decode(token_rows(seqs, first), true);
  };
  return sample(next_logits, cfg, prompt, opt, count, on_token);
}

std::vector<std::vector<uint32_t>> generate_samples(nn::Transformer& model, const std::vector<uint32_t>& prompt,
                                                    const SamplingOptions& opt, int64_t count,
                                                    const TokenFn& on_token) {
  ZT_CHECK(count >= 1, "generate: count must be at least 1, got ", count);
  nn::KvCache cache = model.make_kv_cache(count, kv_cache_positions(model.config(), prompt, opt));
  Tensor logits = Tensor::empty(Shape{count, model.config().padded_vocab()}, DType::f32, model.device());
  const DecodeFn decode = [&](const Tensor& tokens, bool restart) {
    if (restart) cache.clear();
    model.last_logits(logits, tokens, cache);
    return ops::to_device(logits, Device::cpu());
  };
  return generate_samples(decode, model.config(), prompt, opt, count, on_token);
}

std::vector<uint32_t> generate(nn::Transformer& model, const std::vector<uint32_t>& prompt,
                               const SamplingOptions& opt) {
  return generate_samples(model, prompt, opt, 1).front();
}

LastLogitsFn window_last_logits(nn::Transformer& model) {
  return [&model](const Tensor& tokens) {
    Tensor logits = Tensor::empty(Shape{tokens.size(0), model.config().padded_vocab()}, DType::f32, model.device());
    model.last_logits(logits, tokens);  // the head on the last position alone
    return ops::to_device(logits, Device::cpu());
  };
}

std::vector<uint32_t> generate(const LastLogitsFn& last_logits, const nn::ModelConfig& cfg,
                               const std::vector<uint32_t>& prompt, const SamplingOptions& opt) {
  const NextLogitsFn next_logits = [&](const std::vector<std::vector<uint32_t>>& seqs) {
    return last_logits(token_rows(seqs, window_start(seqs.front().size(), cfg)));
  };
  return sample(next_logits, cfg, prompt, opt, 1).front();
}

}  // namespace zt::train
