// The warp emulator itself (warp_emulator.h): the promises the kernel tests
// rely on - a read that no barrier orders after its write reads the wrong
// value in one of the block orders, the same on every run; a refill that no
// barrier orders after another warp's reads shows; a barrier some thread
// never reaches stops the test with a message; an exception in a kernel
// reaches the caller. Each race kernel also runs with its barrier, where
// every value must be right, so a test that cannot fail shows too.
#include "cuda_emu/warp_emulator.h"  // first: it defines what the kernels use

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

namespace zt {
namespace {

constexpr int kThreads = 64;  // two warps

// Thread `producer` writes 1 + its block index to shared memory; every
// thread copies it to out, after a __syncthreads when `ordered`.
void broadcast_kernel(float* out, int producer, bool ordered) {
  ZT_SHARED_MEMORY(smem);
  float* value = reinterpret_cast<float*>(smem);
  if (int(threadIdx.x) == producer) *value = 1.0f + float(blockIdx.x);
  if (ordered) __syncthreads();
  out[blockIdx.x * kThreads + threadIdx.x] = *value;
}

// How many threads of each block read another value than their block's.
std::vector<int> wrong_reads(int producer, bool ordered) {
  std::vector<float> out(2 * kThreads, -1.0f);
  emu::launch(dim3(2), kThreads, sizeof(float), broadcast_kernel, out.data(), producer, ordered);
  std::vector<int> wrong(2, 0);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < kThreads; ++t) wrong[size_t(b)] += out[size_t(b * kThreads + t)] != 1.0f + float(b);
  return wrong;
}

TEST(WarpEmulator, AReadNoBarrierOrdersAfterItsWriteIsWrongInOneOrder) {
  for (const int producer : {0, kThreads - 1}) {
    SCOPED_TRACE(::testing::Message() << "written by thread " << producer);
    EXPECT_EQ(wrong_reads(producer, true), (std::vector<int>{0, 0}));
    const std::vector<int> racing = wrong_reads(producer, false);
    // Block 0 runs the last thread first, block 1 the first: a producer at
    // either end runs after every other thread in one of them.
    EXPECT_EQ(racing[producer == 0 ? 0 : 1], kThreads - 1) << "every reader before the write";
    EXPECT_EQ(racing, wrong_reads(producer, false)) << "the same on every run";
  }
}

// A tile of 64 floats staged by cp.async, read by every thread (thread t its
// element t), then refilled from `next` by the first warp's 16 lanes and
// waited for after the next barrier, as a double buffer does: on the GPU the
// refill may land while the other warp still reads, unless a barrier orders
// it after the reads (`ordered`). The emulator poisons the tile when the
// refill is issued.
void refill_kernel(float* out, const float* first, const float* next, bool ordered) {
  ZT_SHARED_MEMORY(smem);
  float* tile = reinterpret_cast<float*>(smem);
  const int t = int(threadIdx.x);
  if (t < 16) emu::cp_async16(tile + 4 * t, first + 4 * t, true);
  emu::cp_async_commit();
  emu::cp_async_wait<0>();
  __syncthreads();
  out[blockIdx.x * kThreads + t] = tile[t];
  if (ordered) __syncthreads();
  if (t < 16) emu::cp_async16(tile + 4 * t, next + 4 * t, true);
  emu::cp_async_commit();
  __syncthreads();
  emu::cp_async_wait<0>();
}

std::vector<int> stale_reads(bool ordered) {
  std::vector<float> first(kThreads), next(kThreads, -7.0f), out(2 * kThreads, -1.0f);
  for (int i = 0; i < kThreads; ++i) first[size_t(i)] = float(i);
  emu::launch(dim3(2), kThreads, kThreads * sizeof(float), refill_kernel, out.data(), first.data(), next.data(),
              ordered);
  std::vector<int> wrong(2, 0);
  for (int b = 0; b < 2; ++b)
    for (int t = 0; t < kThreads; ++t) wrong[size_t(b)] += out[size_t(b * kThreads + t)] != float(t);
  return wrong;
}

TEST(WarpEmulator, ARefillWhileAnotherWarpReadsShows) {
  EXPECT_EQ(stale_reads(true), (std::vector<int>{0, 0}));
  // The warp whose lane releases the first barrier runs on first: in block
  // 0 (last warp and lane first) the first warp, which poisons the tile
  // before the second warp reads any of it; in block 1 the second warp reads
  // first, and the first warp's lanes after lane 0 read the poison.
  const std::vector<int> racing = stale_reads(false);
  EXPECT_EQ(racing[0], 32) << "the other warp's reads";
  EXPECT_EQ(racing[1], 31) << "the refilling warp's lanes after its first";
  EXPECT_EQ(racing, stale_reads(false)) << "the same on every run";
}

void skipping_kernel(int skipper) {
  if (int(threadIdx.x) != skipper) __syncthreads();
}

TEST(WarpEmulatorDeathTest, ABarrierAThreadNeverReachesStopsWithAMessage) {
  EXPECT_DEATH(emu::launch(dim3(1), kThreads, 0, skipping_kernel, 3),
               "63 thread\\(s\\) wait at barriers that the others never reach");
}

void throwing_kernel(float* out) {
  if (threadIdx.x == 5 && blockIdx.x == 1) throw std::runtime_error("thread 5 of block 1");
  __syncthreads();
  out[blockIdx.x * kThreads + threadIdx.x] = float(threadIdx.x);
}

TEST(WarpEmulator, AnExceptionInAKernelReachesTheCallerAndTheNextLaunchRuns) {
  std::vector<float> out(2 * kThreads, -1.0f);
  try {
    emu::launch(dim3(2), kThreads, 0, throwing_kernel, out.data());
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "thread 5 of block 1");
  }
  std::vector<float> again(kThreads, -1.0f);
  emu::launch(dim3(1), kThreads, 0, throwing_kernel, again.data());  // block 0 only: no throw
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(again[size_t(t)], float(t));
}

}  // namespace
}  // namespace zt
