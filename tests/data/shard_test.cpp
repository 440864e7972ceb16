// Token shards and the dataset index (data/shard.h, data/dataset_index.h):
// round trips, the checksum, and a clear error naming the file for every
// kind of damage.
#include <cstdint>
#include <gtest/gtest.h>

#include "core/hash.h"
#include "data/loader.h"
#include "data/shard.h"
#include "data_test_util.h"

namespace zt::data {
namespace {

using test::error_of;

std::vector<uint32_t> iota_tokens(size_t n, uint32_t vocab) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint32_t((i * 7919) % vocab);
  return v;
}

TEST(Checksum64, StreamingEqualsOneShotForAnySplit) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(5);
  std::string data(1000, '\0');
  for (char& c : data) c = char(rng());
  std::uniform_int_distribution<size_t> cut(0, 1000);
  const uint64_t whole = checksum64(data.data(), data.size());
  for (int i = 0; i < 200; ++i) {
    size_t a = cut(rng), b = cut(rng);
    if (a > b) std::swap(a, b);
    Checksum64 c;
    c.update(data.data(), a);
    c.update(data.data() + a, b - a);
    c.update(data.data() + b, data.size() - b);
    ASSERT_EQ(c.digest(), whole) << a << " " << b;
  }
  // Sensitive to every byte, to the length and to order.
  for (size_t i = 0; i < data.size(); i += 37) {
    std::string d = data;
    d[i] ^= 1;
    EXPECT_NE(checksum64(d.data(), d.size()), whole) << i;
  }
  EXPECT_NE(checksum64(data.data(), 999), whole);
  std::string swapped = data.substr(32, 32) + data.substr(0, 32) + data.substr(64);
  EXPECT_NE(checksum64(swapped.data(), swapped.size()), whole);
}

class ShardRoundTrip : public testing::TestWithParam<uint32_t> {};

TEST_P(ShardRoundTrip, WriteThenRead) {
  const uint32_t vocab = GetParam();
  test::TempDir d;
  const auto tokens = iota_tokens(300001, vocab);
  ShardWriter w(d / "s.bin", token_bytes_for_vocab(vocab), vocab);
  w.append(tokens.data(), 1000);
  w.append(tokens.data() + 1000, tokens.size() - 1000);
  w.add_documents(3);
  const ShardHeader h = w.finish();
  EXPECT_EQ(h.token_count, tokens.size());
  EXPECT_EQ(h.documents, 3u);
  EXPECT_EQ(std::filesystem::file_size(d / "s.bin"), kShardHeaderBytes + tokens.size() * h.token_bytes);
  ShardReader r(d / "s.bin", vocab, true);
  EXPECT_EQ(r.tokens(), tokens.size());
  EXPECT_EQ(r.header().checksum, h.checksum);
  std::vector<int32_t> got(tokens.size());
  r.read(0, tokens.size(), got.data());
  for (size_t i = 0; i < tokens.size(); ++i) ASSERT_EQ(uint32_t(got[i]), tokens[i]) << i;
  std::vector<int32_t> mid(5);
  r.read(12345, 5, mid.data());
  EXPECT_EQ(uint32_t(mid[0]), tokens[12345]);
}

INSTANTIATE_TEST_SUITE_P(Data, ShardRoundTrip, testing::Values(50257u, 65536u, 128256u));

// A valid single-shard dataset whose shard the test then damages.
struct DamagedDataset {
  test::TempDir dir;
  std::string shard;
  static constexpr uint32_t kVocab = 1000;
  DamagedDataset() {
    test::write_dataset(dir.path(), iota_tokens(5000, kVocab), {}, kVocab, 1 << 20);
    shard = dir / "train-0.bin";
  }
  std::string bytes() const { return test::read_all(shard); }
  void set(const std::string& b) const { test::write_all(shard, b); }
  std::string open_error() const {
    return error_of([&] { DataLoader(dir.path(), Split::train, 16, 1, 0, 1); });
  }
};

void expect_mentions(const std::string& msg, const std::string& file, const std::string& what) {
  EXPECT_NE(msg.find(file), std::string::npos) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
}

TEST(ShardErrors, Valid) {
  DamagedDataset ds;
  DataLoader(ds.dir.path(), Split::train, 16, 1, 0, 1);  // no error
}

TEST(ShardErrors, WrongMagic) {
  DamagedDataset ds;
  std::string b = ds.bytes();
  b[0] = 'X';
  ds.set(b);
  expect_mentions(ds.open_error(), ds.shard, "bad magic");
}

