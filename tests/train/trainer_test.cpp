// The training loop: non-finite losses stop it with a clear message, and the
// demo setup (fortunes prepared with GPT-2, the demo model) learns: its
// validation loss falls well below the corpus's unigram entropy.
#include <cstdint>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>

#include "core/determinism.h"
#include "core/error.h"
#include "data/dataset_index.h"
#include "data/shard.h"
#include "ops/elementwise.h"
#include "core/trace.h"
#include "ops/op_profile.h"
#include "test_util.h"
#include "train/config.h"
#include "train/data_source.h"
#include "train/trainer.h"
#include "train/train_test_util.h"

namespace zt::train {
namespace {

namespace fs = std::filesystem;

TEST(Trainer, NonFiniteLossStopsWithTheStepAndLastGoodValues) {
  Config cfg = parse_config(kTiny, "tiny");
  Trainer t(cfg, std::make_unique<RandomBatches>(cfg.model.vocab_size, 1), nullptr, nullptr);
  const StepMetrics first = t.train_step(0);
  EXPECT_TRUE(std::isfinite(first.loss));
  EXPECT_FALSE(first.skipped);
  // Corrupt one weight: the next loss is NaN.
  ops::fill(t.model().param("layers.0.mlp.in.weight").slice(0, 1), NAN);
  try {
    t.train_step(1);
    FAIL() << "a NaN loss did not stop training";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("training stopped at step 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("last good values: step 1"), std::string::npos) << msg;
  }
}

TEST(Trainer, NonFiniteStepsCanBeSkippedUpToALimit) {
  Config cfg = parse_config(kTiny, "tiny", {"train.max_bad_steps=2"});
  Trainer t(cfg, std::make_unique<RandomBatches>(cfg.model.vocab_size, 2), nullptr, nullptr);
  t.train_step(0);
  const Tensor w = t.model().param("layers.0.mlp.in.weight").slice(0, 1);
  ops::fill(w, NAN);
  const StepMetrics skipped = t.train_step(1);
  EXPECT_TRUE(skipped.skipped);
  EXPECT_EQ(t.optimizer().steps_taken(), 1) << "a skipped step must not update the weights";
  EXPECT_THROW(t.train_step(2), Error);
}

// Random batches that note the ops' determinism switch each time the trainer
// asks for one (inside its step).
class BatchesNotingDeterminism : public RandomBatches {
 public:
  using RandomBatches::RandomBatches;
  void next(const Tensor& inputs, const Tensor& targets) override {
    seen.push_back(deterministic());
    RandomBatches::next(inputs, targets);
  }
  std::vector<bool> seen;
};

// train.deterministic is the switch the ops read (core/determinism.h): each
// step of a trainer runs under its own config's value (true by default) and
// leaves the process's as it found it, so two trainers with different
// settings can step in turn. On the CPU both settings train to the same bits
// (its kernels have one summation order); on a GPU false lets cuDNN's
// attention backward sum dq with atomics (tests/cuda/trainer_test.cpp runs
// it against the CPU).
TEST(Trainer, StepsUnderTheDeterminismOfItsConfig) {
  const Config fast = parse_config(kTiny, "tiny", {"train.deterministic=false"});
  const Config exact = parse_config(kTiny, "tiny");
  EXPECT_FALSE(fast.train.deterministic);
  EXPECT_TRUE(exact.train.deterministic);
  auto fast_data = std::make_unique<BatchesNotingDeterminism>(fast.model.vocab_size, 3);
  auto exact_data = std::make_unique<BatchesNotingDeterminism>(exact.model.vocab_size, 3);
  const BatchesNotingDeterminism &fast_seen = *fast_data, &exact_seen = *exact_data;
  Trainer a(fast, std::move(fast_data), nullptr, nullptr), b(exact, std::move(exact_data), nullptr, nullptr);
  a.log = b.log = [](const std::string&) {};
  double loss[2][2];
  for (int64_t step = 0; step < 2; ++step) {  // in turn
    loss[0][step] = a.train_step(step).loss;
    EXPECT_TRUE(deterministic()) << "a step leaves the switch as it found it";
    loss[1][step] = b.train_step(step).loss;
  }
  ASSERT_FALSE(fast_seen.seen.empty());
  ASSERT_FALSE(exact_seen.seen.empty());
  for (const bool on : fast_seen.seen) EXPECT_FALSE(on);
  for (const bool on : exact_seen.seen) EXPECT_TRUE(on);
  EXPECT_EQ(loss[0][1], loss[1][1]) << "the CPU backend is deterministic either way";
}

// metrics.op_profile: each step's metrics.jsonl record carries the time per
// op, with the structural call counts (one embedding lookup per micro-batch,
// one attention per block and micro-batch, forward and backward), and the
// op times sum to at most the step time (outermost ops never overlap), the
// products' reported arithmetic is the model's; the run ends with the table;
// without it neither appears. The step's account splits the LM head (its
// forward, loss and fused backward) from the blocks' forward and backward:
// each op lies in the part that runs it.
TEST(Trainer, OpProfileReportsTimePerOpInTheMetricsAndAtTheEnd) {
  for (const bool on : {true, false}) {
    SCOPED_TRACE(on ? "op_profile on" : "op_profile off");
    const fs::path dir = fs::temp_directory_path() / ("zt_op_profile_" + std::to_string(test::test_seed()));
    fs::remove_all(dir);
    Config cfg = parse_config(kTiny, "tiny",
                              {"train.steps=3", "train.recompute=none", "train.run_dir=" + dir.string(),
                               std::string("metrics.op_profile=") + (on ? "true" : "false")});
    Trainer t(cfg, std::make_unique<RandomBatches>(cfg.model.vocab_size, 5), nullptr, nullptr);
    std::string said;
    t.log = [&](const std::string& line) { said += line + "\n"; };
    t.run();
    EXPECT_FALSE(ops::op_profile_enabled()) << "the run turns the profiler off when it ends";
    EXPECT_EQ(said.find("time per op") != std::string::npos, on) << said;
    std::ifstream in(dir / "metrics.jsonl");
    std::string line;
    int64_t steps = 0;
    const int64_t micro = cfg.grad_accum_steps(1), blocks = cfg.model.n_layer;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (!j.contains("step") || !j.contains("loss")) continue;
      ++steps;
      const nlohmann::json& times = j["time_s"];
      const double forward = times.at("forward").get<double>(), head = times.at("head").get<double>(),
                   backward = times.at("backward").get<double>();
      EXPECT_GT(forward, 0) << line;
      EXPECT_GT(head, 0) << line;
      EXPECT_GT(backward, 0) << line;
      EXPECT_LE(forward + head + backward, times.at("step").get<double>()) << line;
      ASSERT_EQ(j.contains("ops"), on) << line;
      if (!on) continue;
      const nlohmann::json& ops = j["ops"];
      // Only the head computes the loss; attention runs in the blocks.
      EXPECT_LE(ops["softmax_cross_entropy"]["s"].get<double>(), head) << line;
      EXPECT_LE(ops["attention_forward"]["s"].get<double>(), forward) << line;
      EXPECT_LE(ops["attention_backward"]["s"].get<double>(), backward) << line;
      EXPECT_EQ(ops["embedding_forward"]["calls"].get<int64_t>(), micro);
      EXPECT_EQ(ops["embedding_backward"]["calls"].get<int64_t>(), micro);
      EXPECT_EQ(ops["attention_forward"]["calls"].get<int64_t>(), blocks * micro);
      EXPECT_EQ(ops["attention_backward"]["calls"].get<int64_t>(), blocks * micro);
      EXPECT_GE(ops["adamw_step"]["calls"].get<int64_t>(), 1);
      double sum = 0, product_flops = 0;
      for (const auto& [name, t] : ops.items()) {
        sum += t["s"].get<double>();
        EXPECT_GE(t.at("workspace_bytes").get<int64_t>(), 0) << name;
        EXPECT_GE(t.at("cache_misses").get<int64_t>(), 0) << name;
        if (name != "attention_forward" && name != "attention_backward") product_flops += t.at("flops").get<double>();
      }
      EXPECT_LE(sum, j["time_s"]["step"].get<double>()) << line;
      // The products' reported arithmetic is the model's: 2 flops per weight
      // and token in each of forward, input gradient and weight gradient.
      const nn::ModelConfig& mc = cfg.model;
      const int64_t C = mc.d_model, qkv = (mc.n_head + 2 * mc.n_kv_head) * mc.head_dim();
      const int64_t weights = mc.n_layer * (C * qkv + mc.n_head * mc.head_dim() * C + C * mc.mlp_in_width() +
                                            mc.d_ff * C) + mc.padded_vocab() * C;
      EXPECT_EQ(product_flops, 6.0 * double(cfg.train.global_batch * cfg.train.seq_len) * double(weights)) << line;
    }
    EXPECT_EQ(steps, 3);
    fs::remove_all(dir);
  }
}

// metrics.trace_step: RUN_DIR/trace.json is a Chrome trace of that step
// alone: every op the step's op profile counts is one span on the "ops"
// track (the outermost ones: no two overlap), each micro-batch's forward,
// head and backward one span each on the "step" track in that order, and the
// host's data loading, reduction and optimizer on "host" - all inside the
// step; no trace is written for a run without it.
TEST(Trainer, TraceStepWritesThatStepsTimeline) {
  const fs::path dir = fs::temp_directory_path() / ("zt_trace_" + std::to_string(test::test_seed()));
  fs::remove_all(dir);
  const Config cfg = parse_config(kTiny, "tiny",
                                  {"train.steps=3", "metrics.trace_step=2", "train.run_dir=" + dir.string()});
  Trainer t(cfg, std::make_unique<RandomBatches>(cfg.model.vocab_size, 5), nullptr, nullptr);
  ops::enable_op_profile(true);  // as run() does under metrics.op_profile: the step's totals to compare with
  std::vector<StepMetrics> steps;
  for (int64_t s = 0; s < 3; ++s) {
    steps.push_back(t.train_step(s));
    EXPECT_EQ(fs::exists(dir / "trace.json"), s >= 1) << "after step " << s + 1;
  }
  ops::enable_op_profile(false);
  EXPECT_FALSE(trace_on()) << "the trace ends with its step";
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "trace.json"));
  std::map<std::string, std::vector<nlohmann::json>> by_track;
  std::map<int64_t, std::string> track_of_tid;
  for (const nlohmann::json& e : j.at("traceEvents")) {
    ASSERT_EQ(e.at("pid").get<int64_t>(), 0) << "one process, rank 0";
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      track_of_tid[e.at("tid").get<int64_t>()] = e.at("args").at("name").get<std::string>();
    if (e.at("ph") == "X") by_track[e.at("cat").get<std::string>()].push_back(e);
  }
  EXPECT_EQ(track_of_tid, (std::map<int64_t, std::string>{{0, "step"}, {1, "host"}, {2, "ops"}}));
  const double step_us = 1e6 * steps[1].step_seconds;
  std::map<std::string, int64_t> calls;
  double previous_end = -1;
  for (const nlohmann::json& e : by_track["ops"]) {
    ++calls[e.at("name").get<std::string>()];
    const double ts = e.at("ts").get<double>(), dur = e.at("dur").get<double>();
    EXPECT_GE(ts, previous_end - 1e-3) << e.dump() << ": ops on one thread, the outermost only";
    EXPECT_GE(dur, 0.0);
    EXPECT_LE(ts + dur, step_us) << e.dump();
    previous_end = ts + dur;
  }
  std::map<std::string, int64_t> profiled;
  for (const ops::OpTotal& o : steps[1].op_totals) profiled[o.name] = o.calls;
  EXPECT_EQ(calls, profiled);
  const int64_t micro = cfg.grad_accum_steps(1);
  std::vector<std::string> phases;
  for (const nlohmann::json& e : by_track["step"]) phases.push_back(e.at("name").get<std::string>());
  std::vector<std::string> expected;
  for (int64_t i = 1; i <= micro; ++i)
    for (const char* phase : {"forward", "head + its backward", "backward"})
      expected.push_back(std::string(phase) + " (micro-batch " + std::to_string(i) + ")");
  EXPECT_EQ(phases, expected);
  std::map<std::string, int64_t> host;
  for (const nlohmann::json& e : by_track["host"]) ++host[e.at("name").get<std::string>()];
  EXPECT_EQ(host, (std::map<std::string, int64_t>{
                      {"data", micro}, {"gradient reduction: the rest", 1}, {"norm, optimizer step", 1}}));
  fs::remove_all(dir);
}

