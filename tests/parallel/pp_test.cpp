// Pipeline parallelism under mpirun (pp = the world size): each rank builds
// its model chunks (nn::Transformer parts of a balanced stage plan), the
// PipelineRunner drives AFAB, 1F1B, interleaved 1F1B and ZB-H1 over them, and 10
// optimizer steps (AdamW, clipping by the global norm) give the losses and
// final weights of the single-process run with the same batches (fp32,
// relative 1e-5), for GPT-2 (tied embeddings: the head stage's copy is kept
// in sync) and Llama 3 tiny models with 1, 4 and 8 micro-batches. The
// allocator shows 1F1B keeping at most p micro-batches of activations on the
// first stage where AFAB keeps all m.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "comm/process_group.h"
#include "core/allocator.h"
#include "nn/transformer.h"
#include "optim/adamw.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "parallel/pipeline_stages.h"
#include "parallel/parallel_test_util.h"
#include "train/generate.h"
#include "test_util.h"

namespace zt::parallel {
namespace {

constexpr int64_t kB = 2, kT = 16, kSteps = 10;

nn::ModelConfig tiny(const char* preset) {
  nn::ModelConfig c = nn::model_preset(preset);
  c.n_layer = 8;  // 8 stages at pp = 4 with 2 chunks each
  return c;
}

// Micro-batch k of step s, the same on every rank (a fixed seed).
std::vector<PipelineMicroBatch> batches(const nn::ModelConfig& c, int64_t step, int64_t m) {
  std::mt19937_64 rng(1000 + uint64_t(step));
  std::vector<PipelineMicroBatch> out;
  for (int64_t k = 0; k < m; ++k) {
    PipelineMicroBatch mb{Tensor::empty(Shape{kB, kT}, DType::i32), Tensor::empty(Shape{kB, kT}, DType::i32)};
    for (int64_t i = 0; i < kB * kT; ++i) {
      mb.tokens.data<int32_t>()[i] = int32_t(rng() % uint64_t(c.vocab_size));
      mb.targets.data<int32_t>()[i] = int32_t(rng() % uint64_t(c.vocab_size));
    }
    out.push_back(mb);
  }
  return out;
}

optim::AdamWConfig adamw() { return optim::AdamWConfig{}; }
constexpr double kLr = 3e-3, kClip = 1.0;

struct PipeRun {
  std::vector<double> losses;
  std::map<std::string, Tensor> weights;  // the tensors this rank holds (owned ones)
  int64_t peak_in_flight = 0;
  int64_t peak_activation_bytes = 0;  // first step, allocator
};

PipeRun reference(const nn::ModelConfig& c, int64_t m) {
  nn::Transformer model(c, DType::f32);
  model.init_weights(9);
  optim::AdamW opt(model.param_sets(), adamw());
  PipeRun r;
  const float scale = 1.0f / float(m * kB * kT);
  for (int64_t s = 0; s < kSteps; ++s) {
    model.zero_grads();
    double loss = 0;
    for (const PipelineMicroBatch& mb : batches(c, s, m)) {
      nn::ForwardContext ctx;
      loss += model.forward(ctx, mb.tokens, mb.targets, true, scale);
      model.backward(ctx);
    }
    r.losses.push_back(loss * double(scale));
    opt.step(kLr, optim::clip_scale(optim::grad_norm(opt), kClip));
  }
  for (const nn::ParamSet* set : model.param_sets())
    for (size_t i = 0; i < set->size(); ++i) r.weights[set->spec(i).name] = set->param(i);
  return r;
}

// This rank's v chunks of a balanced plan, initialised as the reference.
std::vector<std::unique_ptr<nn::Transformer>> make_chunks(const nn::ModelConfig& c, int64_t v, comm::ProcessGroup& pp) {
  const std::vector<StageLayers> plan = plan_pipeline_stages(c, kT, pp.size() * v);
  std::vector<std::unique_ptr<nn::Transformer>> chunks;
  for (int64_t k = 0; k < v; ++k) {
    const StageLayers& st = plan[size_t(k * pp.size() + pp.rank())];
    chunks.push_back(std::make_unique<nn::Transformer>(c, DType::f32, Device::cpu(), 1, nn::TensorParallel{},
                                                       nn::ModelPart{st.first, st.last, st.embedding, st.head}));
    chunks.back()->init_weights(9);
  }
  return chunks;
}

std::vector<nn::Transformer*> raw_pointers(const std::vector<std::unique_ptr<nn::Transformer>>& chunks) {
  std::vector<nn::Transformer*> raw;
  for (const auto& ch : chunks) raw.push_back(ch.get());
  return raw;
}

PipeRun pipelined(const nn::ModelConfig& c, int64_t m, PipelineSchedule kind, int64_t v, Mesh& mesh) {
  comm::ProcessGroup& pp = mesh.pp();
  const std::vector<std::unique_ptr<nn::Transformer>> chunks = make_chunks(c, v, pp);
  std::vector<nn::ParamSet*> sets;
  for (const auto& ch : chunks)
    for (nn::ParamSet* s : ch->param_sets()) sets.push_back(s);
  PipelineRunner runner(pp, raw_pointers(chunks), kind);
  optim::AdamW opt(sets, adamw());
  PipeRun out;
  const float scale = 1.0f / float(m * kB * kT);
  for (int64_t s = 0; s < kSteps; ++s) {
    for (auto& ch : chunks) ch->zero_grads();
    // The step's own activations: less what was live before it (other tests' cached results).
    int64_t live = 0;
    if (s == 0) {
      allocator_for(Device::cpu()).reset_peak();
      live = allocator_for(Device::cpu()).stats().current_bytes[size_t(MemCategory::activations)];
    }
    const PipelineRunner::StepResult res = runner.run(batches(c, s, m), scale);
    if (s == 0)
      out.peak_activation_bytes =
          allocator_for(Device::cpu()).stats().peak_bytes[size_t(MemCategory::activations)] - live;
    out.peak_in_flight = std::max(out.peak_in_flight, res.peak_in_flight);
    runner.sync_tied_embedding();
    out.losses.push_back(comm::sum_exact(pp, res.loss_sum) * double(scale));
    const double local = optim::grad_norm(opt);  // each element counted on one rank (the tied copy is not owned)
    const double norm = std::sqrt(comm::sum_exact(pp, local * local));
    opt.step(kLr, optim::clip_scale(norm, kClip));
  }
  for (const auto& ch : chunks)
    for (const nn::ParamSet* set : ch->param_sets())
      for (size_t i = 0; i < set->size(); ++i) out.weights[set->spec(i).name] = set->param(i);
  return out;
}

struct Case {
  PipelineSchedule kind;
  int64_t v;
};

TEST(Pipeline, EveryScheduleMatchesTheSingleProcessRun) {
  const int64_t p = comm::world().size();
  if (p == 1) GTEST_SKIP() << "needs 2 or more ranks";
  Mesh mesh(MeshShape{1, 1, p, 1, 1}, comm::world());
  for (const char* preset : {"gpt2-tiny", "llama3-tiny"}) {
    const nn::ModelConfig c = tiny(preset);
    for (int64_t m : {1, 4, 8}) {
      const PipeRun ref = reference(c, m);
      for (const Case& k : {Case{PipelineSchedule::afab, 1}, Case{PipelineSchedule::one_f_one_b, 1},
                            Case{PipelineSchedule::interleaved, 2}, Case{PipelineSchedule::zero_bubble, 1}}) {
        if (k.kind == PipelineSchedule::interleaved && m % p != 0) continue;
        SCOPED_TRACE(std::string(preset) + " " + std::string(pipeline_schedule_name(k.kind)) + " pp=" +
                     std::to_string(p) + " m=" + std::to_string(m));
        const PipeRun got = pipelined(c, m, k.kind, k.v, mesh);
        ASSERT_EQ(got.losses.size(), ref.losses.size());
        for (size_t s = 0; s < ref.losses.size(); ++s)
          EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "step " << s + 1;
        for (const auto& [name, w] : got.weights)
          EXPECT_LT(test::weight_rel_diff(name, w, ref.weights.at(name), c), 1e-5) << name << " after " << kSteps << " steps";
        // 1F1B: at most p - r micro-batches in flight on rank r; AFAB: all m.
        const int64_t r = mesh.pp().rank();
        if (k.kind == PipelineSchedule::one_f_one_b) {
          EXPECT_EQ(got.peak_in_flight, std::min(m, p - r));
        }
        if (k.kind == PipelineSchedule::afab) {
          EXPECT_EQ(got.peak_in_flight, m);
        }
        if (k.kind == PipelineSchedule::zero_bubble) {
          EXPECT_LE(got.peak_in_flight, std::min(m, p));
        }
      }
    }
  }
}

// Inference through the stages (samples under pp): the last position's
// logits equal the whole model's on every rank, and sampling over them draws
// the whole model's tokens.
TEST(Pipeline, LastLogitsAndSamplesEqualTheWholeModel) {
  const int64_t p = comm::world().size();
  if (p == 1) GTEST_SKIP() << "needs 2 or more ranks";
  Mesh mesh(MeshShape{1, 1, p, 1, 1}, comm::world());
  for (const char* preset : {"gpt2-tiny", "llama3-tiny"}) {
    const nn::ModelConfig c = tiny(preset);
    nn::Transformer whole(c, DType::f32);
    whole.init_weights(9);
    for (const int64_t v : {1, 2}) {
      SCOPED_TRACE(std::string(preset) + " v=" + std::to_string(v));
      const auto chunks = make_chunks(c, v, mesh.pp());
      PipelineRunner runner(mesh.pp(), raw_pointers(chunks), PipelineSchedule::one_f_one_b);
      std::mt19937_64 rng(31);  // the same tokens on every rank
      const Tensor tokens = test::random_tokens(Shape{1, 11}, c.vocab_size, rng);
      Tensor ref = Tensor::empty(Shape{1, 11, c.padded_vocab()}, DType::f32);
      test::poison(ref);
      whole.logits(ref, tokens);
      const Tensor got = runner.last_logits(tokens);
      ASSERT_EQ(got.numel(), c.padded_vocab());
      const std::vector<double> want = test::to_f64(ref.view(Shape{11, c.padded_vocab()}).slice(10, 11));
      EXPECT_TRUE(test::all_close(got, want, 1e-6, 1e-6));
      train::SamplingOptions opt;
      opt.max_new_tokens = 12;
      opt.seed = 77;
      const std::vector<uint32_t> prompt = {1, 2, 3};
      const auto expected = train::generate(whole, prompt, opt);
      const auto sampled = train::generate([&](const Tensor& t) { return runner.last_logits(t); }, c, prompt, opt);
      EXPECT_EQ(sampled, expected);
      // Three samples together over the stages' KV caches, past the
      // context (12 positions): those of the whole model drawn together.
      nn::ModelConfig short_context = c;
      short_context.max_seq_len = 12;
      opt.max_new_tokens = 14;
      std::vector<nn::KvCache> caches = runner.make_kv_caches(3);
      const train::DecodeFn decode = [&](const Tensor& t, bool restart) {
        if (restart)
          for (nn::KvCache& k : caches) k.clear();
        return runner.last_logits(t, &caches);
      };
      nn::KvCache whole_cache = whole.make_kv_cache(3, 12);
      const train::DecodeFn whole_decode = [&](const Tensor& t, bool restart) {
        if (restart) whole_cache.clear();
        Tensor out = Tensor::empty(Shape{3, c.padded_vocab()}, DType::f32);
        whole.last_logits(out, t, whole_cache);
        return out;
      };
      EXPECT_EQ(train::generate_samples(decode, short_context, prompt, opt, 3),
                train::generate_samples(whole_decode, short_context, prompt, opt, 3));
    }
  }
}

// Activation memory of the first stage, from the allocator: AFAB holds all
// m micro-batches' activations, 1F1B at most p of them.
TEST(Pipeline, OneFOneBBoundsTheFirstStagesActivationMemory) {
  const int64_t p = comm::world().size();
  if (p == 1) GTEST_SKIP() << "needs 2 or more ranks";
  Mesh mesh(MeshShape{1, 1, p, 1, 1}, comm::world());
  const nn::ModelConfig c = tiny("gpt2-tiny");
  const int64_t m = 4 * p;
  const PipeRun afab = pipelined(c, m, PipelineSchedule::afab, 1, mesh);
  const PipeRun ofob = pipelined(c, m, PipelineSchedule::one_f_one_b, 1, mesh);
  if (mesh.pp().rank() != 0) return;
  RecordProperty("afab_peak", std::to_string(afab.peak_activation_bytes));
  RecordProperty("1f1b_peak", std::to_string(ofob.peak_activation_bytes));
  // Kept per micro-batch >> transient buffers, so the ratio is about m / p.
  const double ratio = double(afab.peak_activation_bytes) / double(ofob.peak_activation_bytes);
  EXPECT_GT(ratio, 0.75 * double(m) / double(p)) << "AFAB " << afab.peak_activation_bytes << " bytes, 1F1B "
                                                 << ofob.peak_activation_bytes;
  EXPECT_LT(ratio, 1.25 * double(m) / double(p));
}

}  // namespace
}  // namespace zt::parallel

