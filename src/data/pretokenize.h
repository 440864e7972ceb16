// Pre-tokenisation: splitting text into the pieces that BPE merges within.
//
// Each pattern is a hand-written matcher that returns exactly what the
// regular expression returns when scanned left to right (JavaScript
// String.matchAll with the `u` flag), without a regex engine:
//
// GPT-2 (also tiktoken's r50k/p50k):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Llama 3 (Meta's tokenizer.model pattern; tiktoken/fancy-regex syntax):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// The alternatives are tried in order at each position; the first that
// matches wins, with the greedy/backtracking outcome worked out by hand:
//   `\s+(?!\S)` on a white-space run [i, j) followed by a non-space gives
//   [i, start of the run's last character) if the run has two or more
//   characters, so that the last one can prefix the next word;
//   `\s*[\r\n]+` gives [i, last CR/LF in the run + 1).
// The case-insensitive contractions of Llama 3 fold ASCII only ('S, 'RE...),
// as the JavaScript reference does. Classes come from data/unicode.h; an
// invalid UTF-8 byte is one character of class "other".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace zt::data {

enum class Pattern : uint8_t { gpt2, llama3 };

// The end of the piece that starts at byte `pos` (pos < n); always > pos.
size_t next_piece(Pattern p, const char* text, size_t n, size_t pos);

// All pieces of a text, in order (their concatenation is the text).
std::vector<std::string_view> pretokenize(Pattern p, std::string_view text);

// True if every pattern is guaranteed to end a piece at byte `pos` whatever
// came before (an ASCII letter followed by a space, or a line feed followed
// by an ASCII letter): text can be cut there and the halves encoded apart.
inline bool is_piece_boundary(const char* text, size_t n, size_t pos) {
  if (pos == 0 || pos >= n) return pos == 0 || pos == n;
  const unsigned char a = static_cast<unsigned char>(text[pos - 1]), b = static_cast<unsigned char>(text[pos]);
  const auto ascii_letter = [](unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; };
  return (ascii_letter(a) && b == ' ') || (a == '\n' && ascii_letter(b));
}

}  // namespace zt::data
