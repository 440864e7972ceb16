// The kernels of norm.cu: LayerNorm / RMSNorm forward and backward, one warp
// per row, f32 statistics (LayerNorm variance from (x - mean)^2, as the CPU
// computes it), and deterministic two-stage weight/bias gradients.
//
// A row is swept in packs of V elements (V = 1, or kPack16<T> when the launch
// checked that 16-byte packs fit: one 128-bit memory instruction per pack),
// lane l taking packs l, l + 32, ...; the later sweeps re-read the row from
// cache. A warp per row, not a block: the statistics are warp shuffles with
// no block barrier, and a GPT-2 row (768 bf16 = 96 packs) keeps every lane
// busy. A header so that the warp emulator (tests/cuda_emu) runs them on the
// CPU.
#pragma once

#include <cstdint>
#include <type_traits>

#include "backend/cuda/colsum_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::norm_kernels {

constexpr int kRowWarps = 8;   // row kernels: rows (warps) per block of kRowWarps * 32 threads

// dw/db partials: chunks of colsum_kernels::chunk_rows(N) rows (at most
// kMaxChunks of them, so their sum - colsum.h's add_chunk_partials - is
// short), blocks of (kSumCols, kSumLanes) threads as the bias-gradient column
// sums.
using colsum_kernels::chunk_rows;
using colsum_kernels::kSumCols;
using colsum_kernels::kSumLanes;

inline unsigned row_blocks(int64_t rows) { return unsigned((rows + kRowWarps - 1) / kRowWarps); }

// True when V-element packs of T (and of the weights' type W) tile rows of C
// at every pointer given: 16-byte packs of T, and the matching W packs
// aligned to their own width.
template <typename T, typename W, typename... Ptrs>
inline bool row_packs_fit(int64_t C, const W* w, const W* b, const Ptrs*... ptrs) {
  constexpr uintptr_t w_bytes = sizeof(W) * kPack16<T>;
  return packs_of_16_fit<T>(C, ptrs...) && reinterpret_cast<uintptr_t>(w) % w_bytes == 0 &&
         reinterpret_cast<uintptr_t>(b) % w_bytes == 0;
}

// The packs each lane holds in registers in the forward (P: a power of two,
// P x 32 >= packs), so its later sweeps do not re-read the row; 0 above 256
// packs (2048 bf16 or 1024 f32 elements), where it re-reads from cache.
inline int forward_packs_per_lane(int64_t packs) {
  for (int P = 1; P <= 8; P *= 2)
    if (packs <= 32 * int64_t(P)) return P;
  return 0;
}

// Calls f(std::integral_constant<int, P>{}) for P = 0, 1, 2, 4 or 8.
template <typename F>
void with_forward_packs(int P, F&& f) {
  using std::integral_constant;
  switch (P) {
    case 1: return f(integral_constant<int, 1>{});
    case 2: return f(integral_constant<int, 2>{});
    case 4: return f(integral_constant<int, 4>{});
    case 8: return f(integral_constant<int, 8>{});
    default: return f(integral_constant<int, 0>{});
  }
}

// fn(i, j) for the packs j = lane + 32 i of a row of `packs`: unrolled over
// i < P when P > 0 (so held[i] stays in registers), else a loop.
template <int P, typename F>
__device__ __forceinline__ void for_lane_packs(int lane, int64_t packs, F&& fn) {
  if constexpr (P > 0) {
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t j = lane + 32 * int64_t(i);
      if (j < packs) fn(i, j);
    }
  } else {
    int i = 0;
    for (int64_t j = lane; j < packs; j += 32, ++i) fn(i, j);
  }
}

