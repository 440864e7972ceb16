// DataLoader (data/loader.h): exact epoch coverage across ranks, disjoint
// rank slices, determinism from the seed, micro-batch equivalence, exact
// resume from a saved state (also with another data-parallel size at a
// boundary), the validation split in order, and bad arguments.
//
// The datasets hold token value == stream position (vocabulary 2^20, u32
// shards), so every row identifies its sample: sample s starts with s * T.
#include <cstdint>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "data/loader.h"
#include "data_test_util.h"

namespace zt::data {
namespace {

using test::error_of;
constexpr uint32_t kVocab = 1u << 20;

std::vector<uint32_t> positions(size_t n, uint32_t offset = 0) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint32_t(offset + i);
  return v;
}

// A dataset of n train tokens (several shards, so samples cross shard ends)
// and m val tokens.
struct Dataset {
  test::TempDir dir;
  Dataset(size_t n, size_t m = 0, uint64_t shard_tokens = 97) {
    test::write_dataset(dir.path(), positions(n), positions(m, 500000), kVocab, shard_tokens);
  }
  const std::string& path() const { return dir.path(); }
};

struct Batch {
  std::vector<int32_t> inputs, targets;  // (B, T)
  bool operator==(const Batch&) const = default;
};

Batch next(DataLoader& l, int64_t B) {
  const int64_t T = l.seq_len();
  Tensor in = Tensor::empty(Shape{B, T}, DType::i32), tg = Tensor::empty(Shape{B, T}, DType::i32);
  test::poison(in);
  test::poison(tg);
  l.next_batch(in, tg);
  Batch b;
  b.inputs.assign(in.data<int32_t>(), in.data<int32_t>() + B * T);
  b.targets.assign(tg.data<int32_t>(), tg.data<int32_t>() + B * T);
  return b;
}

// The sample index of each row, after checking the row is a contiguous window.
std::vector<int64_t> samples_of(const Batch& b, int64_t T, uint32_t offset = 0) {
  std::vector<int64_t> out;
  const size_t B = b.inputs.size() / size_t(T);
  for (size_t r = 0; r < B; ++r) {
    const int64_t first = int64_t(b.inputs[r * size_t(T)]) - int64_t(offset);
    EXPECT_EQ(first % T, 0) << "row " << r << " does not start a sample";
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(b.inputs[r * size_t(T) + size_t(t)], int32_t(offset) + int32_t(first + t));
      EXPECT_EQ(b.targets[r * size_t(T) + size_t(t)], int32_t(offset) + int32_t(first + t + 1));
    }
    out.push_back(first / T);
  }
  return out;
}

TEST(EpochPermutation, IsABijectionThatDependsOnSeedAndEpoch) {
  for (uint64_t n : {1, 2, 3, 5, 17, 100, 1000, 4097}) {
    EpochPermutation p(n, 42, 0);
    std::vector<uint8_t> hit(n, 0);
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t v = p(i);
      ASSERT_LT(v, n);
      ASSERT_FALSE(hit[v]) << "n " << n << " value " << v << " twice";
      hit[v] = 1;
    }
  }
  auto perm = [](uint64_t seed, uint64_t epoch) {
    EpochPermutation p(1000, seed, epoch);
    std::vector<uint64_t> v;
    for (uint64_t i = 0; i < 1000; ++i) v.push_back(p(i));
    return v;
  };
  EXPECT_EQ(perm(1, 0), perm(1, 0));
  EXPECT_NE(perm(1, 0), perm(2, 0));
  EXPECT_NE(perm(1, 0), perm(1, 1));
  // Not close to the identity: few fixed points.
  const auto p = perm(7, 3);
  int fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) fixed += p[i] == i;
  EXPECT_LT(fixed, 20);
}

// dp ranks, each taking its slice of every global batch: over one epoch
// (S a multiple of G) every sample, so every input token, is used exactly once.
TEST(DataLoader, EveryTokenOnceAcrossRanks) {
  const int64_t T = 8;
  Dataset ds(T * 120 + 1);  // S = 120
  for (int dp : {1, 2, 3, 4}) {
    for (int64_t G : {12, 24, 60, 120}) {
      std::vector<int> used(120, 0);
      std::set<int64_t> input_tokens;
      for (int r = 0; r < dp; ++r) {
        DataLoader l(ds.path(), Split::train, T, 1234, r, dp);
        l.set_global_batch(G);
        EXPECT_EQ(l.samples_per_epoch(), 120);
        EXPECT_EQ(l.tokens_per_epoch(), 960);
        for (int64_t step = 0; step < 120 / G; ++step) {
          const Batch b = next(l, G / dp);
          for (int64_t s : samples_of(b, T)) ++used[size_t(s)];
          for (int32_t t : b.inputs) input_tokens.insert(t);
        }
        EXPECT_EQ(l.state().epoch, 1u);
        EXPECT_EQ(l.state().position, 0u);
      }
      EXPECT_EQ(used, std::vector<int>(120, 1)) << "dp " << dp << " G " << G;
      EXPECT_EQ(input_tokens.size(), 960u);
      EXPECT_EQ(*input_tokens.begin(), 0);
      EXPECT_EQ(*input_tokens.rbegin(), 959);
    }
  }
}

