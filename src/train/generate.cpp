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

// The logits of the last position of `seq` given the tokens before it:
// (padded vocabulary) f32 on the host.
using NextLogitsFn = std::function<Tensor(const std::vector<uint32_t>& seq)>;

// tokens[first, end) of seq as a (1, T) i32 row on the host.
Tensor token_row(const std::vector<uint32_t>& seq, size_t first) {
  const int64_t T = int64_t(seq.size() - first);
  Tensor tokens = Tensor::empty(Shape{1, T}, DType::i32);
  for (int64_t t = 0; t < T; ++t) tokens.data<int32_t>()[t] = int32_t(seq[first + size_t(t)]);
  return tokens;
}

// The window of seq each step sees: its last max_seq_len tokens.
size_t window_start(const std::vector<uint32_t>& seq, const nn::ModelConfig& cfg) {
  return seq.size() > size_t(cfg.max_seq_len) ? seq.size() - size_t(cfg.max_seq_len) : 0;
}

std::vector<uint32_t> sample(const NextLogitsFn& next_logits, const nn::ModelConfig& cfg,
                             const std::vector<uint32_t>& prompt, const SamplingOptions& opt) {
  ZT_CHECK(!prompt.empty(), "generate: the prompt must contain at least one token");
  ZT_CHECK(opt.temperature > 0, "generate: temperature must be positive");
  std::vector<uint32_t> seq = prompt;
  const int64_t V = cfg.vocab_size, Vp = cfg.padded_vocab();
  std::vector<int64_t> order(static_cast<size_t>(V));
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    const Tensor last_row = next_logits(seq);
    ZT_CHECK(last_row.numel() == Vp && last_row.dtype() == DType::f32 && last_row.device().is_cpu(),
             "generate: the logits function must return the last position's ", Vp, " f32 logits on the host, got ",
             last_row.str());
    const float* last = last_row.data<float>();
    // Top-k over the real vocabulary, then softmax with temperature (f64).
    std::iota(order.begin(), order.end(), 0);
    const int64_t k = opt.top_k > 0 ? std::min(opt.top_k, V) : V;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t a, int64_t b) { return last[a] > last[b] || (last[a] == last[b] && a < b); });
    const double max_logit = last[order[0]];
    std::vector<double> p(static_cast<size_t>(k));
    double sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += p[size_t(i)] = std::exp((last[order[size_t(i)]] - max_logit) / opt.temperature);
    const double u = double(philox_uniform_at(opt.seed, 0, uint64_t(step))) * sum;
    double acc = 0;
    int64_t pick = order[size_t(k - 1)];
    for (int64_t i = 0; i < k; ++i) {
      acc += p[size_t(i)];
      if (u < acc) {
        pick = order[size_t(i)];
        break;
      }
    }
    seq.push_back(uint32_t(pick));
    if (opt.stop_token >= 0 && pick == opt.stop_token) break;
  }
  return seq;
}

}  // namespace

std::vector<uint32_t> generate(nn::Transformer& model, const std::vector<uint32_t>& prompt,
                               const SamplingOptions& opt) {
  const nn::ModelConfig& cfg = model.config();
  nn::KvCache cache = model.make_kv_cache(1);
  Tensor logits = Tensor::empty(Shape{1, cfg.padded_vocab()}, DType::f32, model.device());
  const NextLogitsFn next_logits = [&](const std::vector<uint32_t>& seq) {
    // The cache holds seq but its last token while that fits; else the
    // window runs again from an empty cache.
    size_t first = cache.length();
    if (first + 1 != seq.size() || first >= size_t(cache.capacity())) {
      cache.clear();
      first = window_start(seq, cfg);
    }
    model.last_logits(logits, token_row(seq, first), cache);
    return ops::to_device(logits, Device::cpu());
  };
  return sample(next_logits, cfg, prompt, opt);
}

LastLogitsFn window_last_logits(nn::Transformer& model) {
  return [&model](const Tensor& tokens) {
    Tensor logits = Tensor::empty(Shape{1, model.config().padded_vocab()}, DType::f32, model.device());
    model.last_logits(logits, tokens);  // the head on the last position alone
    return ops::to_device(logits, Device::cpu());
  };
}

std::vector<uint32_t> generate(const LastLogitsFn& last_logits, const nn::ModelConfig& cfg,
                               const std::vector<uint32_t>& prompt, const SamplingOptions& opt) {
  return sample([&](const std::vector<uint32_t>& seq) { return last_logits(token_row(seq, window_start(seq, cfg))); },
                cfg, prompt, opt);
}

}  // namespace zt::train
