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
  with_int_constant<0, 1, 2, 4, 8>(P, "norm forward: packs per lane", f);
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

// The backward's arithmetic is rounded intrinsics (__fmul_rn, __fadd_rn,
// __fsub_rn, __fdiv_rn), which nvcc may not contract into FMAs: the one-pass
// kernel and the two passes it races (norm.cu) then compute the same bits
// from the same sums in the same order, whatever each kernel's code around
// them. xhat = (x - mean) * rstd.
__device__ __forceinline__ float xhat_of(float x, float mu, float rs) { return __fmul_rn(__fsub_rn(x, mu), rs); }

// One element's share of a row's dx sums: sg += g, sgx += g * xhat, where
// g = dy * w; returns xhat (the dw sums' factor).
__device__ __forceinline__ float add_dx_sum(float& sg, float& sgx, float dy, float w, float x, float mu, float rs) {
  const float g = __fmul_rn(dy, w), xhat = xhat_of(x, mu, rs);
  sg = __fadd_rn(sg, g);
  sgx = __fadd_rn(sgx, __fmul_rn(g, xhat));
  return xhat;
}

// One pack's share of a row's dx sums (add_dx_sum, element by element).
template <typename T, typename W, int V>
__device__ __forceinline__ void add_dx_sums(float& sg, float& sgx, const Pack<T, V>& dv, const Pack<T, V>& xv,
                                            const Pack<W, V>& wv, float mu, float rs) {
#pragma unroll
  for (int k = 0; k < V; ++k) add_dx_sum(sg, sgx, to_f32(dv.v[k]), to_f32(wv.v[k]), to_f32(xv.v[k]), mu, rs);
}

// A row's dx means from its lanes' sums: mg = mean(g) (0 for RMSNorm),
// mgx = mean(g * xhat), by warp sums.
__device__ __forceinline__ void dx_means(bool rms, int64_t C, float sg, float sgx, float& mg, float& mgx) {
  mg = rms ? 0.0f : __fdiv_rn(warp_sum(sg), float(C));
  mgx = __fdiv_rn(warp_sum(sgx), float(C));
}

// A row's dx means: each lane's packs l, l + 32, ... through add_dx_sums,
// then dx_means.
template <typename T, typename W, int V>
__device__ __forceinline__ void row_dx_means(bool rms, int lane, int64_t C, const T* dyr, const T* xr, const W* w,
                                             float mu, float rs, float& mg, float& mgx) {
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = lane; j < C / V; j += 32)
    add_dx_sums<T, W, V>(sg, sgx, load_pack<T, V>(dyr + j * V), load_pack<T, V>(xr + j * V),
                         load_pack<W, V>(w + j * V), mu, rs);
  dx_means(rms, C, sg, sgx, mg, mgx);
}

// One pack of dx = rstd * ((g - mg) - xhat * mgx), plus dx_add's pack when add.
template <typename T, typename W, int V>
__device__ __forceinline__ Pack<T, V> dx_pack(const Pack<T, V>& dv, const Pack<T, V>& xv, const Pack<W, V>& wv,
                                              const Pack<T, V>& av, bool add, float mu, float rs, float mg,
                                              float mgx) {
  Pack<T, V> out;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const float g = __fmul_rn(to_f32(dv.v[k]), to_f32(wv.v[k]));
    const float xhat = xhat_of(to_f32(xv.v[k]), mu, rs);
    float v = __fmul_rn(rs, __fsub_rn(__fsub_rn(g, mg), __fmul_rn(xhat, mgx)));
    if (add) v = __fadd_rn(v, to_f32(av.v[k]));
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
  row_dx_means<T, W, V>(rms, lane, C, dyr, xr, w, mu, rs, mg, mgx);
  T* dxr = dx + row * C;
  const T* addr = dx_add != nullptr ? dx_add + row * C : nullptr;
  for (int64_t j = lane; j < packs; j += 32) {
    const Pack<T, V> dv = load_pack<T, V>(dyr + j * V), xv = load_pack<T, V>(xr + j * V);
    store_pack<T, V>(dxr + j * V, dx_pack<T, W, V>(dv, xv, load_pack<W, V>(w + j * V),
                                                   load_pack_or_zero<T, V>(addr, j * V), addr != nullptr, mu, rs,
                                                   mg, mgx));
  }
}

