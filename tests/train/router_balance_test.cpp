// The routers' load controls. Aux-loss-free balancing
// (model.router_bias_update_rate, DeepSeek-V3): the bias step's arithmetic,
// the trainer's counting of each step's routed slots (every training forward
// once: micro-batches summed, recomputation not counted), biases that follow
// those counts exactly, a run whose experts end up more evenly loaded than
// the same run without, and the biases kept as model state: checkpoints
// (exact resume), --init-from, the final model file and generation, and
// refused by the Hugging Face (Mixtral) export. A capacity
// (model.expert_capacity_factor): the step's reported share of dropped slots
// is what the routed counts and the capacity make it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <filesystem>
#include <string>
#include <vector>

#include "nn/moe.h"
#include "test_util.h"
#include "train/checkpointing.h"
#include "train/config.h"
#include "train/data_source.h"
#include "train/model_file.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace zt::train {
namespace {

namespace fs = std::filesystem;

// A command's standard output (stderr too, where the command redirects it).
std::string output_of(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  ::pclose(f);
  return out;
}

TEST(RouterBias, EachBiasMovesByTheRateTowardsItsBlocksMean) {
  const float r = 0.25f;
  // Two blocks of 4 experts: block 0 routed 16 slots (mean 4), block 1 seven
  // (mean 1.75: no expert equals it); block 2 routed nothing.
  std::vector<float> bias = {0.5f, 0.5f, 0.5f, 0.5f, -1.0f, 0.0f, 0.0f, 0.0f, 2.0f, 2.0f, 2.0f, 2.0f};
  const std::vector<int64_t> load = {5, 3, 4, 4, 1, 2, 2, 2, 0, 0, 0, 0};
  nn::move_router_bias(bias, load, 4, r);
  const std::vector<float> want = {0.25f, 0.75f, 0.5f, 0.5f, -0.75f, -0.25f, -0.25f, -0.25f, 2.0f, 2.0f, 2.0f, 2.0f};
  EXPECT_EQ(bias, want);
  // Loads counted several times alike (a tp group's ranks) move them alike.
  std::vector<float> again = {0.5f, 0.5f, 0.5f, 0.5f};
  nn::move_router_bias(again, {15, 9, 12, 12}, 4, r);
  EXPECT_EQ(again, (std::vector<float>{0.25f, 0.75f, 0.5f, 0.5f}));
  std::vector<float> three(3);
  EXPECT_NE(test::error_of([&] { nn::move_router_bias(three, {1, 2, 3}, 4, r); }).find("blocks of 4 experts"),
            std::string::npos);
  std::vector<float> four(4);
  EXPECT_NE(test::error_of([&] { nn::move_router_bias(four, {1, 2, 3}, 4, r); }).find("3 loads"), std::string::npos);
}

// The fortunes corpus prepared once for the suite, and llama3-moe-tiny (4
// experts, top 2, 2 blocks) on it with no load-balancing loss.
class RouterBalance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::temp_directory_path() / ("zt_router_balance_" + std::to_string(::getpid())));
    fs::remove_all(*root_);
    const std::string cmd = std::string(ZT_BINARY_DIR) +
                            "/bin/zettatron prepare --force --tokenizer gpt2 --input /usr/share/games/fortunes "
                            "--doc-split percent --val-fraction 0.05 --output " + (*root_ / "data").string() +
                            " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete root_;
  }
  static Config config(const std::string& run, std::vector<std::string> more = {}) {
    const std::string text = "[model]\npreset = \"llama3-moe-tiny\"\nvocab_size = 50257\nrouter_aux_loss = 0\n"
                             "[data]\ndir = \"" + (*root_ / "data").string() + "\"\ntokenizer = \"gpt2\"\n"
                             "[train]\nseq_len = 32\nglobal_batch = 8\nmicro_batch = 4\nsteps = 6\nlog_every = 100\n"
                             "[optim]\nlr = 3e-3\nwarmup_steps = 2\n[sample]\ncount = 0\n[metrics]\npeak_gflops = 1\n"
                             "[checkpoint]\nevery = 3\nkeep_last = 0\n";
    more.push_back("train.run_dir=" + (*root_ / run).string());
    return parse_config(text, "router balance", more);
  }
  static std::unique_ptr<Trainer> trainer(const Config& cfg) {
    TrainingData data = open_training_data(cfg);
    auto t = std::make_unique<Trainer>(cfg, std::move(data.train), std::move(data.val), std::move(data.codec));
    t->log = [](const std::string&) {};
    return t;
  }
  static fs::path* root_;
};
fs::path* RouterBalance::root_ = nullptr;

