// Checkpoints of real training runs: a resumed run (in this process or a
// fresh one) produces bit-identical losses, optimizer state and weights; a
// crash in the middle of a save leaves the previous checkpoint as latest;
// background saves write the same bytes; a trained model exported to Hugging
// Face format gives PyTorch the same logits; mismatches are named.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "ckpt/safetensors.h"
#include "core/error.h"
#include "ops/elementwise.h"
#include "test_util.h"
#include "train/hf_reference.h"
#include "train/checkpointing.h"
#include "train/config.h"
#include "train/data_source.h"
#include "train/model_file.h"
#include "train/trainer.h"

namespace zt::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kBin = std::string(ZT_BINARY_DIR) + "/bin/zettatron";

// The fortunes corpus prepared once for the whole binary (GPT-2 tokens).
class ResumeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new fs::path(fs::temp_directory_path() / ("zt_resume_" + std::to_string(::getpid())));
    fs::remove_all(*root_);
    fs::create_directories(*root_);
    const std::string cmd = kBin + " prepare --force --tokenizer gpt2 --input /usr/share/games/fortunes "
                                   "--doc-split percent --val-fraction 0.05 --output " + (*root_ / "data").string() +
                            " > /dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    // A second dataset for blends: one fortune file, no validation split.
    const std::string second = kBin + " prepare --force --tokenizer gpt2 --input /usr/share/games/fortunes/computers "
                                      "--doc-split percent --val-fraction 0 --output " +
                               (*root_ / "computers").string() + " > /dev/null";
    ASSERT_EQ(std::system(second.c_str()), 0) << second;
    std::ofstream(*root_ / "tiny.toml") << config_text("gpt2-tiny", "f32");
  }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete root_;
  }

  static std::string config_text(const std::string& preset, const std::string& dtype) {
    return "[model]\npreset = \"" + preset + "\"\nvocab_size = 50257\n"
           "[data]\ndir = \"" + (*root_ / "data").string() + "\"\ntokenizer = \"\"\n"
           "[train]\nseq_len = 32\nglobal_batch = 8\nmicro_batch = 4\nsteps = 6\ndtype = \"" + dtype + "\"\n"
           "log_every = 100\n"
           "[optim]\nlr = 3e-3\nwarmup_steps = 2\n[sample]\ncount = 0\n[metrics]\npeak_gflops = 1\n"
           "[checkpoint]\nevery = 2\nkeep_last = 0\n";
  }
  static Config config(const std::string& preset, const std::string& dtype, const std::string& run,
                       std::vector<std::string> more = {}) {
    more.push_back("train.run_dir=" + (*root_ / run).string());
    return parse_config(config_text(preset, dtype), "test", more);
  }
  static std::unique_ptr<Trainer> trainer(const Config& cfg) {
    TrainingData data = open_training_data(cfg);
    auto t = std::make_unique<Trainer>(cfg, std::move(data.train), std::move(data.val), nullptr);
    t->log = [](const std::string&) {};
    return t;
  }
  static std::string bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  static std::vector<double> logged_losses(const fs::path& run) {
    std::vector<double> out;
    std::ifstream in(run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.contains("loss")) out.push_back(j["loss"].get<double>());
    }
    return out;
  }
  static int run_cli(const std::string& args, const std::string& env = "") {
    const std::string cmd = env + " " + kBin + " " + args + " > /dev/null 2>&1";
    return std::system(cmd.c_str());
  }
  static fs::path* root_;
};
fs::path* ResumeTest::root_ = nullptr;

struct Variant {
  const char* preset;
  const char* dtype;
  std::vector<std::string> settings = {};
};