// Unigram entropy (nats/token) of a prepared split, from its shards.
double unigram_entropy(const std::string& dir) {
  const data::DatasetIndex index = data::DatasetIndex::load(dir);
  std::map<int32_t, int64_t> counts;
  int64_t total = 0;
  for (const data::ShardInfo& s : index.train.shards) {
    data::ShardReader r((fs::path(dir) / s.file).string(), uint32_t(index.vocab_size), false);
    std::vector<int32_t> tok(r.tokens());
    r.read(0, r.tokens(), tok.data());
    for (int32_t t : tok) ++counts[t];
    total += int64_t(tok.size());
  }
  double h = 0;
  for (auto& [t, c] : counts) {
    const double p = double(c) / double(total);
    h -= p * std::log(p);
  }
  return h;
}

// The demo corpus (fortunes with GPT-2's tokenizer, 5% validation) prepared
// into dir by the CLI.
void prepare_fortunes(const fs::path& dir) {
  const std::string prepare = std::string(ZT_BINARY_DIR) +
                              "/bin/zettatron prepare --force --tokenizer gpt2 --input /usr/share/games/fortunes "
                              "--doc-split percent --val-fraction 0.05 --output " +
                              dir.string() + " > /dev/null";
  ASSERT_EQ(std::system(prepare.c_str()), 0) << prepare;
}

