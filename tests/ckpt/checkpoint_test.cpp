// Checkpoint directories: the commit protocol, retention, corruption of any
// file, and the resharding reader (any box of any tensor assembled from
// slices spread over several files).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "core/error.h"
#include "test_util.h"

namespace zt::ckpt {
namespace {

namespace fs = std::filesystem;
using test::make_rng;
using test::random_tensor;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "zt_ckpt_dir_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

// Bytes of a tensor (for exact comparisons).
std::vector<char> bytes_of(const Tensor& t) {
  const char* p = static_cast<const char*>(t.data_ptr());
  return std::vector<char>(p, p + t.nbytes());
}

// The box [start, start + shape) of a 2-D or 3-D tensor, as a new tensor.
Tensor box_of(const Tensor& full, const std::vector<int64_t>& start, const Shape& shape) {
  Tensor out = Tensor::empty(shape, full.dtype());
  const size_t e = dtype_size(full.dtype());
  const Shape& fs = full.shape();
  const int nd = fs.ndim();
  std::vector<int64_t> idx(size_t(nd), 0);
  for (int64_t i = 0; i < shape.numel(); ++i) {
    int64_t rem = i, src = 0, stride = 1;
    for (int d = nd - 1; d >= 0; --d) {
      idx[size_t(d)] = rem % shape[d];
      rem /= shape[d];
    }
    for (int d = nd - 1; d >= 0; --d) {
      src += (idx[size_t(d)] + start[size_t(d)]) * stride;
      stride *= fs[d];
    }
    std::memcpy(static_cast<char*>(out.data_ptr()) + size_t(i) * e,
                static_cast<const char*>(full.data_ptr()) + size_t(src) * e, e);
  }
  return out;
}

// A two-step checkpoint of three tensors in one file.
std::string write_simple(const std::string& root, int64_t step, std::mt19937_64& rng,
                         std::vector<Tensor>* out = nullptr) {
  CheckpointWriter w(root, step);
  Tensor a = random_tensor(Shape{7, 5}, DType::f32, rng), b = random_tensor(Shape{13}, DType::bf16, rng);
  Tensor c = random_tensor(Shape{3, 2, 4}, DType::f32, rng);
  w.write_file("shard-00000.safetensors", {{"model.a", a.shape(), {}, a}, {"model.b", b.shape(), {}, b}});
  w.write_file("shard-00001.safetensors", {{"optim.c", c.shape(), {}, c}});
  w.manifest().tokens_seen = step * 100;
  w.manifest().config = "[train]\nsteps = 10\n";
  w.manifest().state = {{"loader", {{"epoch", 1}}}, {"loss", 2.5}};
  if (out) *out = {a, b, c};
  return w.commit();
}

TEST_F(CheckpointTest, RoundTripAndCommitProtocol) {
  auto rng = make_rng(1);
  std::vector<Tensor> t;
  const std::string dir = write_simple(root_, 20, rng, &t);
  EXPECT_EQ(fs::path(dir).filename(), "step_00000020");
  EXPECT_EQ(latest_checkpoint(root_), dir);
  EXPECT_EQ(list_checkpoints(root_), std::vector<int64_t>{20});
  for (const auto& e : fs::directory_iterator(root_))  // no staging directory left behind
    EXPECT_NE(e.path().filename().string().rfind(".tmp-", 0), 0u) << e.path();

  // Every way a user names it resolves to the same checkpoint.
  const Checkpoint ck = Checkpoint::open(root_);
  EXPECT_EQ(ck.dir(), dir);
  EXPECT_EQ(Checkpoint::open(dir).dir(), dir);
  EXPECT_EQ(Checkpoint::open(fs::path(root_).parent_path().string() + "/" + fs::path(root_).filename().string()).dir(),
            dir);
  EXPECT_EQ(ck.manifest().step, 20);
  EXPECT_EQ(ck.manifest().tokens_seen, 2000);
  EXPECT_EQ(ck.manifest().config, "[train]\nsteps = 10\n");
  EXPECT_EQ(ck.manifest().state["loss"].get<double>(), 2.5);
  EXPECT_EQ(bytes_of(ck.read("model.a")), bytes_of(t[0]));
  EXPECT_EQ(bytes_of(ck.read("model.b")), bytes_of(t[1]));
  EXPECT_EQ(bytes_of(ck.read("optim.c")), bytes_of(t[2]));
  EXPECT_EQ(ck.read("model.b").dtype(), DType::bf16);
  try {
    ck.read("model.nope");
    FAIL() << "no error for a missing tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no tensor 'model.nope'"), std::string::npos) << e.what();
  }