// Within each global batch the ranks' rows are disjoint and together are the
// G next samples of the single stream (what dp = 1 sees), in rank order.
TEST(DataLoader, RankSlicesAreDisjointPartsOfTheGlobalBatch) {
  const int64_t T = 5;
  Dataset ds(T * 100 + 3);  // S = 100, not a multiple of G: batches run into epoch 1
  const int64_t G = 12;
  DataLoader whole(ds.path(), Split::train, T, 9, 0, 1);
  whole.set_global_batch(G);
  for (int dp : {2, 3, 4, 6}) {
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < dp; ++r) {
      ranks.push_back(std::make_unique<DataLoader>(ds.path(), Split::train, T, 9, r, dp));
      ranks.back()->set_global_batch(G);
    }
    DataLoader ref(ds.path(), Split::train, T, 9, 0, 1);
    ref.set_global_batch(G);
    for (int step = 0; step < 20; ++step) {  // 240 samples: 2.4 epochs
      const auto want = samples_of(next(ref, G), T);
      std::vector<int64_t> got;
      std::set<int64_t> distinct;
      for (int r = 0; r < dp; ++r) {
        const auto s = samples_of(next(*ranks[size_t(r)], G / dp), T);
        got.insert(got.end(), s.begin(), s.end());
      }
      distinct.insert(got.begin(), got.end());
      ASSERT_EQ(got, want) << "dp " << dp << " step " << step;
      // Distinct within a batch unless the batch crosses an epoch boundary.
      const bool crosses = (step * G) / 100 != (step * G + G - 1) / 100;
      if (!crosses) {
        EXPECT_EQ(distinct.size(), size_t(G));
      }
    }
  }
}

