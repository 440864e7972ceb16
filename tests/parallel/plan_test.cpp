// The planner's traffic per step (plan/step_model.h) against what the
// trainer's comm layer counts on every rank (StepMetrics' dp_comm, tp_comm,
// cp_comm, ep_comm): data parallelism at every ZeRO stage, tensor and
// sequence parallelism, context parallelism at every recompute policy,
// expert parallelism, f32 and bf16, and their combinations on 4 ranks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "comm/process_group.h"
#include "parallel/mesh.h"
#include "plan/step_model.h"
#include "parallel/parallel_test_util.h"
#include "test_util.h"
#include "train/config.h"
#include "train/data_source.h"
#include "train/trainer.h"

namespace zt::train {
namespace {

namespace fs = std::filesystem;

struct Layout {
  const char* preset;
  parallel::MeshShape shape;
  std::vector<std::string> settings;
  const char* what;
};

Config layout_config(const Layout& l) {
  std::vector<std::string> ov = l.settings;
  ov.push_back("train.global_batch=24");
  ov.push_back("parallel.dp=" + std::to_string(l.shape.dp));
  ov.push_back("parallel.tp=" + std::to_string(l.shape.tp));
  ov.push_back("parallel.pp=" + std::to_string(l.shape.pp));
  ov.push_back("parallel.cp=" + std::to_string(l.shape.cp));
  ov.push_back("parallel.ep=" + std::to_string(l.shape.ep));
  ov.push_back("train.run_dir=" + (fs::temp_directory_path() / ("zt_plan_run_" + std::to_string(::getpid()))).string());
  return test::fortunes_config(l.preset, ov);
}

// Bytes sent are counted in whole bytes; the plan's ring shares are exact
// fractions of them (a relative 1e-12 covers the double arithmetic).
void expect_bytes(int64_t measured, double planned, const char* dim) {
  EXPECT_NEAR(double(measured), planned, 1e-12 * std::max(1.0, planned)) << dim << " bytes";
}

// Step 2 of the layout (step 1 warms every lazily made buffer) on this
// rank against the plan of its stage. The router's weights are zeroed before
// it: every token's top k are experts 0..k-1 (ties go to the lower index),
// which on 2 ranks sends exactly balanced routing's rows (see
// ExpertParallel.BytesPerStepFollowTheDispatch); on more ranks the ranks'
// sum does.
void expect_planned_traffic(const Layout& l) {
  SCOPED_TRACE(std::string(l.what) + " on " + std::to_string(comm::world().size()) + " ranks");
  const Config cfg = layout_config(l);
  auto mesh = std::make_shared<parallel::Mesh>(l.shape, comm::world());
  TrainingData data = open_training_data(cfg, int(mesh->coord().dp), int(l.shape.dp));
  Trainer t(cfg, std::move(data.train), nullptr, nullptr, mesh);
  t.train_step(0);
  if (cfg.model.moe())
    for (int64_t i = 0; i < cfg.model.n_layer; ++i) {
      const Tensor w = t.model().param("layers." + std::to_string(i) + ".mlp.router.weight");  // no pp here
      std::fill_n(w.data<float>(), w.numel(), 0.0f);
    }
  const StepMetrics m = t.train_step(1);
  const plan::StepVolumes v = plan::step_volumes(cfg, mesh->shape(), mesh->coord().pp);
  expect_bytes(m.dp_comm.bytes, v.dp_bytes, "dp");
  expect_bytes(m.tp_comm.bytes, v.tp_bytes, "tp");
  expect_bytes(m.cp_comm.bytes, v.cp_bytes, "cp");
  if (l.shape.ep <= 2) {
    expect_bytes(m.ep_comm.bytes, v.ep_bytes, "ep");
  } else {  // the zero router sends more from the ranks holding experts 0..k-1: the mean is balanced
    const double sum = comm::sum_exact(mesh->ep(), double(m.ep_comm.bytes));
    EXPECT_NEAR(sum / double(l.shape.ep), v.ep_bytes, 1e-12 * v.ep_bytes) << "ep bytes, mean over the ep group";
  }
}

TEST(Plan, TrafficPerStepIsWhatTheTrainerSends) {
  const int64_t p = comm::world().size();
  if (p == 1) GTEST_SKIP() << "one rank sends nothing";
  std::vector<Layout> layouts;
  for (int zero : {0, 1, 2, 3})
    layouts.push_back({"gpt2-tiny", {p, 1, 1, 1, 1}, {"parallel.zero_stage=" + std::to_string(zero)}, "dp"});
  for (int zero : {1, 2, 3})  // the weights gathered in bf16
    layouts.push_back({"llama3-tiny", {p, 1, 1, 1, 1}, {"parallel.zero_stage=" + std::to_string(zero), "train.dtype=bf16"},
                       "dp bf16"});
  layouts.push_back({"gpt2-tiny", {1, p, 1, 1, 1}, {}, "tp"});
  layouts.push_back({"gpt2-tiny", {1, p, 1, 1, 1}, {"parallel.sequence_parallel=true"}, "tp + sp"});
  layouts.push_back({"llama3-tiny", {1, p, 1, 1, 1}, {"train.recompute=full"}, "tp, full recompute"});
  layouts.push_back({"llama3-tiny", {1, p, 1, 1, 1}, {"parallel.sequence_parallel=true", "train.recompute=full",
                                                      "train.dtype=bf16"}, "tp + sp, full recompute, bf16"});
  for (const char* rc : {"none", "selective", "full"})
    layouts.push_back({"llama3-tiny", {1, 1, 1, p, 1}, {std::string("train.recompute=") + rc}, "cp"});
  layouts.push_back({"llama3-tiny", {1, 1, 1, p, 1}, {"train.dtype=bf16"}, "cp bf16"});
  for (const char* rc : {"none", "selective", "full"})
    layouts.push_back({"llama3-moe-tiny", {p, 1, 1, 1, p}, {std::string("train.recompute=") + rc}, "dp x ep"});
  layouts.push_back({"llama3-moe-tiny", {p, 1, 1, 1, 2}, {"parallel.zero_stage=2"}, "dp, ep 2, ZeRO-2"});
  for (const char* rc : {"none", "selective", "full"}) {
    layouts.push_back({"llama3-moe-tiny", {1, p, 1, 1, 1}, {std::string("train.recompute=") + rc}, "MoE tp"});
    layouts.push_back({"llama3-moe-tiny", {1, p, 1, 1, 1}, {"parallel.sequence_parallel=true",
                                                          std::string("train.recompute=") + rc}, "MoE tp + sp"});
  }
  // A shared expert's partial output joins the experts' one reduction: no bytes of its own.
  layouts.push_back({"llama3-moe-tiny", {1, p, 1, 1, 1}, {"model.shared_expert_ff=64", "parallel.sequence_parallel=true"},
                     "MoE with a shared expert, tp + sp"});
  if (p == 4) {
    layouts.push_back({"llama3-moe-tiny", {2, 2, 1, 1, 2}, {"parallel.sequence_parallel=true",
                                                          "train.recompute=selective"}, "MoE tp 2 + sp x dp 2, ep 2"});
    layouts.push_back({"llama3-tiny", {2, 2, 1, 1, 1}, {"parallel.zero_stage=1"}, "dp 2 x tp 2, ZeRO-1"});
    layouts.push_back({"gpt2-tiny", {2, 1, 2, 1, 1}, {"parallel.pp_schedule=1f1b"}, "dp 2 x pp 2"});
    layouts.push_back({"llama3-tiny", {1, 2, 1, 2, 1}, {"train.recompute=selective"}, "tp 2 x cp 2"});
    layouts.push_back({"llama3-moe-tiny", {1, 1, 1, 4, 2}, {"parallel.zero_stage=1"}, "cp 4, ep 2, ZeRO-1"});
  }
  for (const Layout& l : layouts) expect_planned_traffic(l);
}

}  // namespace
}  // namespace zt::train
