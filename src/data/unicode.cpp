#include "data/unicode.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>

namespace zt::data {
namespace {

struct Run {
  uint32_t first;
  uint8_t cls;
};

constexpr Run kRuns[] = {
#include "data/unicode_classes.inc"
};
static_assert(sizeof(kRuns) / sizeof(kRuns[0]) == ZT_UNICODE_RUNS);

CharClass lookup_runs(uint32_t cp) {
  // The last run starting at or before cp.
  const Run* it = std::upper_bound(std::begin(kRuns), std::end(kRuns), cp,
                                   [](uint32_t c, const Run& r) { return c < r.first; });
  return CharClass((it - 1)->cls);
}

// The Basic Multilingual Plane, 2 bits per code point (16 KiB), built once
// from the runs: nearly all text is here, and a table read beats a search.
struct BmpTable {
  std::array<uint8_t, 0x10000 / 4> bits{};
  BmpTable() {
    for (uint32_t cp = 0; cp < 0x10000; ++cp) bits[cp >> 2] |= uint8_t(lookup_runs(cp) << ((cp & 3) * 2));
  }
  CharClass get(uint32_t cp) const { return CharClass((bits[cp >> 2] >> ((cp & 3) * 2)) & 3); }
};

const BmpTable& bmp() {
  static const BmpTable table;
  return table;
}

}  // namespace

namespace detail {

constinit const std::array<uint8_t, 128> kAsciiClass = [] {
  std::array<uint8_t, 128> t{};
  size_t r = 0;
  for (uint32_t cp = 0; cp < 128; ++cp) {
    while (r + 1 < std::size(kRuns) && kRuns[r + 1].first <= cp) ++r;
    t[cp] = kRuns[r].cls;
  }
  return t;
}();

}  // namespace detail

CharClass char_class(uint32_t cp) {
  if (cp < 0x10000) return bmp().get(cp);
  if (cp > 0x10FFFF) return kOther;
  return lookup_runs(cp);
}

const char* unicode_version() { return ZT_UNICODE_VERSION; }

namespace detail {

Utf8Char decode_non_ascii(const unsigned char* s, size_t n) {
  const Utf8Char invalid{s[0], 1, kOther};
  const unsigned char b0 = s[0];
  uint32_t cp;
  uint8_t len;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    cp = b0 & 0x0F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    cp = b0 & 0x07;
  } else {
    return invalid;  // continuation byte, C0/C1 (overlong 2-byte) or F5..FF
  }
  if (n < len) return invalid;
  for (uint8_t i = 1; i < len; ++i) {
    if ((s[i] & 0xC0) != 0x80) return invalid;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return invalid;  // overlong
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return invalid;
  return Utf8Char{cp, len, char_class(cp)};
}

}  // namespace detail

bool is_valid_utf8(const char* s, size_t n) {
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) {  // eight ASCII bytes at a time
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const Utf8Char c = detail::decode_non_ascii(p + i, n - i);
    if (c.len == 1) return false;
    i += c.len;
  }
  return true;
}

}  // namespace zt::data