TEST(DataLoader, SameSeedSameBatchesOtherSeedOtherOrder) {
  const int64_t T = 16;
  Dataset ds(T * 64 + 1);
  auto run = [&](uint64_t seed) {
    DataLoader l(ds.path(), Split::train, T, seed, 0, 1);
    std::vector<Batch> out;
    for (int i = 0; i < 12; ++i) out.push_back(next(l, 8));  // 1.5 epochs
    return out;
  };
  const auto a = run(5), b = run(5), c = run(6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Epoch 1 is another order than epoch 0.
  const auto e0 = samples_of(a[0], T), e1 = samples_of(a[8], T);
  EXPECT_NE(e0, e1);
}

// k calls of B/k rows hand out exactly the rows of one call of B rows.
TEST(DataLoader, MicroBatchesEqualOneBatch) {
  const int64_t T = 7;
  Dataset ds(T * 90 + 1);
  for (int dp : {1, 3}) {
    DataLoader one(ds.path(), Split::train, T, 3, dp - 1, dp), micro(ds.path(), Split::train, T, 3, dp - 1, dp),
        single(ds.path(), Split::train, T, 3, dp - 1, dp);
    for (DataLoader* l : {&one, &micro, &single}) l->set_global_batch(12 * dp);
    for (int step = 0; step < 10; ++step) {
      const Batch b = next(one, 12);
      Batch m;
      for (int k = 0; k < 3; ++k) {
        const Batch part = next(micro, 4);
        m.inputs.insert(m.inputs.end(), part.inputs.begin(), part.inputs.end());
        m.targets.insert(m.targets.end(), part.targets.begin(), part.targets.end());
      }
      Batch s;
      for (int k = 0; k < 12; ++k) {
        const Batch part = next(single, 1);
        s.inputs.insert(s.inputs.end(), part.inputs.begin(), part.inputs.end());
        s.targets.insert(s.targets.end(), part.targets.begin(), part.targets.end());
      }
      ASSERT_EQ(b, m) << "dp " << dp << " step " << step;
      ASSERT_EQ(b, s) << "dp " << dp << " step " << step;
    }
  }
}

// Save mid-epoch (at a step boundary and in the middle of a global batch),
// serialise through JSON, restore into a new loader built with another seed:
// the following batches are identical, across the epoch boundary too.
TEST(DataLoader, SaveAndRestoreContinuesWithIdenticalBatches) {
  const int64_t T = 6;
  Dataset ds(T * 50 + 4);  // S = 50
  for (int64_t prefetch : {int64_t(0), int64_t(-1), int64_t(3)}) {
    LoaderOptions o;
    o.prefetch_rows = prefetch;
    // G = 8 over 2 ranks: 4 rows per rank per step, 2 rows per call. Saved
    // after 2 steps (a boundary), 2.5 steps and 5.5 steps (mid-batch).
    for (int calls : {4, 5, 11}) {
      DataLoader a(ds.path(), Split::train, T, 77, 1, 2, o);
      a.set_global_batch(8);
      for (int i = 0; i < calls; ++i) next(a, 2);
      EXPECT_EQ(a.state().row, calls % 2 == 0 ? 0u : 2u);
      const nlohmann::json saved = a.state();
      const std::string text = saved.dump();
      std::vector<Batch> want;
      for (int i = 0; i < 40; ++i) want.push_back(next(a, 2));  // runs through epochs 0, 1, 2

      DataLoader b(ds.path(), Split::train, T, 999, 1, 2, o);
      b.restore(nlohmann::json::parse(text).get<LoaderState>());
      EXPECT_EQ(b.global_batch(), 8);
      EXPECT_EQ(b.state().seed, 77u);
      for (int i = 0; i < 40; ++i) ASSERT_EQ(next(b, 2), want[size_t(i)]) << "batch " << i;
      EXPECT_EQ(nlohmann::json(b.state()), nlohmann::json(a.state()));
    }
  }
}

// A checkpoint taken at a global-batch boundary with dp = 2 resumes with dp = 4
// (and 1): the ranks together see the global batches the dp = 2 run would.
TEST(DataLoader, RestoreWithAnotherDataParallelSizeAtABoundary) {
  const int64_t T = 4, G = 8;
  Dataset ds(T * 40 + 1);
  DataLoader r0(ds.path(), Split::train, T, 5, 0, 2), r1(ds.path(), Split::train, T, 5, 1, 2);
  for (DataLoader* l : {&r0, &r1}) {
    l->set_global_batch(G);
    for (int i = 0; i < 3; ++i) next(*l, G / 2);
  }
  const LoaderState s = r0.state();
  EXPECT_EQ(s.row, 0u);
  std::vector<int64_t> want;
  for (int i = 0; i < 6; ++i) {
    for (DataLoader* l : {&r0, &r1}) {
      const auto v = samples_of(next(*l, G / 2), T);
      want.insert(want.end(), v.begin(), v.end());
    }
  }
  for (int dp : {1, 4}) {
    std::vector<std::unique_ptr<DataLoader>> ls;
    for (int r = 0; r < dp; ++r) {
      ls.push_back(std::make_unique<DataLoader>(ds.path(), Split::train, T, 0, r, dp));
      ls.back()->restore(s);
    }
    std::vector<int64_t> got;
    for (int i = 0; i < 6; ++i) {
      for (auto& l : ls) {
        const auto v = samples_of(next(*l, G / dp), T);
        got.insert(got.end(), v.begin(), v.end());
      }
    }
    EXPECT_EQ(got, want) << "dp " << dp;
  }
  // In the middle of a global batch the data-parallel size must stay.
  next(r0, 1);
  DataLoader other(ds.path(), Split::train, T, 5, 0, 4);
  const std::string msg = error_of([&] { other.restore(r0.state()); });
  EXPECT_NE(msg.find("global-batch boundary"), std::string::npos) << msg;
}

// The validation split is read in order, split across ranks like train, and
// wraps around; reset() starts it over.
TEST(DataLoader, ValidationSplitInOrder) {
  const int64_t T = 10;
  Dataset ds(T * 30 + 1, T * 12 + 1);  // val: S = 12
  DataLoader v(ds.path(), Split::val, T, 1, 0, 1);
  std::vector<int64_t> seen;
  for (int i = 0; i < 4; ++i) {
    const auto s = samples_of(next(v, 4), T, 500000);
    seen.insert(seen.end(), s.begin(), s.end());
  }
  EXPECT_EQ(seen, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3}));
  v.reset();
  EXPECT_EQ(samples_of(next(v, 4), T, 500000), (std::vector<int64_t>{0, 1, 2, 3}));
  DataLoader v1(ds.path(), Split::val, T, 1, 1, 2);
  v1.set_global_batch(6);
  EXPECT_EQ(samples_of(next(v1, 3), T, 500000), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(samples_of(next(v1, 3), T, 500000), (std::vector<int64_t>{9, 10, 11}));
}

