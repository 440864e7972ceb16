#include "core/hash.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "core/error.h"

namespace zt {
namespace {

constexpr uint64_t kK1 = 0x87c37b91114253d5ull;
constexpr uint64_t kK2 = 0x4cf5ad432745937full;

inline uint64_t absorb(uint64_t lane, uint64_t w) { return std::rotl(lane ^ (w * kK1), 27) * kK2; }

}  // namespace

Checksum64::Checksum64()
    : lane_{0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull} {}

void Checksum64::update(const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (buffered_) {
    const size_t take = std::min(n, 32 - buffered_);
    std::memcpy(buf_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < 32) return;
    for (int l = 0; l < 4; ++l) lane_[l] = absorb(lane_[l], load_le64(buf_ + 8 * l));
    buffered_ = 0;
  }
  uint64_t a = lane_[0], b = lane_[1], c = lane_[2], d = lane_[3];
  while (n >= 32) {
    a = absorb(a, load_le64(p));
    b = absorb(b, load_le64(p + 8));
    c = absorb(c, load_le64(p + 16));
    d = absorb(d, load_le64(p + 24));
    p += 32;
    n -= 32;
  }
  lane_[0] = a;
  lane_[1] = b;
  lane_[2] = c;
  lane_[3] = d;
  std::memcpy(buf_, p, n);
  buffered_ = n;
}

uint64_t Checksum64::digest() const {
  uint64_t h = total_ * 0x9e3779b97f4a7c15ull;
  for (int l = 0; l < 4; ++l) h = mix64(h ^ lane_[l]) + uint64_t(l);
  size_t i = 0;
  for (; i + 8 <= buffered_; i += 8) h = mix64(h ^ load_le64(buf_ + i));
  if (i < buffered_) {
    uint64_t w = 0;
    std::memcpy(&w, buf_ + i, buffered_ - i);
    h = mix64(h ^ w ^ 0xff);
  }
  return mix64(h);
}

uint64_t checksum64(const void* data, size_t n) {
  Checksum64 c;
  c.update(data, n);
  return c.digest();
}

std::string hex64(uint64_t v) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[size_t(i)] = kDigits[v & 15];
  return s;
}

std::string hex_bytes(const void* data, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(2 * n, '0');
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) s[2 * i] = kDigits[p[i] >> 4], s[2 * i + 1] = kDigits[p[i] & 15];
  return s;
}

uint64_t parse_hex64(const std::string& s, const std::string& where) {
  ZT_CHECK(s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos, where,
           ": checksum \"", s, "\" is not 16 lowercase hex digits");
  return std::stoull(s, nullptr, 16);
}

}  // namespace zt