// Every step: each block's loads sum to the step's tokens x k (each training
// forward counted once, whatever the recompute policy), and each bias moved
// by exactly +-rate or not at all, by its expert's load against the mean.
TEST_F(RouterBalance, BiasesFollowEachStepsRoutedSlots) {
  const float rate = 0.01f;
  for (const char* recompute : {"none", "full"}) {
    SCOPED_TRACE(std::string("recompute ") + recompute);
    const Config cfg = config(std::string("follow-") + recompute,
                              {"model.router_bias_update_rate=0.01", std::string("train.recompute=") + recompute});
    const int64_t L = cfg.model.n_layer, E = cfg.model.n_expert, k = cfg.model.expert_top_k;
    auto t = trainer(cfg);
    std::vector<float> before = t->progress().router_bias;
    ASSERT_EQ(before, std::vector<float>(size_t(L * E), 0.0f)) << "balancing starts from zero biases";
    int64_t moved = 0;
    for (int64_t s = 0; s < 5; ++s) {
      t->train_step(s);
      const std::vector<int64_t>& load = t->step_expert_load();
      const std::vector<float>& after = t->progress().router_bias;
      ASSERT_EQ(load.size(), size_t(L * E));
      for (int64_t l = 0; l < L; ++l) {
        int64_t total = 0;
        for (int64_t e = 0; e < E; ++e) total += load[size_t(l * E + e)];
        ASSERT_EQ(total, cfg.train.global_batch * cfg.train.seq_len * k) << "block " << l << ", step " << s + 1;
        const double mean = double(total) / double(E);
        for (int64_t e = 0; e < E; ++e) {
          const size_t i = size_t(l * E + e);
          const double n = double(load[i]);
          const float want = n < mean ? before[i] + rate : n > mean ? before[i] - rate : before[i];
          EXPECT_EQ(after[i], want) << "block " << l << " expert " << e << ", step " << s + 1;
          moved += after[i] != before[i];
        }
      }
      before = after;
    }
    EXPECT_GT(moved, 0);
  }
}

// The purpose: without a balancing loss the tiny model's routers collapse
// onto one expert per block within a few steps; with the biases, each
// expert's share of the slots routed over the run's second half comes
// closer to the even 1 / E.
TEST_F(RouterBalance, BiasesEvenOutTheExpertsLoadOverARun) {
  const int64_t steps = 60, from = 30;
  auto run = [&](const char* rate) {
    const Config cfg = config(std::string("even-") + rate, {std::string("model.router_bias_update_rate=") + rate,
                                                            "train.steps=" + std::to_string(steps)});
    auto t = trainer(cfg);
    const int64_t L = cfg.model.n_layer, E = cfg.model.n_expert;
    std::vector<int64_t> sum(size_t(L * E), 0);
    for (int64_t s = 0; s < steps; ++s) {
      t->train_step(s);
      // Without balancing the trainer leaves the counts in the model.
      const std::vector<int64_t> load =
          cfg.model.router_bias_update_rate > 0 ? t->step_expert_load() : t->model().take_expert_load();
      if (s >= from)
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += load[i];
    }
    double worst = 0;  // the busiest expert's share over the mean, worst block
    for (int64_t l = 0; l < L; ++l) {
      int64_t total = 0, most = 0;
      for (int64_t e = 0; e < E; ++e) {
        total += sum[size_t(l * E + e)];
        most = std::max(most, sum[size_t(l * E + e)]);
      }
      worst = std::max(worst, double(most) * double(E) / double(total));
    }
    return worst;
  };
  const double plain = run("0"), balanced = run("0.01");
  std::cout << "busiest expert over the mean, steps " << from + 1 << "-" << steps << ": " << plain << " without, "
            << balanced << " with balancing biases\n";
  EXPECT_GT(plain, 1.8) << "the test expects the routers to collapse without balancing";
  EXPECT_LT(balanced, plain - 0.3);
  EXPECT_LT(balanced, 1.6);
}

