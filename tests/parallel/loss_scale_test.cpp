// Dynamic loss scaling under data, tensor and pipeline parallelism: an
// overflow injected into the gradients of one rank only (world rank 1)
// skips that step on every rank - the grad norm is summed over the model-
// parallel groups, and data-parallel replicas vote - so 6 steps give the
// losses of the single process with the same step skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "comm/process_group.h"
#include "ops/elementwise.h"
#include "parallel/mesh.h"
#include "parallel/parallel_test_util.h"
#include "test_util.h"
#include "train/config.h"
#include "train/data_source.h"
#include "train/trainer.h"

namespace zt::train {
namespace {

constexpr int64_t kPoisonStep = 2;  // 0-based

// The shared tiny config, 4 blocks, 6 steps, dynamic loss scaling from 4096
// doubling after 2 good steps.
Config scaled_config(std::vector<std::string> more) {
  more.insert(more.begin(), {"model.n_layer=4", "train.steps=6", "train.loss_scale=dynamic",
                             "train.loss_scale_init=4096.0", "train.loss_scale_window=2"});
  return test::fortunes_config("gpt2-tiny", more);
}

// Losses and skip flags of 6 steps; `poison_here` fills one gradient
// element with inf at kPoisonStep.
std::vector<StepMetrics> run(const Config& cfg, std::shared_ptr<parallel::Mesh> mesh, bool poison_here) {
  const int dp = mesh ? int(mesh->dp().size()) : 1, rank = mesh ? int(mesh->coord().dp) : 0;
  TrainingData data = open_training_data(cfg, rank, dp);
  Trainer t(cfg, std::move(data.train), nullptr, nullptr, mesh);
  t.before_update = [&](int64_t step) {
    if (step == kPoisonStep && poison_here) ops::fill(t.param_sets().front()->grad_flat().slice(0, 1), INFINITY);
  };
  std::vector<StepMetrics> out;
  for (int64_t s = 0; s < cfg.train.steps; ++s) out.push_back(t.train_step(s));
  return out;
}

TEST(LossScaling, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  const int64_t p = comm::world().size();
  if (p != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::vector<StepMetrics> ref = run(scaled_config({}), nullptr, true);
  struct Layout {
    int64_t dp, tp, pp;
  };
  for (const Layout l : {Layout{2, 1, 1}, Layout{1, 2, 1}, Layout{1, 1, 2}}) {
    SCOPED_TRACE("dp=" + std::to_string(l.dp) + " tp=" + std::to_string(l.tp) + " pp=" + std::to_string(l.pp));
    const Config cfg = scaled_config({"parallel.tp=" + std::to_string(l.tp), "parallel.pp=" + std::to_string(l.pp)});
    auto mesh = std::make_shared<parallel::Mesh>(parallel::MeshShape{l.dp, l.tp, l.pp, 1, 1}, comm::world());
    const std::vector<StepMetrics> got = run(cfg, mesh, comm::world().rank() == 1);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t s = 0; s < ref.size(); ++s) {
      EXPECT_EQ(got[s].skipped, s == size_t(kPoisonStep)) << "step " << s + 1;
      EXPECT_EQ(got[s].overflow, ref[s].overflow) << "step " << s + 1;
      EXPECT_EQ(got[s].loss_scale, ref[s].loss_scale) << "step " << s + 1;
      EXPECT_NEAR(got[s].loss, ref[s].loss, 1e-5 * std::fabs(ref[s].loss)) << "step " << s + 1;
    }
  }
}

}  // namespace
}  // namespace zt::train
