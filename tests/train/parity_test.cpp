// The model against PyTorch: the same weights (exchanged as safetensors) and
// batches go through tests/reference/model_ref.py (Debian's PyTorch, an
// independent implementation) and through Zettatron; logits, loss, every
// parameter gradient and 10 AdamW steps (cosine schedule, clipping) must agree
// to a relative error < 1e-4 in fp32.
#include <cstdint>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "ckpt/safetensors.h"
#include "test_util.h"
#include "train/config.h"
#include "train/trainer.h"

namespace zt::train {
namespace {

namespace fs = std::filesystem;

// Batches from a (steps, B, T) tensor pair, handed out as consecutive
// micro-batches.
class FixedBatches : public BatchSource {
 public:
  FixedBatches(Tensor tokens, Tensor targets) : tokens_(tokens), targets_(targets) {}
  void next(const Tensor& inputs, const Tensor& targets) override {
    const int64_t rows = inputs.size(0), T = inputs.size(1), per_step = tokens_.size(1);
    const int64_t step = row_ / per_step, r = row_ % per_step;
    std::memcpy(inputs.data_ptr(), tokens_.select(step).slice(r, r + rows).data_ptr(), size_t(rows * T) * 4);
    std::memcpy(targets.data_ptr(), targets_.select(step).slice(r, r + rows).data_ptr(), size_t(rows * T) * 4);
    row_ += rows;
  }
  void reset() override { row_ = 0; }

 private:
  Tensor tokens_, targets_;
  int64_t row_ = 0;
};

double rel_error(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.numel(), ref.numel());
  const auto g = test::to_f64(got), r = test::to_f64(ref);
  double num = 0, den = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    num = std::max(num, std::fabs(g[i] - r[i]));
    den = std::max(den, std::fabs(r[i]));
  }
  return den > 0 ? num / den : num;
}

using test::rel_l2_error;

struct ParityCase {
  std::string name;
  std::string toml;  // model + train overrides
};

