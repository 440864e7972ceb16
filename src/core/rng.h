// Counter-based RNG: Philox4x32-10 (Salmon et al., SC'11).
//
// A draw is a pure function of (seed, offset, element index), so the CPU and
// CUDA backends produce the same numbers for the same arguments, and any
// rank can reproduce any slice of a stream without generating the prefix.
//
// Stream layout: element i of a draw at `offset` comes from the Philox block
// with counter (lo32(offset + i/4), hi32(offset + i/4), 0, 0) and key
// (lo32(seed), hi32(seed)), word i % 4. A draw of n elements consumes
// ceil(n / 4) counter values; Generator advances its offset by that much.
//
// Uniform: (word >> 8) * 2^-24, in [0, 1).
// Normal: Box-Muller on word pairs (0,1) and (2,3) of the block, computed in
// double: words (a, b) give r = sqrt(-2 ln u1), u1 = (a + 1) * 2^-32 in
// (0, 1], and the two normals r cos(2 pi u2), r sin(2 pi u2), u2 = b * 2^-32.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define ZT_HOST_DEVICE __host__ __device__
#else
#define ZT_HOST_DEVICE
#endif

namespace zt {

struct PhiloxBlock {
  uint32_t w[4];
};

ZT_HOST_DEVICE inline PhiloxBlock philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                                                uint32_t k1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  // Fully unrolled, so that host loops over blocks vectorise (philox_words;
  // nvcc unrolls a constant trip count on its own and does not know the GCC form).
#if !defined(__CUDACC__)
#pragma GCC unroll 10
#endif
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t(kMul0) * c0;
    const uint64_t p1 = uint64_t(kMul1) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1);
    c3 = uint32_t(p0);
    c0 = n0;
    c2 = n2;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return PhiloxBlock{{c0, c1, c2, c3}};
}

ZT_HOST_DEVICE inline PhiloxBlock philox_block_at(uint64_t seed, uint64_t counter) {
  return philox4x32_10(uint32_t(counter), uint32_t(counter >> 32), 0u, 0u, uint32_t(seed), uint32_t(seed >> 32));
}

ZT_HOST_DEVICE inline float philox_uniform(uint32_t word) { return float(word >> 8) * 0x1p-24f; }

// The two normals of the word pair (a, b).
ZT_HOST_DEVICE inline void philox_box_muller(uint32_t a, uint32_t b, float* n0, float* n1) {
  const double u1 = (double(a) + 1.0) * 0x1p-32;
  const double u2 = double(b) * 0x1p-32;
  const double r = sqrt(-2.0 * log(u1));
  const double angle = 6.283185307179586476925286766559 * u2;
  *n0 = float(r * cos(angle));
  *n1 = float(r * sin(angle));
}

// Element i of a draw (see the layout above).
ZT_HOST_DEVICE inline float philox_uniform_at(uint64_t seed, uint64_t offset, uint64_t i) {
  const PhiloxBlock b = philox_block_at(seed, offset + i / 4);
  return philox_uniform(b.w[i % 4]);
}
ZT_HOST_DEVICE inline float philox_normal_at(uint64_t seed, uint64_t offset, uint64_t i) {
  const PhiloxBlock b = philox_block_at(seed, offset + i / 4);
  float n[4];
  philox_box_muller(b.w[0], b.w[1], &n[0], &n[1]);
  philox_box_muller(b.w[2], b.w[3], &n[2], &n[3]);
  return n[i % 4];
}

// --- stochastic rounding ---------------------------------------------------------
// 32 random bits for element i of stream `stream` under `seed`: word i % 4 of
// the Philox block with counter (i / 4, stream). A pure function of (seed,
// stream, i), so results do not depend on how elements are split into calls,
// threads or GPU blocks.
ZT_HOST_DEVICE inline uint32_t philox_word_at(uint64_t seed, uint64_t stream, uint64_t i) {
  const PhiloxBlock b = philox4x32_10(uint32_t(i / 4), uint32_t((i / 4) >> 32), uint32_t(stream),
                                      uint32_t(stream >> 32), uint32_t(seed), uint32_t(seed >> 32));
  return b.w[i % 4];
}

