#include <gtest/gtest.h>

#include "core/error.h"
#include "ops/device.h"
#include "test_util.h"
#include "train/config.h"

namespace zt::train {
namespace {

const char* kBase = R"(
[model]
preset = "gpt2-tiny"
[data]
dir = "somewhere"
[train]
seq_len = 32
global_batch = 8
micro_batch = 4
steps = 3
)";

std::string error_of(const std::string& toml, const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(toml, "test.toml", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

::testing::AssertionResult has(const std::string& msg, const std::string& part) {
  if (msg.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "message '" << msg << "' lacks '" << part << "'";
}

TEST(Config, PresetThenOverrides) {
  Config c = parse_config(std::string(kBase) + "", "t", {"model.n_layer=3", "train.steps=7", "data.dir=a/b c"});
  EXPECT_EQ(c.model_preset, "gpt2-tiny");
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.d_model, 64);  // from the preset
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.data.dir, "a/b c");
  EXPECT_EQ(c.grad_accum_steps(), 2);
  EXPECT_FALSE(c.adamw().stochastic_rounding);
  c = parse_config(kBase, "t", {"train.dtype=\"bf16\"", "optim.stochastic_rounding=true", "train.seed=42"});
  EXPECT_TRUE(c.adamw().stochastic_rounding);
  EXPECT_EQ(c.adamw().seed, 42u);
}

TEST(Config, UnknownKeyNamesTheClosestValidOne) {
  std::string msg = error_of(std::string(kBase) + "stpes = 4\n");
  EXPECT_TRUE(has(msg, "unknown config key 'train.stpes'"));
  EXPECT_TRUE(has(msg, "did you mean 'train.steps'"));
  EXPECT_TRUE(has(msg, "test.toml"));
  // A key in the wrong section finds its home.
  msg = error_of(std::string(kBase) + "lr = 0.1\n");
  EXPECT_TRUE(has(msg, "did you mean 'optim.lr'"));
  msg = error_of(std::string(kBase) + "[optimizer]\nlr = 1\n");
  EXPECT_TRUE(has(msg, "unknown config section [optimizer]"));
  msg = error_of(kBase, {"train.setps=3"});
  EXPECT_TRUE(has(msg, "did you mean 'train.steps'"));
}

TEST(Config, WrongTypesAreNamed) {
  EXPECT_TRUE(has(error_of(std::string(kBase) + "seed = \"7\"\n"), "train.seed must be an integer, got string"));
  EXPECT_TRUE(has(error_of(std::string(kBase) + "[optim]\nlr = \"fast\"\n"), "optim.lr must be a number"));
  EXPECT_TRUE(has(error_of(std::string(kBase) + "[optim]\ndecay_embeddings = 1\n"), "must be true or false"));
  EXPECT_TRUE(has(error_of("[train\nsteps = 1"), "not valid TOML"));
}

TEST(Config, InconsistentSettingsAreRejectedWithTheFix) {
  EXPECT_TRUE(has(error_of(kBase, {"model.n_head=5"}), "model.n_head = 5 does not divide model.d_model = 64"));
  EXPECT_TRUE(has(error_of(kBase, {"model.arch=\"llama3\"", "model.n_kv_head=3"}),
                  "model.n_kv_head = 3 does not divide model.n_head = 4"));
  EXPECT_TRUE(has(error_of(kBase, {"train.seq_len=65"}), "longer than the model's context"));
  EXPECT_TRUE(has(error_of(kBase, {"sample.top_p=0"}), "sample.top_p must be in (0, 1] (1: no nucleus filtering)"));
  EXPECT_TRUE(has(error_of(kBase, {"sample.top_p=1.5"}), "sample.top_p must be in (0, 1]"));
  EXPECT_TRUE(has(error_of(kBase, {"sample.temperature=-0.5"}), "sample.temperature must be >= 0 (0: the most likely"));
  EXPECT_NO_THROW(parse_config(kBase, "t", {"sample.temperature=0", "sample.top_p=0.9"}));
  EXPECT_TRUE(has(error_of(kBase, {"train.micro_batch=3"}),
                  "train.global_batch = 8 is not divisible by train.micro_batch = 3"));
  EXPECT_TRUE(has(error_of(kBase, {"train.dtype=\"f16\""}), "train.dtype"));
  EXPECT_TRUE(has(error_of(kBase, {"train.recompute=\"most\""}), "valid: none, selective, full"));
  EXPECT_TRUE(has(error_of(kBase, {"model.preset=\"gpt5\""}), "unknown model preset 'gpt5'"));
  EXPECT_TRUE(has(error_of(kBase, {"optim.min_lr=1.0"}), "optim.min_lr"));
  EXPECT_TRUE(has(error_of(kBase, {"data.dir=\"\""}), "data.dir is empty"));
  EXPECT_TRUE(has(error_of(kBase, {"optim.stochastic_rounding=true"}),
                  "optim.stochastic_rounding rounds bf16 weights from their f32 master, but train.dtype = \"f32\""));
  EXPECT_TRUE(has(error_of(kBase, {"optim.stochastic_rounding=true", "train.dtype=\"f16\"", "train.device=\"cuda\""}),
                  "has f16 weights"));
  EXPECT_TRUE(has(error_of(kBase, {"metrics.profiler_capture_step=-2"}),
                  "metrics.profiler_capture_step must be >= 0 (0: no capture), not -2"));
  EXPECT_TRUE(has(error_of(kBase, {"metrics.profiler_capture_step=4"}),
                  "metrics.profiler_capture_step = 4 comes after the run's last step (train.steps = 3)"));
  EXPECT_EQ(error_of(kBase, {"metrics.profiler_capture_step=3"}), "");
  EXPECT_TRUE(has(error_of(kBase, {"metrics.trace_step=4"}),
                  "metrics.trace_step = 4 comes after the run's last step (train.steps = 3), so no trace would be "
                  "written; pick a step from 1 to 3, or 0 for none"));
  EXPECT_TRUE(has(error_of(kBase, {"metrics.pipeline_trace_step=5"}),
                  "metrics.pipeline_trace_step = 5 comes after the run's last step"));
  EXPECT_EQ(error_of(kBase, {"metrics.trace_step=3", "metrics.pipeline_trace_step=1"}), "");
}

// data.blend: "DIR WEIGHT, ..." in order, spaces in a folder's name kept;
// each malformed entry named with the form to write; not beside data.dir.
TEST(Config, DataBlendListsDatasetsAndWeights) {
  const Config one = parse_config(kBase, "test.toml");
  ASSERT_EQ(one.data_parts().size(), 1u);
  EXPECT_EQ(one.data_parts()[0].dir, "somewhere");
  EXPECT_EQ(one.data_parts()[0].weight, 1.0);
  const Config mix =
      parse_config(kBase, "test.toml", {"data.dir=\"\"", "data.blend=\" data/web 0.7,data/my code\t0.25 , x 1e-3\""});
  const std::vector<data::BlendPart> parts = mix.data_parts();
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].dir, "data/web");
  EXPECT_EQ(parts[0].weight, 0.7);
  EXPECT_EQ(parts[1].dir, "data/my code");
  EXPECT_EQ(parts[1].weight, 0.25);
  EXPECT_EQ(parts[2].dir, "x");
  EXPECT_EQ(parts[2].weight, 1e-3);
  const std::string no_dir = "data.dir=\"\"";
  EXPECT_TRUE(has(error_of(kBase, {"data.blend=\"a 1\""}), "are both set; train on one dataset (data.dir) or a mix"));
  EXPECT_TRUE(has(error_of(kBase, {no_dir, "data.blend=\"a 1, b\""}),
                  "data.blend entry 2 ('b') has no weight; write data.blend as \"DIR WEIGHT, DIR WEIGHT, ...\""));
  EXPECT_TRUE(has(error_of(kBase, {no_dir, "data.blend=\"a 1, b heavy\""}),
                  "data.blend entry 2 ('b heavy'): the weight 'heavy' is not a positive number"));
  EXPECT_TRUE(has(error_of(kBase, {no_dir, "data.blend=\"a 0\""}), "the weight '0' is not a positive number"));
  EXPECT_TRUE(has(error_of(kBase, {no_dir, "data.blend=\"a 1,,b 2\""}), "data.blend entry 2 is empty"));
  EXPECT_TRUE(has(error_of(kBase, {no_dir}), "data.dir is empty"));
}