TEST(ShardErrors, WrongVersion) {
  DamagedDataset ds;
  std::string b = ds.bytes();
  b[8] = 2;
  ds.set(b);
  expect_mentions(ds.open_error(), ds.shard, "format version 2");
}

TEST(ShardErrors, CorruptedHeader) {
  DamagedDataset ds;
  std::string b = ds.bytes();
  b[17] ^= 1;  // token count
  ds.set(b);
  expect_mentions(ds.open_error(), ds.shard, "header checksum mismatch");
}

TEST(ShardErrors, Truncated) {
  DamagedDataset ds;
  const std::string b = ds.bytes();
  ds.set(b.substr(0, b.size() - 2));
  expect_mentions(ds.open_error(), ds.shard, "is truncated: its header says 5000 tokens");
  ds.set(b.substr(0, 40));
  expect_mentions(ds.open_error(), ds.shard, "shorter than the 64-byte header");
  ds.set("");
  expect_mentions(ds.open_error(), ds.shard, "is truncated");
}

TEST(ShardErrors, TrailingBytes) {
  DamagedDataset ds;
  ds.set(ds.bytes() + "xy");
  expect_mentions(ds.open_error(), ds.shard, "2 bytes after its last token");
}

TEST(ShardErrors, ChecksumMismatch) {
  DamagedDataset ds;
  std::string b = ds.bytes();
  b[kShardHeaderBytes + 4000] ^= 0x10;
  ds.set(b);
  expect_mentions(ds.open_error(), ds.shard, "checksum mismatch");
}

// A shard whose data and checksums are consistent but holds an id outside
// the vocabulary (a foreign or buggy writer): caught when opening.
TEST(ShardErrors, TokenIdOutsideVocabulary) {
  test::TempDir d;
  auto tokens = iota_tokens(5000, 1000);
  tokens[4321] = 1000;
  test::write_dataset(d.path(), tokens, {}, 1000, 1 << 20);
  const std::string msg = error_of([&] { DataLoader(d.path(), Split::train, 16, 1, 0, 1); });
  expect_mentions(msg, d / "train-0.bin", "token id 1000 at token 4321");
  // With verification off the loader opens it (the check costs a pass over the data).
  LoaderOptions o;
  o.verify = false;
  DataLoader(d.path(), Split::train, 16, 1, 0, 1, o);
}

TEST(ShardErrors, ShardFromAnotherRun) {
  DamagedDataset ds;
  test::TempDir other;
  test::write_dataset(other.path(), iota_tokens(5000, 999), {}, DamagedDataset::kVocab, 1 << 20);
  std::filesystem::copy_file(other / "train-0.bin", ds.shard, std::filesystem::copy_options::overwrite_existing);
  expect_mentions(ds.open_error(), ds.shard, "does not match index.json");
}

TEST(ShardErrors, MissingShard) {
  DamagedDataset ds;
  std::filesystem::remove(ds.shard);
  expect_mentions(ds.open_error(), ds.shard, "cannot be opened");
}

TEST(IndexErrors, MissingOrBrokenIndex) {
  DamagedDataset ds;
  const std::string index = ds.dir / "index.json";
  const std::string good = test::read_all(index);
  std::filesystem::remove(index);
  expect_mentions(ds.open_error(), ds.dir.path(), "has no index.json");
  test::write_all(index, "{\"format\": ");
  expect_mentions(ds.open_error(), index, "not valid JSON");
  test::write_all(index, "{\"format\": \"something-else\"}");
  expect_mentions(ds.open_error(), index, "not a Zettatron dataset index");
  auto j = nlohmann::json::parse(good);
  j["version"] = 7;
  test::write_all(index, j.dump());
  expect_mentions(ds.open_error(), index, "version 7");
  j = nlohmann::json::parse(good);
  j["splits"]["train"]["tokens"] = 4999;
  test::write_all(index, j.dump());
  expect_mentions(ds.open_error(), index, "the shards hold 5000 tokens");
  j = nlohmann::json::parse(good);
  j["splits"]["train"]["shards"][0]["file"] = "../evil.bin";
  test::write_all(index, j.dump());
  expect_mentions(ds.open_error(), index, "plain file name");
  j = nlohmann::json::parse(good);
  j["tokenizer"].erase("vocab_size");
  test::write_all(index, j.dump());
  expect_mentions(ds.open_error(), index, "missing field \"vocab_size\"");
  expect_mentions(error_of([&] { DataLoader(ds.dir / "nope", Split::train, 16, 1, 0, 1); }), ds.dir / "nope",
                  "does not exist");
}

}  // namespace
}  // namespace zt::data
