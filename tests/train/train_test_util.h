// Shared by the trainer tests (train/ and cuda/): the tiny training config,
// a BatchSource of uniformly random tokens and targets from a seeded
// generator, whose state (the generator's, as text) a checkpoint saves and
// restores, and one of a single fixed batch that a model can memorise.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>

#include "train/trainer.h"

namespace zt::train {

// gpt2-tiny, T = 16, 2 micro-batches of 2 per step, 5 steps, no data (tests
// pass a BatchSource). Change it with parse_config's overrides.
inline const char* kTiny = R"(
[model]
preset = "gpt2-tiny"
[data]
dir = "unused"
[train]
seq_len = 16
global_batch = 4
micro_batch = 2
steps = 5
[metrics]
peak_gflops = 1.0
)";

class RandomBatches : public BatchSource {
 public:
  RandomBatches(int64_t vocab, uint64_t seed) : vocab_(vocab), rng_(seed) {}
  void next(const Tensor& inputs, const Tensor& targets) override {
    std::uniform_int_distribution<int32_t> d(0, int32_t(vocab_ - 1));
    for (int64_t i = 0; i < inputs.numel(); ++i) {
      inputs.data<int32_t>()[i] = d(rng_);
      targets.data<int32_t>()[i] = d(rng_);
    }
  }
  void reset() override {}
  nlohmann::json state() const override {
    std::ostringstream os;
    os << rng_;
    return os.str();
  }
  void restore(const nlohmann::json& state) override {
    std::istringstream is(state.get<std::string>());
    is >> rng_;
  }

 private:
  int64_t vocab_;
  std::mt19937_64 rng_;
};

// The same (rows, T) batch every time, drawn once from `seed`: a model
// memorises it, so a run's loss falls fast (random targets cannot be learnt).
class FixedBatch : public BatchSource {
 public:
  FixedBatch(int64_t vocab, int64_t rows, int64_t T, uint64_t seed = 21)
      : tokens_(Tensor::empty(Shape{rows, T}, DType::i32)), targets_(Tensor::empty(Shape{rows, T}, DType::i32)) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
    for (int64_t i = 0; i < rows * T; ++i) tokens_.data<int32_t>()[i] = d(rng);
    for (int64_t i = 0; i < rows * T; ++i) targets_.data<int32_t>()[i] = d(rng);
  }
  void next(const Tensor& inputs, const Tensor& targets) override {
    ZT_CHECK(inputs.numel() == tokens_.numel(), "fixed batch: unexpected micro-batch shape");
    std::copy_n(tokens_.data<int32_t>(), tokens_.numel(), inputs.data<int32_t>());
    std::copy_n(targets_.data<int32_t>(), targets_.numel(), targets.data<int32_t>());
  }
  void reset() override {}

 private:
  Tensor tokens_, targets_;
};

}  // namespace zt::train
