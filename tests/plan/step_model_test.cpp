// The planner's step model and search on one process (the traffic volumes
// against the trainer's counters: tests/parallel/plan_test.cpp): its
// arithmetic against hand-written formulas, the links a group's span
// chooses, the pipeline's bubble, and a search that only returns layouts
// that run and fit, fastest first.
#include <gtest/gtest.h>

#include <algorithm>

#include <cmath>
#include <set>
#include <tuple>

#include "core/error.h"
#include "parallel/pipeline_stages.h"
#include "plan/cluster.h"
#include "plan/search.h"
#include "plan/step_model.h"
#include "train/config.h"

namespace zt::plan {
namespace {

train::Config config(const std::string& preset, const std::vector<std::string>& more = {}) {
  const std::string text = "[model]\npreset = \"" + preset + "\"\n[data]\ndir = \"unused\"\n[train]\nseq_len = 64\n"
                           "global_batch = 32\nmicro_batch = 4\nsteps = 10\n";
  return train::parse_config(text, preset, more);
}

// Round numbers, so the formulas below are checked exactly.
Cluster cluster(int64_t nodes = 1, int64_t per_node = 8) {
  Cluster c;
  c.name = "test";
  c.nodes = nodes;
  c.devices_per_node = per_node;
  c.peak_flops = 2e12;
  c.matmul_flops = 1e12;
  c.step_efficiency = 0.5;
  c.memory_bytes = int64_t(1) << 34;
  c.memory_bandwidth = 1e11;
  c.intra_node_bandwidth = 1e10;
  c.inter_node_bandwidth = 1e9;
  c.latency_seconds = 1e-5;
  c.host_memory_bytes = int64_t(1) << 36;
  c.host_link_bandwidth = 1e9;
  c.host_memory_bandwidth = 2e10;
  return c;
}

TEST(StepModel, ComputeIsTheModelFlopsAtTheStepRateAndTheStepAddsItsParts) {
  for (const char* rc : {"none", "selective", "full"}) {
    const train::Config cfg = config("llama3-tiny", {std::string("train.recompute=") + rc});
    const StepEstimate e = estimate_step(cfg, {2, 1, 1, 1, 1}, cluster());
    const nn::ModelConfig& m = cfg.model;
    const double T = 64, tokens = 32 * T;
    const double attention = 4.0 * double(m.n_layer * m.d_model) * T;  // per token, forward
    const double blocks = 2.0 * double(m.matmul_params() - m.vocab_size * m.d_model) + attention;
    const double extra = std::string(rc) == "full" ? blocks : std::string(rc) == "selective" ? attention : 0.0;
    const double flops = (6.0 * double(m.matmul_params()) + 12.0 * double(m.n_layer * m.d_model) * T + extra) * tokens / 2;
    EXPECT_DOUBLE_EQ(e.flops, flops) << rc;
    EXPECT_DOUBLE_EQ(e.compute_seconds, flops / 0.5e12) << rc;
    EXPECT_DOUBLE_EQ(e.step_seconds, e.compute_seconds + e.bubble_seconds + e.dp.exposed_seconds +
                                         e.tp.exposed_seconds + e.cp.exposed_seconds + e.ep.exposed_seconds +
                                         e.pp.exposed_seconds + e.optimizer_seconds + e.offload_seconds);
    EXPECT_EQ(e.offload_seconds, 0.0) << "nothing offloaded";
    EXPECT_DOUBLE_EQ(e.tokens_per_second, tokens / e.step_seconds);
    EXPECT_DOUBLE_EQ(e.mfu, m.train_flops_per_token(64) * e.tokens_per_second / (2e12 * 2));
    EXPECT_GT(e.dp.seconds, 0.0);
    EXPECT_LE(e.dp.exposed_seconds, e.dp.seconds + 1e-15);
    EXPECT_EQ(e.tp.seconds + e.cp.seconds + e.ep.seconds + e.pp.seconds, 0.0) << "data parallelism only";
  }
}

// A pipeline computes at its busiest rank (the stage planner's costs: the
// LM head weighs on the last stage) and idles for the schedule's bubble -
// 1F1B's and AFAB's idle over work is (p-1)/m for balanced stages
// (../shared/REFERENCES.md), interleaving v chunks divides it by v - scaled
// by the other ranks' share of the work (their passes fill and drain it).
TEST(StepModel, PipelineBubbleIsTheSchedulesOwn) {
  struct Case {
    const char* schedule;
    int64_t v, micro_batch;
  };
  for (const Case& c : {Case{"1f1b", 1, 4}, Case{"afab", 1, 2}, Case{"interleaved", 2, 1}}) {
    const train::Config cfg = config("llama3-tiny", {"parallel.pp=2", std::string("parallel.pp_schedule=") + c.schedule,
                                                     "parallel.virtual_stages=" + std::to_string(c.v),
                                                     "model.n_layer=4", "train.micro_batch=" + std::to_string(c.micro_batch)});
    const StepEstimate e = estimate_step(cfg, {1, 1, 2, 1, 1}, cluster());
    const double m = double(32 / c.micro_batch);
    const auto stages = parallel::plan_pipeline_stages(cfg.model, 64, 2 * c.v);
    double rank_cost[2] = {0, 0};
    for (size_t s = 0; s < stages.size(); ++s) rank_cost[s % 2] += stages[s].cost;
    const double busiest = std::max(rank_cost[0], rank_cost[1]), other = std::min(rank_cost[0], rank_cost[1]);
    EXPECT_DOUBLE_EQ(e.flops, busiest * 32 * 64) << c.schedule;
    EXPECT_NEAR(e.bubble_seconds / e.compute_seconds, 1.0 / (m * double(c.v)) * other / busiest, 1e-12) << c.schedule;
    EXPECT_GT(e.pp.seconds, 0.0);
    EXPECT_GT(e.volumes.pp_bytes, 0.0);
  }
}

// Ranks are laid out tp fastest (parallel/mesh.h): a group whose ranks
// span more than a node's devices runs at the links between nodes.
TEST(StepModel, AGroupSpanningNodesRunsAtTheLinksBetweenThem) {
  const train::Config cfg = config("gpt2-tiny", {"parallel.zero_stage=0"});
  const Cluster two = cluster(2, 4);
  const StepEstimate in_node = estimate_step(cfg, {4, 1, 1, 1, 1}, two);
  const StepEstimate across = estimate_step(cfg, {8, 1, 1, 1, 1}, two);
  EXPECT_DOUBLE_EQ(in_node.dp.seconds, in_node.volumes.dp_bytes / 1e10 + in_node.volumes.dp_ops * 1e-5);
  EXPECT_DOUBLE_EQ(across.dp.seconds, across.volumes.dp_bytes / 1e9 + across.volumes.dp_ops * 1e-5);
  // Tensor parallelism inside each node, data parallelism across them.
  const StepEstimate mixed = estimate_step(config("gpt2-tiny"), {2, 4, 1, 1, 1}, two);
  EXPECT_DOUBLE_EQ(mixed.tp.seconds, mixed.volumes.tp_bytes / 1e10 + mixed.volumes.tp_ops * 1e-5);
  EXPECT_DOUBLE_EQ(mixed.tp.exposed_seconds, mixed.tp.seconds) << "the tp all-reduces block the step";
  EXPECT_DOUBLE_EQ(mixed.dp.seconds, mixed.volumes.dp_bytes / 1e9 + mixed.volumes.dp_ops * 1e-5);
}

// ZeRO-1 halves the optimizer's pass per rank against ZeRO-0 on 2 ranks,
// and the experts' all-to-all is planned for balanced routing.
TEST(StepModel, ShardedOptimizerAndBalancedExperts) {
  const StepEstimate z0 = estimate_step(config("gpt2-tiny", {"parallel.zero_stage=0"}), {2, 1, 1, 1, 1}, cluster());
  const StepEstimate z1 = estimate_step(config("gpt2-tiny", {"parallel.zero_stage=1"}), {2, 1, 1, 1, 1}, cluster());
  EXPECT_NEAR(z1.optimizer_seconds, z0.optimizer_seconds / 2, 1e-6 * z0.optimizer_seconds);
  EXPECT_DOUBLE_EQ(balanced_ep_rows(1), 0.0);
  EXPECT_DOUBLE_EQ(balanced_ep_rows(4), 1.5);
  const train::Config moe = config("llama3-moe-tiny", {"parallel.ep=2"});
  const StepVolumes balanced = step_volumes(moe, {2, 1, 1, 1, 2});
  const StepVolumes none = step_volumes(moe, {2, 1, 1, 1, 2}, 0, 0.0);
  // Two passes of rows (forward, backward) of C elements each, f32.
  const double rows = 1.0 * double(4 * 64) * 2;  // balanced_ep_rows(2) N k, N = 4 x 64 tokens
  EXPECT_DOUBLE_EQ(balanced.ep_bytes - none.ep_bytes,
                   double(moe.grad_accum_steps(2) * moe.model.n_layer) * 2 * rows * 64 * 4);
}

// Offloaded, AdamW's passes run at the host's memory bandwidth (with a
// master of its own: 28 + 2 bytes an element in bf16) after each element's
// gradient (f32) comes down the host link and before its weight goes up;
// the kept activations cross it twice per micro-batch. The trainer waits
// for every copy: all of it is in the step.
TEST(StepModel, OffloadingCostsTheHostLinkAndTheHostsBandwidth) {
  const std::vector<std::string> bf16 = {"train.dtype=bf16", "parallel.zero_stage=1"};
  std::vector<std::string> opt = bf16, act = bf16;
  opt.push_back("optim.offload=true");
  act.push_back("train.offload_activations=true");
  const parallel::MeshShape mesh{2, 1, 1, 1, 1};
  const StepEstimate plain = estimate_step(config("llama3-tiny", bf16), mesh, cluster());
  const StepEstimate o = estimate_step(config("llama3-tiny", opt), mesh, cluster());
  const StepEstimate a = estimate_step(config("llama3-tiny", act), mesh, cluster());
  const train::Config cfg = config("llama3-tiny", bf16);
  const double elements = double(train::rank_params(cfg, {2, 1, 1, 0, 0}).dense) / 2;  // ZeRO-1's shard
  EXPECT_DOUBLE_EQ(plain.optimizer_seconds, elements * 30 / 1e11);
  EXPECT_DOUBLE_EQ(o.optimizer_seconds, elements * 30 / 2e10 + elements * 6 / 1e9);
  EXPECT_EQ(o.offload_seconds, 0.0);
  const train::Config acfg = config("llama3-tiny", act);
  const double kept = double(train::offloaded_activation_bytes(acfg, {2, 1, 1, 0, 0}));
  ASSERT_GT(kept, 0.0);
  EXPECT_DOUBLE_EQ(a.offload_bytes, 2.0 * double(acfg.grad_accum_steps(2)) * kept);
  EXPECT_DOUBLE_EQ(a.offload_seconds, a.offload_bytes / 1e9);
  EXPECT_DOUBLE_EQ(a.step_seconds - plain.step_seconds, a.offload_seconds);
}

TEST(StepModel, ALayoutLargerThanTheClusterIsRefused) {
  try {
    estimate_step(config("gpt2-tiny"), {16, 1, 1, 1, 1}, cluster(1, 8));
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs 16 devices; the cluster has 8"), std::string::npos) << e.what();
  }
}

TEST(Cluster, PresetsAndUnknownNames) {
  const Cluster h = cluster_preset("h100-sxm", 2);
  EXPECT_EQ(h.devices(), 16);
  EXPECT_TRUE(h.gpu);
  EXPECT_GT(h.matmul_flops, 0.0);
  EXPECT_LE(h.matmul_flops, h.peak_flops);
  EXPECT_GT(h.intra_node_bandwidth, h.inter_node_bandwidth);
  EXPECT_FALSE(h.source.empty());
  EXPECT_EQ(cluster_preset("h200-sxm", 1, 4).devices(), 4);
  try {
    cluster_preset("tpu-v5");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no cluster preset 'tpu-v5'; choose one of h100-sxm, h200-sxm, cpu"),
              std::string::npos)
        << e.what();
  }
}

// Every candidate runs (the checks the trainer makes), fits, uses the
// devices asked for; the list is ordered; the config's own layout is in it.
TEST(Search, CandidatesRunFitAndComeFastestFirst) {
  const train::Config cfg = config("llama3-tiny");
  Cluster c = cluster(1, 4);
  const std::vector<Candidate> all = search_layouts(cfg, c, {});
  ASSERT_FALSE(all.empty());
  std::set<std::tuple<int64_t, int64_t, int64_t, int64_t>> meshes;
  for (size_t i = 0; i < all.size(); ++i) {
    const Candidate& x = all[i];
    EXPECT_TRUE(x.fits);
    EXPECT_TRUE(train::plan_fits(x.memory.total(), c.memory_bytes));
    EXPECT_EQ(x.mesh.world(), 4);
    EXPECT_NO_THROW(x.cfg.validate());
    EXPECT_EQ(x.cfg.train.global_batch % (x.cfg.train.micro_batch * x.mesh.dp), 0);
    if (i > 0) {
      EXPECT_LE(x.step.tokens_per_second, all[i - 1].step.tokens_per_second * 1.0101);
    }
    meshes.insert({x.mesh.dp, x.mesh.tp, x.mesh.pp, x.mesh.cp});
  }
  EXPECT_TRUE(meshes.count({4, 1, 1, 1})) << "plain data parallelism runs";
  EXPECT_TRUE(meshes.count({1, 2, 2, 1})) << "tp 2 x pp 2 runs (4 heads, 2 layers)";
  EXPECT_EQ(best_per_mesh(all).size(), meshes.size());
  // Context parallelism is searched on GPUs and on CPUs.
  EXPECT_TRUE(std::any_of(meshes.begin(), meshes.end(), [](const auto& m) { return std::get<3>(m) > 1; }))
      << "a GPU cluster searches context parallelism";
  c.gpu = false;
  bool cp = false;
  for (const Candidate& x : search_layouts(cfg, c, {})) cp = cp || x.mesh.cp > 1;
  EXPECT_TRUE(cp);
}

// Pipelines are searched with each schedule the trainer runs (interleaved
// with 2 chunks a rank where the blocks allow); without them only the
// config's own.
TEST(Search, PipelinesTryEachSchedule) {
  const train::Config cfg = config("llama3-tiny", {"model.n_layer=4"});
  const auto schedules = [&](bool vary) {
    SearchOptions o;
    o.vary_schedule = vary;
    std::set<std::string> seen;
    for (const Candidate& x : search_layouts(cfg, cluster(1, 2), o))
      if (x.mesh.pp > 1) seen.insert(x.cfg.parallel.pp_schedule + std::to_string(x.cfg.parallel.virtual_stages));
    return seen;
  };
  EXPECT_EQ(schedules(true), (std::set<std::string>{"1f1b1", "interleaved2", "zb1"}));
  EXPECT_EQ(schedules(false), (std::set<std::string>{cfg.parallel.pp_schedule + "1"}));
}

// Memory decides: below what replicating everything needs, only layouts
// that shard or split the model remain.
TEST(Search, TooLittleMemoryLeavesOnlyLayoutsThatShard) {
  const train::Config cfg = config("llama3-1b", {"train.micro_batch=1", "train.recompute=full"});
  Cluster c = cluster(1, 4);
  const Candidate replicated = evaluate_layout(cfg, c, 4);
  ASSERT_EQ(replicated.mesh.dp, 4);
  c.memory_bytes = replicated.memory.total() * 7 / 10;
  SearchOptions kept;
  kept.vary_offload = false;
  const std::vector<Candidate> left = search_layouts(cfg, c, kept);
  ASSERT_FALSE(left.empty());
  for (const Candidate& x : left) {
    EXPECT_LT(x.memory.total(), replicated.memory.total());
    EXPECT_TRUE(x.cfg.parallel.zero_stage > 0 || x.mesh.tp > 1 || x.mesh.pp > 1) << x.mesh.str();
    EXPECT_FALSE(x.cfg.optim.offload || x.cfg.train.offload_activations);
  }
  // Offloading joins, for layouts that do not fit without it: a replicated
  // one now fits only with its state or activations on the host, and ranks
  // below a layout that fits as it is when both are as fast.
  const std::vector<Candidate> more = search_layouts(cfg, c, {});
  EXPECT_GT(more.size(), left.size());
  bool replicated_offloaded = false;
  for (const Candidate& x : more) {
    const bool offloads = x.cfg.optim.offload || x.cfg.train.offload_activations;
    if (x.cfg.parallel.zero_stage == 0 && x.mesh.tp == 1 && x.mesh.pp == 1) {
      EXPECT_TRUE(offloads) << x.mesh.str();
      replicated_offloaded = true;
    }
    if (offloads) {
      EXPECT_GT(x.step.optimizer_seconds + x.step.offload_seconds, 0.0);
    }
  }
  EXPECT_TRUE(replicated_offloaded);
  // Not with the host too small for what would wait there.
  c.host_memory_bytes = 1 << 20;
  for (const Candidate& x : search_layouts(cfg, c, {})) EXPECT_FALSE(x.cfg.optim.offload) << x.mesh.str();
  c.memory_bytes = 1 << 20;
  EXPECT_TRUE(search_layouts(cfg, c, {}).empty());
}

}  // namespace
}  // namespace zt::plan