// Through the trainer (config, mesh, data loader, clipping, AdamW, data and
// tensor parallelism around the pipeline): 10 steps of pp x dp and pp x tp
// layouts equal the single-process run.
#include "train/config.h"
#include "train/data_source.h"
#include "train/trainer.h"

namespace zt::train {
namespace {

// The shared tiny config with 4 blocks (pp = 4 needs a block per stage).
Config pp_config(const std::string& preset, std::vector<std::string> more) {
  more.insert(more.begin(), "model.n_layer=4");
  return test::fortunes_config(preset, more);
}

struct TrainerRun {
  std::vector<double> losses;
  std::map<std::string, Tensor> weights;  // this rank's tensors, whole (tp gathered)
  StepMetrics last;                        // the last step's metrics
};

TrainerRun train_with(const Config& cfg, std::shared_ptr<parallel::Mesh> mesh) {
  const int dp = mesh ? int(mesh->dp().size()) : 1, rank = mesh ? int(mesh->coord().dp) : 0;
  TrainingData data = open_training_data(cfg, rank, dp);
  Trainer t(cfg, std::move(data.train), nullptr, nullptr, mesh);
  TrainerRun r;
  for (int64_t s = 0; s < cfg.train.steps; ++s) {
    r.last = t.train_step(s);
    r.losses.push_back(r.last.loss);
  }
  t.data_parallel().hold_full_params(true);  // ZeRO-3: gather the weights to compare them
  for (const auto& c : t.chunks())
    for (const nn::ParamSet* set : static_cast<const nn::Transformer&>(*c).param_sets())
      for (size_t i = 0; i < set->size(); ++i) r.weights[set->spec(i).name] = c->global_param(set->spec(i).name);
  return r;
}

TEST(PipelineTrainer, LayoutsWithDataAndTensorParallelismMatchOneProcess) {
  const int64_t p = comm::world().size();
  if (p != 2 && p != 4) GTEST_SKIP() << "needs 2 or 4 ranks";
  struct Layout {
    int64_t dp, tp, pp;
    std::vector<std::string> settings;
  };
  std::vector<Layout> layouts;
  if (p == 2) {
    layouts = {{1, 1, 2, {"parallel.pp_schedule=1f1b"}},
               {1, 1, 2, {"parallel.pp_schedule=interleaved", "parallel.virtual_stages=2"}},
               {1, 1, 2, {"parallel.pp_schedule=zb"}},
               {1, 1, 2, {"parallel.pp_schedule=afab", "parallel.pp_layers=3,1"}}};
  } else {
    layouts = {{2, 1, 2, {"parallel.pp_schedule=1f1b", "parallel.zero_stage=1"}},
               {2, 1, 2, {"parallel.pp_schedule=1f1b", "parallel.zero_stage=2"}},
               {2, 1, 2, {"parallel.pp_schedule=interleaved", "parallel.virtual_stages=2", "parallel.zero_stage=3"}},
               {2, 1, 2, {"parallel.pp_schedule=zb", "parallel.zero_stage=2"}},
               {2, 1, 2, {"parallel.pp_schedule=zb", "parallel.zero_stage=3"}},
               {1, 2, 2, {"parallel.pp_schedule=1f1b"}},
               {1, 2, 2, {"parallel.pp_schedule=zb", "parallel.sequence_parallel=true"}},
               {1, 1, 4, {"parallel.pp_schedule=1f1b"}}};
  }
  for (const char* preset : {"gpt2-tiny", "llama3-tiny"}) {
    const Config ref_cfg = pp_config(preset, {});
    const TrainerRun ref = train_with(ref_cfg, nullptr);
    for (const Layout& l : layouts) {
      std::vector<std::string> ov = l.settings;
      ov.push_back("parallel.pp=" + std::to_string(l.pp));
      ov.push_back("parallel.tp=" + std::to_string(l.tp));
      std::string what = std::string(preset) + " dp=" + std::to_string(l.dp) + " tp=" + std::to_string(l.tp) +
                         " pp=" + std::to_string(l.pp);
      for (const auto& s : l.settings) what += " " + s;
      SCOPED_TRACE(what);
      const Config cfg = pp_config(preset, ov);
      auto mesh = std::make_shared<parallel::Mesh>(parallel::MeshShape{l.dp, l.tp, l.pp, 1, 1}, comm::world());
      const TrainerRun got = train_with(cfg, mesh);
      ASSERT_EQ(got.losses.size(), ref.losses.size());
      for (size_t s = 0; s < ref.losses.size(); ++s)
        EXPECT_NEAR(got.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s])) << "step " << s + 1;
      for (const auto& [layer, diff] : test::layer_rel_diffs(got.weights, ref.weights, cfg.model))
        EXPECT_LT(diff, 1e-5) << layer << " after 10 steps";
      // Per-stage bubble: 1 - compute / span of the longest rank; the time
      // blocked on transfers is part of it; every stage idles some (p > 1).
      const StepMetrics& mt = got.last;
      ASSERT_EQ(mt.pp_bubble_per_stage.size(), size_t(l.pp));
      ASSERT_EQ(mt.pp_wait_per_stage.size(), size_t(l.pp));
      for (int64_t st = 0; st < l.pp; ++st) {
        EXPECT_GT(mt.pp_bubble_per_stage[size_t(st)], 0.0) << "stage " << st;
        EXPECT_LT(mt.pp_bubble_per_stage[size_t(st)], 1.0) << "stage " << st;
        EXPECT_GE(mt.pp_wait_per_stage[size_t(st)], 0.0) << "stage " << st;
        EXPECT_LE(mt.pp_wait_per_stage[size_t(st)], mt.pp_bubble_per_stage[size_t(st)] + 1e-9) << "stage " << st;
      }
      EXPECT_GT(mt.pp_bubble_theory, 0.0);
    }
  }
}

