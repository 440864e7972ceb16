// Sampling (train/generate.h): with the model's KV cache against
// recomputing each window.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace zt::train
