// Hashes: a fast byte hash for hash tables and
// fingerprints, and a streaming 64-bit checksum for token shards and
// checkpoint files.
//
// Checksum64 ("zt64"): four 64-bit lanes, each absorbing every fourth
// little-endian 8-byte word of the data as  lane = rotl(lane ^ w * K1, 27) * K2;
// the lanes, the trailing (< 32) bytes and the length are folded with a
// splitmix64 finaliser. It detects corruption (bit flips, truncation,
// reordered blocks); it is not a cryptographic hash. Feeding the data in any
// split gives the same value as one call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace zt {

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

inline uint64_t load_le64(const void* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return w;  // the project targets little-endian machines
}

// A fast hash of a short byte string (hash tables, fingerprints).
inline uint64_t hash_bytes(const void* data, size_t n, uint64_t seed = 0) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed ^ (uint64_t(n) * 0x9e3779b97f4a7c15ull);
  while (n >= 8) {
    h = (h ^ load_le64(p)) * 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0xd6e8feb86659fd93ull;
  }
  return mix64(h);
}

class Checksum64 {
 public:
  Checksum64();
  void update(const void* data, size_t n);
  uint64_t digest() const;

 private:
  uint64_t lane_[4];
  unsigned char buf_[32];
  size_t buffered_ = 0;
  uint64_t total_ = 0;
};

// One-shot Checksum64.
uint64_t checksum64(const void* data, size_t n);

// "0123456789abcdef" (16 lowercase hex digits).
std::string hex64(uint64_t v);
// n bytes as 2 n lowercase hex digits, first byte first.
std::string hex_bytes(const void* data, size_t n);
// The inverse of hex64; throws zt::Error naming `where` for anything else.
uint64_t parse_hex64(const std::string& s, const std::string& where);

}  // namespace zt