TEST(DataLoader, PrefetchDoesNotChangeBatches) {
  const int64_t T = 32;
  Dataset ds(T * 200 + 1, 0, 1000);
  auto run = [&](int64_t prefetch) {
    LoaderOptions o;
    o.prefetch_rows = prefetch;
    DataLoader l(ds.path(), Split::train, T, 11, 0, 1, o);
    std::vector<Batch> out;
    for (int i = 0; i < 30; ++i) out.push_back(next(l, 1 + i % 5));
    return out;
  };
  const auto sync = run(-1);
  EXPECT_EQ(run(0), sync);
  EXPECT_EQ(run(1), sync);
  EXPECT_EQ(run(64), sync);
}

TEST(DataLoader, TooSmallForOneGlobalBatch) {
  const int64_t T = 8;
  Dataset ds(T * 10 + 1);  // S = 10
  DataLoader l(ds.path(), Split::train, T, 1, 0, 2);
  const std::string msg = error_of([&] { l.set_global_batch(12); });
  EXPECT_NE(msg.find(ds.path()), std::string::npos) << msg;
  EXPECT_NE(msg.find("too small for one global batch"), std::string::npos) << msg;
  EXPECT_NE(msg.find("10 samples"), std::string::npos) << msg;
  // Also when G is inferred from the first call (6 rows x 2 ranks).
  const std::string msg2 = error_of([&] { next(l, 6); });
  EXPECT_NE(msg2.find("too small for one global batch"), std::string::npos) << msg2;
  // Fewer tokens than one sample.
  const std::string msg3 = error_of([&] { DataLoader(ds.path(), Split::train, 100, 1, 0, 1); });
  EXPECT_NE(msg3.find("too few for one sample"), std::string::npos) << msg3;
  // No validation split.
  const std::string msg4 = error_of([&] { DataLoader(ds.path(), Split::val, 8, 1, 0, 1); });
  EXPECT_NE(msg4.find("has no val split"), std::string::npos) << msg4;
}

TEST(DataLoader, BadArguments) {
  const int64_t T = 8;
  Dataset ds(T * 20 + 1);
  EXPECT_NE(error_of([&] { DataLoader(ds.path(), Split::train, 0, 1, 0, 1); }).find("T must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataLoader(ds.path(), Split::train, T, 1, 2, 2); }).find("rank 2 of 2"),
            std::string::npos);
  DataLoader l(ds.path(), Split::train, T, 1, 0, 2);
  EXPECT_NE(error_of([&] { l.set_global_batch(3); }).find("multiple of the data-parallel size 2"),
            std::string::npos);
  Tensor good = Tensor::empty(Shape{2, T}, DType::i32), good2 = Tensor::empty(Shape{2, T}, DType::i32);
  Tensor wrong_t = Tensor::empty(Shape{2, T + 1}, DType::i32), wrong_dtype = Tensor::empty(Shape{2, T}, DType::i64);
  Tensor wrong_b = Tensor::empty(Shape{3, T}, DType::i32);
  int32_t fake[16];
  Tensor gpu = Tensor::wrap(fake, Shape{2, T}, DType::i32, Device::cuda(0));
  auto msg = [&](const Tensor& a, const Tensor& b) { return error_of([&] { l.next_batch(a, b); }); };
  EXPECT_NE(msg(wrong_t, good).find("'inputs'"), std::string::npos);
  EXPECT_NE(msg(good, wrong_dtype).find("'targets'"), std::string::npos);
  EXPECT_NE(msg(good, wrong_b).find("same shape"), std::string::npos);
  EXPECT_NE(msg(gpu, good).find("CPU tensor"), std::string::npos);
  EXPECT_NE(msg(good, good).find("overlap"), std::string::npos);
  l.next_batch(good, good2);  // fine
  // Restoring a state from another T or dataset.
  LoaderState s = l.state();
  DataLoader other_t(ds.path(), Split::train, T / 2, 1, 0, 2);
  EXPECT_NE(error_of([&] { other_t.restore(s); }).find("sequence length 8"), std::string::npos);
  Dataset other(T * 20 + 1, 0, 50);  // same tokens, other shard layout
  DataLoader other_ds(other.path(), Split::train, T, 1, 0, 2);
  EXPECT_NE(error_of([&] { other_ds.restore(s); }).find("different dataset"), std::string::npos);
  nlohmann::json j = s;
  j.erase("seed");
  EXPECT_NE(error_of([&] { j.get<LoaderState>(); }).find("missing field \"seed\""), std::string::npos);
}

}  // namespace
}  // namespace zt::data
