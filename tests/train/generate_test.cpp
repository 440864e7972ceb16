// Sampling (train/generate.h): with the model's KV cache against
// recomputing each window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "nn/transformer.h"
#include "train/generate.h"

namespace zt::train {
namespace {

// A tiny preset with a 16-position context, which the tests' samplings outgrow.
nn::ModelConfig short_context(const char* preset) {
  nn::ModelConfig c = nn::model_preset(preset);
  c.max_seq_len = 16;
  return c;
}

// Generation with the cache samples what recomputing each window samples -
// past the model's context too, where both run the last max_seq_len tokens
// again each step: the same tokens (the logits agree to rounding, far below
// what moves a sample).
TEST(Generate, WithTheKvCacheSamplesWhatRecomputingEachWindowSamples) {
  for (const char* preset : {"gpt2-tiny", "llama3-tiny"}) {
    SCOPED_TRACE(preset);
    nn::Transformer m(short_context(preset), DType::f32);
    m.init_weights(13);
    const nn::ModelConfig& c = m.config();
    const std::vector<uint32_t> prompt = {3, 1, 4, 1, 5};
    SamplingOptions opt;
    opt.max_new_tokens = 30;  // 35 tokens: past the 16 positions
    opt.temperature = 1.0;
    opt.top_k = 0;
    opt.seed = 17;
    const auto cached = generate(m, prompt, opt);
    const auto recomputed = generate(
        [&](const Tensor& window) {
          EXPECT_LE(window.size(1), c.max_seq_len);
          Tensor logits = Tensor::empty(Shape{1, c.padded_vocab()}, DType::f32);
          m.last_logits(logits, window);
          return logits;
        },
        c, prompt, opt);
    ASSERT_EQ(cached.size(), prompt.size() + 30);
    EXPECT_EQ(cached, recomputed);
  }
}

// Several samples drawn together (one cache of that many sequences, the
// products over that many rows) are the samples drawn one at a time with
// seeds seed, seed + 1, ...: past the context, and each ending at its own
// stop token while the others go on.
TEST(Generate, SamplesDrawnTogetherAreThoseDrawnOneAtATime) {
  for (const char* preset : {"gpt2-tiny", "llama3-tiny"}) {
    SCOPED_TRACE(preset);
    nn::Transformer m(short_context(preset), DType::f32);
    m.init_weights(13);
    const std::vector<uint32_t> prompt = {2, 7, 1, 8};
    SamplingOptions opt;
    opt.max_new_tokens = 24;
    opt.top_k = 0;
    opt.seed = 40;
    // No stop token, then as stop token the third token sample 0 drew: it
    // ends there, the others go on (or end where they draw it).
    int64_t stop = -1;
    size_t first_stop = 0;
    for (int pass = 0; pass < 2; ++pass) {
      opt.stop_token = stop;
      const auto together = generate_samples(m, prompt, opt, 5);
      ASSERT_EQ(together.size(), 5u);
      for (int64_t i = 0; i < 5; ++i) {
        SamplingOptions one = opt;
        one.seed = opt.seed + uint64_t(i);
        EXPECT_EQ(together[size_t(i)], generate(m, prompt, one)) << "sample " << i << ", stop token " << stop;
      }
      if (pass == 0) {
        for (const auto& s : together) EXPECT_EQ(s.size(), prompt.size() + 24);
        stop = together[0][prompt.size() + 2];
        // Where sample 0 draws it first (its third token or before).
        first_stop = size_t(std::find(together[0].begin() + std::ptrdiff_t(prompt.size()), together[0].end(),
                                      uint32_t(stop)) - together[0].begin());
      } else {
        EXPECT_EQ(together[0].size(), first_stop + 1) << "sample 0 ends at the stop token";
      }
    }
  }
}

// The KV cache holds the positions a sampling runs (prompt, and the tokens
// drawn but the last), at most the model's context: a short sampling from a
// long-context model sizes it small, and runs in it.
TEST(Generate, SizesItsKvCacheToTheTokensItRuns) {
  nn::ModelConfig c = nn::model_preset("llama3-tiny");  // 64 positions
  const std::vector<uint32_t> prompt = {2, 7, 1, 8};
  SamplingOptions opt;
  opt.max_new_tokens = 5;
  EXPECT_EQ(kv_cache_positions(c, prompt, opt), 8);
  opt.max_new_tokens = 0;
  EXPECT_EQ(kv_cache_positions(c, prompt, opt), 4);
  opt.max_new_tokens = 100;
  EXPECT_EQ(kv_cache_positions(c, prompt, opt), 64);
  opt.max_new_tokens = 5;
  opt.top_k = 0;
  nn::Transformer m(c, DType::f32);
  m.init_weights(3);
  const auto cached = generate(m, prompt, opt);
  EXPECT_EQ(cached.size(), prompt.size() + 5);
  EXPECT_EQ(cached, generate(window_last_logits(m), c, prompt, opt));
}

// One position's draw: greedy at temperature 0 (ties to the lowest id);
// else the top k, then the nucleus - the fewest most likely whose
// probabilities reach top_p of theirs - each drawn in proportion to its
// probability (4000 draws, different seeds).
TEST(Generate, SampleTokenKeepsTheTopKThenTheNucleus) {
  const std::vector<double> probs = {0.4, 0.25, 0.15, 0.1, 0.06, 0.04};
  std::vector<float> logits;
  for (double p : probs) logits.push_back(float(std::log(p)) + 3.0f);  // softmax is shift-invariant
  const int64_t V = int64_t(logits.size());
  // The share of 4000 draws that are each token.
  auto shares = [&](const SamplingOptions& opt) {
    std::vector<double> n(size_t(V), 0.0);
    for (uint64_t seed = 0; seed < 4000; ++seed) n[size_t(sample_token(logits.data(), V, opt, seed, 5))] += 1.0 / 4000;
    return n;
  };
  // Each kept token's share within 0.03 (5 standard deviations) of its
  // probability renormalised over the kept ones; the others never drawn.
  auto expect_shares = [&](const SamplingOptions& opt, size_t kept) {
    const std::vector<double> got = shares(opt);
    double total = 0;
    for (size_t i = 0; i < kept; ++i) total += probs[i];
    for (size_t i = 0; i < size_t(V); ++i)
      EXPECT_NEAR(got[i], i < kept ? probs[i] / total : 0.0, i < kept ? 0.03 : 0.0)
          << "token " << i << " (top_k " << opt.top_k << ", top_p " << opt.top_p << ")";
  };
  SamplingOptions opt;
  opt.top_k = 0;
  expect_shares(opt, 6);
  opt.top_k = 3;
  expect_shares(opt, 3);
  opt.top_k = 0;
  opt.top_p = 0.6;  // 0.4 < 0.6 <= 0.65
  expect_shares(opt, 2);
  opt.top_p = 0.3;  // the most likely alone
  expect_shares(opt, 1);
  opt.top_k = 3;
  opt.top_p = 0.8;  // of the top 3 (0.8): 0.5, then 0.8125 >= 0.8
  expect_shares(opt, 2);
  opt.temperature = 0;
  opt.top_p = 1;
  EXPECT_EQ(sample_token(logits.data(), V, opt, 1, 0), 0);
  logits[3] = logits[0];  // a tie: the lower id
  EXPECT_EQ(sample_token(logits.data(), V, opt, 2, 0), 0);
  logits[0] -= 1.0f;
  EXPECT_EQ(sample_token(logits.data(), V, opt, 3, 0), 3);
}

// Greedy generation (temperature 0): at each step the most likely token of
// the whole sequence's last logits, whatever the seed.
TEST(Generate, GreedyTakesTheMostLikelyTokenEachStep) {
  const nn::ModelConfig c = nn::model_preset("gpt2-tiny");
  nn::Transformer m(c, DType::f32);
  m.init_weights(21);
  std::vector<uint32_t> want = {9, 4, 6};
  const size_t prompt = want.size();
  for (int step = 0; step < 10; ++step) {
    Tensor tokens = Tensor::empty(Shape{1, int64_t(want.size())}, DType::i32);
    for (size_t t = 0; t < want.size(); ++t) tokens.data<int32_t>()[t] = int32_t(want[t]);
    Tensor logits = Tensor::empty(Shape{1, c.padded_vocab()}, DType::f32);
    m.last_logits(logits, tokens);
    const float* l = logits.data<float>();
    want.push_back(uint32_t(std::max_element(l, l + c.vocab_size) - l));
  }
  SamplingOptions opt;
  opt.max_new_tokens = 10;
  opt.temperature = 0;
  for (uint64_t seed : {1, 99}) {
    opt.seed = seed;
    EXPECT_EQ(generate(m, std::vector<uint32_t>(want.begin(), want.begin() + std::ptrdiff_t(prompt)), opt), want);
  }
}

}  // namespace
}  // namespace zt::train
