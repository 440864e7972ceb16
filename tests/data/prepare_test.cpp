// `prepare` (data/prepare.h): document splitting, shards that hold exactly
// the tokenizer's ids + end-of-text per document, the validation fraction,
// shard sizes, byte-identical output for any thread count, the fortunes
// corpus end to end, and bad input (every error names the file; a failed
// run leaves no output folder and no temporary folder behind).
#include <cstdint>
#include <gtest/gtest.h>

#include <iostream>

#include "data/loader.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "data_test_util.h"

namespace zt::data {
namespace {

using test::error_of;
using Docs = std::vector<std::string>;

Docs split(std::string_view text, DocSplit mode, const std::string& file = "f.txt") {
  std::deque<std::string> storage;
  Docs out;
  for (auto v : split_documents(text, mode, file, storage)) out.emplace_back(v);
  return out;
}

TEST(SplitDocuments, Modes) {
  EXPECT_EQ(split("a\nb\n", DocSplit::file), (Docs{"a\nb\n"}));
  EXPECT_EQ(split("one\n%\ntwo\nlines\n%\n%\n  \n%\nlast", DocSplit::percent),
            (Docs{"one\n", "two\nlines\n", "last"}));
  EXPECT_EQ(split("%\r\nx\r\n%\r\n", DocSplit::percent), (Docs{"x\r\n"}));
  EXPECT_EQ(split("p1 a\np1 b\n\n \n\np2\n", DocSplit::blank), (Docs{"p1 a\np1 b\n", "p2\n"}));
  EXPECT_EQ(split("l1\n\nl2\r\nl3", DocSplit::line), (Docs{"l1", "l2", "l3"}));
  EXPECT_EQ(split("{\"text\": \"a\\nb\"}\n\n{\"text\": \"c\", \"id\": 2}\n", DocSplit::jsonl), (Docs{"a\nb", "c"}));
  EXPECT_EQ(split("{\"text\": \"x\"}\n", DocSplit::automatic, "d.jsonl"), (Docs{"x"}));
  EXPECT_EQ(split("{\"text\": \"x\"}\n", DocSplit::automatic, "d.txt"), (Docs{"{\"text\": \"x\"}\n"}));
  EXPECT_EQ(split(" \n\t\n", DocSplit::file), (Docs{}));
  const std::string msg = error_of([] { split("{\"text\": 1}\n", DocSplit::jsonl, "bad.jsonl"); });
  EXPECT_NE(msg.find("'bad.jsonl' line 1"), std::string::npos) << msg;
  const std::string msg2 = error_of([] { split("{\"text\": \"a\"}\n{oops\n", DocSplit::jsonl, "bad.jsonl"); });
  EXPECT_NE(msg2.find("'bad.jsonl' line 2 is not valid JSON"), std::string::npos) << msg2;
  EXPECT_EQ(parse_doc_split("percent"), DocSplit::percent);
  EXPECT_NE(error_of([] { parse_doc_split("pages"); }).find("expected auto, file, percent"), std::string::npos);
}

// All tokens of a split, in order.
std::vector<uint32_t> read_split(const std::string& dir, Split split) {
  const DatasetIndex index = DatasetIndex::load(dir);
  std::vector<uint32_t> out;
  for (const ShardInfo& sh : index.split(split).shards) {
    ShardReader r(dir + "/" + sh.file, uint32_t(index.vocab_size), true);
    std::vector<int32_t> v(r.tokens());
    r.read(0, r.tokens(), v.data());
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// A small corpus in a folder: two text files of '%'-separated documents, plus
// what a folder scan must skip.
struct Corpus {
  test::TempDir dir;
  Docs docs;  // in prepare's order
  Corpus() {
    std::filesystem::create_directories(dir / "in/sub");
    std::string a, b;
    for (int i = 0; i < 40; ++i) {
      const std::string d = "Document " + std::to_string(i) + ": it's a test, isn't it?\n  Numbers 12345 and \xf0\x9f\xa6\x99.\n";
      (i < 25 ? a : b) += d + "%\n";
      docs.push_back(d);
    }
    test::write_all(dir / "in/a.txt", a);
    test::write_all(dir / "in/sub/b.txt", b);
    test::write_all(dir / "in/.hidden.txt", "never read\n");
    test::write_all(dir / "in/empty.txt", "");
    test::write_all(dir / "in/index.dat", std::string("\x00\x01\x02", 3));
    std::filesystem::create_symlink(dir / "in/a.txt", dir / "in/a.u8");
  }
  PrepareOptions options(const std::string& out) const {
    PrepareOptions o;
    o.inputs = {dir / "in"};
    o.output = out;
    o.doc_split = DocSplit::percent;
    o.val_fraction = 0.1;
    o.progress = false;
    return o;
  }
};

TEST(Prepare, ShardsHoldEachDocumentsTokensAndEndOfText) {
  const Tokenizer* tok = test::cached_tokenizer("gpt2");
  ASSERT_TRUE(tok);
  Corpus c;
  PrepareOptions o = c.options(c.dir / "out");
  o.shard_tokens = 100;
  const PrepareSummary s = prepare(o, *tok, nullptr);
  EXPECT_EQ(s.files, 2u);
  EXPECT_EQ(s.skipped_files, 4u);  // hidden, empty, binary, symlink
  EXPECT_EQ(s.documents, 40u);
  std::vector<uint32_t> want_train, want_val;
  for (size_t i = 0; i < c.docs.size(); ++i) {
    auto ids = tok->encode(c.docs[i]);
    ids.push_back(tok->eot_token());
    auto& dst = (i % 10 == 9) ? want_val : want_train;  // floor((i+1)/10) > floor(i/10)
    dst.insert(dst.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(read_split(o.output, Split::train), want_train);
  EXPECT_EQ(read_split(o.output, Split::val), want_val);
  const DatasetIndex index = DatasetIndex::load(o.output);
  EXPECT_EQ(index.tokenizer_name, "gpt2");
  EXPECT_EQ(index.tokenizer_fingerprint, tok->fingerprint());
  EXPECT_EQ(index.vocab_size, 50257u);
  EXPECT_EQ(index.eot_token, 50256u);
  EXPECT_EQ(index.token_bytes, 2u);
  EXPECT_EQ(index.train.documents, 36u);
  EXPECT_EQ(index.val.documents, 4u);
  EXPECT_EQ(index.train.tokens, want_train.size());
  uint64_t docs = 0;
  for (size_t k = 0; k < index.train.shards.size(); ++k) {
    const ShardInfo& sh = index.train.shards[k];
    docs += sh.documents;
    if (k + 1 < index.train.shards.size()) {
      EXPECT_EQ(sh.tokens, 100u) << sh.file;
    }
    EXPECT_EQ(ShardReader(o.output + "/" + sh.file, 50257, true).header().documents, sh.documents);
  }
  EXPECT_EQ(docs, 36u);
  EXPECT_GT(index.train.shards.size(), 5u);
  // Decoding the shards gives back the documents.
  std::string text;
  for (uint32_t id : want_val)
    if (id != tok->eot_token()) text += tok->token_bytes(id);
  EXPECT_EQ(text, c.docs[9] + c.docs[19] + c.docs[29] + c.docs[39]);
  // No temporary folder left beside the output.
  for (const auto& e : std::filesystem::directory_iterator(c.dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

TEST(Prepare, OutputIsIdenticalForAnyThreadCount) {
  const Tokenizer* tok = test::cached_tokenizer("gpt2");
  ASSERT_TRUE(tok);
  Corpus c;
  std::vector<std::map<std::string, std::string>> outs;
  for (int threads : {1, 2, 5}) {
    PrepareOptions o = c.options(c.dir / ("out" + std::to_string(threads)));
    o.threads = threads;
    o.shard_tokens = 333;
    prepare(o, *tok, nullptr);
    std::map<std::string, std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(o.output))
      files[e.path().filename().string()] = test::read_all(e.path().string());
    outs.push_back(files);
  }
  EXPECT_GT(outs[0].size(), 3u);
  for (auto& o : outs) {
    // index.json records the inputs; they are the same folder here.
    EXPECT_EQ(o, outs[0]);
  }
}

// Llama 3's vocabulary does not fit u16: shards are u32; invalid UTF-8 goes
// through unchanged.
TEST(Prepare, Llama3WritesU32AndKeepsInvalidUtf8) {
  const Tokenizer* tok = test::cached_tokenizer("llama3");
  ASSERT_TRUE(tok);
  test::TempDir d;
  const std::string text = "caf\xc3\xa9 \xff\xfe broken \xe4\xb8 bytes\n";
  test::write_all(d / "doc.txt", text);
  PrepareOptions o;
  o.inputs = {d / "doc.txt"};
  o.output = d / "out";
  o.val_fraction = 0;
  o.progress = false;
  const PrepareSummary s = prepare(o, *tok, nullptr);
  EXPECT_EQ(s.invalid_utf8_documents, 1u);
  const DatasetIndex index = DatasetIndex::load(o.output);
  EXPECT_EQ(index.token_bytes, 4u);
  EXPECT_EQ(index.vocab_size, 128256u);
  EXPECT_TRUE(index.val.shards.empty());
  const auto ids = read_split(o.output, Split::train);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.back(), 128001u);
  EXPECT_EQ(tok->decode(std::span(ids).first(ids.size() - 1)), text);
}

TEST(Prepare, ExistingOutputNeedsForce) {
  const Tokenizer* tok = test::cached_tokenizer("gpt2");
  ASSERT_TRUE(tok);
  Corpus c;
  PrepareOptions o = c.options(c.dir / "out");
  prepare(o, *tok, nullptr);
  const std::string msg = error_of([&] { prepare(o, *tok, nullptr); });
  EXPECT_NE(msg.find("already exists; pass --force"), std::string::npos) << msg;
  o.force = true;
  o.val_fraction = 0.5;
  prepare(o, *tok, nullptr);
  EXPECT_EQ(DatasetIndex::load(o.output).val.documents, 20u);
}

// Prepare fails before or while writing: no output folder, no temporary one.
void expect_fails_cleanly(const PrepareOptions& o, const Tokenizer* tok, const std::vector<std::string>& needles) {
  const std::string msg = error_of([&] {
    if (tok) {
      prepare(o, *tok, nullptr);
    } else {
      prepare(o, nullptr);
    }
  });
  for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << msg;
  EXPECT_FALSE(std::filesystem::exists(o.output)) << o.output;
  const auto parent = std::filesystem::path(o.output).parent_path();
  for (const auto& e : std::filesystem::directory_iterator(parent))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST(Prepare, BadInputIsAClearErrorAndLeavesNothing) {
  const Tokenizer* tok = test::cached_tokenizer("gpt2");
  ASSERT_TRUE(tok);
  test::TempDir d;
  PrepareOptions o;
  o.output = d / "out";
  o.progress = false;

  o.inputs = {d / "missing.txt"};
  expect_fails_cleanly(o, tok, {d / "missing.txt", "does not exist"});

  test::write_all(d / "empty.txt", "");
  o.inputs = {d / "empty.txt"};
  expect_fails_cleanly(o, tok, {d / "empty.txt", "is empty"});

  test::write_all(d / "blob.bin", std::string("ab\0cd", 5));
  o.inputs = {d / "blob.bin"};
  expect_fails_cleanly(o, tok, {d / "blob.bin", "looks binary"});

  std::filesystem::create_directories(d / "nothing");
  test::write_all(d / "nothing/empty.txt", "");
  test::write_all(d / "nothing/x.dat", std::string("\0", 1));
  o.inputs = {d / "nothing"};
  expect_fails_cleanly(o, tok, {d / "nothing", "has no text files"});

  test::write_all(d / "blank.txt", "  \n\n\t\n");
  o.inputs = {d / "blank.txt"};
  expect_fails_cleanly(o, tok, {"no documents"});

  // A bad line in the second of two files: the error comes after the first
  // file was tokenised and written; the temporary folder is removed.
  test::write_all(d / "1.jsonl", "{\"text\": \"fine\"}\n");
  test::write_all(d / "2.jsonl", "{\"text\": \"fine\"}\n[1, 2]\n");
  o.inputs = {d / "1.jsonl", d / "2.jsonl"};
  expect_fails_cleanly(o, tok, {d / "2.jsonl", "line 2"});

  // A tokenizer file that does not parse.
  test::write_all(d / "bad.tiktoken", "this is not base64 !!! 0\n");
  test::write_all(d / "ok.txt", "text\n");
  o.inputs = {d / "ok.txt"};
  o.tokenizer = d / "bad.tiktoken";
  expect_fails_cleanly(o, nullptr, {d / "bad.tiktoken", "line 1"});

  o.tokenizer = "gpt2";
  o.val_fraction = 1.0;
  expect_fails_cleanly(o, tok, {"--val-fraction"});
}

// The default demo data: the fortunes corpus with GPT-2, end to end, then
// read back through the loader.
TEST(Prepare, FortunesCorpusEndToEnd) {
  const Tokenizer* tok = test::cached_tokenizer("gpt2");
  ASSERT_TRUE(tok);
  ASSERT_TRUE(std::filesystem::is_directory(test::kFortunesDir))
      << test::kFortunesDir << " is missing: run `make deps` (Debian package fortunes)";
  test::TempDir d;
  PrepareOptions o;
  o.inputs = {test::kFortunesDir};
  o.output = d / "fortunes";
  o.doc_split = DocSplit::percent;
  o.val_fraction = 0.05;
  std::ostringstream log;
  const PrepareSummary s = prepare(o, *tok, &log);
  EXPECT_NE(log.str().find("MB/s"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("prepared"), std::string::npos) << log.str();
  EXPECT_GT(s.documents, 10000u);
  EXPECT_GT(s.train.tokens, 500000u);
  EXPECT_GT(s.val.tokens, 10000u);
  // Every document of the corpus is in the shards: the token count equals
  // the sum over the documents split the same way.
  uint64_t tokens = 0;
  for (const auto& doc : test::fortune_documents())
    if (doc.find_first_not_of(" \t\r\n\v\f") != std::string::npos) tokens += tok->encode(doc).size() + 1;
  EXPECT_EQ(s.train.tokens + s.val.tokens, tokens);
  DataLoader train(o.output, Split::train, 64, 1, 0, 1), val(o.output, Split::val, 64, 1, 0, 1);
  EXPECT_EQ(train.vocab_size(), 50257);
  Tensor in = Tensor::empty(Shape{4, 64}, DType::i32), tg = Tensor::empty(Shape{4, 64}, DType::i32);
  train.next_batch(in, tg);
  val.next_batch(in, tg);
  for (int64_t i = 0; i < in.numel(); ++i) ASSERT_LT(in.data<int32_t>()[i], 50257);
}

}  // namespace
}  // namespace zt::data