// The validation split is opened only for evaluations: a micro-batch larger
// than the split is an error naming the fix with train.eval_every > 0, and
// no error without evaluations (the GPU benchmark's micro-batch probes).
TEST(TrainingData, ValidationSplitIsOpenedOnlyWhenEvaluating) {
  const fs::path dir = fs::temp_directory_path() / ("zt_val_split_" + std::to_string(test::test_seed()));
  ASSERT_NO_FATAL_FAILURE(prepare_fortunes(dir));
  const int64_t T = 16;
  const data::DatasetIndex index = data::DatasetIndex::load(dir.string());
  const int64_t micro = int64_t(index.val.tokens) / T + 1;  // more samples than the split holds
  ASSERT_LT(micro * (T + 1), int64_t(index.train.tokens)) << "the train split must hold a micro-batch";
  auto config = [&](int eval_every) {
    return parse_config(kTiny, "tiny",
                        {"data.dir=" + dir.string(), "model.vocab_size=50257", "train.seq_len=" + std::to_string(T),
                         "train.micro_batch=" + std::to_string(micro), "train.global_batch=" + std::to_string(micro),
                         "train.eval_every=" + std::to_string(eval_every)});
  };
  const TrainingData without = open_training_data(config(0));
  EXPECT_NE(without.train, nullptr);
  EXPECT_EQ(without.val, nullptr) << "no evaluations: no validation source";
  const std::string err = test::error_of([&] { open_training_data(config(10)); });
  EXPECT_NE(err.find("fewer than one micro-batch"), std::string::npos) << err;
  EXPECT_NE(err.find("train.eval_every = 0"), std::string::npos) << err;
  const TrainingData small = open_training_data(parse_config(
      kTiny, "tiny",
      {"data.dir=" + dir.string(), "model.vocab_size=50257", "train.seq_len=" + std::to_string(T), "train.eval_every=10"}));
  EXPECT_NE(small.val, nullptr) << "evaluations with a split that holds a micro-batch";
  fs::remove_all(dir);
}

