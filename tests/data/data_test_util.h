// Helpers for the data tests: the JavaScript reference tokenizers (run under
// node), the fortunes corpus, adversarial strings and temporary folders.
//
// The references and the corpus are installed by `make deps`; when one is
// missing the test FAILS with a message saying so (it never skips silently).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/dataset_index.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "test_util.h"

#ifndef ZT_SOURCE_DIR
#error "ZT_SOURCE_DIR must be defined (tests/CMakeLists.txt)"
#endif

namespace zt::test {

namespace fs = std::filesystem;

inline std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_all(const std::string& path, std::string_view bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

// A fresh empty folder, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "zt_data_test_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct NodeResult {
  bool ok = false;
  std::string error;                       // why it failed (node missing, package missing, ...)
  std::vector<std::vector<uint32_t>> out;  // one list per input
};

// Runs tests/reference/tokenizer/reference_encode.mjs IMPL on `inputs`.
inline NodeResult run_reference(const std::string& impl, const std::vector<std::string>& inputs,
                                const std::string& extra_arg = "") {
  NodeResult r;
  if (std::system("command -v node >/dev/null 2>&1") != 0) {
    r.error = "node is not installed: run `make deps` (scripts/install_deps.sh)";
    return r;
  }
  TempDir tmp;
  std::string in;
  for (const std::string& s : inputs) {
    const uint32_t n = uint32_t(s.size());
    in.append(reinterpret_cast<const char*>(&n), 4);
    in += s;
  }
  write_all(tmp / "in.bin", in);
  const std::string script = std::string(ZT_SOURCE_DIR) + "/tests/reference/tokenizer/reference_encode.mjs";
  const std::string cmd = "node '" + script + "' " + impl + " '" + (tmp / "in.bin") + "' '" + (tmp / "out.bin") +
                          "' '" + data::cache_dir() + "' " + (extra_arg.empty() ? "" : "'" + extra_arg + "'") +
                          " 2>'" + (tmp / "err.txt") + "'";
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    r.error = "reference '" + impl + "' failed (exit " + std::to_string(rc) + "): " + read_all(tmp / "err.txt");
    return r;
  }
  const std::string out = read_all(tmp / "out.bin");
  size_t off = 0;
  while (off + 4 <= out.size()) {
    uint32_t n;
    std::memcpy(&n, out.data() + off, 4);
    off += 4;
    std::vector<uint32_t> v(n);
    if (off + 4 * size_t(n) > out.size()) break;
    if (n > 0) std::memcpy(v.data(), out.data() + off, 4 * size_t(n));  // (an empty vector's data() may be null)
    off += 4 * size_t(n);
    r.out.push_back(std::move(v));
  }
  const size_t expected = impl == "classes" ? 1 : inputs.size();
  if (r.out.size() != expected || off != out.size()) {
    r.error = "reference '" + impl + "' wrote a malformed output";
    return r;
  }
  r.ok = true;
  return r;
}

inline const char* kFortunesDir = "/usr/share/games/fortunes";

// The fortunes corpus as documents: every regular (non-symlink) file except
// the binary .dat indexes, split at lines holding only '%' (empty documents
// included).
inline std::vector<std::string> fortune_documents() {
  std::vector<std::string> docs;
  if (!fs::is_directory(kFortunesDir)) return docs;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kFortunesDir))
    if (e.is_regular_file() && !e.is_symlink() && e.path().extension() != ".dat") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f);
    std::string line, doc;
    while (std::getline(in, line)) {
      if (line == "%") {
        docs.push_back(doc);
        doc.clear();
      } else {
        doc += line;
        if (!in.eof()) doc += '\n';
      }
    }
    docs.push_back(doc);
  }
  return docs;
}