  // A second save moves `latest`; the first stays intact.
  const std::string dir2 = write_simple(root_, 40, rng);
  EXPECT_EQ(latest_checkpoint(root_), dir2);
  EXPECT_EQ(bytes_of(Checkpoint::open(dir).read("model.a")), bytes_of(t[0]));
}

TEST_F(CheckpointTest, ExistingCheckpointIsNeverOverwritten) {
  auto rng = make_rng(2);
  std::vector<Tensor> t;
  const std::string dir = write_simple(root_, 5, rng, &t);
  const auto before = digest_file(dir + "/shard-00000.safetensors");
  try {
    CheckpointWriter again(root_, 5);
    FAIL() << "no error for an existing checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exists already"), std::string::npos) << e.what();
  }
  const auto after = digest_file(dir + "/shard-00000.safetensors");
  EXPECT_EQ(before.checksum, after.checksum);
  EXPECT_EQ(bytes_of(Checkpoint::open(root_).read("model.a")), bytes_of(t[0]));
}

TEST_F(CheckpointTest, AbandonedSaveLeavesPreviousLatest) {
  auto rng = make_rng(3);
  const std::string dir = write_simple(root_, 10, rng);
  {
    CheckpointWriter w(root_, 20);
    Tensor a = random_tensor(Shape{4}, DType::f32, rng);
    w.write_file("shard-00000.safetensors", {{"model.a", a.shape(), {}, a}});
    // no commit: an exception unwinding the save
  }
  EXPECT_EQ(latest_checkpoint(root_), dir);
  EXPECT_EQ(list_checkpoints(root_), std::vector<int64_t>{10});
  EXPECT_FALSE(fs::exists(root_ + "/step_00000020"));
  // A staging directory from a crash (not cleaned by a destructor) is ignored
  // by readers and removed by the next prune.
  fs::create_directories(root_ + "/.tmp-step_00000030");
  std::ofstream(root_ + "/.tmp-step_00000030/manifest.json") << "{}";
  EXPECT_EQ(list_checkpoints(root_), std::vector<int64_t>{10});
  EXPECT_EQ(Checkpoint::open(root_).dir(), dir);
  const auto removed = prune_checkpoints(root_, {});
  EXPECT_EQ(removed, std::vector<std::string>{".tmp-step_00000030"});
}

TEST_F(CheckpointTest, EveryCorruptedByteIsCaughtByAChecksum) {
  auto rng = make_rng(4);
  const std::string dir = write_simple(root_, 7, rng);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  ASSERT_EQ(files.size(), 4u);  // manifest.json, manifest.zt64, two shards
  for (const std::string& f : files) {
    const auto size = fs::file_size(f);
    for (uint64_t pos : {uint64_t(0), uint64_t(size / 2), uint64_t(size - 2)}) {
      SCOPED_TRACE(f + " byte " + std::to_string(pos));
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      io.seekg(std::streamoff(pos));
      char c = 0;
      io.read(&c, 1);
      const char flipped = char(c ^ 0x04);
      io.seekp(std::streamoff(pos));
      io.write(&flipped, 1);
      io.close();
      try {
        Checkpoint::open(root_);
        ADD_FAILURE() << "no error";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(fs::path(f).filename().string()), std::string::npos) << msg;
        EXPECT_TRUE(msg.find("checksum mismatch") != std::string::npos || msg.find("corrupted") != std::string::npos)
            << msg;
      }
      std::fstream back(f, std::ios::in | std::ios::out | std::ios::binary);
      back.seekp(std::streamoff(pos));
      back.write(&c, 1);
    }
  }
  EXPECT_NO_THROW(Checkpoint::open(root_));
  // Truncation and a missing file.
  const std::string shard = dir + "/shard-00001.safetensors";
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size - 3);
  try {
    Checkpoint::open(dir);
    ADD_FAILURE() << "no error for a truncated file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  fs::remove(shard);
  try {
    Checkpoint::open(dir);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'shard-00001.safetensors', which is missing"), std::string::npos)
        << e.what();
  }
}

