// Pipeline stage planning (pure): every block in exactly one stage, the
// embedding on the first and the head on the last, the most expensive stage
// no costlier than any other contiguous split's (checked by brute force),
// explicit splits honoured, bad shapes refused with the fix.
#include <gtest/gtest.h>

#include <functional>

#include "parallel/pipeline_stages.h"
#include "test_util.h"

namespace zt::parallel {
namespace {

double max_cost(const std::vector<StageLayers>& st) {
  double m = 0;
  for (const auto& s : st) m = std::max(m, s.cost);
  return m;
}

// The best max-cost over every contiguous split (brute force).
double brute_best(const nn::ModelConfig& c, int64_t T, int64_t S) {
  double best = 1e300;
  std::vector<int64_t> counts;
  std::function<void(int64_t, int64_t)> rec = [&](int64_t stage, int64_t left) {
    if (stage == S - 1) {
      if (left < 1) return;
      counts.push_back(left);
      best = std::min(best, max_cost(plan_pipeline_stages(c, T, S, counts)));
      counts.pop_back();
      return;
    }
    for (int64_t n = 1; n <= left - (S - 1 - stage); ++n) {
      counts.push_back(n);
      rec(stage + 1, left - n);
      counts.pop_back();
    }
  };
  rec(0, c.n_layer);
  return best;
}

TEST(PipelineStages, BalancedSplitsCoverEveryBlockAndAreOptimal) {
  for (const char* preset : {"gpt2-124m", "llama3-1b", "gpt2-tiny"})
    for (int64_t S : {1, 2, 3, 4, 8}) {
      nn::ModelConfig c = nn::model_preset(preset);
      if (c.n_layer < S) c.n_layer = S + 3;
      SCOPED_TRACE(std::string(preset) + " S=" + std::to_string(S));
      const auto st = plan_pipeline_stages(c, 1024, S);
      ASSERT_EQ(int64_t(st.size()), S);
      int64_t next = 0;
      for (int64_t s = 0; s < S; ++s) {
        EXPECT_EQ(st[size_t(s)].first, next);
        EXPECT_GT(st[size_t(s)].last, st[size_t(s)].first);
        EXPECT_EQ(st[size_t(s)].embedding, s == 0);
        EXPECT_EQ(st[size_t(s)].head, s == S - 1);
        next = st[size_t(s)].last;
      }
      EXPECT_EQ(next, c.n_layer);
      EXPECT_DOUBLE_EQ(max_cost(st), brute_best(c, 1024, S));
    }
}

// GPT-2 124M: the LM head (6 V C = 232 MFLOP/token) costs about 4.5 blocks
// (52 MFLOP/token each at T = 1024), so a 4-stage split gives the last stage
// fewer blocks.
TEST(PipelineStages, TheHeadCountsAgainstTheLastStage) {
  const auto st = plan_pipeline_stages(nn::model_preset("gpt2-124m"), 1024, 4);
  EXPECT_LT(st.back().last - st.back().first, st.front().last - st.front().first);
}

TEST(PipelineStages, ExplicitSplitsAndBadShapes) {
  const nn::ModelConfig c = nn::model_preset("gpt2-124m");  // 12 blocks
  const auto st = plan_pipeline_stages(c, 1024, 3, parse_stage_layers("5, 4,3"));
  EXPECT_EQ(st[0].last, 5);
  EXPECT_EQ(st[1].last, 9);
  EXPECT_EQ(st[2].last, 12);
  auto err = [&](int64_t S, const std::string& list) {
    return test::error_of([&] { plan_pipeline_stages(c, 1024, S, parse_stage_layers(list)); });
  };
  EXPECT_NE(err(16, "").find("has 12 blocks (model.n_layer) but the pipeline has 16 stages"), std::string::npos);
  EXPECT_NE(err(3, "6,6").find("lists 2 stages, but the pipeline has 3"), std::string::npos);
  EXPECT_NE(err(3, "6,6,0").find("stage 2 has 0 blocks"), std::string::npos);
  EXPECT_NE(err(3, "6,6,1").find("adds up to 13 blocks, but the model has 12"), std::string::npos);
  EXPECT_NE(err(3, "6;6").find("is not a comma-separated list"), std::string::npos);
}

}  // namespace
}  // namespace zt::parallel