// Rows of N, one per warp. When r_in is given: r = r_in + x is rounded,
// written to r_out, and normalised (the backward sees the same rounded r_out).
// P > 0 (forward_packs_per_lane): the row's packs stay in registers after the
// first sweep; the same arithmetic in the same order as P = 0.
template <typename T, typename W, int V, int P = 0>
__global__ void __launch_bounds__(kRowWarps * 32)
    norm_forward_kernel(bool rms, T* y, float* mean_out, float* rstd_out, const T* x, const T* r_in, T* r_out,
                        const W* w, const W* b, int64_t N, int64_t C, float eps) {
  const int lane = int(threadIdx.x & 31);
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (row >= N) return;  // the whole warp: nothing below waits for the block
  const int64_t packs = C / V;
  const T* src = x + row * C;
  Pack<T, V> held[P > 0 ? P : 1] = {};  // (set by the first sweep; zeroed so nvcc sees it set)
  // The lane's pack i (row pack j) for the sweeps after the first.
  auto row_pack = [&](int i, int64_t j) {
    if constexpr (P > 0) {
      return held[i];
    } else {
      (void)i;
      return load_pack<T, V>(src + j * V);
    }
  };
  float s = 0.0f;  // sum of the normalised row's values (LayerNorm's mean)
  if (r_in != nullptr) {
    T* rr = r_out + row * C;
    const T* ri = r_in + row * C;
    for_lane_packs<P>(lane, packs, [&](int i, int64_t j) {
      const Pack<T, V> a = load_pack<T, V>(ri + j * V), xv = load_pack<T, V>(src + j * V);
      Pack<T, V> r;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        r.v[k] = from_f32<T>(to_f32(a.v[k]) + to_f32(xv.v[k]));
        s += to_f32(r.v[k]);
      }
      store_pack<T, V>(rr + j * V, r);
      if constexpr (P > 0) held[i] = r;
    });
    src = rr;  // each lane re-reads only the packs it wrote
  } else if (!rms || P > 0) {
    for_lane_packs<P>(lane, packs, [&](int i, int64_t j) {
      const Pack<T, V> xv = load_pack<T, V>(src + j * V);
      if (!rms) {
#pragma unroll
        for (int k = 0; k < V; ++k) s += to_f32(xv.v[k]);
      }
      if constexpr (P > 0) held[i] = xv;
    });
  }
  const float mean = rms ? 0.0f : warp_sum(s) / float(C);
  float ss = 0.0f;
  for_lane_packs<P>(lane, packs, [&](int i, int64_t j) {
    const Pack<T, V> xv = row_pack(i, j);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const float d = to_f32(xv.v[k]) - mean;
      ss += d * d;
    }
  });
  const float rstd = rsqrtf(warp_sum(ss) / float(C) + eps);
  T* yr = y + row * C;
  for_lane_packs<P>(lane, packs, [&](int i, int64_t j) {
    const Pack<T, V> xv = row_pack(i, j);
    const Pack<W, V> wv = load_pack<W, V>(w + j * V);
    const Pack<W, V> bv = load_pack_or_zero<W, V>(b, j * V);
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float v = (to_f32(xv.v[k]) - mean) * rstd * to_f32(wv.v[k]);
      if (b != nullptr) v += to_f32(bv.v[k]);
      out.v[k] = from_f32<T>(v);
    }
    store_pack<T, V>(yr + j * V, out);
  });
  if (lane == 0) {
    if (mean_out != nullptr) mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
}

// One pack's share of a row's dx sums: sg += g, sgx += g * xhat, where
// g = dy * w and xhat = (x - mean) * rstd.
template <typename T, typename W, int V>
__device__ __forceinline__ void add_dx_sums(float& sg, float& sgx, const Pack<T, V>& dv, const Pack<T, V>& xv,
                                            const Pack<W, V>& wv, float mu, float rs) {
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float g = to_f32(dv.v[k]) * to_f32(wv.v[k]);
    const float xhat = (to_f32(xv.v[k]) - mu) * rs;
    sg += g;
    sgx += g * xhat;
  }
}

// A row's dx means, mg = mean(g) (0 for RMSNorm) and mgx = mean(g * xhat):
// each lane's packs (for_lane_packs<P>) through add_dx_sums, then warp sums.
template <int P, typename T, typename W, int V>
__device__ __forceinline__ void row_dx_means(bool rms, int lane, int64_t C, const T* dyr, const T* xr, const W* w,
                                             float mu, float rs, float& mg, float& mgx) {
  float sg = 0.0f, sgx = 0.0f;
  for_lane_packs<P>(lane, C / V, [&](int, int64_t j) {
    add_dx_sums<T, W, V>(sg, sgx, load_pack<T, V>(dyr + j * V), load_pack<T, V>(xr + j * V),
                         load_pack<W, V>(w + j * V), mu, rs);
  });
  mg = rms ? 0.0f : warp_sum(sg) / float(C);
  mgx = warp_sum(sgx) / float(C);
}

// One pack of dx = rstd * (g - mg - xhat * mgx), plus dx_add's pack when add.
template <typename T, typename W, int V>
__device__ __forceinline__ Pack<T, V> dx_pack(const Pack<T, V>& dv, const Pack<T, V>& xv, const Pack<W, V>& wv,
                                              const Pack<T, V>& av, bool add, float mu, float rs, float mg,
                                              float mgx) {
  Pack<T, V> out;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float g = to_f32(dv.v[k]) * to_f32(wv.v[k]);
    const float xhat = (to_f32(xv.v[k]) - mu) * rs;
    float v = rs * (g - mg - xhat * mgx);
    if (add) v += to_f32(av.v[k]);
    out.v[k] = from_f32<T>(v);
  }
  return out;
}