// Rewrites a checkpoint's manifest (and its checksum) through `edit`, as a
// buggy writer could have produced it.
void edit_manifest(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  std::ifstream in(dir + "/manifest.json");
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  const std::string text = j.dump(1);
  std::ofstream(dir + "/manifest.json", std::ios::trunc) << text;
  char sum[96];
  std::snprintf(sum, sizeof sum, "%s %zu manifest.json\n", hex64(checksum64(text.data(), text.size())).c_str(),
                text.size());
  std::ofstream(dir + "/manifest.zt64", std::ios::trunc) << sum;
}

TEST_F(CheckpointTest, InconsistentManifestsAreRejectedWithTheReason) {
  auto rng = make_rng(5);
  const std::string dir = write_simple(root_, 3, rng);
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"slice in an unlisted file",
       [](nlohmann::json& j) { j["tensors"]["model.a"]["slices"][0]["file"] = "other.safetensors"; },
       "which the manifest's 'files' does not list"},
      {"slice past the end", [](nlohmann::json& j) { j["tensors"]["model.a"]["slices"][0]["start"] = {1, 0}; },
       "reaches past the tensor"},
      {"gap", [](nlohmann::json& j) { j["tensors"]["model.a"]["shape"] = {8, 5}; }, "the slices hold 35 of 40"},
      {"overlap",
       [](nlohmann::json& j) {
         auto s = j["tensors"]["model.a"]["slices"][0];
         j["tensors"]["model.a"]["slices"].push_back(s);
       },
       "overlap"},
      {"file listed but missing",
       [](nlohmann::json& j) { j["files"]["gone.safetensors"] = {{"bytes", 8}, {"checksum", "0000000000000000"}}; },
       "'gone.safetensors', which is missing"},
      {"unknown version", [](nlohmann::json& j) { j["version"] = 99; }, "manifest version 99 is not supported"},
      {"missing field", [](nlohmann::json& j) { j.erase("step"); }, "missing field 'step'"},
  };
  const std::string good = dir + ".good";
  fs::copy(dir, good);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    fs::remove_all(dir);
    fs::copy(good, dir);
    edit_manifest(dir, c.edit);
    try {
      Checkpoint::open(dir);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.expect), std::string::npos) << e.what();
    }
  }
  // A manifest that names a key its file does not hold: caught on read.
  fs::remove_all(dir);
  fs::copy(good, dir);
  edit_manifest(dir, [](nlohmann::json& j) { j["tensors"]["model.a"]["slices"][0]["key"] = "model.zz"; });
  try {
    Checkpoint::open(dir).read("model.a");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor 'model.zz'"), std::string::npos) << e.what();
  }
}

