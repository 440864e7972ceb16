// The whole model on the GPU against the same model on the CPU: same seed,
// same batch; loss and every parameter gradient compared (f32: the kernels
// differ only in summation order; bf16: within bf16 rounding of activations).
// Then a few optimizer steps on each device must track each other, and the
// recompute policies must give bitwise-identical gradients on the GPU too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "cuda/cuda_test_util.h"
#include "nn/transformer.h"
#include "optim/adamw.h"

namespace zt::test {
namespace {

using nn::ForwardContext;
using nn::ModelConfig;
using nn::Recompute;
using nn::Transformer;

struct Batch {
  Tensor tokens, targets;
};

Batch random_batch(const ModelConfig& c, int64_t B, int64_t T, uint64_t salt) {
  auto rng = make_rng(salt);
  Batch b{random_tokens(Shape{B, T}, c.vocab_size, rng), random_tokens(Shape{B, T}, c.vocab_size, rng)};
  b.targets.data<int32_t>()[1] = -1;  // one ignored target
  return b;
}

ModelConfig tiny(const char* preset) {
  ModelConfig c = nn::model_preset(preset);
  c.n_layer = 2;
  return c;
}

// ||a - b|| / ||b|| over all gradients of the model (host copies).
double grad_rel_error(const Transformer& gpu_model, const Transformer& cpu_model) {
  double num = 0, den = 0;
  const auto gs = gpu_model.param_sets(), cs = cpu_model.param_sets();
  for (size_t i = 0; i < gs.size(); ++i) {
    const std::vector<double> g = values_of(gs[i]->grad_flat()), r = values_of(cs[i]->grad_flat());
    for (size_t j = 0; j < g.size(); ++j) {
      if (!std::isfinite(g[j])) return INFINITY;
      num += (g[j] - r[j]) * (g[j] - r[j]);
      den += r[j] * r[j];
    }
  }
  return std::sqrt(num / den);
}

class GpuModelTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuModelTest, LossAndGradientsMatchTheCpuModel) {
  ZT_REQUIRE_GPU();
  const ModelConfig c = tiny(GetParam());
  const int64_t B = 2, T = 48;
  const Batch b = random_batch(c, B, T, 3);
  const float scale = 1.0f / float(B * T);
  Transformer cpu_model(c, DType::f32);
  cpu_model.init_weights(7);
  ForwardContext cctx;
  const double cpu_loss = cpu_model.forward(cctx, b.tokens, b.targets, true, scale);
  cpu_model.backward(cctx);
  for (DType dt : {DType::f32, DType::bf16}) {
    Transformer gpu_model(c, dt, gpu());
    gpu_model.init_weights(7);
    ForwardContext gctx;
    const double gpu_loss = gpu_model.forward(gctx, b.tokens, b.targets, true, scale);
    gpu_model.backward(gctx);
    const bool f32 = dt == DType::f32;
    EXPECT_NEAR(gpu_loss / cpu_loss, 1.0, f32 ? 1e-5 : 1e-2) << GetParam() << " " << dtype_name(dt);
    const double err = grad_rel_error(gpu_model, cpu_model);
    EXPECT_LT(err, f32 ? 1e-4 : 5e-2) << GetParam() << " " << dtype_name(dt) << " gradient relative error";
  }
}

TEST_P(GpuModelTest, RecomputePoliciesGiveBitwiseEqualGradients) {
  ZT_REQUIRE_GPU();
  const ModelConfig c = tiny(GetParam());
  const Batch b = random_batch(c, 2, 40, 5);
  std::vector<std::vector<double>> reference;
  for (Recompute policy : {Recompute::none, Recompute::selective, Recompute::full}) {
    Transformer m(c, DType::bf16, gpu());
    m.init_weights(9);
    m.recompute = policy;
    ForwardContext ctx;
    m.forward(ctx, b.tokens, b.targets, true, 1.0f / 80);
    m.backward(ctx);
    std::vector<std::vector<double>> grads;
    for (const nn::ParamSet* s : m.param_sets()) grads.push_back(values_of(s->grad_flat()));
    if (policy == Recompute::none)
      reference = grads;
    else
      EXPECT_TRUE(grads == reference) << "gradients differ under recompute " << nn::recompute_name(policy);
  }
}

TEST_P(GpuModelTest, TrainingStepsTrackTheCpu) {
  ZT_REQUIRE_GPU();
  const ModelConfig c = tiny(GetParam());
  const Batch b = random_batch(c, 2, 32, 8);
  optim::AdamWConfig oc;
  const double lr = 3e-3;
  Transformer cm(c, DType::f32), gm(c, DType::f32, gpu());
  cm.init_weights(4);
  gm.init_weights(4);
  optim::AdamW copt(cm.param_sets(), oc), gopt(gm.param_sets(), oc);
  double first = 0, last_cpu = 0, last_gpu = 0;
  for (int step = 0; step < 8; ++step) {
    for (Transformer* m : {&cm, &gm}) {
      m->zero_grads();
      ForwardContext ctx;
      const double loss = m->forward(ctx, b.tokens, b.targets, true, 1.0f / 64) / 63.0;
      m->backward(ctx);
      (m == &cm ? copt : gopt).step(lr, 1.0f);
      if (step == 0 && m == &cm) first = loss;
      (m == &cm ? last_cpu : last_gpu) = loss;
    }
  }
  EXPECT_LT(last_cpu, first * 0.9) << "the CPU run should learn the fixed batch";
  EXPECT_NEAR(last_gpu / last_cpu, 1.0, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Arch, GpuModelTest, ::testing::Values("gpt2-tiny", "llama3-tiny"));

}  // namespace
}  // namespace zt::test
