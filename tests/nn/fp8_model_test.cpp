// The model with fp8 blocks (Transformer::fp8: the blocks' linear layers on
// per-tensor-scaled E4M3 / E5M2 operands) against the same weights in the
// compute dtype: the loss within 2%, every parameter's gradient within 20% in
// the 2-norm - E5M2 keeps 2 mantissa bits (up to 12.5% per element, about 7%
// RMS), and a norm's gradient went through two fp8 backward products (the
// worst here: 13%, the linear layers' own 9-10%); a wrong scale or a
// swapped operand is off by 100% and more - for GPT-2 and Llama, f32 and
// bf16, every recompute policy; and the fp8 products are really the ones
// that ran (the op profile counts them, the bits differ), each operand
// quantised once however many products read it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "nn/transformer.h"
#include "ops/op_profile.h"
#include "test_util.h"

namespace zt::nn {
namespace {

int64_t calls(const std::vector<ops::OpTotal>& ops, const std::string& name) {
  for (const ops::OpTotal& t : ops)
    if (t.name == name) return t.calls;
  return 0;
}

TEST(Fp8Model, BlocksOnFp8TrackTheComputeDtype) {
  ZT_TEST_TRACE_SEED();
  for (const char* preset : {"gpt2-tiny", "llama3-tiny"})
    for (DType dt : {DType::f32, DType::bf16})
      for (Recompute rc : {Recompute::none, Recompute::selective, Recompute::full}) {
        SCOPED_TRACE(std::string(preset) + " " + std::string(dtype_name(dt)) + " recompute " + std::string(recompute_name(rc)));
        const ModelConfig c = model_preset(preset);
        auto rng = test::make_rng(7);
        const Tensor tokens = test::random_tokens(Shape{2, 32}, c.vocab_size, rng);
        const Tensor targets = test::random_tokens(Shape{2, 32}, c.vocab_size, rng);
        Transformer ref(c, dt), q(c, dt);
        q.fp8 = true;
        for (Transformer* m : {&ref, &q}) {
          m->init_weights(11);
          m->recompute = rc;
        }
        ForwardContext rc_ctx, q_ctx;
        const float scale = 1.0f / float(tokens.numel());
        const double l_ref = ref.forward(rc_ctx, tokens, targets, true, scale);
        ref.backward(rc_ctx);
        ops::enable_op_profile(true);
        (void)ops::take_op_profile();
        const double l_q = q.forward(q_ctx, tokens, targets, true, scale);
        q.backward(q_ctx);
        const std::vector<ops::OpTotal> prof = ops::take_op_profile();
        ops::enable_op_profile(false);
        EXPECT_NEAR(l_q / l_ref, 1.0, 0.02);
        EXPECT_NE(l_q, l_ref) << "the fp8 products ran";
        // Four linear layers a block (qkv may run as q, k and v), each
        // forward once (twice under full recompute).
        EXPECT_GE(calls(prof, "fp8_linear_forward"), (rc == Recompute::full ? 8 : 4) * c.n_layer);
        EXPECT_GE(calls(prof, "fp8_linear_backward"), 8 * c.n_layer) << "data and weight products";
        // Each tensor quantised once for every product that reads it: a
        // block's forward its four inputs (q, k and v share ln1) and each
        // product's weight; its backward each product's output gradient and
        // weight (data products), the four inputs (weight products, which
        // read the data products' gradient codes).
        const int64_t forwards = rc == Recompute::full ? 2 : 1;
        const int64_t products = calls(prof, "fp8_linear_forward") / (forwards * c.n_layer);  // 6: q, k, v apart
        EXPECT_EQ(calls(prof, "quantize_fp8"), (forwards * (4 + products) + 2 * products + 4) * c.n_layer);
        const auto rs = ref.param_sets(), qs = q.param_sets();
        for (size_t i = 0; i < rs.size(); ++i)
          for (size_t j = 0; j < rs[i]->size(); ++j) {
            const Tensor gr = rs[i]->grad(j), gq = qs[i]->grad(j);
            EXPECT_LT(test::rel_l2_error(gq, gr), 0.2) << rs[i]->spec(j).name;
          }
      }
}

}  // namespace
}  // namespace zt::nn