void run_case(const ParityCase& pc) {
  ZT_TEST_TRACE_SEED();
  SCOPED_TRACE(pc.name);
  const int64_t steps = 10;
  const std::string base = R"(
[data]
dir = "unused"
[optim]
lr = 3e-3
min_lr = 3e-4
warmup_steps = 3
weight_decay = 0.1
grad_clip = 0.5
[metrics]
peak_gflops = 1.0
)";
  Config cfg = parse_config(pc.toml + base, pc.name, {"train.steps=10", "train.seq_len=16", "train.seed=7"});
  const int64_t B = cfg.train.global_batch, T = cfg.train.seq_len, V = cfg.model.vocab_size;

  auto rng = test::make_rng(std::hash<std::string>{}(pc.name));
  Tensor tokens = test::random_tokens(Shape{steps, B, T}, V, rng);
  Tensor targets = test::random_tokens(Shape{steps, B, T}, V, rng);

  const fs::path dir = fs::temp_directory_path() / ("zt_parity_" + pc.name + "_" + std::to_string(test::test_seed()));
  fs::create_directories(dir);

  Trainer trainer(cfg, std::make_unique<FixedBatches>(tokens, targets), nullptr, nullptr);
  nn::Transformer& model = trainer.model();
  std::vector<std::pair<std::string, Tensor>> weights;
  nlohmann::json no_decay = nlohmann::json::array();
  for (const nn::ParamSet* s : model.param_sets())
    for (size_t i = 0; i < s->size(); ++i) {
      weights.emplace_back(s->spec(i).name, s->param(i));
      if (!s->spec(i).decay) no_decay.push_back(s->spec(i).name);
    }
  ckpt::write_safetensors((dir / "weights.safetensors").string(), weights);
  ckpt::write_safetensors((dir / "batches.safetensors").string(), {{"tokens", tokens}, {"targets", targets}});
  const nn::ModelConfig& m = cfg.model;
  nlohmann::json j = {
      {"arch", std::string(nn::arch_name(m.arch))}, {"vocab_size", m.vocab_size}, {"n_layer", m.n_layer},
      {"d_model", m.d_model}, {"n_head", m.n_head}, {"n_kv_head", m.n_kv_head}, {"d_ff", m.d_ff},
      {"max_seq_len", m.max_seq_len}, {"norm_eps", m.norm_eps}, {"rope_theta", m.rope_theta},
      {"rope_scaling", m.rope_scaling.enabled}, {"rope_scaling_factor", m.rope_scaling.factor},
      {"rope_low_freq_factor", m.rope_scaling.low_freq_factor},
      {"rope_high_freq_factor", m.rope_scaling.high_freq_factor},
      {"rope_original_max_position", m.rope_scaling.original_max_position},
      {"tied_embeddings", m.tied_embeddings}, {"grad_accum", cfg.grad_accum_steps()}, {"no_decay", no_decay},
      {"n_expert", m.n_expert}, {"expert_top_k", m.expert_top_k}, {"expert_normalize", m.expert_normalize},
      {"router_aux_loss", m.router_aux_loss}, {"router_z_loss", m.router_z_loss},
      {"shared_expert_ff", m.shared_expert_ff}, {"expert_capacity_factor", m.expert_capacity_factor},
      {"optim",
       {{"lr", cfg.optim.lr}, {"min_lr", cfg.optim.min_lr}, {"warmup_steps", cfg.optim.warmup_steps},
        {"steps", steps}, {"beta1", cfg.optim.beta1}, {"beta2", cfg.optim.beta2}, {"eps", cfg.optim.eps},
        {"weight_decay", cfg.optim.weight_decay}, {"grad_clip", cfg.optim.grad_clip}}}};
  std::ofstream(dir / "config.json") << j.dump(2);

  const std::string cmd = "cd " ZT_SOURCE_DIR "/tests/reference && /usr/bin/python3 model_ref.py " + dir.string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the PyTorch reference failed: " << cmd
                                         << " (Debian's python3-torch is installed by make deps)";
  auto ref = ckpt::SafetensorsFile::open((dir / "ref.safetensors").string());

  // Logits of batch 0.
  Tensor logits = Tensor::empty(Shape{B, T, m.padded_vocab()}, DType::f32);
  model.logits(logits, tokens.select(0));
  EXPECT_LT(rel_error(logits, ref.tensor("logits")), 1e-4) << "logits";

  // Loss and every gradient on batch 0 (one micro-batch of the whole batch).
  {
    nn::ForwardContext ctx;
    model.zero_grads();
    const double loss = model.forward(ctx, tokens.select(0), targets.select(0), true, float(1.0 / double(B * T))) /
                        double(B * T);
    model.backward(ctx);
    const double ref_loss = test::load_f64(ref.tensor("loss"), 0);
    EXPECT_LT(std::fabs(loss - ref_loss) / std::fabs(ref_loss), 1e-5) << "loss " << loss << " vs " << ref_loss;
    for (auto& [name, w] : weights)
      EXPECT_LT(rel_error(model.grad(name), ref.tensor("grad." + name)), 1e-4) << "gradient of " << name;
    model.zero_grads();
  }

  // Ten optimizer steps through the trainer (accumulation as configured).
  for (int64_t s = 0; s < steps; ++s) {
    const StepMetrics sm = trainer.train_step(s);
    const double ref_loss = test::load_f64(ref.tensor("losses"), s);
    EXPECT_LT(std::fabs(sm.loss - ref_loss) / std::fabs(ref_loss), 1e-4) << "loss of step " << s;
  }
  // Final weights (beyond the issue's checks, which are the 1e-4 ones above):
  // Adam divides by sqrt(v), so an element whose gradient is at rounding
  // level (the key bias's gradient is exactly zero in exact arithmetic; rows
  // of rare tokens) gets an O(lr) update of arbitrary sign in either
  // implementation. Hence the L2-relative norm and a 1e-3 bound here; the
  // observed values are 1e-5..1.2e-4.
  // The key bias is all noise, so it is left out after checking that the
  // reference gradient there is at rounding level.
  const int64_t qk = m.n_head * m.head_dim(), kv = m.n_kv_head * m.head_dim();
  auto max_abs = [](const Tensor& t) {
    double mx = 0;
    for (double x : test::to_f64(t)) mx = std::max(mx, std::fabs(x));
    return mx;
  };
  for (auto& [name, w] : weights) {
    const Tensor got = model.param(name), want = ref.tensor("final." + name);
    if (name.ends_with("attn.qkv.bias")) {
      const Tensor g = ref.tensor("grad." + name);
      EXPECT_LT(max_abs(g.slice(qk, qk + kv)), 1e-6 * max_abs(g))
          << "the reference key-bias gradient of " << name << " is not at rounding-noise level";
      EXPECT_LT(rel_l2_error(got.slice(0, qk), want.slice(0, qk)), 1e-3) << "q bias of " << name;
      EXPECT_LT(rel_l2_error(got.slice(qk + kv, qk + 2 * kv), want.slice(qk + kv, qk + 2 * kv)), 1e-3)
          << "v bias of " << name;
      continue;
    }
    EXPECT_LT(rel_l2_error(got, want), 1e-3) << "weights of " << name << " after training";
  }
  if (std::getenv("ZT_KEEP_PARITY_DIR")) {  // debugging aid: keep the exchange files and our final weights
    std::vector<std::pair<std::string, Tensor>> finals;
    for (auto& [name, w] : weights) finals.emplace_back("final." + name, model.param(name));
    ckpt::write_safetensors((dir / "ours.safetensors").string(), finals);
    std::cout << "kept " << dir << "\n";
  } else {
    fs::remove_all(dir);
  }
}