// metrics.trace_step under a pipeline: each rank's "step" track holds its
// schedule's actions - a forward and a backward of every micro-batch (1F1B).
TEST(PipelineTrainer, TraceStepHoldsEachRanksSchedule) {
  const int64_t p = comm::world().size();
  if (p != 2) GTEST_SKIP() << "needs 2 ranks";
  const std::string dir = test::fortunes_dataset().string() + "_trace";
  const Config cfg = pp_config("gpt2-tiny", {"parallel.pp=2", "parallel.pp_schedule=1f1b", "metrics.trace_step=2",
                                             "train.steps=2", "train.run_dir=" + dir});
  auto mesh = std::make_shared<parallel::Mesh>(parallel::MeshShape{1, 1, 2, 1, 1}, comm::world());
  TrainingData data = open_training_data(cfg, 0, 1);
  Trainer t(cfg, std::move(data.train), nullptr, nullptr, mesh);
  t.log = [](const std::string&) {};
  t.train_step(0);
  t.train_step(1);
  if (comm::world().rank() != 0) return;
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/trace.json"));
  std::map<int64_t, std::multiset<std::string>> steps;  // rank -> its schedule's actions
  for (const nlohmann::json& e : j.at("traceEvents"))
    if (e.at("ph") == "X" && e.at("cat") == "step")
      steps[e.at("pid").get<int64_t>()].insert(e.at("name").get<std::string>());
  ASSERT_EQ(steps.size(), 2u);
  const int64_t micro = cfg.grad_accum_steps(1);
  for (const auto& [rank, names] : steps)
    for (int64_t m = 1; m <= micro; ++m)
      for (const char* action : {"forward", "backward"})
        EXPECT_EQ(names.count(std::string(action) + " (micro-batch " + std::to_string(m) + ")"), 1u)
            << "rank " << rank << " " << action << " " << m;
}