// The bf16 bits of f rounded stochastically with the low 16 bits of `random`:
// to the bf16 neighbour above in magnitude with probability (dropped bits) /
// 2^16, else truncated, so E[result] = f for finite f (up to the 2^-16
// granularity of the probability). bf16 values stay exact; NaN -> quiet NaN
// as float_to_bf16 gives; infinities stay; a finite f beyond the largest
// bf16 rounds to infinity with the probability it lies beyond.
ZT_HOST_DEVICE inline uint16_t float_to_bf16_bits_stochastic(float f, uint32_t random) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  return uint16_t((u + (random & 0xffffu)) >> 16);  // a carry out of the dropped bits rounds up
}

// out[k] = philox_word_at(seed, stream, first + k) for k < n (host code):
// one Philox block per 4 words, in a loop over blocks that GCC vectorises
// (not under `omp simd`, which keeps the returned block in memory).
inline void philox_words(uint64_t seed, uint64_t stream, uint64_t first, int64_t n, uint32_t* out) {
  if (n <= 0) return;
  const uint64_t b0 = first / 4, b1 = (first + uint64_t(n) + 3) / 4;
  const int64_t skip = int64_t(first % 4);
  constexpr int64_t kChunk = 64;  // blocks per staging buffer
  uint32_t words[4][kChunk];  // word w of block c + j: words[w][j] (contiguous stores: the loop vectorises)
  for (uint64_t c = b0; c < b1; c += kChunk) {
    const int64_t blocks = int64_t(b1 - c < uint64_t(kChunk) ? b1 - c : uint64_t(kChunk));
    for (int64_t j = 0; j < blocks; ++j) {
      const uint64_t b = c + uint64_t(j);
      const PhiloxBlock blk = philox4x32_10(uint32_t(b), uint32_t(b >> 32), uint32_t(stream), uint32_t(stream >> 32),
                                            uint32_t(seed), uint32_t(seed >> 32));
      for (int w = 0; w < 4; ++w) words[w][j] = blk.w[w];
    }
    // Element 4 (c + j) + w is out[base + 4 j + w], kept when in [0, n).
    const int64_t base = int64_t(4 * (c - b0)) - skip;
    for (int64_t j = 0; j < blocks; ++j)
      for (int w = 0; w < 4; ++w)
        if (const int64_t k = base + 4 * j + w; k >= 0 && k < n) out[k] = words[w][j];
  }
}

// Element i of a stochastically rounded stream: f rounded with word i of
// (seed, stream). AdamW's bf16 copy uses it with stream = step and i = the
// element's offset in its parameter set (ops/adamw.h).
ZT_HOST_DEVICE inline uint16_t bf16_bits_stochastic_at(float f, uint64_t seed, uint64_t stream, uint64_t i) {
  return float_to_bf16_bits_stochastic(f, philox_word_at(seed, stream, i));
}

// out[k] = bf16_bits_stochastic_at(in[k], seed, stream, first + k) for k < n
// (host code; the words drawn by philox_words).
inline void bf16_bits_stochastic(const float* in, uint16_t* out, int64_t n, uint64_t seed, uint64_t stream,
                                 uint64_t first) {
  constexpr int64_t kChunk = 512;
  uint32_t words[kChunk];
  for (int64_t k0 = 0; k0 < n; k0 += kChunk) {
    const int64_t len = n - k0 < kChunk ? n - k0 : kChunk;
    philox_words(seed, stream, first + uint64_t(k0), len, words);
    for (int64_t k = 0; k < len; ++k) out[k0 + k] = float_to_bf16_bits_stochastic(in[k0 + k], words[k]);
  }
}

// Host fills of float buffers (threaded). out[i] = the i-th element of the draw.
void philox_fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi);
void philox_fill_normal(float* out, int64_t n, uint64_t seed, uint64_t offset, float mean, float std);

// A (seed, offset) cursor: each draw of n elements takes the next ceil(n/4)
// counters, so consecutive draws never overlap. Its state is two integers,
// which a checkpoint stores.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0, uint64_t offset = 0) : seed_(seed), offset_(offset) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  // Reserves the counters of an n-element draw; returns the draw's offset.
  uint64_t reserve(int64_t n) {
    const uint64_t at = offset_;
    offset_ += (uint64_t(n) + 3) / 4;
    return at;
  }

 private:
  uint64_t seed_;
  uint64_t offset_;
};

}  // namespace zt