// dx for one row per warp:
//   g = dy * w, xhat = (x - mean) * rstd
//   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat))
// dx may be dy or dx_add (in place): a lane reads a pack before it writes it.
template <typename T, typename W, int V>
__global__ void __launch_bounds__(kRowWarps * 32)
    norm_dx_kernel(bool rms, T* dx, const T* dy, const T* x, const W* w, const float* mean, const float* rstd,
                   const T* dx_add, int64_t N, int64_t C) {
  const int lane = int(threadIdx.x & 31);
  const int64_t row = int64_t(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (row >= N) return;
  const int64_t packs = C / V;
  const T* dyr = dy + row * C;
  const T* xr = x + row * C;
  const float mu = rms ? 0.0f : mean[row], rs = rstd[row];
  float mg, mgx;
  row_dx_means<0, T, W, V>(rms, lane, C, dyr, xr, w, mu, rs, mg, mgx);
  T* dxr = dx + row * C;
  const T* addr = dx_add != nullptr ? dx_add + row * C : nullptr;
  for (int64_t j = lane; j < packs; j += 32) {
    const Pack<T, V> dv = load_pack<T, V>(dyr + j * V), xv = load_pack<T, V>(xr + j * V);
    store_pack<T, V>(dxr + j * V, dx_pack<T, W, V>(dv, xv, load_pack<W, V>(w + j * V),
                                                   load_pack_or_zero<T, V>(addr, j * V), addr != nullptr, mu, rs,
                                                   mg, mgx));
  }
}

// The backward in one pass over the rows (dy and x read once from device
// memory, not twice): block b takes rows [b * R, (b + 1) * R), R = per_block
// (fused_rows); warp w its rows w, w + kRowWarps, ... in order, each computing
// dx with norm_dx_kernel's arithmetic (the last place may differ: each kernel
// has its own multiply-add contractions) while lane l adds the row's
// dy * xhat and dy into its dw / db sums of packs l, l + 32, ..., l + 32 (P - 1). The warps then add their sums into shared memory in warp
// order, and the block writes its partials: pdw, pdb (blocks, C) f32, summed
// over the blocks by colsum.h. Every order depends on the shape alone.
// Requires C / V <= 32 P (V: 16-byte packs of T; weights of type T).
template <typename T, int V, int P, bool kDb>
__global__ void __launch_bounds__(kRowWarps * 32)
    norm_backward_fused_kernel(bool rms, T* dx, float* pdw, float* pdb, const T* dy, const T* x, const T* w,
                               const float* mean, const float* rstd, const T* dx_add, int64_t N, int64_t C,
                               int64_t per_block) {
  __shared__ float block_dw[32 * P * V], block_db[kDb ? 32 * P * V : 1];
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const int64_t packs = C / V;
  const int64_t r0 = int64_t(blockIdx.x) * per_block, r1 = min(N, r0 + per_block);
  float sw[P][V] = {}, sb[kDb ? P : 1][V] = {};
  for (int64_t row = r0 + warp; row < r1; row += kRowWarps) {
    const T* dyr = dy + row * C;
    const T* xr = x + row * C;
    const float mu = rms ? 0.0f : mean[row], rs = rstd[row];
    float mg, mgx;
    row_dx_means<P, T, T, V>(rms, lane, C, dyr, xr, w, mu, rs, mg, mgx);
    T* dxr = dx + row * C;
    const T* addr = dx_add != nullptr ? dx_add + row * C : nullptr;
#pragma unroll
    for (int q = 0; q < P; ++q) {
      const int64_t j = lane + 32 * q;
      if (j >= packs) break;
      const Pack<T, V> dv = load_pack<T, V>(dyr + j * V), xv = load_pack<T, V>(xr + j * V);
      const Pack<T, V> out = dx_pack<T, T, V>(dv, xv, load_pack<T, V>(w + j * V),
                                              load_pack_or_zero<T, V>(addr, j * V), addr != nullptr, mu, rs, mg, mgx);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float gy = to_f32(dv.v[k]);
        sw[q][k] += gy * ((to_f32(xv.v[k]) - mu) * rs);
        if constexpr (kDb) sb[q][k] += gy;
      }
      store_pack<T, V>(dxr + j * V, out);
    }
  }
  // The warps' sums into shared memory, warp 0 first (0 + s is exact).
  for (int turn = 0; turn < kRowWarps; ++turn) {
    if (warp == turn) {
#pragma unroll
      for (int q = 0; q < P; ++q) {
        const int64_t j = lane + 32 * q;
        if (j >= packs) break;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const int64_t c = j * V + k;
          block_dw[c] = (turn == 0 ? 0.0f : block_dw[c]) + sw[q][k];
          if constexpr (kDb) block_db[c] = (turn == 0 ? 0.0f : block_db[c]) + sb[q][k];
        }
      }
    }
    __syncthreads();
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    pdw[int64_t(blockIdx.x) * C + c] = block_dw[c];
    if constexpr (kDb) pdb[int64_t(blockIdx.x) * C + c] = block_db[c];
  }
}