// The backward in one pass: dy, x and dx_add leave device memory once, dx is
// written once, and the dw / db sums never leave the SM until the block ends.
//
// Grid: G blocks (the GPU's resident capacity, backward_blocks), block b
// taking the rows [b N / G, (b + 1) N / G); warp w of a block its rows w,
// w + kBackwardWarps, ... in order. A warp loads its row's dy and x packs
// into registers at once (lane l: packs l, l + 32, ..., Q per lane; dx_add's
// with them up to Q = 4, after the statistics above, to stay under 128
// registers), so every warp of the SM keeps a whole row in flight and a row
// costs one trip to device memory; the statistics are warp shuffles, dx is computed
// from the registers (so dx may be dy or dx_add: a row is read before it is
// written) with norm_dx_kernel's arithmetic, to the bit.
//
// dw / db: each warp adds its rows' dy * xhat (and dy) into its own f32
// region of shared memory, lane l owning the columns of its packs, laid out
// float4 slot (q * V / 4 + h) * 32 + l so a warp's accesses hit 32 distinct
// banks; no atomics, no registers held across rows. At the end the block
// adds its warps' regions in warp order and writes its partials rows:
// pdw, pdb (G, C) f32, which colsum.h adds over the blocks. Every order
// depends on the shape and G alone: the same bits on every run on one GPU,
// and those of the two passes on the same G (norm_dwdb_partial_kernel on
// its blocks, then norm_dx_kernel). Requires 16-byte packs (V = kPack16<T>) and
// C / V <= 32 Q; weights of type T. Dynamic shared memory:
// backward_shared_bytes.
constexpr int kBackwardWarps = 8;

// Packs per lane Q for rows of `packs` 16-byte packs: the least of 1, 2, 3,
// 4, 6, 8 with 32 Q >= packs (a bf16 row of up to 2048, an f32 one of up to
// 1024); 0 for wider rows (the two-pass backward). GPT-2's 768 bf16: 3.
inline int backward_packs_per_lane(int64_t packs) {
  for (const int Q : {1, 2, 3, 4, 6, 8})
    if (packs <= 32 * int64_t(Q)) return Q;
  return 0;
}

// Calls f(std::integral_constant<int, Q>{}) for a nonzero
// backward_packs_per_lane.
template <typename F>
void with_backward_packs(int Q, F&& f) {
  with_int_constant<1, 2, 3, 4, 6, 8>(Q, "norm backward: packs per lane", f);
}

// The one-pass kernel's shared memory (bytes): per warp, 32 Q V f32 sums for
// dw, as many again for db.
inline size_t backward_shared_bytes(int Q, int V, bool db) {
  return size_t(kBackwardWarps) * (db ? 2 : 1) * size_t(32 * Q * V) * sizeof(float);
}

// Its block count: `resident` (the blocks the GPU holds at once, so every
// block runs from the start and none waits for a second wave), but no more
// blocks than leave each warp 4 rows.
inline int64_t backward_blocks(int64_t rows, int64_t resident) {
  const int64_t most = (rows + 4 * kBackwardWarps - 1) / (4 * kBackwardWarps);
  return resident < most ? resident : most;
}