// Resharding: tensors cut into boxes along different dimensions, spread over
// files the way ranks of another layout would write them; any box read back
// equals that box of the original.
TEST_F(CheckpointTest, ReadsAnyBoxFromSlicesInManyFiles) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(6);
  const Tensor m = random_tensor(Shape{12, 10}, DType::f32, rng);       // 2 x 3 grid of boxes
  const Tensor v = random_tensor(Shape{30}, DType::bf16, rng);          // 3 uneven pieces
  const Tensor w = random_tensor(Shape{4, 6, 5}, DType::f32, rng);      // split along dim 1
  {
    CheckpointWriter wr(root_, 1);
    const int64_t rows[] = {0, 5, 12}, cols[] = {0, 3, 7, 10};
    int file = 0;
    for (int r = 0; r < 2; ++r)
      for (int c = 0; c < 3; ++c) {
        const std::vector<int64_t> start{rows[r], cols[c]};
        const Shape shape{rows[r + 1] - rows[r], cols[c + 1] - cols[c]};
        std::vector<SliceToWrite> slices{{"m", m.shape(), start, box_of(m, start, shape)}};
        if (c == 0) {  // v's pieces ride along in some files
          const int64_t cut[] = {0, 11, 12, 30};
          for (int k = r; k < 3; k += 2) {
            const std::vector<int64_t> vs{cut[k]};
            slices.push_back({"v", v.shape(), vs, box_of(v, vs, Shape{cut[k + 1] - cut[k]})});
          }
        }
        wr.write_file("rank-" + std::to_string(file++) + ".safetensors", slices);
      }
    // Two slices of w in one file (keys w#0, w#1), the third in another.
    wr.write_file("rank-6.safetensors", {{"w", w.shape(), {0, 0, 0}, box_of(w, {0, 0, 0}, Shape{4, 2, 5})},
                                         {"w", w.shape(), {0, 2, 0}, box_of(w, {0, 2, 0}, Shape{4, 3, 5})}});
    wr.write_file("rank-7.safetensors", {{"w", w.shape(), {0, 5, 0}, box_of(w, {0, 5, 0}, Shape{4, 1, 5})}});
    wr.commit();
  }
  const Checkpoint ck = Checkpoint::open(root_);
  EXPECT_EQ(ck.entry("m").slices.size(), 6u);
  EXPECT_EQ(bytes_of(ck.read("m")), bytes_of(m));
  EXPECT_EQ(bytes_of(ck.read("v")), bytes_of(v));
  EXPECT_EQ(bytes_of(ck.read("w")), bytes_of(w));
  for (int trial = 0; trial < 200; ++trial) {
    const Tensor* src[] = {&m, &v, &w};
    const char* names[] = {"m", "v", "w"};
    const int k = trial % 3;
    const Shape& full = src[k]->shape();
    std::vector<int64_t> start;
    Shape shape;
    for (int d = 0; d < full.ndim(); ++d) {
      const int64_t a = int64_t(rng() % uint64_t(full[d])), b = int64_t(rng() % uint64_t(full[d]));
      start.push_back(std::min(a, b));
      shape.push_back(std::max(a, b) - std::min(a, b) + 1);
    }
    Tensor got = Tensor::empty(shape, src[k]->dtype());
    test::poison(got);
    ck.read(names[k], got, start);
    ASSERT_EQ(bytes_of(got), bytes_of(box_of(*src[k], start, shape))) << names[k] << " box at " << start[0] << " "
                                                                       << shape.str();
  }
  Tensor outside = Tensor::empty(Shape{3, 3}, DType::f32);
  EXPECT_THROW(ck.read("m", outside, {10, 0}), Error);
  Tensor wrong_dtype = Tensor::empty(Shape{30}, DType::f32);
  EXPECT_THROW(ck.read("v", wrong_dtype), Error);
}

TEST_F(CheckpointTest, RetentionKeepsTheLastKAndEveryMth) {
  auto rng = make_rng(7);
  for (int64_t s = 1; s <= 10; ++s) write_simple(root_, s * 10, rng);
  const auto removed = prune_checkpoints(root_, {3, 40});
  EXPECT_EQ(list_checkpoints(root_), (std::vector<int64_t>{40, 80, 90, 100}));
  EXPECT_EQ(removed.size(), 6u);
  EXPECT_EQ(latest_checkpoint(root_), root_ + "/step_00000100");
  // keep_last = 0 keeps everything.
  EXPECT_TRUE(prune_checkpoints(root_, {0, 0}).empty());
  // `latest` is kept even when the policy would drop it (e.g. a resumed run
  // whose latest is an older step).
  std::ofstream(root_ + "/latest", std::ios::trunc) << "step_00000040\n";
  prune_checkpoints(root_, {1, 0});
  EXPECT_EQ(list_checkpoints(root_), (std::vector<int64_t>{40, 100}));
}

