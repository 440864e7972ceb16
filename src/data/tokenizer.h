// Byte-level BPE tokenizers: GPT-2 and Llama 3.
//
// One implementation, two vocabulary formats:
//   - GPT-2's files (encoder.json: token string -> id, in GPT-2's
//     bytes-to-printable-characters alphabet; vocab.bpe: the merges in rank
//     order), with GPT-2's pre-tokenisation pattern and its one special token
//     <|endoftext|>. Output is identical to OpenAI's encoder (and to the
//     gpt-3-encoder npm package, which the tests compare against).
//   - tiktoken rank files (each line "base64(token bytes) rank", rank = id),
//     with Llama 3's pattern and its 256 special tokens (<|begin_of_text|>,
//     <|end_of_text|>, ..., ids from 128000). Like tiktoken, a piece that is
//     itself a token is emitted whole before any merging.
// See data/pretokenize.h for the patterns and data/bpe.h for the merge loop.
//
// Text is bytes. encode() never fails and never alters text: valid UTF-8 is
// split as the reference tokenizers split it; each byte of an invalid UTF-8
// sequence is treated as one "other" character (neither letter, number nor
// space) and still encoded, so decode(encode(x)) == x for every byte string.
// decode() concatenates token bytes, which for a slice of a sequence may end
// inside a multi-byte character.
//
// Special tokens: encode() treats text like "<|endoftext|>" as ordinary text
// (a document cannot forge a boundary); encode_with_special() maps the
// tokenizer's special-token strings to their ids.
//
// Speed: a per-thread cache of recently seen pieces, merges by a scan or a
// heap (data/bpe.h), and encode_parallel() cuts long text at positions where
// the pattern is known to end a piece and encodes the parts on several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/bpe.h"
#include "data/pretokenize.h"

namespace zt::data {

struct SpecialToken {
  std::string text;  // "<|endoftext|>"
  uint32_t id;
};

class Tokenizer {
 public:
  virtual ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // GPT-2 format: encoder.json + vocab.bpe. Throws zt::Error naming the file
  // and line/entry that does not parse.
  static std::unique_ptr<Tokenizer> from_gpt2_files(const std::string& encoder_json_path,
                                                    const std::string& vocab_bpe_path, const std::string& name);
  // tiktoken rank file with the Llama 3 pattern and special tokens (ids from
  // the number of ranks on). Throws zt::Error naming the file and line.
  static std::unique_ptr<Tokenizer> from_tiktoken_file(const std::string& path, const std::string& name);

  // Ordinary text -> token ids (special-token strings are plain text).
  std::vector<uint32_t> encode(std::string_view text) const;
  // Appends to `out` (no allocation once warm).
  void encode_append(std::string_view text, std::vector<uint32_t>& out) const;
  // Like encode(), but the tokenizer's special-token strings become their ids.
  std::vector<uint32_t> encode_with_special(std::string_view text) const;
  // Same ids as encode(text), computed on up to `threads` threads.
  std::vector<uint32_t> encode_parallel(std::string_view text, int threads) const;

  // Token ids -> bytes. Throws zt::Error for an id >= vocab_size().
  std::string decode(std::span<const uint32_t> ids) const;
  // The bytes of one token (a special token's text for a special token).
  std::string_view token_bytes(uint32_t id) const;

  size_t vocab_size() const;  // mergeable + special tokens (GPT-2 50257, Llama 3 128256)
  uint32_t eot_token() const;  // <|endoftext|> (GPT-2), <|end_of_text|> (Llama 3)
  std::string name() const;    // "gpt2", "llama3", or the path it was loaded from
  Pattern pattern() const;
  const std::vector<SpecialToken>& special_tokens() const;
  std::optional<uint32_t> special_token_id(std::string_view text) const;
  // 16 hex digits identifying the vocabulary, merges, pattern and special
  // tokens: two tokenizers with the same fingerprint encode identically.
  std::string fingerprint() const;

  // Internal, for tests: the merge table and the token of each byte.
  const detail::PairTable& merge_table() const;
  uint32_t byte_token(uint8_t b) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// "gpt2" or "llama3" (files in the cache; see cache_dir()), or a path:
//   a directory holding encoder.json + vocab.bpe      -> GPT-2 format
//   a directory holding tokenizer.model or *.tiktoken -> tiktoken ranks, Llama 3 pattern
//   a file                                            -> tiktoken ranks, Llama 3 pattern
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& name_or_path);

// Where scripts/fetch_vocab.sh puts the vocabularies and reference packages:
// $ZT_CACHE_DIR, else $XDG_CACHE_HOME/zettatron, else $HOME/.cache/zettatron.
std::string cache_dir();

}  // namespace zt::data