// At least 3 blocks an SM up to 3 packs a lane (80 registers: GPT-2's rows),
// else 2 (128): more would spill.
template <typename T, int V, int Q, bool kDb>
__global__ void __launch_bounds__(kBackwardWarps * 32, Q <= 3 ? 3 : 2)
    norm_backward_fused_kernel(bool rms, T* dx, float* pdw, float* pdb, const T* dy, const T* x, const T* w,
                               const float* mean, const float* rstd, const T* dx_add, int64_t N, int64_t C) {
  static_assert(V % 4 == 0, "a pack is whole float4 slots");
  constexpr int kSlots = Q * V / 4;              // float4 slots per lane and sum
  constexpr int kSums = kDb ? 2 : 1;             // dw, and db
  // dx_add's packs load with the row's up to 4 packs a lane; wider rows
  // load them after the statistics, keeping under 128 registers.
  constexpr bool kHoldAdd = Q <= 4;
  ZT_SHARED_MEMORY(smem_bytes);
  float4* const sums = reinterpret_cast<float4*>(smem_bytes);  // [warp][sum][slot][lane]
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  float4* const mine = sums + int64_t(warp) * kSums * kSlots * 32 + lane;
#pragma unroll
  for (int s = 0; s < kSums * kSlots; ++s) mine[s * 32] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const int64_t packs = C / V;
  const int64_t r0 = int64_t(blockIdx.x) * N / gridDim.x, r1 = (int64_t(blockIdx.x) + 1) * N / gridDim.x;
  for (int64_t row = r0 + warp; row < r1; row += kBackwardWarps) {
    const T* dyr = dy + row * C;
    const T* xr = x + row * C;
    const T* addr = dx_add != nullptr ? dx_add + row * C : nullptr;
    Pack<T, V> dv[Q], xv[Q], av[kHoldAdd ? Q : 1];
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const int64_t j = lane + 32 * q;
      dv[q] = xv[q] = Pack<T, V>{};
      if constexpr (kHoldAdd) av[q] = Pack<T, V>{};
      if (j < packs) {
        dv[q] = load_pack<T, V>(dyr + j * V);
        xv[q] = load_pack<T, V>(xr + j * V);
        if constexpr (kHoldAdd) av[q] = load_pack_or_zero<T, V>(addr, j * V);
      }
    }
    const float mu = rms ? 0.0f : mean[row], rs = rstd[row];
    // The dx sums (add_dx_sums' order) and, from the same products, the
    // lane's dw / db sums.
    float sg = 0.0f, sgx = 0.0f;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const int64_t j = lane + 32 * q;
      if (j >= packs) continue;
      const Pack<T, V> wv = load_pack<T, V>(w + j * V);
#pragma unroll
      for (int h = 0; h < V / 4; ++h) {
        float gy[4], gx[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int k = 4 * h + e;
          gy[e] = to_f32(dv[q].v[k]);
          const float xhat = add_dx_sum(sg, sgx, gy[e], to_f32(wv.v[k]), to_f32(xv[q].v[k]), mu, rs);
          gx[e] = __fmul_rn(gy[e], xhat);
        }
        float4* dw_slot = mine + (q * (V / 4) + h) * 32;
        float4 a = *dw_slot;
        a.x = __fadd_rn(a.x, gx[0]), a.y = __fadd_rn(a.y, gx[1]), a.z = __fadd_rn(a.z, gx[2]),
        a.w = __fadd_rn(a.w, gx[3]);
        *dw_slot = a;
        if constexpr (kDb) {
          float4* db_slot = dw_slot + kSlots * 32;
          float4 b = *db_slot;
          b.x = __fadd_rn(b.x, gy[0]), b.y = __fadd_rn(b.y, gy[1]), b.z = __fadd_rn(b.z, gy[2]),
          b.w = __fadd_rn(b.w, gy[3]);
          *db_slot = b;
        }
      }
    }
    float mg, mgx;
    dx_means(rms, C, sg, sgx, mg, mgx);
    T* dxr = dx + row * C;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const int64_t j = lane + 32 * q;
      if (j >= packs) continue;
      keep_packed(dv[q]);
      keep_packed(xv[q]);
      Pack<T, V> add;
      if constexpr (kHoldAdd) add = av[q];
      else add = load_pack_or_zero<T, V>(addr, j * V);
      store_pack<T, V>(dxr + j * V, dx_pack<T, T, V>(dv[q], xv[q], load_pack<T, V>(w + j * V), add,
                                                     addr != nullptr, mu, rs, mg, mgx));
    }
  }
  __syncthreads();
  // The block's partials: slot s of every warp, added in warp order (the
  // first addition 0 + x is exact), at its columns.
  for (int s = int(threadIdx.x); s < kSums * kSlots * 32; s += kBackwardWarps * 32) {
    const int sum = s / (kSlots * 32), slot = (s / 32) % kSlots, l = s % 32;
    const int64_t c = (l + 32 * int64_t(slot / (V / 4))) * V + 4 * (slot % (V / 4));
    if (c >= C) continue;
    float4 t = sums[s];
    for (int wi = 1; wi < kBackwardWarps; ++wi) {
      const float4 u = sums[int64_t(wi) * kSums * kSlots * 32 + s];
      t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;
    }
    *reinterpret_cast<float4*>((sum == 0 ? pdw : pdb) + int64_t(blockIdx.x) * C + c) = t;
  }
}