// 6 steps straight vs 3 steps, a new Trainer restored from the checkpoint,
// 3 more: the same losses and the same checkpoint bytes (master weights,
// both AdamW moments) at step 6, bit for bit.
TEST_F(ResumeTest, RestoredTrainerContinuesBitForBit) {
  // Stochastic rounding draws its bits from (seed, step, position): a resumed
  // run rounds exactly as the straight one.
  for (const Variant& v : {Variant{"gpt2-tiny", "f32"}, Variant{"llama3-tiny", "bf16"},
                           Variant{"gpt2-tiny", "bf16", {"optim.stochastic_rounding=true"}},
                           Variant{"llama3-moe-tiny", "bf16"}}) {
    SCOPED_TRACE(std::string(v.preset) + " " + v.dtype + (v.settings.empty() ? "" : " " + v.settings[0]));
    const std::string tag = std::string(v.preset) + "-" + v.dtype + (v.settings.empty() ? "" : "-sr");
    const Config straight_cfg = config(v.preset, v.dtype, "straight-" + tag, v.settings);
    const TrainResult straight = trainer(straight_cfg)->run();
    ASSERT_EQ(straight.losses.size(), 6u);

    const Config cfg = config(v.preset, v.dtype, "resumed-" + tag, v.settings);
    {
      const TrainResult first = trainer(cfg)->run(3);
      ASSERT_EQ(first.losses.size(), 3u);
      for (size_t i = 0; i < 3; ++i) EXPECT_EQ(first.losses[i], straight.losses[i]) << "step " << i + 1;
    }
    auto t = trainer(cfg);
    const std::string from = restore_checkpoint(*t, resume_path(cfg, ""));
    EXPECT_EQ(fs::path(from).filename(), "step_00000003");
    EXPECT_EQ(t->progress().steps_done, 3);
    EXPECT_EQ(t->progress().tokens_seen, 3 * 8 * 32);
    EXPECT_EQ(t->optimizer().steps_taken(), 3);
    const TrainResult second = t->run();
    ASSERT_EQ(second.losses.size(), 3u);
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << "step " << 4 + i;
    const fs::path a = fs::path(straight_cfg.checkpoint_dir()) / "step_00000006" / "shard-00000.safetensors";
    const fs::path b = fs::path(cfg.checkpoint_dir()) / "step_00000006" / "shard-00000.safetensors";
    EXPECT_TRUE(bytes(a) == bytes(b)) << "weights or optimizer state differ after resuming";
    // metrics.jsonl holds each step once, as the straight run's does.
    EXPECT_EQ(logged_losses(cfg.train.run_dir), logged_losses(straight_cfg.train.run_dir));
  }
}