// Packs per lane of the fused backward for rows of `packs` 16-byte packs: 2,
// 4 or 8 - 8 only without a bias gradient (with one, 4 already takes 127
// registers on sm_90a) -, 0 when the rows are wider (the two-pass backward).
inline int fused_packs_per_lane(int64_t packs, bool db) {
  if (packs <= 64) return 2;
  if (packs <= 128) return 4;
  return !db && packs <= 256 ? 8 : 0;
}

// Calls f(std::integral_constant<int, P>{}, std::bool_constant<db>{}) for a
// nonzero P = fused_packs_per_lane(packs, db): the kernels instantiated.
template <typename F>
void with_fused_shape(int P, bool db, F&& f) {
  using std::integral_constant;
  if (db) {
    if (P == 2) f(integral_constant<int, 2>{}, std::true_type{});
    else f(integral_constant<int, 4>{}, std::true_type{});
  } else if (P == 2) {
    f(integral_constant<int, 2>{}, std::false_type{});
  } else if (P == 4) {
    f(integral_constant<int, 4>{}, std::false_type{});
  } else {
    f(integral_constant<int, 8>{}, std::false_type{});
  }
}

// Rows per block of the fused backward: a function of the row count only;
// at most kMaxFusedBlocks blocks (enough to fill an H100 several times over),
// at least four rows per warp.
constexpr int64_t kMaxFusedBlocks = 2048;
inline int64_t fused_rows(int64_t rows) {
  const int64_t spread = (rows + kMaxFusedBlocks - 1) / kMaxFusedBlocks;
  return spread > 4 * kRowWarps ? spread : 4 * kRowWarps;
}

// Partials of dw (and db) over the rows [chunk * R, (chunk + 1) * R) of chunk
// blockIdx.y, R = per_chunk: lane threadIdx.x takes V adjacent columns (V = 1,
// or a 16-byte pack when packs tile the rows: a warp reads 512 contiguous
// bytes of a row per load), row lane j = threadIdx.y sums rows j, j + kSumLanes,
// ... in row order, then the lanes are added in lane order. Every column's
// summation order depends on the shape alone (the same bits at any V).
// pdw, pdb: (chunks, C) f32.
template <typename T, int V>
__global__ void __launch_bounds__(kSumCols* kSumLanes)
    norm_dwdb_partial_kernel(bool rms, float* pdw, float* pdb, const T* dy, const T* x, const float* mean,
                             const float* rstd, int64_t N, int64_t C, int64_t per_chunk) {
  __shared__ float lanes_dw[kSumLanes][kSumCols * V + 1], lanes_db[kSumLanes][kSumCols * V + 1];
  const int64_t c0 = (int64_t(blockIdx.x) * kSumCols + threadIdx.x) * V;
  const int64_t r0 = int64_t(blockIdx.y) * per_chunk, r1 = min(N, r0 + per_chunk);
  float sw[V] = {}, sb[V] = {};
  if (c0 < C) {
#pragma unroll 4  // several rows' loads in flight; the additions stay in row order
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kSumLanes) {
      const Pack<T, V> g = load_pack<T, V>(dy + r * C + c0), xv = load_pack<T, V>(x + r * C + c0);
      const float mu = rms ? 0.0f : mean[r], rs = rstd[r];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float gk = to_f32(g.v[k]);
        sw[k] += gk * ((to_f32(xv.v[k]) - mu) * rs);
        sb[k] += gk;
      }
    }
  }
#pragma unroll
  for (int k = 0; k < V; ++k) {
    lanes_dw[threadIdx.y][threadIdx.x * V + k] = sw[k];
    lanes_db[threadIdx.y][threadIdx.x * V + k] = sb[k];
  }
  __syncthreads();
  if (threadIdx.y != 0 || c0 >= C) return;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    float w = lanes_dw[0][threadIdx.x * V + k], b = lanes_db[0][threadIdx.x * V + k];
#pragma unroll
    for (int j = 1; j < kSumLanes; ++j) {
      w += lanes_dw[j][threadIdx.x * V + k];
      b += lanes_db[j][threadIdx.x * V + k];
    }
    pdw[int64_t(blockIdx.y) * C + c0 + k] = w;
    if (pdb != nullptr) pdb[int64_t(blockIdx.y) * C + c0 + k] = b;
  }
}

}  // namespace zt::cuda::norm_kernels