TEST(BackgroundWriter, RunsJobsInOrderAndReportsErrors) {
  BackgroundWriter bw;
  std::vector<int> order;
  for (int i = 0; i < 4; ++i) bw.submit([&order, i] { order.push_back(i); });
  bw.wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3}));
  bw.submit([] { ZT_FAIL("disk full"); });
  try {
    bw.submit([] {});
    FAIL() << "the first job's error was not reported";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "disk full");
  }
  EXPECT_NO_THROW(bw.wait());
}

}  // namespace
}  // namespace zt::ckpt

namespace zt::ckpt {
namespace {

// Every flat range of several shapes: the boxes are in flat order, each a
// contiguous run, and together exactly the range.
TEST(FlatRangeBoxes, TileAnyFlatRangeInOrder) {
  for (const Shape& s : {Shape{7}, Shape{4, 5}, Shape{3, 4, 5}, Shape{2, 1, 3, 2}, Shape{1, 6}}) {
    const int64_t n = s.numel();
    for (int64_t a = 0; a <= n; ++a)
      for (int64_t b = a; b <= n; ++b) {
        const auto boxes = flat_range_boxes(s, a, b);
        int64_t next = a;
        for (const auto& [start, extent] : boxes) {
          ASSERT_EQ(start.size(), size_t(s.ndim()));
          // The box's first element is the next flat index, and the box is
          // contiguous: only its outermost non-unit dim may be partial.
          int64_t flat = 0;
          for (int d = 0; d < s.ndim(); ++d) flat = flat * s[d] + start[size_t(d)];
          ASSERT_EQ(flat, next) << s.str() << " [" << a << ", " << b << ")";
          bool inner_full = true;
          for (int d = s.ndim() - 1; d >= 0; --d) {
            if (!inner_full) {
              ASSERT_EQ(extent[d], 1) << s.str() << " not contiguous";
            }
            ASSERT_LE(start[size_t(d)] + extent[d], s[d]);
            if (extent[d] != s[d]) inner_full = false;
          }
          next += extent.numel();
        }
        ASSERT_EQ(next, b) << s.str() << " [" << a << ", " << b << ")";
        ASSERT_LE(boxes.size(), size_t(2 * s.ndim() - 1));
      }
  }
}

// Parts written by different ranks merge into one manifest whose slices
// tile every tensor; disagreement and duplicated files are named.
TEST(ManifestMerge, PartsOfRanksTileTheTensors) {
  Manifest a, b;
  a.tensors["w"] = {DType::f32, Shape{4, 3}, {{"r0.safetensors", "w", {0, 0}, Shape{2, 3}}}};
  a.files["r0.safetensors"] = {10, 1};
  b.tensors["w"] = {DType::f32, Shape{4, 3}, {{"r1.safetensors", "w", {2, 0}, Shape{2, 3}}}};
  b.files["r1.safetensors"] = {10, 2};
  Manifest all;
  all.merge_part(a.part_json(), "rank 0");
  EXPECT_THROW(all.validate("half"), Error);  // half the tensor
  all.merge_part(b.part_json(), "rank 1");
  EXPECT_NO_THROW(all.validate("merged"));
  EXPECT_EQ(all.tensors["w"].slices.size(), 2u);
  EXPECT_THROW(all.merge_part(b.part_json(), "rank 1 again"), Error);  // file listed twice
  Manifest c;
  c.tensors["w"] = {DType::bf16, Shape{4, 3}, {}};
  Manifest d;
  d.merge_part(a.part_json(), "a");
  try {
    d.merge_part(c.part_json(), "c");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zt::ckpt
