// Pre-tokenisation (data/pretokenize.h): hand-worked cases, and piece
// boundaries identical to the reference packages' JavaScript regexes on the
// fortunes corpus, adversarial strings and random strings.
#include <cstdint>
#include <gtest/gtest.h>

#include "data/pretokenize.h"
#include "data_test_util.h"

namespace zt::data {
namespace {

using Pieces = std::vector<std::string>;

Pieces pieces(Pattern p, std::string_view s) {
  Pieces out;
  for (auto v : pretokenize(p, s)) out.emplace_back(v);
  return out;
}

TEST(Pretokenize, Gpt2HandCases) {
  const Pattern g = Pattern::gpt2;
  EXPECT_EQ(pieces(g, "Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces(g, "  hello"), (Pieces{" ", " hello"}));
  EXPECT_EQ(pieces(g, "hello\n\nworld"), (Pieces{"hello", "\n", "\n", "world"}));
  EXPECT_EQ(pieces(g, "I'm don't"), (Pieces{"I", "'m", " don", "'t"}));
  EXPECT_EQ(pieces(g, "I'M"), (Pieces{"I", "'", "M"}));  // case-sensitive
  EXPECT_EQ(pieces(g, "we'll they've"), (Pieces{"we", "'ll", " they", "'ve"}));
  EXPECT_EQ(pieces(g, "123abc 45"), (Pieces{"123", "abc", " 45"}));
  EXPECT_EQ(pieces(g, "a  b"), (Pieces{"a", " ", " b"}));
  EXPECT_EQ(pieces(g, "x!!! y"), (Pieces{"x", "!!!", " y"}));
  EXPECT_EQ(pieces(g, "end  "), (Pieces{"end", "  "}));
  EXPECT_EQ(pieces(g, " 's"), (Pieces{" '", "s"}));
  EXPECT_EQ(pieces(g, "\t\tx"), (Pieces{"\t", "\t", "x"}));
  EXPECT_EQ(pieces(g, " \n x"), (Pieces{" \n", " x"}));
  EXPECT_EQ(pieces(g, ""), (Pieces{}));
}

TEST(Pretokenize, Llama3HandCases) {
  const Pattern l = Pattern::llama3;
  EXPECT_EQ(pieces(l, "Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces(l, "12345"), (Pieces{"123", "45"}));
  EXPECT_EQ(pieces(l, " 12"), (Pieces{" ", "12"}));
  EXPECT_EQ(pieces(l, "'Sorry"), (Pieces{"'S", "orry"}));
  EXPECT_EQ(pieces(l, "I'M"), (Pieces{"I", "'M"}));  // case-insensitive
  EXPECT_EQ(pieces(l, "(hello)"), (Pieces{"(hello", ")"}));
  EXPECT_EQ(pieces(l, "a\n\nb"), (Pieces{"a", "\n\n", "b"}));
  EXPECT_EQ(pieces(l, "  \n  x"), (Pieces{"  \n", " ", " x"}));
  EXPECT_EQ(pieces(l, "hi!\n\nthere"), (Pieces{"hi", "!\n\n", "there"}));
  EXPECT_EQ(pieces(l, "\thello"), (Pieces{"\thello"}));
  EXPECT_EQ(pieces(l, " !?"), (Pieces{" !?"}));
  EXPECT_EQ(pieces(l, "x  "), (Pieces{"x", "  "}));
  EXPECT_EQ(pieces(l, "\r\nx"), (Pieces{"\r\n", "x"}));
}

// An invalid byte is one "other" character; nothing is dropped or changed.
TEST(Pretokenize, InvalidUtf8) {
  EXPECT_EQ(pieces(Pattern::gpt2, "a\xff" "b"), (Pieces{"a", "\xff", "b"}));
  EXPECT_EQ(pieces(Pattern::llama3, "a\xff" "b"), (Pieces{"a", "\xff" "b"}));
  EXPECT_EQ(pieces(Pattern::gpt2, " \xe4\xb8"), (Pieces{" \xe4\xb8"}));
  EXPECT_EQ(pieces(Pattern::gpt2, "\xe4\xb8\xad\xe4\xb8"), (Pieces{"\xe4\xb8\xad", "\xe4\xb8"}));
}

// Compares piece byte lengths with the JavaScript regex of the reference package.
void expect_same_pieces(Pattern p, const std::string& impl, const std::vector<std::string>& texts) {
  const test::NodeResult r = test::run_reference(impl, texts);
  ASSERT_TRUE(r.ok) << r.error;
  int bad = 0;
  for (size_t i = 0; i < texts.size() && bad < 5; ++i) {
    std::vector<uint32_t> mine;
    for (auto v : pretokenize(p, texts[i])) mine.push_back(uint32_t(v.size()));
    if (mine != r.out[i]) {
      ++bad;
      ADD_FAILURE() << impl << ": pieces differ for text #" << i << " " << testing::PrintToString(texts[i])
                    << "\n mine: " << testing::PrintToString(mine) << "\n node: " << testing::PrintToString(r.out[i]);
    }
  }
}

// Adversarial strings, random ASCII-heavy and multi-script strings, and the
// fortunes corpus, split by `pattern` and by JavaScript's regex.
void expect_same_pieces_on_every_kind_of_text(Pattern pattern, const char* js_mode, uint64_t seed) {
  auto rng = test::make_rng(seed);
  std::vector<std::string> texts = test::adversarial_strings();
  for (auto& s : test::random_strings(rng, 3000, 40)) texts.push_back(std::move(s));
  for (auto& s : test::random_multiscript_strings(rng, 3000, 30)) texts.push_back(std::move(s));
  const auto docs = test::fortune_documents();
  ASSERT_GT(docs.size(), 1000u) << "the fortunes corpus is missing (" << test::kFortunesDir << "): run `make deps`";
  texts.insert(texts.end(), docs.begin(), docs.end());
  expect_same_pieces(pattern, js_mode, texts);
}

TEST(Pretokenize, Gpt2MatchesJavaScriptRegex) {
  ZT_TEST_TRACE_SEED();
  expect_same_pieces_on_every_kind_of_text(Pattern::gpt2, "pieces-gpt2", 1);
}

TEST(Pretokenize, Llama3MatchesJavaScriptRegex) {
  ZT_TEST_TRACE_SEED();
  expect_same_pieces_on_every_kind_of_text(Pattern::llama3, "pieces-llama3", 2);
}

// Wherever is_piece_boundary() says so, both patterns end a piece there,
// whatever precedes it.
TEST(Pretokenize, SafeBoundariesAreBoundaries) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(3);
  auto texts = test::random_strings(rng, 2000, 60);
  for (auto& s : test::adversarial_strings()) texts.push_back(s);
  int64_t checked = 0;
  for (Pattern p : {Pattern::gpt2, Pattern::llama3}) {
    for (const std::string& t : texts) {
      std::vector<uint8_t> ends(t.size() + 1, 0);
      size_t pos = 0;
      ends[0] = 1;
      for (auto v : pretokenize(p, t)) {
        pos += v.size();
        ends[pos] = 1;
      }
      ASSERT_EQ(pos, t.size());
      for (size_t i = 0; i <= t.size(); ++i) {
        if (is_piece_boundary(t.data(), t.size(), i)) {
          ++checked;
          EXPECT_TRUE(ends[i]) << testing::PrintToString(t) << " at " << i;
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

}  // namespace
}  // namespace zt::data
