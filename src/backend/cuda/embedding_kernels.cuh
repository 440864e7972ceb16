// The kernels of embedding.cu: the gather forward (out = wte[tok] (+ wpe)),
// and a backward without atomics - positions are grouped by token id on the
// host (group_by_token, a stable counting sort; under tensor parallelism only
// the ids of the rank's vocabulary slice) and the groups cut into segments
// (segment_groups); blocks sum segments' rows in position order in f32, and
// each group's sum reaches dwte with one rounding; dwpe likewise sums over
// the batch in order. A header so that the warp
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

// The groups cut into segments of at most kSegmentRows positions, in order,
// so that no block's loop is long: real text repeats a few tokens thousands
// of times (the demo corpus: one token is 9143 of 131072 positions, which one
// block per 256 channels would sum serially). A group of one segment is
// summed and added to its row by one block, as a whole group; a longer
// group's segments write f32 partial sums, which a second kernel adds in
// segment order, one rounding into the row.
constexpr int32_t kSegmentRows = 32;
struct TokenSegments {
  std::vector<int32_t> begin;  // (segments + 1): segment s is order[begin[s] .. begin[s+1])
  std::vector<int32_t> slot;   // (segments): -1 adds to its row at once; else its partial row
  std::vector<int32_t> token;  // (segments): the table row
  std::vector<int32_t> split_first;  // (split groups + 1): their partial rows, consecutive
  std::vector<int32_t> split_token;  // (split groups): their table rows
  int32_t partials() const { return split_first.empty() ? 0 : split_first.back(); }
};

inline TokenSegments segment_groups(const TokenGroups& g) {
  TokenSegments s;
  s.split_first.push_back(0);
  for (size_t k = 0; k + 1 < g.begin.size(); ++k) {
    const int32_t b = g.begin[k], e = g.begin[k + 1];
    const bool split = e - b > kSegmentRows;
    for (int32_t j = b; j < e; j += kSegmentRows) {
      s.begin.push_back(j);
      s.slot.push_back(split ? s.split_first.back() + (j - b) / kSegmentRows : -1);
      s.token.push_back(g.token[k]);
    }
    if (split) {
      s.split_first.push_back(s.split_first.back() + (e - b + kSegmentRows - 1) / kSegmentRows);
      s.split_token.push_back(g.token[k]);
    }
  }
  s.begin.push_back(g.begin.empty() ? 0 : g.begin.back());
  return s;
}

// Block (s, cb): segment s (positions order[begin[s] .. begin[s+1])),
// channels cb*kThreads + threadIdx.x, summed in position order in f32; four
// rows' loads in flight before their additions (in order: the same sum).
// Added to its row with one rounding, or written to its partial row.
template <typename T, typename G>
__global__ void embed_bwd_segment_kernel(G* dwte, float* partial, const T* dout, const int32_t* order,
                                         const int32_t* seg_begin, const int32_t* seg_slot,
                                         const int32_t* seg_token, int64_t C) {
  const int64_t c = blockIdx.y * int64_t(kThreads) + threadIdx.x;
  if (c >= C) return;
  const int s = blockIdx.x;
  const int32_t e = seg_begin[s + 1];
  int32_t j = seg_begin[s];
  float acc = 0.0f;
  for (; j + 4 <= e; j += 4) {
    const float v0 = to_f32(dout[int64_t(order[j]) * C + c]), v1 = to_f32(dout[int64_t(order[j + 1]) * C + c]);
    const float v2 = to_f32(dout[int64_t(order[j + 2]) * C + c]), v3 = to_f32(dout[int64_t(order[j + 3]) * C + c]);
    acc += v0;
    acc += v1;
    acc += v2;
    acc += v3;
  }
  for (; j < e; ++j) acc += to_f32(dout[int64_t(order[j]) * C + c]);
  const int32_t slot = seg_slot[s];
  if (slot >= 0) {
    partial[int64_t(slot) * C + c] = acc;
    return;
  }
  G* row = dwte + int64_t(seg_token[s]) * C;
  row[c] = from_f32<G>(to_f32(row[c]) + acc);
}

// Block (k, cb): split group k's partial rows [first[k], first[k+1]) summed
// in segment order, added to its row with one rounding.
template <typename G>
__global__ void embed_bwd_partials_kernel(G* dwte, const float* partial, const int32_t* split_first,
                                          const int32_t* split_token, int64_t C) {
  const int64_t c = blockIdx.y * int64_t(kThreads) + threadIdx.x;
  if (c >= C) return;
  const int k = blockIdx.x;
  float acc = 0.0f;
  for (int32_t r = split_first[k]; r < split_first[k + 1]; ++r) acc += partial[int64_t(r) * C + c];
  G* row = dwte + int64_t(split_token[k]) * C;
  row[c] = from_f32<G>(to_f32(row[c]) + acc);
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