TEST(PyTorchParity, Gpt2TiedEmbeddings) {
  run_case({"gpt2_tied", R"([model]
preset = "gpt2-tiny"
vocab_size = 500
[train]
global_batch = 4
micro_batch = 4
)"});
}

TEST(PyTorchParity, Gpt2UntiedHeadWithAccumulation) {
  run_case({"gpt2_untied_accum", R"([model]
preset = "gpt2-tiny"
tied_embeddings = false
[train]
global_batch = 8
micro_batch = 2
)"});
}

TEST(PyTorchParity, Llama3GqaRopeScaling) {
  run_case({"llama3_gqa", R"([model]
preset = "llama3-tiny"
n_head = 4
n_kv_head = 2
rope_scaling = true
[train]
global_batch = 4
micro_batch = 4
)"});
}

TEST(PyTorchParity, Llama3TiedGradAccumulation) {
  run_case({"llama3_tied_accum", R"([model]
preset = "llama3-tiny"
tied_embeddings = true
n_kv_head = 1
[train]
global_batch = 8
micro_batch = 2
)"});
}

// Mixture of experts (nn/moe.h): the reference runs every expert on every
// token and keeps each token's top k, so the dispatch, the per-expert
// products and the combine are checked against plain dense algebra; the
// load-balancing loss is in the gradients and the training run.
TEST(PyTorchParity, MixtureOfExpertsTopTwoWithAccumulation) {
  run_case({"llama3_moe", R"([model]
preset = "llama3-moe-tiny"
router_aux_loss = 0.05
[train]
global_batch = 8
micro_batch = 4
)"});
}

TEST(PyTorchParity, MixtureOfExpertsSoftmaxWeightsTopThreeZLossSelectiveRecompute) {
  run_case({"llama3_moe_softmax", R"([model]
preset = "llama3-moe-tiny"
n_expert = 5
expert_top_k = 3
expert_normalize = false
router_aux_loss = 0.1
router_z_loss = 0.01
tied_embeddings = true
[train]
global_batch = 4
micro_batch = 4
recompute = "selective"
)"});
}

// A capacity (Switch / GShard): each expert takes at most its mean
// share of a micro-batch's slots, the first come; the reference drops the
// same slots from its dense algebra (their outputs and gradients), while
// the balancing loss still counts what the router chose.
TEST(PyTorchParity, MixtureOfExpertsDropsSlotsOverCapacity) {
  run_case({"llama3_moe_capacity", R"([model]
preset = "llama3-moe-tiny"
expert_capacity_factor = 1.0
router_aux_loss = 0.05
[train]
global_batch = 8
micro_batch = 4
recompute = "full"
)"});
}

// A shared expert (DeepSeekMoE): every token through one more SwiGLU MLP
// beside its top k, here of another width than the routed experts'.
TEST(PyTorchParity, MixtureOfExpertsWithASharedExpert) {
  run_case({"llama3_moe_shared", R"([model]
preset = "llama3-moe-tiny"
shared_expert_ff = 80
router_aux_loss = 0.05
[train]
global_batch = 8
micro_batch = 4
)"});
}

}  // namespace
}  // namespace zt::train