// fp8 blocks under every kind of layout of 2 ranks. Pipelines: zero
// bubble's deferred weight passes quantise their operands again when they
// run (no codes held through the schedule), 1F1B's read the codes of the
// data product; data parallelism (ZeRO-3: weights gathered per block):
// each rank quantises its own micro-batches as the one process does. Both
// agree with the one process as the compute dtype does, up to an fp8 code a
// last-bit difference moved across a rounding boundary. Tensor parallelism
// scales each rank's shard of a weight, of q, k and v, of the MLP's hidden
// activations by its own amax: other codes, up to 0.4% after 10 steps here
// (a swapped scale or operand is off by tens of percent).
TEST(ParallelFp8, EveryKindOfLayoutMatchesOneProcess) {
  const int64_t p = comm::world().size();
  if (p != 2) GTEST_SKIP() << "needs 2 ranks";
  struct Layout {
    parallel::MeshShape shape;
    std::vector<std::string> settings;
    double tolerance;
  };
  const std::vector<Layout> layouts = {
      {{1, 1, 2, 1, 1}, {"parallel.pp=2", "parallel.pp_schedule=1f1b"}, 1e-4},
      {{1, 1, 2, 1, 1}, {"parallel.pp=2", "parallel.pp_schedule=zb"}, 1e-4},
      {{2, 1, 1, 1, 1}, {"parallel.zero_stage=3"}, 1e-4},
      {{1, 2, 1, 1, 1}, {"parallel.tp=2", "parallel.sequence_parallel=true"}, 1e-2}};
  for (const char* preset : {"gpt2-tiny", "llama3-tiny"}) {
    const TrainerRun ref = train_with(pp_config(preset, {"train.fp8=true"}), nullptr);
    for (const Layout& l : layouts) {
      std::string what = preset;
      for (const std::string& s : l.settings) what += " " + s;
      SCOPED_TRACE(what);
      std::vector<std::string> ov = l.settings;
      ov.push_back("train.fp8=true");
      const Config cfg = pp_config(preset, ov);
      const TrainerRun got = train_with(cfg, std::make_shared<parallel::Mesh>(l.shape, comm::world()));
      ASSERT_EQ(got.losses.size(), ref.losses.size());
      for (size_t s = 0; s < ref.losses.size(); ++s)
        EXPECT_NEAR(got.losses[s], ref.losses[s], l.tolerance * std::fabs(ref.losses[s])) << "step " << s + 1;
      for (const auto& [layer, diff] : test::layer_rel_diffs(got.weights, ref.weights, cfg.model))
        EXPECT_LT(diff, l.tolerance) << layer << " after 10 steps";
    }
  }
}

}  // namespace
}  // namespace zt::train