// Hand-picked strings that stress the pre-tokeniser and the merges.
inline std::vector<std::string> adversarial_strings() {
  std::vector<std::string> v = {
      "", " ", "  ", "\n", "\n\n\n", "   \n  \n", "hello   world", "hello\n\n\nworld", "  hello", "hello  ",
      "\t\t\tx", "\xc2\xa0\xe2\x80\x83 \xe3\x80\x80x", "a \n b", " \r\n \r\n x", "\r\r\n\n\r", "x\n \ny",
      // contractions
      "I'm you're he's we've they'll I'd don't", "I'M YOU'RE HE'S WE'VE THEY'LL I'D DON'T", "'s's's", "''''",
      "it\xe2\x80\x99s", "rock'n'roll", "'sorry", "' s", "x's 'll 'LL 'Ll", "''s", " 've", "'\n",
      // digits
      "1234567890", "3.14159", "1,000,000", "\xd9\xa3\xd9\xa4\xd9\xa5 \xd9\xa1\xd9\xa2", "\xe2\x85\xab \xc2\xbd \xc2\xb2\xc2\xb3",
      "x2y3", "123abc456", " 12 345 6789", "2024-01-15T10:30:00Z", "v1.2.3-rc4",
      // emoji and symbols
      "\xf0\x9f\xa6\x99\xf0\x9f\xa6\x99\xf0\x9f\xa6\x99", "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 family",
      "hello \xf0\x9f\x8c\x8d!", "\xf0\x9f\x98\x80\xf0\x9f\x98\x83\xf0\x9f\x98\x84", "a\xcc\x81 e\xcc\x81\xcc\x82",
      "\xef\xbb\xbfhello", "a\xc2\x85" "b", "x\xe2\x80\x8dy", "\xe2\x80\xa8line\xe2\x80\xa9para",
      // scripts
      "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88",
      "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xd0\xbc\xd0\xb8\xd1\x80",
      "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd8\xa8\xd8\xa7\xd9\x84\xd8\xb9\xd8\xa7\xd9\x84\xd9\x85",
      "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xed\x85\x8d\xec\x8a\xa4\xed\x8a\xb8", "\xce\x95\xce\xbb\xce\xbb\xce\xb7\xce\xbd\xce\xb9\xce\xba\xce\xac",
      "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80", "\xe0\xb8\xa0\xe0\xb8\xb2\xe0\xb8\xa9\xe0\xb8\xb2\xe0\xb9\x84\xe0\xb8\x97\xe0\xb8\xa2",
      "mixed English \xd0\xb8 \xd1\x80\xd1\x83\xd1\x81\xd1\x81\xd0\xba\xd0\xb8\xd0\xb9 \xe4\xb8\xad\xe6\x96\x87!",
      "\xf0\x9d\x94\x98\xf0\x9d\x94\xab\xf0\x9d\x94\xa6\xf0\x9d\x94\xa0\xf0\x9d\x94\xac\xf0\x9d\x94\xa1\xf0\x9d\x94\xa2", "\xf0\xa0\x80\x80\xf0\xa0\x80\x81",
      // special-token strings inside text
      "<|endoftext|>", "before<|endoftext|>after", "<|begin_of_text|>Hi<|end_of_text|>", "say <|eot_id|> now",
      "<|reserved_special_token_250|>", "<|endoftext|><|endoftext|>", "<|start_header_id|>user<|end_header_id|>\n\nhi",
      "<|not_a_token|>", "<|", "|>",
      // control characters
      std::string("\x00\x01\x7f", 3), "a\rb\r\nc", "\r\n\r\n", "\x0b\x0c", "over\bstrike _\bu_\bn",
      // code
      "int main() {\n    return 0;\n}\n", "    def f(x):\n\t\treturn x**2  # comment\n",
  };
  v.push_back(std::string(10000, ' '));
  v.push_back(std::string(1000, ' ') + "x");
  v.push_back(std::string(5000, 'a'));
  v.push_back(std::string(3001, '9'));
  v.push_back(std::string(3000, '!'));
  v.push_back(std::string(2000, '\n'));
  std::string ab;
  for (int i = 0; i < 3000; ++i) ab += "ab";
  v.push_back(ab);
  std::string emoji;
  for (int i = 0; i < 500; ++i) emoji += "\xf0\x9f\x98\x80";
  v.push_back(emoji);
  return v;
}

// Random valid UTF-8 strings over a pool of characters chosen to hit the
// patterns' edge cases (spaces of several kinds, CR/LF, apostrophes and
// contraction letters, digits of several scripts, letters, emoji, symbols).
inline std::vector<std::string> random_strings(std::mt19937_64& rng, int count, int max_chars) {
  static const std::vector<std::string> pool = {
      " ", " ", " ", "\n", "\r", "\t", "'", "'", "s", "S", "t", "re", "VE", "m", "l", "L", "d", "a", "z", "Q",
      "0", "7", "9", "\xd9\xa3", "\xc2\xbd", "\xe2\x85\xab", "\xc2\xa0", "\xe3\x80\x80", "\xef\xbb\xbf", "\xc2\x85",
      "\xc3\xa9", "\xe4\xb8\xad", "\xd0\x96", "\xf0\x9f\x98\x80", "\xf0\x9d\x94\x98", "!", ".", ",", "-", "_", "(",
      "\"", "<|", "|>", "\xe2\x80\x99", "\xcc\x81", "\x0b", "\x1f", "#", "$"};
  std::uniform_int_distribution<int> len(0, max_chars), pick(0, int(pool.size()) - 1);
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    std::string s;
    const int n = len(rng);
    for (int k = 0; k < n; ++k) s += pool[size_t(pick(rng))];
    out.push_back(std::move(s));
  }
  return out;
}

