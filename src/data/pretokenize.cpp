#include "data/pretokenize.h"

#include "core/error.h"
#include "data/unicode.h"

namespace zt::data {
namespace {

struct Text {
  const unsigned char* s;
  size_t n;

  Utf8Char at(size_t i) const { return decode_utf8(s + i, n - i); }

  // End of the run of characters of class `cls` starting at i.
  size_t run(size_t i, CharClass cls) const {
    while (i < n) {
      if (s[i] < 0x80) {
        if (detail::kAsciiClass[s[i]] != cls) break;
        ++i;
        continue;
      }
      const Utf8Char c = decode_utf8(s + i, n - i);
      if (c.cls != cls) break;
      i += c.len;
    }
    return i;
  }
};

inline unsigned char lower(unsigned char c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

// Contractions 's 't 're 've 'm 'll 'd at i (s[i] == '\''); 0 if none.
inline size_t contraction(const Text& t, size_t i, bool fold) {
  if (i + 1 >= t.n) return 0;
  const unsigned char a = fold ? lower(t.s[i + 1]) : t.s[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if (i + 2 >= t.n) return 0;
  const unsigned char b = fold ? lower(t.s[i + 2]) : t.s[i + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return 0;
}

size_t gpt2_next(const Text& t, size_t i) {
  const Utf8Char c = t.at(i);
  if (c.cp == '\'') {
    if (size_t e = contraction(t, i, false)) return e;
  }
  if (c.cp == ' ' && i + 1 < t.n) {  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+"
    const Utf8Char d = t.at(i + 1);
    if (d.cls != kSpace) return t.run(i + 1 + d.len, d.cls);
  }
  if (c.cls != kSpace) return t.run(i + c.len, c.cls);
  // White space: "\s+(?!\S)" then "\s+".
  size_t j = i, last = i;
  while (j < t.n) {
    const Utf8Char d = t.at(j);
    if (d.cls != kSpace) break;
    last = j;
    j += d.len;
  }
  if (j == t.n || last == i) return j;
  return last;
}

size_t llama3_next(const Text& t, size_t i) {
  const Utf8Char c = t.at(i);
  if (c.cp == '\'') {
    if (size_t e = contraction(t, i, true)) return e;
  }
  // "[^\r\n\p{L}\p{N}]?\p{L}+"
  if (c.cls == kLetter) return t.run(i + c.len, kLetter);
  if (c.cls != kNumber && c.cp != '\r' && c.cp != '\n' && i + c.len < t.n) {
    const Utf8Char d = t.at(i + c.len);
    if (d.cls == kLetter) return t.run(i + c.len + d.len, kLetter);
  }
  // "\p{N}{1,3}"
  if (c.cls == kNumber) {
    size_t j = i + c.len;
    for (int k = 0; k < 2 && j < t.n; ++k) {
      const Utf8Char d = t.at(j);
      if (d.cls != kNumber) break;
      j += d.len;
    }
    return j;
  }
  // " ?[^\s\p{L}\p{N}]+[\r\n]*"
  size_t o = size_t(-1);
  if (c.cls == kOther) {
    o = i;
  } else if (c.cp == ' ' && i + 1 < t.n && t.at(i + 1).cls == kOther) {
    o = i + 1;
  }
  if (o != size_t(-1)) {
    size_t j = t.run(o, kOther);
    while (j < t.n && (t.s[j] == '\r' || t.s[j] == '\n')) ++j;
    return j;
  }
  // White space: "\s*[\r\n]+", then "\s+(?!\S)", then "\s+".
  size_t j = i, last = i, after_crlf = 0;
  while (j < t.n) {
    const Utf8Char d = t.at(j);
    if (d.cls != kSpace) break;
    last = j;
    j += d.len;
    if (d.cp == '\r' || d.cp == '\n') after_crlf = j;
  }
  if (after_crlf) return after_crlf;
  if (j == t.n || last == i) return j;
  return last;
}

}  // namespace

size_t next_piece(Pattern p, const char* text, size_t n, size_t pos) {
  ZT_ASSERT(pos < n);
  const Text t{reinterpret_cast<const unsigned char*>(text), n};
  return p == Pattern::gpt2 ? gpt2_next(t, pos) : llama3_next(t, pos);
}

std::vector<std::string_view> pretokenize(Pattern p, std::string_view text) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = next_piece(p, text.data(), text.size(), pos);
    out.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

}  // namespace zt::data
