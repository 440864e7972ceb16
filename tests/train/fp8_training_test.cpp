// Training with fp8 blocks (train.fp8): a model memorising a fixed batch
// learns as the same model in bf16 does - both fall below a third of their
// first loss in 40 steps, and fp8's losses stay within 10% of bf16's (per
// step, after the first 5) - and a GPU config takes fp8 (its products run
// on the fp8 tensor cores: tests/cuda/fp8_test.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "test_util.h"
#include "train/config.h"
#include "train/train_test_util.h"
#include "train/trainer.h"

namespace zt::train {
namespace {

std::vector<double> losses(bool fp8) {
  const Config cfg = parse_config(kTiny, "fp8 test",
                                  {"model.preset=llama3-tiny", "train.dtype=bf16", "train.steps=40", "optim.lr=3e-3",
                                   "optim.warmup_steps=2", std::string("train.fp8=") + (fp8 ? "true" : "false")});
  Trainer t(cfg, std::make_unique<FixedBatch>(cfg.model.vocab_size, cfg.train.micro_batch, cfg.train.seq_len), nullptr,
            nullptr);
  std::vector<double> out;
  for (int64_t s = 0; s < cfg.train.steps; ++s) out.push_back(t.train_step(s).loss);
  return out;
}

TEST(Fp8Training, LearnsAsBf16Does) {
  const std::vector<double> bf16 = losses(false), fp8 = losses(true);
  EXPECT_LT(bf16.back(), bf16.front() / 3);
  EXPECT_LT(fp8.back(), fp8.front() / 3);
  EXPECT_NE(fp8.back(), bf16.back()) << "fp8 products ran";
  for (size_t s = 5; s < bf16.size(); ++s) EXPECT_NEAR(fp8[s] / bf16[s], 1.0, 0.1) << "step " << s + 1;
  RecordProperty("final_loss_bf16", std::to_string(bf16.back()));
  RecordProperty("final_loss_fp8", std::to_string(fp8.back()));
}

TEST(Fp8Training, AGpuConfigTakesIt) {
  // The GPU runs the fp8 products on its tensor cores (backend/cuda/fp8.cu);
  // the config no longer refuses it (parsing needs no GPU).
  const Config cfg = parse_config(kTiny, "fp8 test", {"train.fp8=true", "train.device=cuda"});
  EXPECT_TRUE(cfg.train.fp8);
}

}  // namespace
}  // namespace zt::train
