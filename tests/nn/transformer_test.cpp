#include <cstdint>
#include <gtest/gtest.h>

#include <cstring>

#include "core/allocator.h"
#include "core/error.h"
#include "nn/transformer.h"
#include "test_util.h"

namespace zt::nn {
namespace {

TEST(ModelConfig, PresetParameterCountsMatchThePublishedModels) {
  EXPECT_EQ(model_preset("gpt2-124m").total_params(), 124439808);   // GPT-2 small
  EXPECT_EQ(model_preset("llama3-8b").total_params(), 8030261248);  // Llama 3 8B
  EXPECT_EQ(model_preset("llama3-1b").total_params(), 1235814400);  // Llama 3.2 1B (tied)
  for (const std::string& name : model_preset_names()) EXPECT_NO_THROW(model_preset(name).validate()) << name;
  EXPECT_THROW(model_preset("nope"), Error);
}

struct Batch {
  Tensor tokens, targets;
};

Batch random_batch(const ModelConfig& c, int64_t B, int64_t T, uint64_t salt) {
  auto rng = test::make_rng(salt);
  return {test::random_tokens(Shape{B, T}, c.vocab_size, rng), test::random_tokens(Shape{B, T}, c.vocab_size, rng)};
}

std::vector<std::vector<char>> grad_bytes(const Transformer& m) {
  std::vector<std::vector<char>> out;
  for (const ParamSet* s : m.param_sets()) {
    const char* p = static_cast<const char*>(s->grad_flat().data_ptr());
    out.emplace_back(p, p + s->grad_flat().nbytes());
  }
  return out;
}

class RecomputeTest : public ::testing::TestWithParam<const char*> {};

TEST_P(RecomputeTest, PoliciesGiveBitwiseEqualGradientsAndLessMemory) {
  ZT_TEST_TRACE_SEED();
  ModelConfig c = model_preset(GetParam());
  c.n_layer = 3;
  const int64_t B = 2, T = 24;
  const Batch b = random_batch(c, B, T, 11);
  std::vector<std::vector<char>> reference;
  int64_t peak[3] = {0, 0, 0};
  int i = 0;
  for (Recompute policy : {Recompute::none, Recompute::selective, Recompute::full}) {
    Transformer m(c, DType::f32);
    m.init_weights(5);
    m.recompute = policy;
    Allocator& alloc = allocator_for(Device::cpu());
    const int64_t before = alloc.stats().current(MemCategory::activations);
    alloc.reset_peak();
    ForwardContext ctx;
    m.forward(ctx, b.tokens, b.targets, true, 1.0f / float(B * T));
    m.backward(ctx);
    peak[i++] = alloc.stats().peak(MemCategory::activations) - before;
    EXPECT_EQ(alloc.stats().current(MemCategory::activations), before) << "activations leaked";
    if (policy == Recompute::none)
      reference = grad_bytes(m);
    else
      EXPECT_TRUE(grad_bytes(m) == reference) << "gradients differ under recompute " << recompute_name(policy);
  }
  EXPECT_LT(peak[1], peak[0]) << "selective should keep less than none";
  EXPECT_LT(peak[2], peak[1]) << "full should keep less than selective";
}

INSTANTIATE_TEST_SUITE_P(Arch, RecomputeTest, ::testing::Values("gpt2-tiny", "llama3-tiny"));

TEST(Transformer, AccumulatingMicroBatchesEqualsOneBatch) {
  ZT_TEST_TRACE_SEED();
  for (const char* preset : {"gpt2-tiny", "llama3-tiny"}) {
    ModelConfig c = model_preset(preset);
    const int64_t B = 8, T = 16;
    const Batch b = random_batch(c, B, T, 3);
    Transformer whole(c, DType::f32), parts(c, DType::f32);
    whole.init_weights(9);
    parts.init_weights(9);
    const float scale = 1.0f / float(B * T);
    ForwardContext ctx;
    const double l1 = whole.forward(ctx, b.tokens, b.targets, true, scale);
    whole.backward(ctx);
    double l4 = 0;
    for (int64_t k = 0; k < 4; ++k) {
      l4 += parts.forward(ctx, b.tokens.slice(2 * k, 2 * k + 2), b.targets.slice(2 * k, 2 * k + 2), true, scale);
      parts.backward(ctx);
    }
    EXPECT_NEAR(l1, l4, 1e-6 * std::fabs(l1));  // f32 sums over different row blockings
    const auto pw = whole.param_sets(), pp = parts.param_sets();
    for (size_t s = 0; s < pw.size(); ++s)
      EXPECT_LT(test::max_rel_error(pp[s]->grad_flat(), test::to_f64(pw[s]->grad_flat())), 1e-5)
          << preset << " param set " << s;
  }
}

TEST(Transformer, InitIsDeterministicAndPaddingRowsAreZero) {
  ModelConfig c = model_preset("gpt2-tiny");
  c.vocab_size = 500;  // padded to 512
  Transformer a(c, DType::f32), b(c, DType::f32), other(c, DType::f32);
  a.init_weights(1);
  b.init_weights(1);
  other.init_weights(2);
  EXPECT_EQ(0, std::memcmp(a.param("embed.wte").data_ptr(), b.param("embed.wte").data_ptr(),
                           a.param("embed.wte").nbytes()));
  EXPECT_NE(0, std::memcmp(a.param("embed.wte").data_ptr(), other.param("embed.wte").data_ptr(),
                           a.param("embed.wte").nbytes()));
  const Tensor pad = a.param("embed.wte").slice(500, 512);
  for (int64_t i = 0; i < pad.numel(); ++i) EXPECT_EQ(pad.data<float>()[i], 0.0f);
  // Residual projections use std / sqrt(2 L): check the sample std is near it.
  const Tensor proj = a.param("layers.1.attn.proj.weight");
  double s2 = 0;
  for (int64_t i = 0; i < proj.numel(); ++i) s2 += double(proj.data<float>()[i]) * proj.data<float>()[i];
  EXPECT_NEAR(std::sqrt(s2 / double(proj.numel())), 0.02 / 2.0, 0.002);
  EXPECT_EQ(a.param("layers.0.attn_norm.weight").data<float>()[3], 1.0f);
  EXPECT_EQ(a.num_params(), c.total_params() + 12 * c.d_model);
}

TEST(Transformer, BadInputsAreClearErrors) {
  ModelConfig c = model_preset("gpt2-tiny");
  Transformer m(c, DType::f32);
  m.init_weights(1);
  ForwardContext ctx;
  Batch b = random_batch(c, 1, c.max_seq_len + 1, 1);
  try {
    m.forward(ctx, b.tokens, b.targets, true, 1.0f);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the model's context"), std::string::npos) << e.what();
  }
  b = random_batch(c, 1, 8, 2);
  b.tokens.data<int32_t>()[5] = int32_t(c.padded_vocab() + 3);
  EXPECT_THROW(m.forward(ctx, b.tokens, b.targets, true, 1.0f), Error);
  EXPECT_THROW(m.backward(ctx), Error);  // no training forward happened
  ModelConfig bad = c;
  bad.n_head = 5;
  EXPECT_THROW(Transformer(bad, DType::f32), Error);
  EXPECT_THROW(Transformer(c, DType::f16), Error);
}

TEST(Transformer, Bf16ForwardTracksF32) {
  ZT_TEST_TRACE_SEED();
  ModelConfig c = model_preset("llama3-tiny");
  const Batch b = random_batch(c, 2, 16, 4);
  Transformer f32(c, DType::f32), bf(c, DType::bf16);
  f32.init_weights(3);
  bf.init_weights(3);
  ForwardContext ctx;
  const double l32 = f32.forward(ctx, b.tokens, b.targets, false, 0.0f);
  const double l16 = bf.forward(ctx, b.tokens, b.targets, false, 0.0f);
  EXPECT_NEAR(l16 / l32, 1.0, 1e-2);
}

}  // namespace
}  // namespace zt::nn
