// DataLoader (data/loader.h): exact epoch coverage across ranks, disjoint
// rank slices, determinism from the seed, micro-batch equivalence, exact
// resume from a saved state (also with another data-parallel size at a
// boundary), the validation split in order, bad arguments, and blends of
// several datasets (exact proportions, each dataset its own shuffled
// stream, ranks and micro-batches, resume, a blend of one = the plain
// loader, their errors).
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

// A dataset whose train tokens are stream positions plus `offset`: a row's
// first token says which dataset and which sample it is.
struct OffsetDataset {
  test::TempDir dir;
  OffsetDataset(size_t n, uint32_t offset, size_t m = 0, uint64_t vocab = kVocab) {
    test::write_dataset(dir.path(), positions(n, offset), positions(m, offset + 200000), vocab, 89);
  }
  const std::string& path() const { return dir.path(); }
};

// Which dataset (by offset) each row came from, and its sample there.
struct Drawn {
  std::vector<int> dataset;
  std::vector<int64_t> sample;
};
Drawn drawn_from(const Batch& b, int64_t T, const std::vector<uint32_t>& offsets) {
  Drawn d;
  for (size_t r = 0; r < b.inputs.size() / size_t(T); ++r) {
    const uint32_t first = uint32_t(b.inputs[r * size_t(T)]);
    int k = int(offsets.size()) - 1;
    while (k > 0 && first < offsets[size_t(k)]) --k;
    Batch row;
    row.inputs.assign(b.inputs.begin() + int64_t(r) * T, b.inputs.begin() + int64_t(r + 1) * T);
    row.targets.assign(b.targets.begin() + int64_t(r) * T, b.targets.begin() + int64_t(r + 1) * T);
    d.dataset.push_back(k);
    d.sample.push_back(samples_of(row, T, offsets[size_t(k)])[0]);
  }
  return d;
}

// Three datasets weighted 5 : 2 : 1 (given unnormalised): at every prefix of
// the stream each dataset has given its share to within one sample, and the
// samples of each are its own stream - the first's exactly a plain loader's
// over it with the same seed, every dataset's epochs permutations of its
// samples (the small third repeats several times while the first is in its
// first epoch).
TEST(DataLoader, BlendDrawsEachDatasetByItsWeight) {
  const int64_t T = 5;
  const std::vector<uint32_t> offsets = {0, 300000, 600000};
  OffsetDataset a(T * 400 + 1, offsets[0]), b(T * 60 + 3, offsets[1]), c(T * 7 + 1, offsets[2]);
  DataLoader l({{a.path(), 5.0}, {b.path(), 2.0}, {c.path(), 1.0}}, Split::train, T, 31, 0, 1);
  EXPECT_EQ(l.datasets(), 3u);
  EXPECT_EQ(l.samples_per_epoch(), 400 + 60 + 7);
  l.set_global_batch(16);
  Drawn all;
  for (int step = 0; step < 20; ++step) {
    const Drawn d = drawn_from(next(l, 16), T, offsets);
    all.dataset.insert(all.dataset.end(), d.dataset.begin(), d.dataset.end());
    all.sample.insert(all.sample.end(), d.sample.begin(), d.sample.end());
  }
  const double w[3] = {5.0 / 8, 2.0 / 8, 1.0 / 8};
  std::vector<int64_t> n(3, 0);
  std::vector<std::vector<int64_t>> per(3);
  for (size_t q = 0; q < all.dataset.size(); ++q) {
    const int k = all.dataset[q];
    per[size_t(k)].push_back(all.sample[q]);
    ++n[size_t(k)];
    for (int i = 0; i < 3; ++i)
      ASSERT_LT(std::abs(double(n[size_t(i)]) - w[i] * double(q + 1)), 1.0) << "dataset " << i << " at " << q + 1;
  }
  EXPECT_EQ(l.samples_drawn(), (std::vector<uint64_t>{200, 80, 40}));
  // The first dataset's samples are a plain loader's over it, seed 31.
  DataLoader plain(a.path(), Split::train, T, 31, 0, 1);
  const std::vector<int64_t> want = samples_of(next(plain, int64_t(per[0].size())), T);
  EXPECT_EQ(per[0], want);
  // Each epoch of each dataset is a permutation of its samples.
  const int64_t S[3] = {400, 60, 7};
  for (int i = 0; i < 3; ++i)
    for (size_t e = 0; (e + 1) * size_t(S[i]) <= per[size_t(i)].size(); ++e) {
      std::set<int64_t> seen(per[size_t(i)].begin() + int64_t(e) * S[i], per[size_t(i)].begin() + int64_t(e + 1) * S[i]);
      EXPECT_EQ(int64_t(seen.size()), S[i]) << "dataset " << i << " epoch " << e;
      EXPECT_EQ(*seen.rbegin(), S[i] - 1);
    }
  EXPECT_GE(per[2].size(), 5u * 7u) << "the small dataset repeats";
  // Another seed: the same proportions, another order.
  DataLoader other({{a.path(), 5.0}, {b.path(), 2.0}, {c.path(), 1.0}}, Split::train, T, 32, 0, 1);
  other.set_global_batch(16);
  const Drawn d2 = drawn_from(next(other, 16), T, offsets);
  EXPECT_EQ(d2.dataset, std::vector<int>(all.dataset.begin(), all.dataset.begin() + 16));
  EXPECT_NE(d2.sample, std::vector<int64_t>(all.sample.begin(), all.sample.begin() + 16));
}