TEST(Trainer, DemoSetupLearnsBelowTheUnigramEntropy) {
  const fs::path dir = fs::temp_directory_path() / ("zt_demo_data_" + std::to_string(test::test_seed()));
  ASSERT_NO_FATAL_FAILURE(prepare_fortunes(dir));
  const double h = unigram_entropy(dir.string());
  // The demo config as shipped (200 steps, seeded): only the data and run
  // folders move, samples are off and evaluation happens once at the end.
  Config cfg = load_config(std::string(ZT_SOURCE_DIR) + "/configs/demo.toml",
                           {"data.dir=" + dir.string(), "train.run_dir=" + (dir / "run").string(),
                            "train.eval_every=" + std::to_string(200), "sample.count=0", "metrics.peak_gflops=1"});
  TrainingData data = open_training_data(cfg);
  Trainer t(cfg, std::move(data.train), std::move(data.val), std::move(data.codec));
  t.log = [](const std::string&) {};
  const TrainResult r = t.run();
  std::cout << "unigram entropy " << h << " nats/token; val loss after " << r.steps << " steps " << r.final_val_loss
            << "; train loss " << r.losses.front() << " -> " << r.final_loss << "\n";
  EXPECT_GT(h, 5.0) << "the corpus's unigram entropy looks wrong";
  EXPECT_LT(r.final_val_loss, h - 0.5) << "the demo did not learn below the unigram entropy";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace zt::train