// Parallel layouts the model or schedule cannot take: one message naming the
// setting and the fix, from pure checks (the same on every rank).
TEST(Config, ParallelLayoutsThatDoNotFitAreRejectedWithTheFix) {
  // Context parallelism: two equal chunks per rank; expert parallelism not built.
  EXPECT_EQ(error_of(kBase, {"parallel.cp=4"}), "");  // 32 tokens = 8 chunks of 4
  EXPECT_TRUE(has(error_of(kBase, {"parallel.cp=3"}),
                  "parallel.cp = 3 cuts each sequence into 2 cp = 6 equal chunks (two per rank, for balance), but "
                  "train.seq_len = 32 is not a multiple of 6"));
  EXPECT_EQ(error_of(kBase, {"parallel.cp=2", "parallel.pp=2"}), "");
  EXPECT_TRUE(has(error_of(kBase, {"parallel.ep=2"}),
                  "parallel.ep = 2 splits the experts of a mixture-of-experts model, but model.n_expert = 0"));
  // Mixture of experts: Llama blocks, k of E, no tensor-parallel experts yet.
  const std::vector<std::string> moe{"model.arch=\"llama3\"", "model.n_kv_head=2", "model.n_expert=4"};
  EXPECT_EQ(error_of(kBase, moe), "");
  EXPECT_TRUE(has(error_of(kBase, {"model.n_expert=4"}),
                  "model.n_expert = 4: mixture-of-experts blocks are built for arch = \"llama3\""));
  auto with = [&](std::vector<std::string> v, const std::string& more) {
    v.push_back(more);
    return v;
  };
  EXPECT_TRUE(has(error_of(kBase, with(moe, "model.expert_top_k=5")), "model.expert_top_k = 5 must be in [1, n_expert = 4]"));
  EXPECT_TRUE(has(error_of(kBase, with(moe, "model.router_aux_loss=-1")), "model.router_aux_loss = -1 must be"));
  EXPECT_EQ(error_of(kBase, with(moe, "parallel.tp=2")), "");  // each expert's hidden width over tp
  EXPECT_TRUE(has(error_of(kBase, with(with(moe, "model.shared_expert_ff=33"), "parallel.tp=2")),
                  "parallel.tp = 2 does not divide model.shared_expert_ff = 33"));
  EXPECT_TRUE(has(error_of(kBase, {"model.shared_expert_ff=64"}),
                  "model.shared_expert_ff = 64 adds a shared expert beside a mixture of experts, but model.n_expert = 0"));
  EXPECT_TRUE(has(error_of(kBase, with(moe, "model.shared_expert_ff=-1")), "model.shared_expert_ff must be >= 0"));
  EXPECT_TRUE(has(error_of(kBase, with(moe, "model.router_bias_update_rate=-0.001")),
                  "model.router_bias_update_rate = -0.001 must be a finite number >= 0"));
  EXPECT_TRUE(has(error_of(kBase, {"model.router_bias_update_rate=0.001"}),
                  "balances a mixture of experts, but model.n_expert = 0"));
  EXPECT_TRUE(has(error_of(kBase, with(moe, "model.expert_capacity_factor=-1")),
                  "model.expert_capacity_factor = -1 must be a finite number >= 0 (0: dropless"));
  EXPECT_TRUE(has(error_of(kBase, {"model.expert_capacity_factor=1.25"}),
                  "bounds the experts of a mixture, but model.n_expert = 0"));
  EXPECT_EQ(error_of(kBase, with(with(moe, "parallel.cp=2"), "parallel.pp=2")), "");
  EXPECT_EQ(error_of(kBase, with(moe, "parallel.ep=4")), "");
  EXPECT_TRUE(has(error_of(kBase, with(moe, "parallel.ep=3")), "parallel.ep = 3 must divide model.n_expert = 4"));
  EXPECT_TRUE(has(error_of(kBase, {"parallel.tp=3"}), "parallel.tp = 3 does not divide model.n_head = 4"));
  EXPECT_TRUE(has(error_of(kBase, {"parallel.tp=2", "parallel.sequence_parallel=true", "train.seq_len=3",
                                   "train.micro_batch=1"}),
                  "make it a multiple of tp"));
  EXPECT_TRUE(has(error_of(kBase, {"parallel.pp=3"}),
                  "the model has 2 blocks (model.n_layer) but the pipeline has 3 stages"));
  EXPECT_TRUE(has(error_of(kBase, {"parallel.pp=2", "parallel.pp_schedule=\"gpipe\""}), "valid: afab, 1f1b, interleaved, zb"));
  EXPECT_TRUE(has(error_of(kBase, {"parallel.pp=2", "parallel.virtual_stages=2"}), "needs pp_schedule = interleaved"));
  EXPECT_TRUE(has(error_of(kBase, {"parallel.pp=2", "parallel.pp_schedule=\"interleaved\""}),
                  "needs parallel.virtual_stages >= 2"));
  EXPECT_TRUE(has(error_of(kBase, {"parallel.pp=2", "parallel.pp_schedule=\"interleaved\"", "parallel.virtual_stages=2"}),
                  "the pipeline has 4 stages"));
  EXPECT_TRUE(has(error_of(kBase, {"parallel.virtual_stages=2"}), "it needs parallel.pp > 1"));
  EXPECT_TRUE(has(error_of(kBase, {"parallel.pp=2", "parallel.pp_layers=\"2,1\""}), "adds up to 3 blocks, but the model has 2"));
  EXPECT_TRUE(has(error_of(kBase, {"parallel.comm_backend=\"gloo\""}), "choose auto, mpi, solo or nccl"));
  EXPECT_TRUE(has(error_of(kBase, {"parallel.comm_backend=\"nccl\""}), "it needs train.device = cuda"));
}

