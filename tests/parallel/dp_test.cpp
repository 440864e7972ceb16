// Data parallelism under mpirun (dp = the world size): 10 steps of the tiny
// models match the single-process run with the same global batch (every
// rank also runs that reference itself, once per model), reruns are bitwise identical, ZeRO-1
// holds 1/dp of the optimizer state, bf16 stochastic rounding draws by the
// layer offset under every ZeRO stage, and the bytes sent per step are the
// ring volumes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "comm/process_group.h"
#include "core/allocator.h"
#include "core/error.h"
#include "core/rng.h"
#include "parallel/mesh.h"
#include "parallel/one_queue_group.h"
#include "train/config.h"
#include "train/data_source.h"
#include "parallel/parallel_test_util.h"
#include "test_util.h"
#include "train/trainer.h"

namespace zt::train {
namespace {

namespace fs = std::filesystem;

// The shared tiny config with a global batch of 24 and ZeRO stage `zero`.
Config tiny(const std::string& preset, int64_t zero, const std::vector<std::string>& more = {}) {
  std::vector<std::string> ov = {"train.global_batch=24", "parallel.zero_stage=" + std::to_string(zero),
                                 "train.run_dir=" + (fs::temp_directory_path() / ("zt_dp_run_" + std::to_string(::getpid()))).string()};
  ov.insert(ov.end(), more.begin(), more.end());
  return test::fortunes_config(preset, ov);
}

struct RunResult {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;  // every layer's flat buffer, as f32
  std::vector<int64_t> comm_bytes;
  int64_t optimizer_bytes = 0;             // allocator's optimizer category right after construction
};

// `inspect` (optional) sees the trainer after training, full weights held.
RunResult train(const Config& cfg, std::shared_ptr<parallel::Mesh> mesh,
                const std::function<void(Trainer&)>& inspect = {}) {
  const int dp = mesh ? int(mesh->dp().size()) : 1, rank = mesh ? int(mesh->dp().rank()) : 0;
  TrainingData data = open_training_data(cfg, rank, dp);
  const int64_t before = allocator_for(Device::cpu()).stats().current_bytes[size_t(MemCategory::optimizer)];
  Trainer t(cfg, std::move(data.train), nullptr, nullptr, mesh);
  RunResult r;
  r.optimizer_bytes = allocator_for(Device::cpu()).stats().current_bytes[size_t(MemCategory::optimizer)] - before;
  for (int64_t s = 0; s < cfg.train.steps; ++s) {
    const StepMetrics m = t.train_step(s);
    r.losses.push_back(m.loss);
    r.comm_bytes.push_back(m.dp_comm.bytes);
  }
  t.data_parallel().hold_full_params(true);  // ZeRO-3: gather the weights to compare them
  for (const nn::ParamSet* s : t.model().param_sets()) {
    std::vector<float> v(size_t(s->numel()));
    for (int64_t i = 0; i < s->numel(); ++i) v[size_t(i)] = float(test::load_f64(s->flat(), i));
    r.params.push_back(std::move(v));
  }
  if (inspect) inspect(t);
  return r;
}

// ||a - b|| / ||b|| over a layer. (Element-wise, a weight whose gradient is
// almost zero - an embedding row of a token seen once - can move by a few
// ulps of its update when the sum order changes: AdamW normalises g / sqrt(v).)
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

std::shared_ptr<parallel::Mesh> world_mesh() {
  return std::make_shared<parallel::Mesh>(parallel::MeshShape{0, 1, 1, 1, 1}, comm::world());
}

class DataParallelTest : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(DataParallelTest, MatchesTheSingleProcessRunAndIsReproducible) {
  const auto [preset, zero] = GetParam();
  const Config cfg = tiny(preset, zero);
  auto mesh = world_mesh();
  // The single process without ZeRO, shared by the ZeRO stages of a preset.
  const RunResult& ref =
      test::cached_reference<RunResult>(preset, [p = std::string(preset)] { return train(tiny(p, 0), nullptr); });
  const RunResult dp = train(cfg, mesh);
  ASSERT_EQ(dp.losses.size(), 10u);
  for (size_t s = 0; s < dp.losses.size(); ++s)
    EXPECT_NEAR(dp.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "step " << s + 1;
  ASSERT_EQ(dp.params.size(), ref.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i)
    EXPECT_LT(rel_diff(dp.params[i], ref.params[i]), 1e-5) << "layer " << i << " after 10 steps";
  // A fixed reduction order: the same run again gives the same bits.
  const RunResult again = train(cfg, mesh);
  EXPECT_EQ(again.losses, dp.losses);
  EXPECT_EQ(again.params, dp.params);
}

INSTANTIATE_TEST_SUITE_P(Models, DataParallelTest,
                         ::testing::Values(std::make_tuple("gpt2-tiny", 0), std::make_tuple("gpt2-tiny", 1),
                                           std::make_tuple("gpt2-tiny", 2), std::make_tuple("gpt2-tiny", 3),
                                           std::make_tuple("llama3-tiny", 0), std::make_tuple("llama3-tiny", 1),
                                           std::make_tuple("llama3-tiny", 2), std::make_tuple("llama3-tiny", 3)));

// ZeRO-1 keeps 1/dp of the optimizer state, as the allocator measures it:
// exactly the padded layers' shards, each a whole number of 16-element
// packs starting 16-byte aligned (NCCL's aligned path; zero_pad_multiple).
TEST(DataParallel, ZeroOneShardsTheOptimizerStateInAlignedSlices) {
  const int64_t p = comm::world().size();
  auto mesh = world_mesh();
  // d_model 40: the blocks' 19720 elements are no multiple of 16 p (what
  // a padding to a multiple of p alone leaves misaligned).
  const std::vector<std::string> odd = {"train.steps=1", "model.d_model=40"};
  Config cfg = tiny("gpt2-tiny", 0, odd);
  const RunResult replicated = train(cfg, mesh);
  cfg = tiny("gpt2-tiny", 1, odd);
  std::vector<optim::OptimShard> shards;
  const RunResult sharded = train(cfg, mesh, [&](Trainer& t) { shards = t.data_parallel().optimizer_shards(); });
  ASSERT_GT(replicated.optimizer_bytes, 0);
  int64_t unpadded = 0, shard_elements = 0;
  for (const auto& v : replicated.params) unpadded += int64_t(v.size());
  ASSERT_EQ(sharded.params.size(), replicated.params.size());
  for (size_t i = 0; i < sharded.params.size(); ++i) {
    const int64_t n = int64_t(sharded.params[i].size());
    EXPECT_EQ(n % (16 * p), 0) << "layer " << i << ": " << n << " elements on " << p << " ranks";
    EXPECT_LT(n - int64_t(replicated.params[i].size()), 16 * p) << "layer " << i << " padded more than needed";
    shard_elements += n / p;
  }
  ASSERT_EQ(replicated.optimizer_bytes % unpadded, 0);
  const int64_t bytes_per_element = replicated.optimizer_bytes / unpadded;  // the moments (+ master)
  EXPECT_EQ(sharded.optimizer_bytes, bytes_per_element * shard_elements)
      << "ZeRO-0 " << replicated.optimizer_bytes << " bytes, ZeRO-1 " << sharded.optimizer_bytes << " on " << p
      << " ranks";
  ASSERT_EQ(shards.size(), sharded.params.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const optim::OptimShard& sh = shards[i];
    EXPECT_EQ(sh.begin % 16, 0) << "layer " << i;
    EXPECT_EQ((sh.end - sh.begin) % 16, 0) << "layer " << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(sh.grad.data_ptr()) % 16, 0u) << "layer " << i;
  }
}

// The single process's 4 steps, which the hybrid layouts match.
const RunResult& hybrid_reference() {
  return test::cached_reference<RunResult>(
      "gpt2-tiny, 4 steps", [] { return train(tiny("gpt2-tiny", 0, {"train.steps=4"}), nullptr); });
}

// Hybrid sharding (shards over pairs of ranks, replicated across pairs)
// trains like the single process too.
TEST(DataParallel, HybridShardingMatchesTheSingleProcessRun) {
  const int64_t p = comm::world().size();
  if (p < 4) GTEST_SKIP() << "needs 4 ranks (2 shard groups of 2)";
  auto mesh = world_mesh();
  const RunResult& ref = hybrid_reference();
  for (int zero : {1, 2}) {
    const Config cfg = tiny("gpt2-tiny", zero, {"parallel.shard_group=2", "train.steps=4"});
    const RunResult dp = train(cfg, mesh);
    for (size_t s = 0; s < dp.losses.size(); ++s)
      EXPECT_NEAR(dp.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "ZeRO-" << zero << " step " << s + 1;
    for (size_t i = 0; i < ref.params.size(); ++i)
      EXPECT_LT(rel_diff(dp.params[i], ref.params[i]), 1e-5) << "ZeRO-" << zero << " layer " << i;
  }
}

// Hybrid sharding with every group on one queue (one_queue_group.h), as
// NCCL runs all of a GPU's communicators on its one stream: every rank
// issues the shard groups' reduce-scatters and the replicas' all-reduces in
// one order - else ranks wait on each other in a cycle, as 4 GPUs would -
// and the run still matches the single process.
TEST(DataParallel, HybridShardingOnOneQueueIssuesInOneOrderOnEveryRank) {
  const int64_t p = comm::world().size();
  if (p < 4) GTEST_SKIP() << "needs 4 ranks (2 shard groups of 2)";
  const RunResult& ref = hybrid_reference();
  for (int zero : {1, 2}) {
    test::OneQueueGroup one_queue(comm::world());
    auto mesh = std::make_shared<parallel::Mesh>(parallel::MeshShape{0, 1, 1, 1, 1}, one_queue);
    const RunResult dp = train(tiny("gpt2-tiny", zero, {"parallel.shard_group=2", "train.steps=4"}), mesh);
    for (size_t s = 0; s < dp.losses.size(); ++s)
      EXPECT_NEAR(dp.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "ZeRO-" << zero << " step " << s + 1;
    for (size_t i = 0; i < ref.params.size(); ++i)
      EXPECT_LT(rel_diff(dp.params[i], ref.params[i]), 1e-5) << "ZeRO-" << zero << " layer " << i;
    const std::vector<std::string> mine = one_queue.issued();
    EXPECT_GT(std::count(mine.begin(), mine.end(), "dp_replica:all_reduce"), 0) << "ZeRO-" << zero;
    const std::vector<std::string> every = comm::all_gather_strings(comm::world(), one_queue.issued_lines());
    for (size_t r = 1; r < every.size(); ++r)
      EXPECT_EQ(every[r], every[0]) << "ZeRO-" << zero << ": rank " << r << " issued in another order than rank 0";
  }
}

// bf16 weights with stochastic rounding (optim.stochastic_rounding): every
// rank's shard of the bf16 copy is its f32 master rounded with the random
// word of the element's offset in the whole layer, not in the shard - so the
// bits do not depend on the ZeRO layout - and the run tracks the single
// process's within bf16 noise.
TEST(DataParallel, StochasticRoundingDrawsByTheLayerOffset) {
  auto mesh = world_mesh();
  const std::vector<std::string> sr = {"train.dtype=bf16", "optim.stochastic_rounding=true", "train.steps=4"};
  const RunResult ref = train(tiny("gpt2-tiny", 0, sr), nullptr);
  for (int zero : {0, 1, 3}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(zero));
    int64_t checked = 0, mismatched = 0, off_nearest = 0;
    const RunResult dp = train(tiny("gpt2-tiny", zero, sr), mesh, [&](Trainer& t) {
      const optim::AdamW& opt = t.optimizer();
      ASSERT_EQ(opt.num_sets(), t.model().param_sets().size());
      for (size_t i = 0; i < opt.num_sets(); ++i) {
        const optim::OptimShard& sh = opt.shard(i);
        const Tensor master = opt.master(i);
        const Tensor& copy = t.model().param_sets()[i]->flat();
        ASSERT_EQ(copy.dtype(), DType::bf16);
        for (int64_t k = 0; k < sh.end - sh.begin; ++k) {
          const float w = master.data<float>()[k];
          const uint16_t want = float_to_bf16_bits_stochastic(
              w, philox_word_at(opt.rounding_seed(i), uint64_t(opt.steps_taken()), uint64_t(sh.begin + k)));
          const uint16_t got = copy.data<bf16>()[sh.begin + k].bits;
          mismatched += got != want;
          off_nearest += got != float_to_bf16(w).bits;
          ++checked;
        }
      }
    });
    EXPECT_EQ(mismatched, 0) << "of " << checked << " elements";
    EXPECT_GT(off_nearest, checked / 10) << "stochastic rounding leaves many elements off the nearest";
    // Losses and weights per layer against the single process's: within bf16
    // noise (measured: 1.1e-3 at most on 2 and 4 ranks; the micro-batches'
    // bf16 gradients sum in another order). Only the check above tells
    // layer offsets from shard offsets: either draws unbiased bits.
    for (size_t s = 0; s < dp.losses.size(); ++s)
      EXPECT_NEAR(dp.losses[s], ref.losses[s], 1e-2 * std::fabs(ref.losses[s])) << "step " << s + 1;
    ASSERT_EQ(dp.params.size(), ref.params.size());
    for (size_t i = 0; i < ref.params.size(); ++i)
      EXPECT_LT(rel_diff(dp.params[i], ref.params[i]), 1e-2) << "layer " << i << " after " << dp.losses.size() << " steps";
  }
}

// Random tokens for memory measurements (any rows will do).
class RandomTokens : public BatchSource {
 public:
  explicit RandomTokens(uint64_t seed) : rng_(seed) {}
  void next(const Tensor& inputs, const Tensor& targets) override {
    for (int64_t i = 0; i < inputs.numel(); ++i) {
      inputs.data<int32_t>()[i] = int32_t(rng_() % 512);
      targets.data<int32_t>()[i] = int32_t(rng_() % 512);
    }
  }
  void reset() override {}

 private:
  std::mt19937_64 rng_;
};

// ZeRO-2 keeps gradient shards plus the layers in flight: the peak of the
// grads category (measured by the allocator) is at most the shards (1/dp)
// plus two layers' full buffers (one reducing, one in backward) and their
// reduced parts, plus the tied embedding's, and below ZeRO-0's full buffers. A model whose blocks outweigh its embeddings (vocab 512, 8
// layers) makes that visible.
TEST(DataParallel, ZeroTwoAndThreeKeepShardsAndTheLayersInFlight) {
  const int64_t p = comm::world().size();
  auto mesh = world_mesh();
  int64_t peak[4] = {0, 0, 0, 0}, param_peak[4] = {0, 0, 0, 0}, total = 0, largest = 0, embed = 0, head = 0;
  int64_t unpadded = 0;  // ZeRO-0's buffers (ZeRO pads each layer: zero_pad_multiple)
  for (int zero : {0, 2, 3}) {
    const Config cfg = tiny("gpt2-tiny", zero, {"model.vocab_size=512", "model.n_layer=8", "train.steps=2"});
    Trainer t(cfg, std::make_unique<RandomTokens>(7 + uint64_t(mesh->dp().rank())), nullptr, nullptr, mesh);
    total = largest = 0;
    embed = t.model().param_sets().front()->numel();
    head = t.model().param_sets().back()->numel();
    for (const nn::ParamSet* s : t.model().param_sets()) {
      total += s->numel();
      largest = std::max(largest, s->numel());
    }
    if (zero == 0) unpadded = total;
    t.train_step(0);
    const StepMetrics m = t.train_step(1);
    peak[zero] = m.memory.peak_bytes[size_t(MemCategory::grads)];
    param_peak[zero] = m.memory.peak_bytes[size_t(MemCategory::params)];
  }
  EXPECT_EQ(peak[0], 4 * unpadded) << "ZeRO-0 holds every full gradient buffer";
  // The tied embedding's gradient is written by the LM head in forward and
  // by the embedding backward at the very end, so it lives through the pass;
  // the head's (the final norm's) is reduced while the last block's is made.
  const int64_t bound = 4 * (total / p + 2 * largest + 2 * largest / p + embed + head);
  EXPECT_LE(peak[2], bound) << "ZeRO-2 peak " << peak[2] << " bytes; shards " << 4 * total / p << ", largest layer "
                            << 4 * largest;
  if (p > 1) {
    EXPECT_LT(peak[2], peak[0]);
  }
  EXPECT_LE(peak[3], bound);
  // Parameters: ZeRO-3 keeps the shards plus the layer in use, the one
  // prefetched and the tied embedding at the LM head.
  EXPECT_EQ(param_peak[0], 4 * unpadded) << "f32 weights, every layer resident";
  const int64_t param_bound = 4 * (total / p + 3 * largest);
  EXPECT_LE(param_peak[3], param_bound) << "ZeRO-3 weights peak " << param_peak[3] << " bytes";
  if (p > 1) {
    EXPECT_LT(param_peak[3], param_peak[0]);
  }
  RecordProperty("zero0_grad_peak", std::to_string(peak[0]));
  RecordProperty("zero2_grad_peak", std::to_string(peak[2]));
  RecordProperty("zero3_param_peak", std::to_string(param_peak[3]));
}

// Bytes sent per step: ring all-reduce of every f32 gradient (2 (p-1)/p of
// the buffer) for ZeRO-0; reduce-scatter of the gradients plus all-gather of
// the parameters ((p-1)/p each) for ZeRO-1, with one reduce-scatter per
// micro-batch for ZeRO-2; for ZeRO-3 every micro-batch all-gathers the
// weights in forward and again in backward (the tied embedding twice in
// forward, not in backward: the same total) and reduce-scatters the
// gradients - 3x; plus 8 (p-1) bytes per scalar exchanged.
TEST(DataParallel, BytesPerStepFollowTheRingVolumes) {
  const int64_t p = comm::world().size();
  if (p == 1) GTEST_SKIP() << "one rank sends nothing";
  auto mesh = world_mesh();
  for (int zero : {0, 1, 2, 3}) {
    const Config cfg = tiny("gpt2-tiny", zero, {"train.steps=2"});
    TrainingData data = open_training_data(cfg, int(mesh->dp().rank()), int(p));
    Trainer t(cfg, std::move(data.train), nullptr, nullptr, mesh);
    int64_t elems = 0;
    for (const nn::ParamSet* s : t.model().param_sets()) elems += s->numel();
    t.train_step(0);
    const StepMetrics m = t.train_step(1);
    const double grad_bytes = 4.0 * double(elems);
    // ZeRO-2 reduce-scatters every micro-batch (global 24 / (2 dp) of them).
    const double accum = double(cfg.grad_accum_steps(p));
    const double ring = grad_bytes * double(p - 1) / double(p);
    // Scalars: the loss sum and (ZeRO >= 1) the squared grad norm or (ZeRO-0)
    // the replicas' vote on its finiteness, 8 bytes each per peer, and the
    // memory report (1 + categories) x 8.
    const double scalars = 8.0 * double(p - 1) * (2 + 1 + kNumMemCategories);
    const double expected = zero == 0   ? 2.0 * ring + scalars
                            : zero == 1 ? 2.0 * ring + scalars
                            : zero == 2 ? (accum + 1.0) * ring + scalars
                                        : 3.0 * accum * ring + scalars;
    EXPECT_NEAR(double(m.dp_comm.bytes), expected, 1e-6 * expected) << "ZeRO-" << zero;
    EXPECT_GT(m.dp_comm.busy_seconds, 0.0) << "reductions ran on the comm thread";
  }
}

}  // namespace
}  // namespace zt::train
