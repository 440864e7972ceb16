// Expert parallelism at the model level under mpirun, ep = the world size
// (nn/moe.h): each rank routes its own tokens over all E experts and holds
// E / ep of them; its loss equals the single-process model's on its tokens,
// the dense gradients summed over the ranks and the local experts'
// gradients (which every rank's tokens reached) equal the single-process
// model's after all ranks' batches - under every recompute policy and the
// zero-bubble split of backward - and logits() (generation) match.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "nn/transformer.h"
#include "parallel/parallel_test_util.h"
#include "test_util.h"

namespace zt::nn {
namespace {

using test::error_of;

Tensor tokens_of(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);  // not the per-process test seed: every rank draws alike
  return test::random_tokens(Shape{B, T}, vocab, rng);
}

TEST(ExpertParallel, LossAndGradientsMatchOneProcess) {
  comm::ProcessGroup& ep = comm::world();
  const train::Config cfg = test::fortunes_config("llama3-moe-tiny", {"model.router_aux_loss=0.05"});
  if (cfg.model.n_expert % ep.size() != 0) GTEST_SKIP() << "ep must divide the " << cfg.model.n_expert << " experts";
  for (Recompute policy : {Recompute::none, Recompute::selective, Recompute::full})
    for (bool split : {false, true}) {
      SCOPED_TRACE(std::string("recompute ") + std::string(recompute_name(policy)) + (split ? ", split backward" : "") +
                   ", ep = " + std::to_string(ep.size()));
      TensorParallel mode;
      mode.experts = &ep;
      Transformer ref(cfg.model, DType::f32), m(cfg.model, DType::f32, Device::cpu(), 1, mode);
      ref.recompute = m.recompute = policy;
      ref.init_weights(11);
      m.init_weights(11);
      ref.zero_grads();
      m.zero_grads();
      const int64_t B = 2, T = 32, V = cfg.model.vocab_size, E = cfg.model.n_expert, El = E / ep.size();
      EXPECT_EQ(m.param("layers.0.mlp.experts.in.weight").size(0), El);
      const float scale = 1.0f / float(ep.size() * B * T);
      // The reference sees every rank's batch in turn; this rank's loss is kept.
      double ref_loss = 0;
      for (int64_t r = 0; r < ep.size(); ++r) {
        ForwardContext c;
        const double l = ref.forward(c, tokens_of(B, T, V, 100 + r), tokens_of(B, T, V, 200 + r), true, scale);
        ref.backward(c);
        if (r == ep.rank()) ref_loss = l;
      }
      ForwardContext ctx;
      const double loss = m.forward(ctx, tokens_of(B, T, V, 100 + ep.rank()), tokens_of(B, T, V, 200 + ep.rank()), true,
                                    scale);
      if (split) {
        m.backward_input(ctx, Tensor());
        m.backward_weight(ctx);
      } else {
        m.backward(ctx);
      }
      EXPECT_NEAR(loss, ref_loss, 1e-6 * std::fabs(ref_loss)) << "this rank's loss";
      for (const ParamSet* set : static_cast<const Transformer&>(ref).param_sets())
        for (size_t i = 0; i < set->size(); ++i) {
          const std::string& name = set->spec(i).name;
          const Tensor g = m.grad(name);
          if (name.find(".mlp.experts.") != std::string::npos) {  // this rank's experts: every rank's tokens in them
            const Tensor want = ref.grad(name).slice(ep.rank() * El, (ep.rank() + 1) * El);
            EXPECT_LT(test::rel_l2_error(g, want), 1e-5) << "gradient of " << name;
            EXPECT_EQ(test::rel_l2_error(m.global_param(name), ref.param(name)), 0.0) << "weights of " << name;
            continue;
          }
          Tensor sum = Tensor::empty(g.shape(), DType::f32);
          std::memcpy(sum.data_ptr(), g.data_ptr(), g.nbytes());
          ep.all_reduce(sum)->wait();  // as data parallelism reduces them
          EXPECT_LT(test::rel_l2_error(sum, ref.grad(name)), 1e-5) << "gradient of " << name;
        }
      // Generation's logits: every rank the same tokens, its experts serving all.
      const Tensor tokens = tokens_of(1, 16, V, 7);
      const int64_t Vp = cfg.model.padded_vocab();
      Tensor lr = Tensor::empty(Shape{1, 16, Vp}, DType::f32), lm = Tensor::empty(Shape{1, 16, Vp}, DType::f32);
      test::poison(lm);
      ref.logits(lr, tokens);
      m.logits(lm, tokens);
      EXPECT_LT(test::rel_l2_error(lm, lr), 1e-6) << "logits";
    }
}

// An expert count the group does not divide is refused where the model is built.
TEST(ExpertParallel, ExpertsThatDoNotSplitAreRefused) {
  comm::ProcessGroup& ep = comm::world();
  train::Config cfg = test::fortunes_config("llama3-moe-tiny");
  cfg.model.n_expert = 5;
  if (ep.size() == 1 || 5 % ep.size() == 0) GTEST_SKIP() << "needs a group size that does not divide 5";
  TensorParallel mode;
  mode.experts = &ep;
  const std::string msg = error_of([&] { Transformer m(cfg.model, DType::f32, Device::cpu(), 1, mode); });
  EXPECT_NE(msg.find("parallel.ep = " + std::to_string(ep.size()) + " must divide model.n_expert = 5"),
            std::string::npos)
      << msg;
}

}  // namespace
}  // namespace zt::nn