// The two passes' dw / db partials: lane threadIdx.x takes V adjacent
// columns (V = 1, or a 16-byte pack when packs tile the rows: a warp reads
// 512 contiguous bytes of a row per load), row lane j = threadIdx.y sums
// dy * xhat (and dy) over its rows r0 + j, r0 + j + kSumLanes, ... in row
// order from 0, then the lanes are added in lane order; pdw, pdb: (gridDim.y,
// C) f32. Block row blockIdx.y = b takes the rows [b R, (b + 1) R), R =
// per_chunk; or, per_chunk = 0, [b N / G, (b + 1) N / G) on G = gridDim.y:
// the one-pass kernel's block b, whose warps are these row lanes - its
// order, so on its grid the two passes race it on the same bits (norm.cu).
// Every column's order depends on the shape and the grid alone (the same
// bits at any V).
static_assert(kSumLanes == kBackwardWarps, "the two passes' row lanes are the one pass's warps");
template <typename T, int V>
__global__ void __launch_bounds__(kSumCols* kSumLanes)
    norm_dwdb_partial_kernel(bool rms, float* pdw, float* pdb, const T* dy, const T* x, const float* mean,
                             const float* rstd, int64_t N, int64_t C, int64_t per_chunk) {
  __shared__ float lanes_dw[kSumLanes][kSumCols * V + 1], lanes_db[kSumLanes][kSumCols * V + 1];
  const int64_t c0 = (int64_t(blockIdx.x) * kSumCols + threadIdx.x) * V;
  const int64_t b = blockIdx.y, G = gridDim.y;
  const int64_t r0 = per_chunk > 0 ? b * per_chunk : b * N / G;
  const int64_t r1 = per_chunk > 0 ? min(N, r0 + per_chunk) : (b + 1) * N / G;
  float sw[V] = {}, sb[V] = {};
  if (c0 < C) {
#pragma unroll 4  // several rows' loads in flight; the additions stay in row order
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kSumLanes) {
      const Pack<T, V> g = load_pack<T, V>(dy + r * C + c0), xv = load_pack<T, V>(x + r * C + c0);
      const float mu = rms ? 0.0f : mean[r], rs = rstd[r];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float gk = to_f32(g.v[k]);
        sw[k] = __fadd_rn(sw[k], __fmul_rn(gk, xhat_of(to_f32(xv.v[k]), mu, rs)));
        sb[k] = __fadd_rn(sb[k], gk);
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
    float w = lanes_dw[0][threadIdx.x * V + k], sum_b = lanes_db[0][threadIdx.x * V + k];
#pragma unroll
    for (int j = 1; j < kSumLanes; ++j) {
      w = __fadd_rn(w, lanes_dw[j][threadIdx.x * V + k]);
      sum_b = __fadd_rn(sum_b, lanes_db[j][threadIdx.x * V + k]);
    }
    pdw[b * C + c0 + k] = w;
    if (pdb != nullptr) pdb[b * C + c0 + k] = sum_b;
  }
}

}  // namespace zt::cuda::norm_kernels
