// The kernels of embedding.cu: the gather forward (out = wte[tok] (+ wpe)),
// and a backward without atomics - positions are grouped by token id on the
// host (group_by_token, a stable counting sort; under tensor parallelism only
// the ids of the rank's vocabulary slice), one block sums a group's
// rows in position order in f32 and adds the sum to dwte with one rounding;
// dwpe likewise sums over the batch in order. A header so that the warp
// emulator (tests/cuda_emu) runs them on the CPU with the same grouping.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::embedding_kernels {

constexpr int kThreads = 256;

// out[p, c] = wte[tok[p] - start, c] (+ wpe[p % T + pos_offset, c]); grid-stride
// over the (B*T*C) outputs in units of V elements of one row (V = 1, or a
// 16-byte pack when packs tile the rows): the row's position (64-bit
// divisions) once per unit. wte holds ids [start, start + rows) (a
// tensor-parallel vocabulary slice; start 0 and every id for a whole table):
// ids outside it add nothing.
template <typename T, int V>
__global__ void embed_fwd_kernel(T* out, const int32_t* tok, const T* wte, const T* wpe, int64_t N, int64_t T_,
                                 int64_t C, int64_t pos_offset, int64_t start, int64_t rows) {
  const int64_t units = N * C / V;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < units; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i * V / C, c = i * V - p * C, id = int64_t(tok[p]) - start;
    const Pack<T, V> e = id >= 0 && id < rows ? load_pack<T, V>(wte + id * C + c) : Pack<T, V>{};
    const Pack<T, V> pos = load_pack_or_zero<T, V>(wpe, (p % T_ + pos_offset) * C + c);
    Pack<T, V> o;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float v = to_f32(e.v[k]);  // 0 for an id outside the table (a zero pack)
      if (wpe != nullptr) v += to_f32(pos.v[k]);
      o.v[k] = from_f32<T>(v);
    }
    store_pack<T, V>(out + i * V, o);
  }
}

// Positions grouped by token id (host side): group g is the positions
// order[begin[g] .. begin[g+1]) of token id token[g] (a row of the table:
// id - start), in position order.
struct TokenGroups {
  std::vector<int32_t> order;  // (M) positions whose id is in the table, M <= N
  std::vector<int32_t> begin;  // (groups + 1), begin[groups] = M
  std::vector<int32_t> token;  // (groups) rows, ascending
};

// Counting sort of the N positions of tok by row id - start, keeping those in
// [0, V) (a table of V rows holding ids [start, start + V)); stable, so a
// group's positions stay in position order.
inline TokenGroups group_by_token(const int32_t* tok, int64_t N, int64_t V, int64_t start = 0) {
  auto row = [&](int64_t p) { return int64_t(tok[p]) - start; };
  std::vector<int32_t> count(size_t(V) + 1, 0);  // count[v + 1]: occurrences of row v, then prefix sums
  for (int64_t p = 0; p < N; ++p)
    if (row(p) >= 0 && row(p) < V) ++count[size_t(row(p)) + 1];
  for (int64_t v = 0; v < V; ++v) count[size_t(v) + 1] += count[size_t(v)];
  TokenGroups g;
  g.order.resize(size_t(count[size_t(V)]));
  {
    std::vector<int32_t> next(count.begin(), count.end() - 1);
    for (int64_t p = 0; p < N; ++p)
      if (row(p) >= 0 && row(p) < V) g.order[size_t(next[size_t(row(p))]++)] = int32_t(p);
  }
  for (int64_t v = 0; v < V; ++v)
    if (count[size_t(v) + 1] > count[size_t(v)]) {
      g.begin.push_back(count[size_t(v)]);
      g.token.push_back(int32_t(v));
    }
  g.begin.push_back(count[size_t(V)]);
  return g;
}

// Block (g, cb): token group g (positions order[begin[g] .. begin[g+1])),
// channels cb*kThreads + threadIdx.x.
template <typename T, typename G>
__global__ void embed_bwd_wte_kernel(G* dwte, const T* dout, const int32_t* order, const int32_t* begin,
                                     const int32_t* group_token, int64_t C) {
  const int64_t c = blockIdx.y * int64_t(kThreads) + threadIdx.x;
  if (c >= C) return;
  const int g = blockIdx.x;
  float s = 0.0f;
  for (int32_t j = begin[g]; j < begin[g + 1]; ++j) s += to_f32(dout[int64_t(order[j]) * C + c]);
  G* row = dwte + int64_t(group_token[g]) * C;
  row[c] = from_f32<G>(to_f32(row[c]) + s);
}

// dwpe[t + pos_offset, c] += sum_b dout[b, t, c], b in order.
template <typename T, typename G>
__global__ void embed_bwd_wpe_kernel(G* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C, int64_t pos_offset) {
  const int64_t n = T_ * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t b = 0; b < B; ++b) s += to_f32(dout[b * n + i]);
    G* p = dwpe + pos_offset * C + i;
    *p = from_f32<G>(to_f32(*p) + s);
  }
}

}  // namespace zt::cuda::embedding_kernels
