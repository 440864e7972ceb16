// The kernel race's bookkeeping (backend/cuda/kernel_race.h): which
// candidate each call runs, when the race is decided and for whom, refusals
// and timings that come back late. No GPU needed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/kernel_race.h"
#include "core/error.h"

namespace zt {
namespace {

using cuda::RaceTally;

// Launches the tally's next candidate and returns it.
int launch_next(RaceTally& t) {
  const int c = t.next();
  EXPECT_GE(c, 0);
  t.launched(c);
  return c;
}

TEST(KernelRace, TakesTurnsThenKeepsTheFastestCall) {
  RaceTally t(3, 2);
  // Timings that come back at once: 0, 1, 2, 0, 1, 2 in turn.
  const std::vector<std::vector<double>> ms = {{5.0, 1.5}, {2.0, 2.5}, {1.8, 9.0}};
  std::vector<int> turns, seen(3, 0);
  for (int call = 0; call < 6; ++call) {
    EXPECT_FALSE(t.decided()) << "after " << call << " calls";
    const int c = launch_next(t);
    turns.push_back(c);
    t.timed(c, ms[size_t(c)][size_t(seen[size_t(c)]++)]);
  }
  EXPECT_EQ(turns, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  ASSERT_TRUE(t.decided());
  // Fastest calls: 1.5, 2.0, 1.8 - candidate 0 by its second call (the
  // minimum, not the mean: 0's mean is the worst).
  EXPECT_EQ(t.winner(), 0);
  EXPECT_EQ(t.best_ms(0), 1.5);
  EXPECT_EQ(t.best_ms(1), 2.0);
  EXPECT_EQ(t.best_ms(2), 1.8);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(t.timed_calls(c), 2);
  for (int call = 0; call < 4; ++call) EXPECT_EQ(t.next(), 0) << "the winner runs every later call";
}

TEST(KernelRace, CallsInFlightCountTowardsTheTurns) {
  // The host runs ahead of the GPU: no timing has come back for the first
  // four calls, yet each candidate gets its turn, and the race is not
  // decided until every candidate has its timed calls.
  RaceTally t(2, 2);
  EXPECT_EQ(launch_next(t), 0);
  EXPECT_EQ(launch_next(t), 1);
  EXPECT_EQ(launch_next(t), 0);
  EXPECT_EQ(launch_next(t), 1);
  EXPECT_EQ(t.next(), 0) << "lowest index when the counts tie";
  t.timed(1, 3.0);
  t.timed(1, 4.0);
  t.timed(0, 3.5);
  EXPECT_FALSE(t.decided()) << "candidate 0 has one timed call of two";
  EXPECT_EQ(t.next(), 0) << "0 has 2 calls counted (1 timed, 1 in flight), 1 has 2 timed: a tie";
  t.timed(0, 3.2);
  ASSERT_TRUE(t.decided());
  EXPECT_EQ(t.winner(), 1);  // 3.0 against 3.2
}

TEST(KernelRace, TiesGoToTheFirstListed) {
  RaceTally t(3, 1);
  for (int c = 0; c < 3; ++c) t.launched(c);
  t.timed(2, 1.0);
  t.timed(1, 1.0);
  t.timed(0, 1.25);
  ASSERT_TRUE(t.decided());
  EXPECT_EQ(t.winner(), 1);
}

TEST(KernelRace, ARefusedCandidateIsPassedOver) {
  RaceTally t(3, 1);
  EXPECT_EQ(launch_next(t), 0);
  t.refused(1);  // as the staged classifier where its packs do not fit
  EXPECT_FALSE(t.available(1));
  EXPECT_EQ(launch_next(t), 2) << "1 refused";
  t.timed(2, 2.0);
  EXPECT_FALSE(t.decided());
  t.timed(0, 4.0);
  ASSERT_TRUE(t.decided());
  EXPECT_EQ(t.winner(), 2);
  // A winner that refuses later (it cannot with the classifier's keys, but
  // the tally stays sound): the next fastest takes over.
  t.refused(2);
  ASSERT_TRUE(t.decided());
  EXPECT_EQ(t.winner(), 0);
  t.refused(0);
  EXPECT_FALSE(t.decided());
  EXPECT_EQ(t.next(), -1) << "no candidate left";
}

// ZT_CUDA_KERNEL_RACES=0 (ctest cuda.kernel_races_off): a call takes the
// first candidate that accepts it, with no timing marks (so no GPU here).
TEST(KernelRace, TheSwitchTurnsRacesOff) {
  const char* env = std::getenv("ZT_CUDA_KERNEL_RACES");
  const bool off = env != nullptr && std::string(env) == "0";
  EXPECT_EQ(cuda::kernel_races_on(), !off);
  if (!off) GTEST_SKIP() << "races are on; ctest cuda.kernel_races_off runs this with ZT_CUDA_KERNEL_RACES=0";
  cuda::KernelRace race(Device::cuda(0), 3, 3);
  std::vector<int> tried;
  for (int call = 0; call < 4; ++call) {
    tried.clear();
    EXPECT_EQ(race.run([&](int c) {
      tried.push_back(c);
      return c == 1;
    }),
              1);
    EXPECT_EQ(tried, (std::vector<int>{0, 1})) << "call " << call;
  }
  EXPECT_FALSE(race.tally().decided()) << "nothing timed";
  EXPECT_THROW(race.run([](int) { return false; }), Error);
}

TEST(KernelRace, RejectsWhatNoCallerMeans) {
  EXPECT_THROW(RaceTally(0, 1), Error);
  EXPECT_THROW(RaceTally(2, 0), Error);
  RaceTally t(2, 1);
  EXPECT_THROW(t.timed(0, 1.0), Error) << "a timing without a launch";
  EXPECT_THROW(t.launched(2), Error);
  EXPECT_THROW((void)t.best_ms(-1), Error);
}

}  // namespace
}  // namespace zt
