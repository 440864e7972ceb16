// `zettatron info`: the activation estimate against the allocator's
// measurement of a real step, and when the measured step is skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "nn/ring_attention.h"
#include "ops/device.h"
#include "train/config.h"
#include "train/info.h"
#include "train/train_test_util.h"
#include "train/trainer.h"

namespace zt::train {
namespace {

Config config_of(const std::string& preset, const std::vector<std::string>& overrides = {}) {
  const std::string toml = "[model]\npreset = \"" + preset +
                           "\"\n[data]\ndir = \"somewhere\"\n[train]\ndevice = \"cpu\"\nseq_len = 64\n"
                           "global_batch = 4\nmicro_batch = 4\nsteps = 1\n";
  return parse_config(toml, "info_test.toml", overrides);
}

::testing::AssertionResult has(const std::string& msg, const std::string& part) {
  if (msg.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << msg << "' lacks '" << part << "'";
}

// The analytic estimate (what a user plans with) within 1% of the bytes a
// real step holds at its peak, for every policy, both architectures, f32 and
// bf16, a shallow and a deeper shape: a tensor per block, or the backward's
// gradients in flight, left out of the estimate are 3-20% of it.
class InfoEstimate : public ::testing::TestWithParam<std::tuple<std::string, std::string, bool>> {};

TEST_P(InfoEstimate, MatchesTheMeasuredStepForEveryPolicy) {
  const auto [preset, dtype, deeper] = GetParam();
  std::vector<std::string> overrides = {std::string("train.dtype=\"") + dtype + "\""};
  if (deeper)  // 6 blocks of width 128, 2 x 128 tokens, a larger vocabulary
    overrides.insert(overrides.end(), {"model.n_layer=6", "model.d_model=128", "model.max_seq_len=128",
                                       "model.vocab_size=3000", "train.seq_len=128", "train.micro_batch=2",
                                       "train.global_batch=2"});
  const Config cfg = config_of(preset, overrides);
  const InfoReport r = make_info(cfg, Measure::always);
  EXPECT_EQ(r.measured_on, "cpu");
  EXPECT_EQ(r.measure_skipped, "");
  ASSERT_EQ(r.activations.size(), 3u);
  for (const PolicyMemory& pm : r.activations) {
    SCOPED_TRACE(std::string(nn::recompute_name(pm.policy)));
    ASSERT_GT(pm.measured_activation_bytes, 0);
    EXPECT_NEAR(double(pm.estimated_activation_bytes), double(pm.measured_activation_bytes),
                0.01 * double(pm.measured_activation_bytes));
  }
  // Recompute keeps less: the policies are not measured the same by accident.
  EXPECT_GT(r.activations[0].measured_activation_bytes, r.activations[1].measured_activation_bytes);
  EXPECT_GT(r.activations[1].measured_activation_bytes, r.activations[2].measured_activation_bytes);
  const std::string text = format_info(cfg, r);
  EXPECT_TRUE(has(text, "measured: one training step per policy on cpu"));
}

INSTANTIATE_TEST_SUITE_P(Presets, InfoEstimate,
                         ::testing::Combine(::testing::Values(std::string("gpt2-tiny"), std::string("llama3-tiny")),
                                            ::testing::Values(std::string("f32"), std::string("bf16")),
                                            ::testing::Bool()),
                         [](const auto& info) {  // gpt2_tiny_f32, ..._deeper
                           std::string name = std::get<0>(info.param) + "_" + std::get<1>(info.param) +
                                              (std::get<2>(info.param) ? "_deeper" : "");
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(Info, MeasureCostVerdictNamesWhatIsTooLarge) {
  const int64_t GiB = int64_t(1) << 30;
  // Affordable: fits, and 1 TFLOP at 100 GFLOP/s is 10 s.
  EXPECT_EQ(measure_cost_verdict(Device::cpu(), 2 * GiB, 8 * GiB, 1e12, 100), "");
  // Memory: both amounts named (a process past the host's memory is killed, not told).
  const std::string mem = measure_cost_verdict(Device::cpu(), 80 * GiB, 23 * GiB, 1e12, 100);
  EXPECT_TRUE(has(mem, "80.0 GiB on cpu")) << mem;
  EXPECT_TRUE(has(mem, "23.0 GiB are free")) << mem;
  // Time on a CPU: 200 TFLOP at 100 GFLOP/s is 2000 s.
  const std::string slow = measure_cost_verdict(Device::cpu(), GiB, 0, 200e12, 100);
  EXPECT_TRUE(has(slow, "200 TFLOP, about 33 minutes on the CPU (sgemm 100 GFLOP/s)")) << slow;
  EXPECT_TRUE(has(measure_cost_verdict(Device::cpu(), GiB, 0, 15e12, 100), "about 150 seconds"));
  // Unknown free memory is not checked; a GPU's time is not a concern.
  EXPECT_EQ(measure_cost_verdict(Device::cpu(), 1000 * GiB, 0, 1e12, 100), "");
  EXPECT_EQ(measure_cost_verdict(Device::cuda(0), GiB, 0, 200e12, 0), "");
}

TEST(Info, MeasuredStepIsSkippedWhenUnaffordable) {
  // Llama 3 8B at micro-batch 8 x 1024 is out of reach of any CPU's budget
  // (and of most hosts' memory): estimates only, and the reason says so.
  const Config cfg = config_of("llama3-8b", {"train.seq_len=1024", "train.global_batch=8", "train.micro_batch=8",
                                             "train.dtype=\"bf16\""});
  const InfoReport r = make_info(cfg, Measure::when_affordable);
  EXPECT_EQ(r.measured_on, "");
  EXPECT_FALSE(r.measure_skipped.empty());
  for (const PolicyMemory& pm : r.activations) {
    EXPECT_EQ(pm.measured_activation_bytes, -1);
    EXPECT_GT(pm.estimated_activation_bytes, 0);
  }
  EXPECT_TRUE(has(format_info(cfg, r), "not measured: " + r.measure_skipped + "; `--measure` runs it anyway"));
  // The step's size: 6N + attention per token, three policies' worth.
  EXPECT_GT(measured_step_flops(cfg), 3 * 6 * 8e9 * 8192);
  EXPECT_GT(measured_step_bytes(r), r.param_bytes + r.grad_bytes);
}

// The plan a run is checked against before it allocates: the same bytes
// `info` reports, a verdict only past the 2% margin, and the way out it names
// fits the same capacity.
TEST(MemoryPlan, VerdictNamesWhatFitsAndOnlyPastTheMargin) {
  const Config cfg = config_of("gpt2-tiny", {"train.global_batch=8", "train.micro_batch=8"});
  const MemoryPlan plan = plan_memory(cfg);
  const InfoReport r = make_info(cfg, Measure::off);
  EXPECT_EQ(plan.weights, r.param_bytes);
  EXPECT_EQ(plan.gradients, r.grad_bytes);
  EXPECT_EQ(plan.optimizer, r.optimizer_bytes);
  EXPECT_EQ(plan.activations, r.activations[0].estimated_activation_bytes);  // recompute none
  EXPECT_EQ(plan.workspace, -1) << "the CPU's scratch is not planned";
  EXPECT_EQ(r.workspace_bytes, -1);
  EXPECT_EQ(memory_plan_verdict(cfg, PlanPlace{}, Device::cpu(), plan.total()), "");
  EXPECT_EQ(memory_plan_verdict(cfg, PlanPlace{}, Device::cpu(), int64_t(double(plan.total()) / 1.01)), "");
  EXPECT_EQ(memory_plan_verdict(cfg, PlanPlace{}, Device::cpu(), 0), "") << "an unknown capacity is not checked";
  // Between micro-batch 4's plan and 8's: 4 is named (it divides the batch).
  Config half = cfg;
  half.train.micro_batch = 4;
  const int64_t between = (plan_memory(half).total() + int64_t(double(plan.total()) / 1.02)) / 2;
  ASSERT_LT(plan_memory(half).total(), between);
  const std::string v = memory_plan_verdict(cfg, PlanPlace{}, Device::cpu(), between);
  EXPECT_TRUE(has(v, "train.micro_batch = 8 would run out of memory on cpu")) << v;
  EXPECT_TRUE(has(v, "with recompute none")) << v;
  EXPECT_TRUE(has(v, "train.micro_batch = 4 about")) << v;
  // Full recompute keeps a third of the blocks' bytes: it fits too, and is
  // named. Each way out it names passes the same capacity.
  EXPECT_TRUE(has(v, "or train.recompute = \"full\" about")) << v;
  EXPECT_EQ(memory_plan_verdict(half, PlanPlace{}, Device::cpu(), between), "");
  Config full = cfg;
  full.train.recompute = "full";
  EXPECT_EQ(memory_plan_verdict(full, PlanPlace{}, Device::cpu(), between), "");
  // Nothing fits: the way out is more devices.
  const std::string none = memory_plan_verdict(cfg, PlanPlace{}, Device::cuda(0), 1024);
  EXPECT_TRUE(has(none, "out of memory on cuda:0")) << none;
  EXPECT_TRUE(has(none, "and cuda:0 has 0.0 GiB free for it")) << none;
  EXPECT_TRUE(has(none, "parallel.zero_stage")) << none;
  EXPECT_TRUE(has(v, "and cpu has ")) << v;
}

// On a GPU the host can hold what the device cannot: the verdict names
// offloading too, and the offloaded plan leaves the optimizer's bytes to
// the host (the CPU's verdict does not: its host is its device).
TEST(MemoryPlan, VerdictOnAGpuNamesOffloading) {
  const Config cfg = config_of("gpt2-tiny", {"train.global_batch=8", "train.micro_batch=8", "train.recompute=full",
                                             "train.device=cuda"});
  Config off = cfg;
  off.optim.offload = true;
  const MemoryPlan plain = plan_memory(cfg), offloaded = plan_memory(off);
  EXPECT_FALSE(offloaded.offload_on_device);
  EXPECT_EQ(offloaded.optimizer, 0);
  EXPECT_GT(offloaded.offload, plain.optimizer) << "its own master and the staging besides m and v";
  EXPECT_EQ(plain.total() - offloaded.total(), plain.optimizer);
  const int64_t between = (offloaded.total() + int64_t(double(plain.total()) / 1.02)) / 2;
  ASSERT_GT(between, int64_t(1.02 * double(offloaded.total())));
  const std::string v = memory_plan_verdict(cfg, PlanPlace{}, Device::cuda(0), between);
  EXPECT_TRUE(has(v, "optim.offload = true about")) << v;
  EXPECT_EQ(memory_plan_verdict(off, PlanPlace{}, Device::cuda(0), between), "");
  Config host = cfg;
  host.train.device = "cpu";
  const int64_t cpu_between = (plan_memory(host).total() * 99) / 100;
  EXPECT_FALSE(has(memory_plan_verdict(host, PlanPlace{}, Device::cpu(), cpu_between), "offload"));
}

// Context parallelism in the plan: a cp rank is a dp x cp replica of
// seq_len / cp tokens plus the ring's buffers while a layer's attention runs
// (their bytes against the allocator: memory_plan_test under mpirun); the
// layout says its cp group and the verdict's other splits keep it.
TEST(MemoryPlan, ContextParallelRanksHoldTheRingAndKeepTheirGroup) {
  const Config cfg = config_of("gpt2-tiny", {"train.global_batch=8", "train.micro_batch=8", "parallel.dp=2",
                                             "parallel.cp=2"});
  const PlanView view = context_parallel_view(cfg, PlanPlace{2, 1, 1});
  EXPECT_EQ(view.layout.dp, 4);
  EXPECT_EQ(view.layout.cp, 2);
  EXPECT_EQ(view.cfg.train.seq_len, cfg.train.seq_len / 2);
  EXPECT_EQ(describe_layout(view.layout), "dp 2 x cp 2 x tp 1 x pp 1");
  const MemoryPlan plan = plan_memory(view.cfg, view.layout);
  const nn::ModelConfig& m = cfg.model;
  const nn::RingBuffers ring = nn::ring_attention_buffers(8, cfg.train.seq_len / 2, m.n_head, m.n_kv_head,
                                                          m.head_dim(), DType::f32, 2);
  EXPECT_GT(ring.comm, 0);
  EXPECT_GT(ring.workspace, 0);
  EXPECT_EQ(plan.ring_comm, ring.comm);
  EXPECT_EQ(plan.ring_workspace, ring.workspace);
  // The same replica without the ring (cp 1 at the view's sizes) holds the
  // rest alike, but for the trainer's host batch of whole sequences (i32
  // tokens and targets, twice the view's).
  PlanPlace no_ring = view.layout;
  no_ring.cp = 1;
  const MemoryPlan replica = plan_memory(view.cfg, no_ring);
  EXPECT_EQ(replica.ring_comm + replica.ring_workspace, 0);
  const int64_t other_half_of_the_batch = 2 * 4 * cfg.train.micro_batch * view.cfg.train.seq_len;
  EXPECT_EQ(plan.total(), replica.total() + ring.comm + ring.workspace + other_half_of_the_batch);
  const std::string line = format_memory_plan(plan, Device::cpu(), 0);
  EXPECT_TRUE(has(line, " + ring attention ")) << line;
  EXPECT_FALSE(has(format_memory_plan(replica, Device::cpu(), 0), "ring")) << line;
  // Just past the margin: the other splits the verdict names keep cp = 2
  // (dp 1 x cp 2 with tp or pp 2; none of the 4 view processes' splits
  // without it, which would plan seq_len / 2 tokens for a run of seq_len).
  const std::string v =
      memory_plan_verdict(view.cfg, view.layout, Device::cpu(), int64_t(double(plan.total()) / 1.03));
  EXPECT_TRUE(has(v, "every rank of dp 2 x cp 2 x tp 1 x pp 1 needs about weights")) << v;
  EXPECT_TRUE(has(v, "parallel.dp = 1, tp = 1, pp = 2 (cp = 2) about") ||
              has(v, "parallel.dp = 1, tp = 2, pp = 1 (cp = 2) about"))
      << v;
  EXPECT_FALSE(has(v, "parallel.dp = 4")) << v;
  EXPECT_FALSE(has(v, "tp = 4")) << v;
  // An expert capacity counts the micro-batch's slots under cp (nn/moe.h):
  // at c = 0.5 over 2 ranks a rank whose slots come first may keep all of
  // its N k, so the bound is the dropless rows; the same tokens as their own
  // routing call (cp 1) keep at most half.
  const auto moe_activations = [&](const char* factor, int64_t cp) {
    const Config moe = config_of("llama3-moe-tiny", {"train.global_batch=8", "train.micro_batch=8", "parallel.dp=2",
                                                     "parallel.cp=2", std::string("model.expert_capacity_factor=") + factor});
    PlanView at = context_parallel_view(moe, PlanPlace{2, 1, 1});
    at.layout.cp = cp;
    return plan_memory(at.cfg, at.layout).activations;
  };
  EXPECT_EQ(moe_activations("0.5", 2), moe_activations("0", 2));
  EXPECT_LT(moe_activations("0.5", 1), moe_activations("0", 1));
}

// What a training process plans in: a GPU's free memory (the CUDA context,
// libraries, NCCL and other processes hold the rest) shared among the
// processes on it, plus what its own allocator already holds, never past its
// share of the total; the host's physical memory.
TEST(MemoryPlan, UsableMemoryIsTheFreeShareAndWhatTheProcessHolds) {
  const int64_t G = int64_t(1) << 30;
  EXPECT_EQ(usable_share(77 * G, 80 * G, 0, 1), 77 * G) << "the context and libraries hold 3 GiB";
  EXPECT_EQ(usable_share(77 * G, 80 * G, 2 * G, 1), 79 * G) << "the allocator's own cached blocks are usable";
  EXPECT_EQ(usable_share(79 * G, 80 * G, 4 * G, 1), 80 * G) << "never past the total";
  EXPECT_EQ(usable_share(60 * G, 80 * G, 1 * G, 4), 16 * G) << "four processes on one GPU: 15 free each + 1 held";
  EXPECT_EQ(usable_share(72 * G, 80 * G, 0, 0), 72 * G) << "no count of processes is one process";
  const TrainingMemory host = training_memory(Device::cpu(), 2);
  EXPECT_EQ(host.usable, device_capacity_bytes(Device::cpu(), 2));
  EXPECT_EQ(host.total, host.usable);
  EXPECT_GT(host.usable, 0);
}

// A GPU's workspace (ops/workspace.h) counts in the plan's total, is named
// in its line and stands in the workspace row of the end-of-run table.
TEST(MemoryPlan, APlannedWorkspaceCountsAndIsShown) {
  const int64_t MiB = int64_t(1) << 20;
  MemoryPlan p;
  p.weights = 1 * MiB;
  p.activations = 2 * MiB;
  EXPECT_EQ(p.total(), 3 * MiB);
  EXPECT_FALSE(has(format_memory_plan(p, Device::cpu(), 0), "workspace"));
  p.workspace = 5 * MiB;
  EXPECT_EQ(p.total(), 8 * MiB);
  EXPECT_TRUE(has(format_memory_plan(p, Device::cuda(0), 0), "activations 2.0 + workspace 5.0 = 8.0 MiB"));
  const std::string table = format_memory_against_plan(MemStats{}, p);
  const size_t row = table.find("\nworkspace ");
  ASSERT_NE(row, std::string::npos) << table;
  const std::string line = table.substr(row + 1, table.find('\n', row + 1) - row - 1);
  EXPECT_EQ(line.substr(line.size() - 5), " 5.00") << line;
}

// The splits of a world the config can run, in their order, each with its
// largest rank's plan; a run that fits only under another split is told so.
TEST(MemoryPlan, SplitsOfTheProcessesAndTheVerdictNamesOneThatFits) {
  // gpt2-tiny: 4 heads (tp 1, 2, 4), 2 blocks (pp 1, 2), 8 sequences in
  // micro-batches of 2 (dp divides 4).
  const Config cfg = config_of("gpt2-tiny", {"train.global_batch=8", "train.micro_batch=2"});
  ASSERT_EQ(cfg.model.n_layer, 2);
  const std::vector<LayoutPlan> splits = plan_layouts(cfg, 4);
  std::vector<std::string> got;
  for (const LayoutPlan& lp : splits) {
    got.push_back(describe_layout(lp.layout));
    EXPECT_EQ(lp.plan.total(), largest_rank_plan(cfg, lp.layout).total()) << got.back();
  }
  EXPECT_EQ(got, (std::vector<std::string>{"dp 4 x tp 1 x pp 1", "dp 2 x tp 1 x pp 2", "dp 2 x tp 2 x pp 1",
                                           "dp 1 x tp 2 x pp 2", "dp 1 x tp 4 x pp 1"}));
  // Pure data parallelism holds the whole model per rank: the most memory.
  for (const LayoutPlan& lp : splits) EXPECT_LE(lp.plan.total(), splits.front().plan.total());
  // A capacity only tensor parallelism over all four ranks fits: the verdict
  // for dp 4 names it (micro-batch 1, recompute and ZeRO do not fit).
  const LayoutPlan& tp4 = splits.back();
  const int64_t capacity = tp4.plan.total();
  const std::string v = memory_plan_verdict(cfg, splits.front().layout, Device::cpu(), capacity);
  EXPECT_TRUE(has(v, "every rank of dp 4 x tp 1 x pp 1 needs about")) << v;
  const auto first_fit = std::find_if(splits.begin(), splits.end(),
                                      [&](const LayoutPlan& lp) { return plan_fits(lp.plan.total(), capacity); });
  ASSERT_NE(first_fit, splits.end());
  const PlanPlace& l = first_fit->layout;
  EXPECT_TRUE(has(v, zt::detail::concat("parallel.dp = ", l.dp, ", tp = ", l.tp, ", pp = ", l.pp, " about "))) << v;
}

// Expert parallelism: only the splits whose data-parallel ranks the ep
// groups divide, each rank holding E / ep experts whose sets shard over the
// ranks holding the same ones (ZeRO-1: dp / ep of them).
TEST(MemoryPlan, SplitsOfAnExpertParallelRunKeepTheEpGroups) {
  const Config cfg = config_of("llama3-moe-tiny", {"train.global_batch=8", "train.micro_batch=2", "parallel.ep=2",
                                                   "parallel.zero_stage=1"});
  std::vector<std::string> got;
  for (const LayoutPlan& lp : plan_layouts(cfg, 4)) got.push_back(describe_layout(lp.layout));
  EXPECT_EQ(got, (std::vector<std::string>{"dp 4 x tp 1 x pp 1", "dp 2 x tp 1 x pp 2", "dp 2 x tp 2 x pp 1"}));
  EXPECT_THROW(plan_memory(cfg, PlanPlace{1, 4, 1}), Error);
  // dp 4: the dense sets' optimizer state over 4 ranks, the experts' over 2.
  const RankParams r = rank_params(cfg, PlanPlace{4, 1, 1});
  const MemoryPlan p = plan_memory(cfg, PlanPlace{4, 1, 1});
  EXPECT_EQ(p.optimizer, 8 * (r.dense / 4 + r.experts / 2));
}

TEST(MemoryPlan, ARunThatCannotFitStopsBeforeAllocating) {
  // 2^26 sequences of 64 tokens: terabytes of activations, more than any
  // host has; the trainer refuses before the model is allocated.
  const Config cfg = config_of("gpt2-tiny", {"train.global_batch=67108864", "train.micro_batch=67108864"});
  try {
    Trainer t(cfg, std::make_unique<RandomBatches>(cfg.model.vocab_size, 1), nullptr, nullptr);
    FAIL() << "the trainer started a run that cannot fit";
  } catch (const Error& e) {
    EXPECT_TRUE(has(e.what(), "train.micro_batch = 67108864 would run out of memory on cpu")) << e.what();
  }
  // One that fits says its plan in the log.
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "zt_memory_plan";
  const Config small = config_of("gpt2-tiny", {"train.steps=1", "train.run_dir=" + dir.string()});
  Trainer t(small, std::make_unique<RandomBatches>(small.model.vocab_size, 1), nullptr, nullptr);
  std::string said;
  t.log = [&](const std::string& line) { said += line + "\n"; };
  t.run();
  EXPECT_TRUE(has(said, "memory plan (estimated): weights ")) << said;
  EXPECT_TRUE(has(said, " of cpu's ")) << said;
  // The end of the run puts the plan beside the allocator's peaks.
  char planned[64];
  std::snprintf(planned, sizeof planned, "%.2f\n", double(plan_memory(small).activations) / (1024.0 * 1024.0));
  EXPECT_TRUE(has(said, "planned MiB\n")) << said;
  const size_t row = said.find("\nactivations ");
  ASSERT_NE(row, std::string::npos) << said;
  EXPECT_EQ(said.substr(said.find('\n', row + 1) - (strlen(planned) - 1), strlen(planned)), planned) << said;
  std::filesystem::remove_all(dir);
}

// A GPU config's workspace is planned where the GPU is (its backend is
// asked), and said to be so where it is not.
TEST(Info, SaysWhereAGpuWorkspaceIsPlanned) {
  const Config cfg = config_of("gpt2-tiny", {"train.device=cuda", "train.dtype=bf16"});
  const InfoReport r = make_info(cfg, Measure::off);
  const std::string said = format_info(cfg, r);
  if (ops::gpu_count() == 0) {
    EXPECT_EQ(r.workspace_bytes, -1);
    EXPECT_TRUE(has(said, "workspace: asked of the GPU's backend, so planned only on a machine with the GPU")) << said;
    EXPECT_TRUE(has(said, "deterministic attention backward keeps B x Hq x T^2 x 2 bytes")) << said;
    const Config atomic = config_of("gpt2-tiny", {"train.device=cuda", "train.dtype=bf16", "train.deterministic=false"});
    const std::string atomic_said = format_info(atomic, make_info(atomic, Measure::off));
    EXPECT_TRUE(has(atomic_said, "f32 dq accumulator")) << atomic_said;
    EXPECT_FALSE(has(atomic_said, "deterministic attention backward keeps")) << atomic_said;
  } else {
    EXPECT_GT(r.workspace_bytes, 0);
    EXPECT_TRUE(has(said, "workspace (cuBLASLt, attention)")) << said;
  }
  EXPECT_FALSE(has(format_info(config_of("gpt2-tiny"), make_info(config_of("gpt2-tiny"), Measure::off)), "workspace"));
}

// Offloading shows as host memory, beside the device's items, with what it holds.
TEST(Info, SaysWhatIsOffloadedToTheHost) {
  const Config cfg = config_of("gpt2-tiny", {"optim.offload=true", "train.offload_activations=true"});
  const InfoReport r = make_info(cfg, Measure::off);
  EXPECT_EQ(r.optimizer_bytes, 0);
  EXPECT_EQ(r.offload_bytes, plan_memory(cfg).offload);
  const std::string said = format_info(cfg, r);
  EXPECT_TRUE(has(said, "offloaded to host memory")) << said;
  EXPECT_TRUE(has(said, "the optimizer's master, m, v and staging; the blocks' kept activations")) << said;
  EXPECT_TRUE(has(said, "the blocks' kept tensors offloaded")) << said;
  EXPECT_FALSE(has(format_info(config_of("gpt2-tiny"), make_info(config_of("gpt2-tiny"), Measure::off)), "offload"));
}

TEST(Info, OffMeasuresNothing) {
  const InfoReport r = make_info(config_of("gpt2-tiny"), Measure::off);
  EXPECT_EQ(r.measured_on, "");
  EXPECT_EQ(r.measure_skipped, "");
  for (const PolicyMemory& pm : r.activations) EXPECT_EQ(pm.measured_activation_bytes, -1);
}

}  // namespace
}  // namespace zt::train