// Ranks' slices and micro-batches of a blend put together are the one-process
// batches; a state saved mid-batch and at a boundary (through JSON, with and
// without prefetch) continues with the same batches, and at a boundary on
// another number of ranks.
TEST(DataLoader, BlendAcrossRanksMicroBatchesAndResume) {
  const int64_t T = 4, G = 12;
  const std::vector<uint32_t> offsets = {0, 300000};
  OffsetDataset a(T * 90 + 1, offsets[0]), b(T * 25 + 2, offsets[1]);
  const std::vector<BlendPart> parts = {{a.path(), 0.3}, {b.path(), 0.7}};
  DataLoader one(parts, Split::train, T, 9, 0, 1);
  one.set_global_batch(G);
  std::vector<Batch> want;
  for (int step = 0; step < 12; ++step) want.push_back(next(one, G));
  for (int dp : {2, 3}) {
    std::vector<std::unique_ptr<DataLoader>> ranks;
    for (int r = 0; r < dp; ++r) {
      ranks.push_back(std::make_unique<DataLoader>(parts, Split::train, T, 9, r, dp));
      ranks.back()->set_global_batch(G);
    }
    for (int step = 0; step < 12; ++step) {
      Batch joined;
      for (auto& l : ranks)
        for (int m = 0; m < 2; ++m) {  // two micro-batches a rank
          const Batch part = next(*l, G / dp / 2);
          joined.inputs.insert(joined.inputs.end(), part.inputs.begin(), part.inputs.end());
          joined.targets.insert(joined.targets.end(), part.targets.begin(), part.targets.end());
        }
      ASSERT_EQ(joined, want[size_t(step)]) << "dp " << dp << " step " << step;
    }
  }
  for (int64_t prefetch : {int64_t(0), int64_t(-1)}) {
    LoaderOptions o;
    o.prefetch_rows = prefetch;
    for (int calls : {6, 7}) {  // 3 steps (a boundary), 3.5 steps
      DataLoader x(parts, Split::train, T, 9, 1, 2, o);
      x.set_global_batch(G);
      for (int i = 0; i < calls; ++i) next(x, G / 4);
      const std::string text = nlohmann::json(x.state()).dump();
      EXPECT_NE(text.find("blend_counts"), std::string::npos);
      std::vector<Batch> rest;
      for (int i = 0; i < 20; ++i) rest.push_back(next(x, G / 4));
      DataLoader y(parts, Split::train, T, 1234, 1, 2, o);
      y.restore(nlohmann::json::parse(text).get<LoaderState>());
      for (int i = 0; i < 20; ++i) ASSERT_EQ(next(y, G / 4), rest[size_t(i)]) << "calls " << calls << " batch " << i;
    }
  }
  // At a boundary of the one-process run, 3 ranks go on with its batches.
  DataLoader base(parts, Split::train, T, 9, 0, 1);
  base.set_global_batch(G);
  for (int step = 0; step < 5; ++step) next(base, G);
  const LoaderState at5 = base.state();
  std::vector<std::unique_ptr<DataLoader>> three;
  for (int r = 0; r < 3; ++r) {
    three.push_back(std::make_unique<DataLoader>(parts, Split::train, T, 0, r, 3));
    three.back()->restore(at5);
  }
  for (int step = 5; step < 12; ++step) {
    Batch joined;
    for (auto& l : three) {
      const Batch part = next(*l, G / 3);
      joined.inputs.insert(joined.inputs.end(), part.inputs.begin(), part.inputs.end());
      joined.targets.insert(joined.targets.end(), part.targets.begin(), part.targets.end());
    }
    ASSERT_EQ(joined, want[size_t(step)]) << "step " << step;
  }
}