// Training on a blend of two datasets (data.blend, weights 3 : 1): 6 steps
// straight and 3 + 3 across a checkpoint give the same losses bit for bit -
// the checkpoint carries each dataset's samples drawn (blend_counts) - and
// evaluation reads the validation split of the one dataset that has it.
TEST_F(ResumeTest, ABlendOfDatasetsResumesBitForBit) {
  const std::string blend =
      "data.blend=\"" + (*root_ / "data").string() + " 3, " + (*root_ / "computers").string() + " 1\"";
  const std::vector<std::string> settings = {"data.dir=\"\"", blend, "train.eval_every=3", "train.eval_batches=2"};
  const Config straight_cfg = config("gpt2-tiny", "f32", "blend-straight", settings);
  ASSERT_EQ(straight_cfg.data_parts().size(), 2u);
  const TrainResult straight = trainer(straight_cfg)->run();
  ASSERT_EQ(straight.losses.size(), 6u);
  EXPECT_TRUE(std::isfinite(straight.final_val_loss));
  const Config cfg = config("gpt2-tiny", "f32", "blend-resumed", settings);
  trainer(cfg)->run(3);
  auto t = trainer(cfg);
  restore_checkpoint(*t, resume_path(cfg, ""));
  const json data_state = t->train_data().state();
  ASSERT_TRUE(data_state.contains("blend_counts")) << data_state.dump();
  EXPECT_EQ(data_state["blend_counts"], json({18, 6})) << "3 steps of 8 samples, 3 : 1";
  const TrainResult second = t->run();
  ASSERT_EQ(second.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << "step " << 4 + i;
  // The same run on the first dataset alone draws other batches.
  const TrainResult alone = trainer(config("gpt2-tiny", "f32", "blend-alone"))->run();
  EXPECT_NE(alone.losses[1], straight.losses[1]);
}

// train.eval_each_dataset: each evaluation of a blend also logs every
// dataset's validation loss alone (the datasets with a val split: here the
// first) - the loss the same model has on that dataset's validation data
// opened by itself; the blend's own validation blends the val splits there
// are, so here it is the first's too.
TEST_F(ResumeTest, EvaluationsOfABlendNameEachDatasetsLoss) {
  const std::string first = (*root_ / "data").string();
  const std::string blend = "data.blend=\"" + first + " 3, " + (*root_ / "computers").string() + " 1\"";
  const Config cfg = config("gpt2-tiny", "f32", "blend-eval-each",
                            {"data.dir=\"\"", blend, "train.eval_every=3", "train.eval_batches=2",
                             "train.eval_each_dataset=true"});
  TrainingData data = open_training_data(cfg);
  ASSERT_EQ(data.val_each.size(), 1u) << "the second dataset has no validation split";
  EXPECT_EQ(data.val_each[0].name, first);
  Trainer t(cfg, std::move(data.train), std::move(data.val), nullptr);
  t.log = [](const std::string&) {};
  t.set_dataset_validation(std::move(data.val_each));
  const TrainResult r = t.run();
  std::vector<json> evals;
  std::ifstream in(fs::path(cfg.train.run_dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (json j = json::parse(line); j.contains("val_loss")) evals.push_back(j);
  ASSERT_EQ(evals.size(), 2u) << "steps 3 and 6";
  ASSERT_TRUE(evals[1].contains("val_loss_by_dataset")) << evals[1].dump();
  EXPECT_EQ(evals[1]["val_loss"].get<double>(), r.final_val_loss);
  const double logged = evals[1]["val_loss_by_dataset"][first].get<double>();
  // The trained model on the first dataset's validation split, opened alone.
  TrainingData alone = open_training_data(config("gpt2-tiny", "f32", "blend-eval-alone",
                                                 {"train.eval_every=3", "train.eval_batches=2"}));
  ASSERT_NE(alone.val, nullptr);
  EXPECT_EQ(t.evaluate(*alone.val), logged);
  EXPECT_EQ(logged, r.final_val_loss) << "the blend's validation is the one val split there is";
  // Without a blend the setting is refused with the reason.
  EXPECT_NE(test::error_of([&] { config("gpt2-tiny", "f32", "x", {"train.eval_each_dataset=true"}); })
                .find("train.eval_each_dataset takes each dataset of a blend alone"),
            std::string::npos);
}

// Offloading (optim.offload: the state in host memory, updated there;
// train.offload_activations) changes where bytes wait, not what is
// computed: an offloaded run writes the checkpoints of one without it, byte
// for byte, and a checkpoint of either resumes in the other bit for bit.
TEST_F(ResumeTest, OffloadedRunsWriteAndResumeTheSameState) {
  for (const Variant& v : {Variant{"gpt2-tiny", "f32"},
                           Variant{"llama3-tiny", "bf16", {"optim.stochastic_rounding=true"}}}) {
    SCOPED_TRACE(std::string(v.preset) + " " + v.dtype);
    const std::string tag = std::string(v.preset) + "-" + v.dtype;
    std::vector<std::string> offloaded = v.settings;
    offloaded.push_back("optim.offload=true");
    offloaded.push_back("train.offload_activations=true");
    const Config plain_cfg = config(v.preset, v.dtype, "offload-plain-" + tag, v.settings);
    const Config off_cfg = config(v.preset, v.dtype, "offload-straight-" + tag, offloaded);
    const TrainResult plain = trainer(plain_cfg)->run();
    const TrainResult off = trainer(off_cfg)->run();
    EXPECT_EQ(off.losses, plain.losses);
    const auto shard = [](const Config& c) {
      return bytes(fs::path(c.checkpoint_dir()) / "step_00000006" / "shard-00000.safetensors");
    };
    EXPECT_TRUE(shard(off_cfg) == shard(plain_cfg)) << "the offloaded run's weights or optimizer state differ";
    // 3 steps offloaded, 3 more resumed without offloading, and the reverse.
    for (const bool first_offloaded : {true, false}) {
      const std::string run = std::string("offload-resumed-") + (first_offloaded ? "a-" : "b-") + tag;
      const Config a = config(v.preset, v.dtype, run, first_offloaded ? offloaded : v.settings);
      const Config b = config(v.preset, v.dtype, run, first_offloaded ? v.settings : offloaded);
      trainer(a)->run(3);
      auto t = trainer(b);
      restore_checkpoint(*t, resume_path(b, ""));
      EXPECT_EQ(t->optimizer().offloaded(), !first_offloaded);
      const TrainResult second = t->run();
      ASSERT_EQ(second.losses.size(), 3u);
      for (size_t i = 0; i < 3; ++i) EXPECT_EQ(second.losses[i], plain.losses[3 + i]) << "step " << 4 + i;
      EXPECT_TRUE(shard(b) == shard(plain_cfg)) << (first_offloaded ? "offloaded, then not" : "then offloaded");
    }
  }
}

// The final model file describes itself: a later run in the same directory
// rewrites config.toml when it starts (here: another dtype and steps), and
// the file still loads with the config and step it was written with; a
// file without them (written before 2026-12-07) takes config.toml's, cast
// to its dtype; and a checkpoint of a later step (a resumed run that
// stopped before its end) is read instead of the file.
TEST_F(ResumeTest, ModelFileDescribesItselfAndYieldsToALaterCheckpoint) {
  const Config cfg = config("gpt2-tiny", "bf16", "model-file", {"train.steps=4"});
  auto first = trainer(cfg);
  first->run();
  save_model_file(std::vector<const nn::Transformer*>{&first->model()}, nullptr, cfg, true, {}, 4);
  const fs::path dir = cfg.train.run_dir;
  auto params = [](const nn::Transformer& m) {
    std::vector<std::pair<std::string, Tensor>> out;
    for (const nn::ParamSet* set : m.param_sets())
      for (size_t i = 0; i < set->size(); ++i) out.emplace_back(set->spec(i).name, m.global_param(set->spec(i).name));
    return out;
  };
  auto equal_after_cast = [](const Tensor& got, const Tensor& want) {
    const Tensor c = Tensor::empty(want.shape(), want.dtype());
    ops::cast(c, got);
    return std::memcmp(c.data_ptr(), want.data_ptr(), want.nbytes()) == 0;
  };
  const Config later = config("gpt2-tiny", "f32", "model-file", {"train.steps=6"});
  std::ofstream(dir / "config.toml") << to_toml(later);
  {
    const LoadedModel m = load_model_file(dir.string());
    EXPECT_EQ(m.config.train.dtype, "bf16");
    EXPECT_EQ(m.config.train.steps, 4);
    EXPECT_EQ(m.source, (dir / "model.safetensors").string() + " (step 4)");
    for (const auto& [name, t] : params(first->model()))
      EXPECT_TRUE(equal_after_cast(m.model->global_param(name), t)) << name;
  }
  {
    ckpt::write_safetensors((dir / "model.safetensors").string(), params(first->model()),
                            {{"format", "zettatron-model"}, {"arch", "gpt2"}});
    const LoadedModel m = load_model_file(dir.string());
    EXPECT_EQ(m.config.train.dtype, "f32") << "config.toml's";
    EXPECT_EQ(m.model->compute_dtype(), DType::f32);
    EXPECT_EQ(m.source, (dir / "model.safetensors").string());
    for (const auto& [name, t] : params(first->model()))
      EXPECT_TRUE(equal_after_cast(m.model->global_param(name), t)) << name;
    save_model_file(std::vector<const nn::Transformer*>{&first->model()}, nullptr, cfg, true, {}, 4);
  }
  auto resumed = trainer(later);
  restore_checkpoint(*resumed, resume_path(later, ""));
  resumed->run();  // to step 6, checkpointed; no model file written
  const LoadedModel m = load_model_file(dir.string());
  EXPECT_EQ(m.source, "checkpoint " + (dir / "checkpoints" / "step_00000006").string() + " (step 6, newer than " +
                          (dir / "model.safetensors").string() + " at step 4)");
  EXPECT_EQ(m.config.train.steps, 6);
  for (const auto& [name, t] : params(resumed->model()))
    EXPECT_TRUE(equal_after_cast(m.model->global_param(name), t)) << name << ": the f32 master rounds to it";
}

// Another micro-batch size (more accumulation steps) on resume: the same
// rows make up each global batch, so the losses agree to rounding; the
// change is named.
TEST_F(ResumeTest, ResumeWithAnotherMicroBatchKeepsTheGlobalBatch) {
  const Config straight_cfg = config("gpt2-tiny", "f32", "mb-straight");
  const TrainResult straight = trainer(straight_cfg)->run();
  const Config cfg = config("gpt2-tiny", "f32", "mb-resumed");
  trainer(cfg)->run(2);
  const Config cfg2 = config("gpt2-tiny", "f32", "mb-resumed", {"train.micro_batch=1"});
  auto t = trainer(cfg2);
  restore_checkpoint(*t, resume_path(cfg2, ""));
  // What the resumed run says with its header: the one setting changed.
  EXPECT_EQ(t->start_notes, std::vector<std::string>{"settings changed since the checkpoint's run:\n  "
                                                     "train.micro_batch: 4 -> 1"});
  const TrainResult second = t->run();
  ASSERT_EQ(second.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(second.losses[i], straight.losses[2 + i], 1e-5 * std::fabs(straight.losses[2 + i])) << "step " << 3 + i;
}

// checkpoint.async: the state is copied at the step boundary and written in
// the background; the files are the synchronous save's, byte for byte.
TEST_F(ResumeTest, BackgroundSavesWriteTheSameBytes) {
  const Config sync_cfg = config("gpt2-tiny", "f32", "sync");
  const Config async_cfg = config("gpt2-tiny", "f32", "async", {"checkpoint.async=true"});
  trainer(sync_cfg)->run();
  trainer(async_cfg)->run();
  const auto steps = ckpt::list_checkpoints(async_cfg.checkpoint_dir());
  EXPECT_EQ(steps, (std::vector<int64_t>{2, 4, 6}));
  for (int64_t s : steps) {
    const std::string name = ckpt::checkpoint_dir_name(s);
    EXPECT_TRUE(bytes(fs::path(sync_cfg.checkpoint_dir()) / name / "shard-00000.safetensors") ==
                bytes(fs::path(async_cfg.checkpoint_dir()) / name / "shard-00000.safetensors"))
        << name;
  }
}

// The CLI in fresh processes: straight vs --stop-after + --resume, and a
// process killed while committing a checkpoint.
TEST_F(ResumeTest, FreshProcessResumeAndCrashDuringSave) {
  const std::string cfg = (*root_ / "tiny.toml").string();
  const fs::path a = *root_ / "cli-straight", b = *root_ / "cli-resumed", c = *root_ / "cli-crashed";
  ASSERT_EQ(run_cli("train " + cfg + " --set train.run_dir=" + a.string()), 0);
  ASSERT_EQ(run_cli("train " + cfg + " --set train.run_dir=" + b.string() + " --stop-after 3"), 0);
  EXPECT_FALSE(fs::exists(b / "model.safetensors")) << "a stopped run has no final weights yet";
  ASSERT_EQ(run_cli("train " + cfg + " --set train.run_dir=" + b.string() + " --resume"), 0);
  const std::vector<double> losses = logged_losses(a);
  ASSERT_EQ(losses.size(), 6u);
  EXPECT_EQ(logged_losses(b), losses);
  EXPECT_TRUE(bytes(a / "model.safetensors") == bytes(b / "model.safetensors")) << "final weights differ";

  // Killed after the step-4 checkpoint's files are written, before its commit.
  const int rc = run_cli("train " + cfg + " --set train.run_dir=" + c.string(), "ZT_CKPT_FAILPOINT=before_commit:4");
  EXPECT_NE(rc, 0) << "the killed run reported success";
  const fs::path ckdir = c / "checkpoints";
  EXPECT_TRUE(fs::exists(ckdir / ".tmp-step_00000004")) << "the failpoint did not fire where expected";
  EXPECT_FALSE(fs::exists(ckdir / "step_00000004"));
  EXPECT_EQ(ckpt::latest_checkpoint(ckdir.string()), (ckdir / "step_00000002").string());
  EXPECT_EQ(ckpt::list_checkpoints(ckdir.string()), std::vector<int64_t>{2});
  ASSERT_EQ(run_cli("train " + cfg + " --set train.run_dir=" + c.string() + " --resume"), 0);
  EXPECT_EQ(logged_losses(c), losses);
  EXPECT_TRUE(bytes(a / "model.safetensors") == bytes(c / "model.safetensors"));
  EXPECT_FALSE(fs::exists(ckdir / ".tmp-step_00000004")) << "the next save should clear the crashed staging dir";

  // The same crash while a background write (checkpoint.async) commits.
  const fs::path e = *root_ / "cli-crashed-async";
  EXPECT_NE(run_cli("train " + cfg + " --set checkpoint.async=true --set train.run_dir=" + e.string(),
                    "ZT_CKPT_FAILPOINT=before_commit:4"),
            0);
  EXPECT_EQ(ckpt::latest_checkpoint((e / "checkpoints").string()), (e / "checkpoints" / "step_00000002").string());
  EXPECT_EQ(ckpt::list_checkpoints((e / "checkpoints").string()), std::vector<int64_t>{2});

  // `generate` reads a run that stopped early from its latest checkpoint.
  EXPECT_EQ(run_cli("generate --checkpoint " + (*root_ / "cli-crashed-async").string() +
                    " --tokenizer gpt2 --tokens 4 --prompt hello"),
            0);
  // With its KV cache and running each window again: the same sample, all
  // 40 tokens past any end-of-text (--ignore-eot), its count on stderr.
  auto text_of = [](const fs::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const std::string mode : {"cached", "again"}) {
    const fs::path out = *root_ / ("sample-" + mode);
    const std::string cmd = std::string(kBin) + " generate --checkpoint " + e.string() +
                            " --tokenizer gpt2 --tokens 40 --ignore-eot --seed 5 --prompt hello" +
                            (mode == "again" ? " --no-kv-cache" : "") + " > " + out.string() + ".out 2> " +
                            out.string() + ".err";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << text_of(out.string() + ".err");
    const std::string err = text_of(out.string() + ".err");
    EXPECT_NE(err.find(mode == "cached" ? "KV cache;" : "each window run again;"), std::string::npos) << err;
    EXPECT_NE(err.find("generated 40 tokens in"), std::string::npos) << err;
  }
  EXPECT_EQ(text_of(*root_ / "sample-cached.out"), text_of(*root_ / "sample-again.out"));
  EXPECT_GT(text_of(*root_ / "sample-cached.out").size(), 40u);
  // Two samples drawn together (written when both are drawn) are the two
  // drawn alone (written as their tokens come) with seeds 5 and 6.
  const std::string two = std::string(kBin) + " generate --checkpoint " + e.string() +
                          " --tokenizer gpt2 --tokens 40 --ignore-eot --seed 5 --count 2 --prompt hello > " +
                          (*root_ / "sample-two.out").string() + " 2>/dev/null";
  ASSERT_EQ(std::system(two.c_str()), 0);
  const std::string six = std::string(kBin) + " generate --checkpoint " + e.string() +
                          " --tokenizer gpt2 --tokens 40 --ignore-eot --seed 6 --prompt hello > " +
                          (*root_ / "sample-six.out").string() + " 2>/dev/null";
  ASSERT_EQ(std::system(six.c_str()), 0);
  EXPECT_EQ(text_of(*root_ / "sample-two.out"),
            text_of(*root_ / "sample-cached.out") + text_of(*root_ / "sample-six.out"));
  // The prompt read from a file (and from standard input) is the prompt given inline.
  { std::ofstream(*root_ / "prompt.txt") << "hello"; }
  for (const std::string& from : {"--prompt-file " + (*root_ / "prompt.txt").string(),
                                 "--prompt-file - < " + (*root_ / "prompt.txt").string()}) {
    const fs::path out = *root_ / "sample-file.out";
    const std::string cmd = std::string(kBin) + " generate --checkpoint " + e.string() +
                            " --tokenizer gpt2 --tokens 40 --ignore-eot --seed 5 " + from + " > " + out.string() +
                            " 2>/dev/null";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << from;
    EXPECT_EQ(text_of(out), text_of(*root_ / "sample-cached.out")) << from;
  }
  EXPECT_NE(run_cli("generate --checkpoint " + e.string() + " --prompt-file " + (*root_ / "no-such-prompt").string()), 0);

  // Resuming with no checkpoint, or with a run that would overwrite later ones.
  const fs::path d = *root_ / "cli-none";
  EXPECT_NE(run_cli("train " + cfg + " --set train.run_dir=" + d.string() + " --resume"), 0);
  try {
    check_no_future_checkpoints(config("gpt2-tiny", "f32", "cli-straight"), 2);
    ADD_FAILURE() << "no error for a run that would save over step 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step_00000004 exists"), std::string::npos) << e.what();
  }
}

// A trained model, exported with `zettatron convert --to-hf`: PyTorch's
// logits from the exported files equal Zettatron's (fp32); HF -> checkpoint
// -> HF through the CLI is byte-identical.
TEST_F(ResumeTest, ExportedTrainedModelMatchesPyTorchAndRoundTrips) {
  for (const char* preset : {"gpt2-tiny", "llama3-tiny", "llama3-moe-tiny"}) {  // the last as Mixtral
    SCOPED_TRACE(preset);
    const Config cfg = config(preset, "f32", std::string("export-") + preset);
    trainer(cfg)->run();
    const fs::path hf = *root_ / (std::string("hf-") + preset);
    ASSERT_EQ(run_cli("convert --to-hf " + cfg.train.run_dir + " --out " + hf.string()), 0);

    const ModelCheckpoint ck = read_model_checkpoint(cfg.train.run_dir);
    EXPECT_EQ(fs::path(ck.dir).filename(), "step_00000006");
    nn::Transformer model(ck.config.model, DType::f32);
    for (const auto& [name, t] : ck.tensors) std::memcpy(model.param(name).data_ptr(), t.data_ptr(), t.nbytes());
    auto rng = test::make_rng(11);
    const int64_t B = 2, T = 16, V = cfg.model.vocab_size;
    const Tensor tokens = test::random_tokens(Shape{B, T}, V, rng);
    const LogitsComparison cmp = compare_with_hf_reference(model, tokens, hf.string(), hf.string());
    const double num = cmp.max_abs_diff, den = cmp.max_abs_ref;
    EXPECT_GT(den, 0.1);
    EXPECT_LT(num / den, 1e-4) << "max |zettatron - pytorch| = " << num << ", max |logit| = " << den;

    // HF (bf16, sharded) -> checkpoint -> HF: the same bytes in every file.
    const fs::path hf16 = *root_ / (std::string("hf16-") + preset), imported = *root_ / (std::string("imp-") + preset),
                   back = *root_ / (std::string("back-") + preset);
    ASSERT_EQ(run_cli("convert --to-hf " + cfg.train.run_dir + " --out " + hf16.string() +
                      " --dtype bf16 --max-shard-size 2MB"),
              0);
    ASSERT_TRUE(fs::exists(hf16 / "model.safetensors.index.json")) << "expected a sharded export";
    ASSERT_EQ(run_cli("convert --from-hf " + hf16.string() + " --out " + imported.string()), 0);
    ASSERT_EQ(run_cli("convert --to-hf " + imported.string() + " --out " + back.string()), 0);
    size_t files = 0;
    for (const auto& e : fs::directory_iterator(hf16)) {
      ++files;
      EXPECT_TRUE(bytes(e.path()) == bytes(back / e.path().filename())) << e.path().filename() << " differs";
    }
    EXPECT_EQ(files, size_t(std::distance(fs::directory_iterator(back), fs::directory_iterator())));
    // The imported checkpoint fine-tunes (--init-from) and cannot be resumed.
    auto t = trainer(config(preset, "f32", std::string("finetune-") + preset));
    EXPECT_NO_THROW(init_weights_from_checkpoint(*t, imported.string()));
    EXPECT_THROW(restore_checkpoint(*t, imported.string()), Error);
  }
}

TEST_F(ResumeTest, MismatchedModelIsRefusedWithEveryTensorNamed) {
  const Config cfg = config("gpt2-tiny", "f32", "mismatch");
  trainer(cfg)->run(2);
  const Config other = config("gpt2-tiny", "f32", "mismatch", {"model.d_ff=96"});
  auto t = trainer(other);
  try {
    restore_checkpoint(*t, resume_path(other, ""));
    FAIL() << "no error for another model shape";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("model.layers.0.mlp.in.weight: checkpoint (256, 64), model (96, 64)"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("optim.exp_avg.layers.1.mlp.out.weight"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace zt::train
