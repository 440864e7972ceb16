#include <cstdint>

#include "core/rng.h"

namespace zt {

// Threads split the output on 4-element block boundaries, so every block is
// generated exactly once and the result does not depend on the thread count.
void philox_fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi) {
  const int64_t blocks = (n + 3) / 4;
  const float span = hi - lo;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const PhiloxBlock blk = philox_block_at(seed, offset + uint64_t(b));
    for (int j = 0; j < 4 && b * 4 + j < n; ++j) out[b * 4 + j] = lo + span * philox_uniform(blk.w[j]);
  }
}

void philox_fill_normal(float* out, int64_t n, uint64_t seed, uint64_t offset, float mean, float std) {
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const PhiloxBlock blk = philox_block_at(seed, offset + uint64_t(b));
    float v[4];
    philox_box_muller(blk.w[0], blk.w[1], &v[0], &v[1]);
    philox_box_muller(blk.w[2], blk.w[3], &v[2], &v[3]);
    for (int j = 0; j < 4 && b * 4 + j < n; ++j) out[b * 4 + j] = mean + std * v[j];
  }
}

}  // namespace zt