// What a resolved mesh needs of the config (Config::check_layout, asked by
// the trainer and the planner's search alike): whole micro-batches per dp
// rank, cp and MoE on the CPU only so far, the schedule's micro-batches.
TEST(Config, LayoutChecksNameTheFix) {
  const Config c = parse_config(kBase, "test.toml");
  const auto layout_error = [](const Config& cfg, parallel::MeshShape mesh) {
    try {
      cfg.check_layout(mesh);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(layout_error(c, {2, 1, 1, 1, 1}), "");
  EXPECT_TRUE(has(layout_error(c, {4, 1, 1, 1, 1}),
                  "train.global_batch = 8 is not divisible by micro_batch x dp = 4 x 4"));
  EXPECT_EQ(layout_error(c, {1, 1, 1, 2, 1}), "") << "context parallelism runs on any device";
  const Config moe = parse_config(kBase, "test.toml", {"model.arch=\"llama3\"", "model.n_kv_head=2", "model.n_expert=4"});
  EXPECT_EQ(layout_error(moe, {1, 1, 1, 1, 1}), "");
  const Config capped = parse_config(kBase, "test.toml", {"model.arch=\"llama3\"", "model.n_kv_head=2",
                                                          "model.n_expert=4", "model.expert_capacity_factor=1.25"});
  EXPECT_EQ(layout_error(capped, {2, 1, 1, 1, 2}), "");
  EXPECT_EQ(layout_error(capped, {1, 1, 1, 2, 1}), "") << "a capacity's first come spans the cp group (nn/moe.h)";
  // Interleaving 2 chunks over pp = 2 needs the micro-batches in multiples of pp: 8 / 4 = 2 is; 8 / (4 x 2) = 1 not.
  const Config il = parse_config(kBase, "test.toml", {"model.n_layer=4", "parallel.pp=2",
                                                      "parallel.pp_schedule=\"interleaved\"", "parallel.virtual_stages=2"});
  EXPECT_EQ(layout_error(il, {1, 1, 2, 1, 1}), "");
  EXPECT_NE(layout_error(il, {2, 1, 2, 1, 1}), "");
}

TEST(Config, AutoDeviceIsThisMachinesGpuElseTheCpu) {
  const Config c = parse_config(kBase, "t", {"train.device=\"auto\""});
  EXPECT_EQ(c.train.device, ops::gpu_count() > 0 ? "cuda" : "cpu") << "GPUs usable here: " << ops::gpu_count();
  EXPECT_TRUE(has(to_toml(c), "device = \"" + c.train.device + "\"")) << "runs record the device they ran on";
  EXPECT_TRUE(has(error_of(kBase, {"train.device=\"gpu\""}),
                  "train.device = \"gpu\" is not a device: use \"cpu\", \"cuda\", \"cuda:N\" or \"auto\""));
}

TEST(Config, LocalRanksGetTheirGpuOrShareOnlyThroughTheStagedMpiPath) {
  // One GPU per process: the local rank's, whatever the backend.
  EXPECT_EQ(local_gpu(3, 8, 8, "auto"), Device::cuda(3));
  EXPECT_EQ(local_gpu(1, 2, 4, "nccl"), Device::cuda(1));
  // Fewer GPUs than processes: shared round-robin through host staging ...
  EXPECT_EQ(local_gpu(0, 2, 1, "mpi"), Device::cuda(0));
  EXPECT_EQ(local_gpu(1, 2, 1, "mpi"), Device::cuda(0));
  EXPECT_EQ(local_gpu(5, 8, 2, "mpi"), Device::cuda(1));
  // ... and refused for NCCL, naming both fixes.
  for (const char* backend : {"auto", "nccl"}) {
    const std::string e = test::error_of([&] { local_gpu(1, 2, 1, backend); });
    EXPECT_TRUE(has(e, "2 processes on this node share its 1 GPU(s), but NCCL needs one GPU per process")) << e;
    EXPECT_TRUE(has(e, "launch at most 1 processes per node, or set parallel.comm_backend = mpi")) << e;
    // A launcher that binds one GPU per process (each sees one): the way out.
    EXPECT_TRUE(has(e, "(srun --gpus-per-task, CUDA_VISIBLE_DEVICES set per rank), set train.device = \"cuda:0\""))
        << e;
  }
  // No GPU at all: the device's own initialisation names the problem later.
  EXPECT_EQ(local_gpu(1, 2, 0, "auto"), Device::cuda(1));
}

TEST(Config, Gpt2KvHeadsFollowHeads) {
  Config c = parse_config(kBase, "t", {"model.n_head=2"});
  EXPECT_EQ(c.model.n_kv_head, 2);
  c = parse_config(kBase, "t", {"model.arch=\"llama3\"", "model.n_head=8", "model.n_kv_head=2"});
  EXPECT_EQ(c.model.n_kv_head, 2);
}

TEST(Config, ResolvedTomlRoundTrips) {
  Config c = parse_config(kBase, "t", {"optim.lr=0.00123", "model.rope_theta=12345.5", "sample.prompt=\"a \\\"q\\\"\""});
  const std::string once = to_toml(c);
  Config again = parse_config(once, "resolved");
  EXPECT_EQ(to_toml(again), once);
  EXPECT_DOUBLE_EQ(again.optim.lr, 0.00123);
  EXPECT_EQ(again.sample.prompt, "a \"q\"");
  EXPECT_EQ(again.model.n_layer, c.model.n_layer);
}

// What a resumed run prints: every setting whose value changed, old ->
// new in TOML, in the config's order; nothing for the same settings (a
// saved config read back included).
TEST(Config, ChangedSettingsListEachChangeOnce) {
  const Config before = parse_config(kBase, "t", {"train.dtype=bf16", "train.fp8=true"});
  EXPECT_TRUE(changed_settings(before, before).empty());
  EXPECT_TRUE(changed_settings(parse_saved_config(to_toml(before), "saved"), before).empty());
  const Config after = parse_config(kBase, "t", {"train.steps=7", "optim.lr=0.001", "sample.prompt=\"hi\""});
  EXPECT_EQ(changed_settings(before, after),
            (std::vector<std::string>{"train.dtype: \"bf16\" -> \"f32\"", "train.steps: 3 -> 7",
                                      "train.fp8: true -> false", "optim.lr: 0.0006 -> 0.001",
                                      "sample.prompt: \"\" -> \"hi\""}));
  const Config llama = parse_config(kBase, "t", {"model.preset=llama3-tiny"});
  const std::vector<std::string> arch = changed_settings(before, llama);
  ASSERT_GE(arch.size(), 2u);
  EXPECT_EQ(arch[0], "model.preset: \"gpt2-tiny\" -> \"llama3-tiny\"");
  EXPECT_EQ(arch[1], "model.arch: \"gpt2\" -> \"llama3\"");
}

TEST(Config, ShippedConfigsLoad) {
  for (const char* name : {"demo", "bench", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "llama3-1b",
                           "llama3-3b", "llama3-8b"}) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(load_config(std::string(ZT_SOURCE_DIR) + "/configs/" + name + ".toml"));
  }
}

}  // namespace
}  // namespace zt::train
