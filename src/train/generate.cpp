#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "ops/device.h"

namespace zt::train {

std::vector<uint32_t> generate(nn::Transformer& model, const std::vector<uint32_t>& prompt,
                               const SamplingOptions& opt) {
  const LastLogitsFn last_logits = [&model](const Tensor& tokens) {
    Tensor logits = Tensor::empty(Shape{1, model.config().padded_vocab()}, DType::f32, model.device());
    model.last_logits(logits, tokens);  // the head on the last position alone
    return ops::to_device(logits, Device::cpu());
  };
  return generate(last_logits, model.config(), prompt, opt);
}

std::vector<uint32_t> generate(const LastLogitsFn& last_logits, const nn::ModelConfig& cfg,
                               const std::vector<uint32_t>& prompt, const SamplingOptions& opt) {
  ZT_CHECK(!prompt.empty(), "generate: the prompt must contain at least one token");
  ZT_CHECK(opt.temperature > 0, "generate: temperature must be positive");
  std::vector<uint32_t> seq = prompt;
  const int64_t V = cfg.vocab_size, Vp = cfg.padded_vocab();
  std::vector<int64_t> order(static_cast<size_t>(V));
  for (int64_t step = 0; step < opt.max_new_tokens; ++step) {
    const int64_t start = std::max<int64_t>(0, int64_t(seq.size()) - cfg.max_seq_len);
    const int64_t T = int64_t(seq.size()) - start;
    Tensor tokens = Tensor::empty(Shape{1, T}, DType::i32);
    for (int64_t t = 0; t < T; ++t) tokens.data<int32_t>()[t] = int32_t(seq[size_t(start + t)]);
    const Tensor last_row = last_logits(tokens);
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

}  // namespace zt::train
