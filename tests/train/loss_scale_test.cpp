// Dynamic loss scaling: the scaler's back-off and growth, the trainer
// skipping exactly the step whose gradients overflow (weights and optimizer
// state untouched, the scale halved), scaled training equal bit for bit to
// unscaled training when nothing overflows (powers of two are exact), the
// state surviving a checkpoint, and bad settings named.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "ops/elementwise.h"
#include "optim/loss_scale.h"
#include "test_util.h"
#include "train/checkpointing.h"
#include "train/config.h"
#include "train/trainer.h"
#include "train/train_test_util.h"

namespace zt::train {
namespace {

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterAWindow) {
  optim::LossScaleConfig c;
  c.init = 1024;
  c.window = 3;
  const optim::LossScaler s(c);
  optim::LossScaleState st = s.initial();
  EXPECT_EQ(st.scale, 1024);
  s.update(st, true);
  EXPECT_EQ(st.scale, 512);
  s.update(st, false);
  s.update(st, false);
  EXPECT_EQ(st.scale, 512);
  s.update(st, true);  // an overflow restarts the window
  EXPECT_EQ(st.scale, 256);
  for (int i = 0; i < 3; ++i) s.update(st, false);
  EXPECT_EQ(st.scale, 512);
  EXPECT_EQ(st.good_steps, 0);
  c.init = c.max_scale;  // growth stops at the largest scale
  const optim::LossScaler top(c);
  optim::LossScaleState t = top.initial();
  for (int i = 0; i < 3; ++i) top.update(t, false);
  EXPECT_EQ(t.scale, c.max_scale);
  for (int i = 0; i < 40; ++i) top.update(t, true);  // below one is allowed: gradients scaled down
  EXPECT_EQ(t.scale, std::ldexp(1.0, 24 - 40));
}

TEST(LossScaler, BadSettingsAreNamed) {
  optim::LossScaleConfig c;
  c.init = 1000;
  EXPECT_NE(test::error_of([&] { optim::LossScaler s(c); }).find("power of two"), std::string::npos);
  c.init = 1024;
  c.window = 0;
  EXPECT_NE(test::error_of([&] { optim::LossScaler s(c); }).find("loss_scale_window"), std::string::npos);
  optim::LossScaler ok(optim::LossScaleConfig{});
  EXPECT_NE(test::error_of([&] { ok.check({3.0, 0}); }).find("damaged"), std::string::npos);
  EXPECT_NE(test::error_of([&] { ok.check({0.0, 0}); }).find("damaged"), std::string::npos);
}

// kTiny with 8 steps, a warm-up and a learning rate that moves the weights.
Config tiny(std::vector<std::string> settings) {
  settings.insert(settings.begin(), {"train.steps=8", "optim.lr=3e-3", "optim.warmup_steps=2"});
  return parse_config(kTiny, "tiny", settings);
}

std::map<std::string, std::vector<float>> weights_of(Trainer& t) {
  std::map<std::string, std::vector<float>> w;
  for (const nn::ParamSet* set : t.param_sets())
    for (size_t i = 0; i < set->size(); ++i) {
      const Tensor p = set->param(i);
      w[set->spec(i).name].assign(p.data<float>(), p.data<float>() + p.numel());
    }
  return w;
}

// Training with dynamic loss scaling and an overflow injected into step
// `poison` (0-based; -1: none). Returns every step's metrics, and the
// weights after each step.
struct ScaledRun {
  std::vector<StepMetrics> steps;
  std::vector<std::map<std::string, std::vector<float>>> weights;
};
ScaledRun train(const std::vector<std::string>& settings, int64_t poison) {
  const Config cfg = tiny(settings);
  Trainer t(cfg, std::make_unique<RandomBatches>(cfg.model.vocab_size, 7), nullptr, nullptr);
  t.before_update = [&](int64_t step) {
    if (step == poison) ops::fill(t.model().grad("layers.1.attn.proj.weight").slice(0, 1), INFINITY);
  };
  ScaledRun r;
  for (int64_t s = 0; s < cfg.train.steps; ++s) {
    r.steps.push_back(t.train_step(s));
    r.weights.push_back(weights_of(t));
  }
  return r;
}

TEST(LossScaling, AnOverflowSkipsExactlyThatStepAndHalvesTheScale) {
  const std::vector<std::string> dynamic = {"train.loss_scale=dynamic", "train.loss_scale_init=1024",
                                            "train.loss_scale_window=3"};
  const ScaledRun plain = train({}, -1);
  const ScaledRun scaled = train(dynamic, -1);
  const ScaledRun hit = train(dynamic, 3);
  // No overflow: scaling by powers of two changes no bit of training.
  for (size_t s = 0; s < plain.steps.size(); ++s) {
    EXPECT_EQ(scaled.steps[s].loss, plain.steps[s].loss) << "step " << s + 1;
    EXPECT_EQ(scaled.steps[s].grad_norm, plain.steps[s].grad_norm) << "step " << s + 1;
    EXPECT_EQ(scaled.weights[s], plain.weights[s]) << "step " << s + 1;
    EXPECT_FALSE(scaled.steps[s].skipped);
    EXPECT_EQ(plain.steps[s].loss_scale, 0.0) << "scaling is off by default for f32";
  }
  // The scale: 1024 for 3 good steps, then 2048.
  EXPECT_EQ(scaled.steps[0].loss_scale, 1024);
  EXPECT_EQ(scaled.steps[3].loss_scale, 2048);
  // With the overflow at step 4: exactly that step is skipped, the weights
  // stay those of step 3, and the scale halves.
  int skipped = 0;
  for (const StepMetrics& m : hit.steps) skipped += m.skipped;
  EXPECT_EQ(skipped, 1);
  EXPECT_TRUE(hit.steps[3].skipped && hit.steps[3].overflow);
  EXPECT_TRUE(std::isfinite(hit.steps[3].loss));
  EXPECT_EQ(hit.weights[3], hit.weights[2]);
  EXPECT_EQ(hit.steps[3].loss_scale, 2048);
  EXPECT_EQ(hit.steps[4].loss_scale, 1024);
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(hit.weights[s], scaled.weights[s]);
  // Training goes on from step 3's weights: step 5's loss is the loss of those weights on step 5's batch.
  EXPECT_NE(hit.weights[4], hit.weights[3]);
}

TEST(LossScaling, AutoTurnsItOnForFp16OnlyAndBadSettingsAreNamed) {
  EXPECT_FALSE(parse_config(kTiny, "t").loss_scaling().has_value());
  EXPECT_FALSE(parse_config(kTiny, "t", {"train.dtype=bf16"}).loss_scaling().has_value());
  EXPECT_TRUE(parse_config(kTiny, "t", {"train.loss_scale=dynamic"}).loss_scaling().has_value());
  EXPECT_TRUE(parse_config(kTiny, "t", {"train.dtype=f16", "train.device=cuda"}).loss_scaling().has_value());
  EXPECT_FALSE(parse_config(kTiny, "t", {"train.dtype=f16", "train.device=cuda", "train.loss_scale=off"})
                   .loss_scaling()
                   .has_value());
  auto error = [](const std::vector<std::string>& ov) {
    return test::error_of([&] { parse_config(kTiny, "t", ov); });
  };
  EXPECT_NE(error({"train.dtype=fp16"}).find("runs on CUDA devices only"), std::string::npos);
  EXPECT_NE(error({"train.loss_scale=always"}).find("use auto (dynamic for fp16), dynamic or off"), std::string::npos);
  EXPECT_NE(error({"train.loss_scale=dynamic", "train.loss_scale_init=1000.0"}).find("power of two"),
            std::string::npos);
}

TEST(LossScaling, TheScaleSurvivesACheckpoint) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("zt_loss_scale_" + std::to_string(test::test_seed()));
  fs::remove_all(dir);
  const std::vector<std::string> settings = {"train.loss_scale=dynamic", "train.loss_scale_init=1024",
                                             "train.loss_scale_window=2", "train.run_dir=" + dir.string()};
  const Config cfg = tiny(settings);
  Trainer a(cfg, std::make_unique<RandomBatches>(cfg.model.vocab_size, 7), nullptr, nullptr);
  a.before_update = [&](int64_t step) {
    if (step == 0) ops::fill(a.model().grad("layers.0.mlp.out.weight").slice(0, 1), NAN);
  };
  for (int64_t s = 0; s < 4; ++s) a.train_step(s);  // 1024 -> 512 (overflow) -> 1024 after two good steps, then 1 more
  ASSERT_EQ(a.progress().loss_scale.scale, 1024);
  ASSERT_EQ(a.progress().loss_scale.good_steps, 1);
  ASSERT_EQ(a.progress().overflow_steps, 1);
  TrainCheckpointer ck(cfg);
  const std::string saved = ck.save(a);
  ck.wait();
  Trainer b(cfg, std::make_unique<RandomBatches>(cfg.model.vocab_size, 7), nullptr, nullptr);
  restore_checkpoint(b, saved);
  EXPECT_EQ(b.progress().loss_scale.scale, 1024);
  EXPECT_EQ(b.progress().loss_scale.good_steps, 1);
  EXPECT_EQ(b.progress().overflow_steps, 1);
  EXPECT_EQ(b.train_step(4).loss_scale, 1024);
  EXPECT_EQ(b.progress().loss_scale.scale, 2048) << "the second good step after the restore grows the scale";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zt::train
