// Pipeline schedules (pure; run under mpirun only because this binary is):
// every schedule runs every micro-batch chunk forward and backward once
// without deadlock, its bubble in the zero-transfer-cost model is what
// theory says, the bubbles are ordered AFAB >= 1F1B > interleaved >
// zero-bubble, and 1F1B keeps at most p micro-batches of activations on the
// first stage where AFAB keeps m.
#include <gtest/gtest.h>

#include <string>

#include "parallel/pipeline_schedule.h"
#include "test_util.h"

namespace zt::parallel {
namespace {

using K = PipelineSchedule;

std::string label(K k, const PipelineShape& s) {
  return std::string(pipeline_schedule_name(k)) + " p=" + std::to_string(s.stages) + " m=" +
         std::to_string(s.micro_batches) + " v=" + std::to_string(s.virtual_stages);
}

std::vector<std::pair<K, PipelineShape>> all_shapes() {
  std::vector<std::pair<K, PipelineShape>> out;
  for (int64_t p : {1, 2, 3, 4, 8})
    for (int64_t m : {1, 2, 3, 4, 8, 16}) {
      out.push_back({K::afab, {p, m, 1}});
      out.push_back({K::one_f_one_b, {p, m, 1}});
      out.push_back({K::zero_bubble, {p, m, 1}});
      if (m % p == 0)
        for (int64_t v : {2, 3}) out.push_back({K::interleaved, {p, m, v}});
    }
  return out;
}

TEST(PipelineSchedule, EveryChunkRunsOnceWithoutDeadlock) {
  for (const auto& [kind, s] : all_shapes()) {
    SCOPED_TRACE(label(kind, s));
    const auto sched = build_pipeline_schedule(kind, s);
    ASSERT_EQ(int64_t(sched.size()), s.stages);
    for (const auto& rank : sched)
      EXPECT_EQ(int64_t(rank.size()), s.micro_batches * s.virtual_stages * (kind == K::zero_bubble ? 3 : 2));
    simulate_pipeline(sched, s);  // asserts: no deadlock, nothing missed or repeated
  }
}

// F = 1, B = 2 (input 1 + weight 1): the classic bubbles, exactly.
TEST(PipelineSchedule, BubblesMatchTheory) {
  for (const auto& [kind, s] : all_shapes()) {
    SCOPED_TRACE(label(kind, s));
    const PipelineSimulation sim = simulate_pipeline(build_pipeline_schedule(kind, s), s);
    const double theory = theoretical_bubble(kind, s);
    if (kind == K::zero_bubble) {
      // ZB-H1 reaches its bound once m >= p; with fewer micro-batches there
      // are not enough weight passes to fill the cool-down: more bubble, never
      // more than 1F1B's.
      EXPECT_LE(sim.bubble, theoretical_bubble(K::one_f_one_b, s) + 1e-12);
      if (s.micro_batches >= s.stages) {
        EXPECT_NEAR(sim.bubble, theory, 1e-12);
      }
    } else {
      EXPECT_NEAR(sim.bubble, theory, 1e-12);
    }
  }
}

TEST(PipelineSchedule, BubblesAreOrderedAsTheorySays) {
  const PipelineShape s{4, 8, 1}, sv{4, 8, 2};
  auto bubble = [](K k, const PipelineShape& sh) { return simulate_pipeline(build_pipeline_schedule(k, sh), sh).bubble; };
  const double afab = bubble(K::afab, s), ofob = bubble(K::one_f_one_b, s), inter = bubble(K::interleaved, sv),
               zb = bubble(K::zero_bubble, s);
  EXPECT_GE(afab, ofob);
  EXPECT_GT(ofob, inter);
  EXPECT_GT(inter, zb);
  RecordProperty("bubbles", std::to_string(afab) + " " + std::to_string(ofob) + " " + std::to_string(inter) + " " +
                                std::to_string(zb));
}

// Micro-batches whose activations are alive (forwarded, backward not done;
// for zb until the weight pass). 1F1B: p - r on rank r; ZB-H1: at most p.
TEST(PipelineSchedule, OneFOneBBoundsActivationsInFlight) {
  for (int64_t p : {2, 4, 8})
    for (int64_t m : {1, 4, 8, 16}) {
      const PipelineShape s{p, m, 1};
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      const auto afab = simulate_pipeline(build_pipeline_schedule(K::afab, s), s);
      const auto ofob = simulate_pipeline(build_pipeline_schedule(K::one_f_one_b, s), s);
      const auto zb = simulate_pipeline(build_pipeline_schedule(K::zero_bubble, s), s);
      EXPECT_EQ(afab.peak_in_flight[0], m);
      for (int64_t r = 0; r < p; ++r) {
        EXPECT_EQ(ofob.peak_in_flight[size_t(r)], std::min(m, p - r)) << "rank " << r;
        EXPECT_LE(zb.peak_in_flight[size_t(r)], std::min(m, p)) << "rank " << r;
      }
    }
}

TEST(PipelineSchedule, ShapesAScheduleCannotRunAreRefused) {
  auto err = [](K k, PipelineShape s) { return test::error_of([&] { check_pipeline_schedule(k, s); }); };
  EXPECT_NE(err(K::interleaved, {4, 8, 1}).find("needs parallel.virtual_stages >= 2"), std::string::npos);
  EXPECT_NE(err(K::interleaved, {4, 6, 2}).find("a multiple of 4"), std::string::npos);
  EXPECT_NE(err(K::one_f_one_b, {4, 8, 2}).find("needs pp_schedule = interleaved"), std::string::npos);
  EXPECT_NE(err(K::afab, {0, 8, 1}).find("must all be >= 1"), std::string::npos);
  EXPECT_NE(test::error_of([] { parse_pipeline_schedule("gpipe"); }).find("valid: afab, 1f1b, interleaved, zb"),
            std::string::npos);
}

}  // namespace
}  // namespace zt::parallel