// A blend of one dataset (any weight) is the plain loader: the same batches
// and the same state, so a checkpoint of either resumes in the other.
TEST(DataLoader, ABlendOfOneIsThePlainLoader) {
  const int64_t T = 6;
  Dataset ds(T * 70 + 2);
  DataLoader plain(ds.path(), Split::train, T, 3, 1, 2), blend({{ds.path(), 2.5}}, Split::train, T, 3, 1, 2);
  for (DataLoader* l : {&plain, &blend}) l->set_global_batch(10);
  for (int i = 0; i < 30; ++i) ASSERT_EQ(next(blend, 5), next(plain, 5)) << "batch " << i;
  EXPECT_EQ(nlohmann::json(blend.state()), nlohmann::json(plain.state()));
  EXPECT_EQ(nlohmann::json(plain.state()).dump().find("blend_counts"), std::string::npos);
}

TEST(DataLoader, BlendErrorsNameTheDatasetAndTheFix) {
  const int64_t T = 4;
  OffsetDataset a(T * 40 + 1, 0), b(T * 40 + 1, 300000);
  OffsetDataset small_vocab(T * 40 + 1, 0, 0, 1u << 16);
  EXPECT_NE(error_of([&] { DataLoader({{a.path(), 1.0}, {b.path(), 0.0}}, Split::train, T, 1, 0, 1); })
                .find("dataset 2 of the blend ('" + b.path() + "') has weight 0"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataLoader({{a.path(), 1.0}, {b.path(), -1.0}}, Split::train, T, 1, 0, 1); })
                .find("every weight must be a positive number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DataLoader(std::vector<BlendPart>{}, Split::train, T, 1, 0, 1); })
                .find("at least one dataset"),
            std::string::npos);
  const std::string mixed =
      error_of([&] { DataLoader({{a.path(), 1.0}, {small_vocab.path(), 1.0}}, Split::train, T, 1, 0, 1); });
  EXPECT_NE(mixed.find("must share one tokenizer"), std::string::npos) << mixed;
  EXPECT_NE(mixed.find(small_vocab.path()), std::string::npos) << mixed;
  // A plain state in a blend, a blend's in another blend, counts that do not add up.
  DataLoader plain(a.path(), Split::train, T, 1, 0, 1);
  DataLoader blend({{a.path(), 1.0}, {b.path(), 1.0}}, Split::train, T, 1, 0, 1);
  DataLoader reweighted({{a.path(), 1.0}, {b.path(), 3.0}}, Split::train, T, 1, 0, 1);
  next(blend, 4);
  EXPECT_NE(error_of([&] { blend.restore(plain.state()); }).find("different dataset"), std::string::npos);
  EXPECT_NE(error_of([&] { reweighted.restore(blend.state()); }).find("different dataset"), std::string::npos);
  LoaderState bad = blend.state();
  bad.blend_counts[0] += 1;
  EXPECT_NE(error_of([&] { blend.restore(bad); }).find("blend_counts"), std::string::npos);
}

}  // namespace
}  // namespace zt::data