// Model state: a resumed run has the straight run's biases and losses; the
// checkpoint's biases initialise a fine-tuning run; the final model file
// keeps them for generation; the Mixtral export refuses a model that routes
// with them.
TEST_F(RouterBalance, CheckpointsModelFilesAndInitFromKeepTheBiases) {
  const std::vector<std::string> balanced = {"model.router_bias_update_rate=0.02"};
  const Config straight_cfg = config("keep-straight", balanced);
  auto straight = trainer(straight_cfg);
  const TrainResult s = straight->run();
  const std::vector<float> bias = straight->progress().router_bias;
  ASSERT_TRUE(std::any_of(bias.begin(), bias.end(), [](float b) { return b != 0.0f; }));

  const Config cfg = config("keep-resumed", balanced);
  trainer(cfg)->run(3);
  auto resumed = trainer(cfg);
  restore_checkpoint(*resumed, resume_path(cfg, ""));
  EXPECT_NE(resumed->progress().router_bias, bias) << "at step 3 the biases are not yet step 6's";
  const TrainResult r = resumed->run();
  ASSERT_EQ(r.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r.losses[i], s.losses[3 + i]) << "step " << 4 + i;
  EXPECT_EQ(resumed->progress().router_bias, bias);

  // --init-from: the weights and the biases, then balancing goes on from them.
  auto tuned = trainer(config("keep-tuned", balanced));
  init_weights_from_checkpoint(*tuned, straight_cfg.train.run_dir);
  EXPECT_EQ(tuned->progress().router_bias, bias);
  EXPECT_EQ(tuned->model().router_bias(), bias);

  // The final model file (what `zettatron train` writes) and its loading.
  save_model_file(std::vector<const nn::Transformer*>{&straight->model()}, nullptr, straight_cfg, true, bias);
  const LoadedModel loaded = load_model_file(straight_cfg.train.run_dir);
  EXPECT_EQ(loaded.model->router_bias(), bias);
  // And from the checkpoint alone.
  const LoadedModel from_ckpt = load_model_file(straight_cfg.checkpoint_dir());
  EXPECT_EQ(from_ckpt.model->router_bias(), bias);

  const std::string convert = std::string(ZT_BINARY_DIR) + "/bin/zettatron convert --to-hf " +
                              straight_cfg.checkpoint_dir() + " --out " + (*root_ / "hf").string() + " 2>&1";
  const std::string out = output_of(convert);
  EXPECT_NE(out.find("balancing biases"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(*root_ / "hf" / "config.json")) << "nothing written";
}

// One micro-batch a step, so a step's routed counts (taken from the model:
// no balancing biases here) are one routing call's: each block drops
// sum_e max(0, n_e - cap) of its N k slots, cap = ceil(c N k / E), and the
// metrics report the worst block's share, in metrics.jsonl too.
TEST_F(RouterBalance, TheMetricsSayWhatACapacityDropped) {
  for (const char* factor : {"0", "1.0", "0.5"}) {
    SCOPED_TRACE(std::string("capacity factor ") + factor);
    const Config cfg = config(std::string("drop-") + factor, {std::string("model.expert_capacity_factor=") + factor,
                                                              "train.global_batch=4", "train.micro_batch=4"});
    const int64_t L = cfg.model.n_layer, E = cfg.model.n_expert, k = cfg.model.expert_top_k;
    const int64_t N = cfg.train.micro_batch * cfg.train.seq_len, cap = nn::expert_capacity(cfg.model, N);
    EXPECT_EQ(cap, cfg.model.expert_capacity_factor > 0
                       ? int64_t(std::ceil(double(cfg.model.expert_capacity_factor) * double(N * k) / double(E)))
                       : -1);
    auto t = trainer(cfg);
    double worst_seen = 0;
    for (int64_t s = 0; s < 4; ++s) {
      const StepMetrics m = t->train_step(s);
      const std::vector<int64_t> load = t->model().take_expert_load();
      double worst = 0;
      for (int64_t l = 0; l < L; ++l) {
        int64_t dropped = 0;
        for (int64_t e = 0; e < E; ++e) dropped += cap < 0 ? 0 : std::max<int64_t>(0, load[size_t(l * E + e)] - cap);
        worst = std::max(worst, double(dropped) / double(N * k));
      }
      EXPECT_EQ(m.expert_dropped_max, worst) << "step " << s + 1;
      worst_seen = std::max(worst_seen, worst);
    }
    if (cap > 0) {
      EXPECT_GT(worst_seen, 0.0) << "a capacity at or under the mean drops slots";
    }
  }
}

}  // namespace
}  // namespace zt::train
