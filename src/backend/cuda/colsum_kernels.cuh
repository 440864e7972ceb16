// The bias-gradient kernels of matmul.cu: db += column sums of dy (rows x
// cols), deterministic. Rows are cut into chunks whose size depends on the
// row count only (chunk_rows); in a chunk, row lane j of a block sums rows
// j, j + kSumLanes, ... in row order, then the lanes are added in lane
// order, and the chunks' f32 partials are added in chunk order - so every
// column's summation order depends on the shape alone, never on the GPU, the
// launch or the pack width. A lane takes V adjacent columns (V = 1, or
// kPack16<TDy> when 16-byte packs tile the rows: a warp then reads 512
// contiguous bytes of a row per load, not 64). A header so that the warp
// emulator (tests/cuda_emu) runs them on the CPU.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::colsum_kernels {

constexpr int kSumCols = 32;   // lanes per block across the columns (each V of them)
constexpr int kSumLanes = 8;   // row lanes per block: lane j sums rows j, j + 8, ... of the chunk
constexpr int64_t kMinChunkRows = 256;
constexpr int64_t kMaxChunks = 64;

// Rows per chunk: a function of the row count only.
inline int64_t chunk_rows(int64_t rows) { return std::max(kMinChunkRows, (rows + kMaxChunks - 1) / kMaxChunks); }

// Block (kSumCols, kSumLanes) sums rows [blockIdx.y * per_chunk, ...) of
// columns [(blockIdx.x * kSumCols + threadIdx.x) * V, ... + V): writes the
// chunk's f32 partials, or (partial null: one chunk) adds them into db
// (overwrite: writes them, db not read).
template <typename TDy, typename TDb, int V>
__global__ void colsum_chunk_kernel(const TDy* __restrict__ dy, int64_t rows, int64_t cols, int64_t per_chunk,
                                    float* __restrict__ partial, TDb* __restrict__ db, bool overwrite) {
  __shared__ float sums[kSumLanes][kSumCols * V + 1];
  const int64_t col0 = (int64_t(blockIdx.x) * kSumCols + threadIdx.x) * V;
  const int64_t r0 = int64_t(blockIdx.y) * per_chunk;
  const int64_t r1 = r0 + per_chunk < rows ? r0 + per_chunk : rows;
  float acc[V] = {};
  if (col0 < cols) {
#pragma unroll 4  // several loads in flight; the additions stay in row order
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kSumLanes) {
      const Pack<TDy, V> p = load_pack<TDy, V>(dy + r * cols + col0);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += to_f32(p.v[k]);
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) sums[threadIdx.y][threadIdx.x * V + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && col0 < cols) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float s = sums[0][threadIdx.x * V + k];
#pragma unroll
      for (int j = 1; j < kSumLanes; ++j) s += sums[j][threadIdx.x * V + k];
      if (partial) {
        partial[int64_t(blockIdx.y) * cols + col0 + k] = s;
      } else {
        db[col0 + k] = from_f32<TDb>(overwrite ? s : to_f32(db[col0 + k]) + s);
      }
    }
  }
}

// db[c] += sum over chunks, in chunk order, of partial[chunk][c]; one
// rounding (overwrite: =, db not read).
template <typename TDb>
__global__ void colsum_finish_kernel(const float* __restrict__ partial, int64_t chunks, int64_t cols,
                                     TDb* __restrict__ db, bool overwrite) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float s = partial[col];
  for (int64_t c = 1; c < chunks; ++c) s += partial[c * cols + col];
  db[col] = from_f32<TDb>(overwrite ? s : to_f32(db[col]) + s);
}

}  // namespace zt::cuda::colsum_kernels