// Appends code point cp (not a surrogate, at most 0x10FFFF) to s as UTF-8:
// the tests' own encoder, independent of src/data/unicode.h.
inline void append_utf8(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
}

// Random valid UTF-8 strings of code points drawn from many scripts and
// symbol blocks (Latin, Greek, Cyrillic, Hebrew, Arabic, Devanagari, Thai,
// Hangul, CJK, kana, full-width forms, emoji, mathematical letters), with
// plenty of ASCII, spaces, apostrophes and digits between them.
inline std::vector<std::string> random_multiscript_strings(std::mt19937_64& rng, int count, int max_chars) {
  static const std::vector<std::pair<uint32_t, uint32_t>> blocks = {
      {0x20, 0x7e},     {0x20, 0x7e},     {0x20, 0x7e},     {0xa0, 0x17f},    {0x370, 0x3ff},   {0x400, 0x4ff},
      {0x590, 0x6ff},   {0x900, 0x97f},   {0xe00, 0xe7f},   {0x1100, 0x11ff}, {0x2000, 0x206f}, {0x2100, 0x218f},
      {0x3000, 0x30ff}, {0x4e00, 0x4fff}, {0xac00, 0xad00}, {0xff00, 0xffef}, {0x1f300, 0x1f6ff},
      {0x1d400, 0x1d4ff}, {0x9, 0xd},     {0x20, 0x20},     {0x20, 0x20},     {0x27, 0x27},     {0x30, 0x39}};
  std::uniform_int_distribution<int> len(0, max_chars);
  std::uniform_int_distribution<size_t> pick(0, blocks.size() - 1);
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    std::string s;
    for (int k = len(rng); k > 0; --k) {
      const auto [lo, hi] = blocks[pick(rng)];
      const uint32_t cp = lo + uint32_t(rng() % (hi - lo + 1));
      append_utf8(s, cp);
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The tokenizers, loaded once per test process. The test FAILS (with the
// loader's message) if the vocabulary files are missing.
inline const data::Tokenizer* cached_tokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<data::Tokenizer>> cache;
  static std::map<std::string, std::string> errors;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(name); it != cache.end()) return it->second.get();
  if (errors.count(name) == 0) {
    try {
      cache[name] = data::load_tokenizer(name);
      return cache[name].get();
    } catch (const std::exception& e) {
      errors[name] = e.what();
    }
  }
  ADD_FAILURE() << "cannot load tokenizer '" << name << "': " << errors[name];
  return nullptr;
}

// Writes a dataset folder directly (shards of `shard_tokens` tokens per split
// + index.json), as prepare would, from given token streams.
inline void write_dataset(const std::string& dir, const std::vector<uint32_t>& train,
                          const std::vector<uint32_t>& val, uint64_t vocab, uint64_t shard_tokens) {
  fs::create_directories(dir);
  data::DatasetIndex index;
  index.tokenizer_name = "test";
  index.tokenizer_fingerprint = "0123456789abcdef";
  index.vocab_size = vocab;
  index.eot_token = 0;
  index.token_bytes = data::token_bytes_for_vocab(vocab);
  for (data::Split split : {data::Split::train, data::Split::val}) {
    const auto& tokens = split == data::Split::train ? train : val;
    data::SplitInfo& info = index.split(split);
    for (uint64_t first = 0, k = 0; first < tokens.size(); first += shard_tokens, ++k) {
      const uint64_t n = std::min<uint64_t>(shard_tokens, tokens.size() - first);
      const std::string name = std::string(data::split_name(split)) + "-" + std::to_string(k) + ".bin";
      data::ShardWriter w(dir + "/" + name, index.token_bytes, uint32_t(vocab));
      w.append(tokens.data() + first, n);
      const data::ShardHeader h = w.finish();
      info.shards.push_back({name, h.token_count, 0, h.checksum});
      info.tokens += n;
    }
  }
  std::ofstream(dir + "/index.json") << index.to_json().dump(2);
}

}  // namespace zt::test
