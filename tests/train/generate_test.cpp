// Sampling (train/generate.h): with the model's KV cache against
// recomputing each window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "nn/transformer.h"
#include "train/generate.h"

namespace zt::train {
namespace {

// Generation with the cache samples what recomputing each window samples -
// past the model's context too, where both run the last max_seq_len tokens
// again each step: the same tokens (the logits agree to rounding, far below
// what moves a sample).
TEST(Generate, WithTheKvCacheSamplesWhatRecomputingEachWindowSamples) {
  for (const char* preset : {"gpt2-tiny", "llama3-tiny"}) {
    SCOPED_TRACE(preset);
    nn::ModelConfig c = nn::model_preset(preset);
    c.max_seq_len = 16;
    nn::Transformer m(c, DType::f32);
    m.init_weights(13);
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
    nn::ModelConfig c = nn::model_preset(preset);
    c.max_seq_len = 16;
    nn::Transformer m(c, DType::f32);
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

}  // namespace
}  // namespace zt::train
