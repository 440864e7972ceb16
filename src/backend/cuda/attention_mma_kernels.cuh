// The kernels of attention_mma.cu: CUDA causal GQA attention,
// FlashAttention-2 on mma.sync (m16n8k16: bf16 or f16 operands, f32
// accumulation) with scores, probabilities and outputs in registers - the
// fast fused path (attention_flash.cu is the same schedule
// through WMMA with shared-memory staging, kept as a second implementation).
//
// forward   one block per (64 query rows, query head, batch row); 4 warps of
//           16 rows. Per key tile of 64 up to the diagonal: S = Q K^T in C
//           fragments, scale + causal mask, the online softmax on the
//           fragments (row max and sum over each lane quad), O = corr O + P V
//           with P re-packed from the C fragments as the A operand.
// backward  delta = rowsum(dO * O) (attention.cu), then, deterministic:
//   dK, dV  one block per (64 keys, kv head, batch row); warps own 16 keys and
//           walk the group's query heads and 32-query tiles from the diagonal:
//           S^T = K Q^T, dP^T = V dO^T, P^T = exp(scale S^T - lse),
//           dS^T = P^T (dP^T - delta); dV += P^T dO, dK += dS^T Q.
//   dQ      one block per (64 queries, query head, batch row); per key tile:
//           S and dP again, dQ += dS K.
// Shared memory holds only the operand tiles (rows padded by 16 bytes, so
// ldmatrix is conflict-free), filled by cp.async one tile ahead of the tile
// being computed (double buffering: loads overlap the products). Fragments
// come from shared memory through ldmatrix (.trans where B's rows are the
// stored rows). Head dims 16, 32, 64, 128; attention.cu chooses.
//
// Fragment layouts (PTX ISA, "mma.m16n8k16"), lane = 4 g + t:
//   A (16 x 16, row): a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
//                     a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]
//   B (16 x 8, col):  b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g]
//   C (16 x 8, f32):  c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] = C[g+8][2t, 2t+1]
// Pairs pack the lower index in the low half. So the C fragments of n-tiles
// 2j and 2j+1 are, packed, the A fragment of k-step j (P, dS as operands),
// and a row's values live in the 4 lanes of a quad.
//
// A header so that the warp emulator (tests/cuda_emu) can run these very
// kernels on the CPU: it defines ZT_WARP_EMULATION and provides mma,
// ldmatrix, cp.async (copies deferred until their wait, so a missing wait
// reads poison), the shuffles, the barriers and the block's shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

#include "backend/cuda/attention_tiles.cuh"

namespace zt::cuda::mma_attention {

using attn::Dims;
using attn::kThreads;

constexpr int kRows = 64;     // query rows (forward, dQ) or key rows (dK dV) of a block: 16 per warp
constexpr int kKeys = 64;     // keys per tile (forward, dQ)
constexpr int kQueries = 32;  // queries per tile (dK dV): S^T and dP^T at 16 registers each

template <int kD>
constexpr int kLd = kD + 8;  // shared row stride, elements

// Shared memory (bytes): forward Q + 2 x (K, V); dK dV K, V + 2 x (Q, dO,
// lse, delta); dQ Q, dO + 2 x (K, V).
template <int kD>
constexpr size_t forward_bytes(size_t es) { return size_t(kRows + 4 * kKeys) * kLd<kD> * es; }
template <int kD>
constexpr size_t dkdv_bytes(size_t es) { return size_t(2 * kRows + 4 * kQueries) * kLd<kD> * es + 4 * kQueries * 4; }
template <int kD>
constexpr size_t dq_bytes(size_t es) { return size_t(2 * kRows + 4 * kKeys) * kLd<kD> * es; }

struct Lane {
  int lane, g, t;
  __device__ Lane() : lane(threadIdx.x & 31), g((threadIdx.x & 31) >> 2), t(threadIdx.x & 3) {}
};

#if ZT_WARP_EMULATION
// The emulator's versions, with the same layouts and semantics.
using ::zt::emu::ldmatrix_x4;
using ::zt::emu::mma;
#else
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma<__half>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Four 8 x 8 matrices of 16-bit elements from shared memory: lane 8 i + j
// gives the address of row j of matrix i (16-byte aligned); register i of
// lane 4 g + t receives row g, elements 2t and 2t + 1 of matrix i - or, with
// trans, rows 2t and 2t + 1, element g (the matrix read transposed).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

#endif

template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof u);  // a register move
  return u;
}
template <>
__device__ __forceinline__ uint32_t pack<__half>(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}

// Queues the copy of rows [0, min(valid, kTileRows)) of a (kTileRows, kD)
// tile from global (rows `stride` elements apart, 16-byte aligned) into
// shared (rows kLd apart), zeros below. The caller commits and waits.
template <typename T, int kD, int kTileRows>
__device__ __forceinline__ void load_tile_async(T* dst, const T* src, int64_t stride, int64_t valid) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < kTileRows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool in = r < valid;
    cp_async16(dst + r * kLd<kD> + col, in ? src + r * stride + col : src, in);
  }
}

// The A fragment of the 16 x 16 block at column k0 of 16 shared rows m:
// matrices (rows 0-7, cols k0..), (rows 8-15, cols k0..), (rows 0-7, cols
// k0 + 8..), (rows 8-15, cols k0 + 8..) are a[0..3].
template <typename T, int kD>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* m, int k0, const Lane& l) {
  const int i = l.lane >> 3, j = l.lane & 7;
  ldmatrix_x4<false>(a, m + (j + 8 * (i & 1)) * kLd<kD> + k0 + 8 * (i >> 1));
}

// The B fragments of n-tiles n0 and n0 + 8 at k-step k0 with
// B[k][n] = M[n][k]: M's rows are B's columns (K in S = Q K^T, Q in S^T =
// K Q^T, V in dP = dO V^T, dO in dP^T = V dO^T). b[p] is n-tile n0 + 8 p.
template <typename T, int kD>
__device__ __forceinline__ void load_b_rows(uint32_t (&b)[2][2], const T* m, int n0, int k0, const Lane& l) {
  const int i = l.lane >> 3, j = l.lane & 7;
  uint32_t r[4];
  ldmatrix_x4<false>(r, m + (n0 + j + 8 * (i >> 1)) * kLd<kD> + k0 + 8 * (i & 1));
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

// The B fragments of n-tiles n0 and n0 + 8 at k-step k0 with
// B[k][n] = M[k][n]: M's rows are B's rows (V in O = P V, dO and Q in
// dV = P^T dO and dK = dS^T Q, K in dQ = dS K), read transposed.
template <typename T, int kD>
__device__ __forceinline__ void load_b_cols(uint32_t (&b)[2][2], const T* m, int k0, int n0, const Lane& l) {
  const int i = l.lane >> 3, j = l.lane & 7;
  uint32_t r[4];
  ldmatrix_x4<true>(r, m + (k0 + j + 8 * (i & 1)) * kLd<kD> + n0 + 8 * (i >> 1));
  b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
}

// The A fragment of k-step j from the C fragments of n-tiles 2j and 2j+1.
template <typename T>
__device__ __forceinline__ void a_from_c(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack<T>(c0[0], c0[1]);
  a[1] = pack<T>(c0[2], c0[3]);
  a[2] = pack<T>(c1[0], c1[1]);
  a[3] = pack<T>(c1[2], c1[3]);
}

// c[n] += A B for every n-tile of M's D columns: A one k-step's fragment,
// M's rows k0.. are B's rows (load_b_cols).
template <typename T, int kD>
__device__ __forceinline__ void accumulate_cols(float (&c)[kD / 8][4], const uint32_t (&a)[4], const T* m, int k0,
                                                const Lane& l) {
#pragma unroll
  for (int n = 0; n < kD / 8; n += 2) {
    uint32_t b[2][2];
    load_b_cols<T, kD>(b, m, k0, n * 8, l);
    mma<T>(c[n], a, b[0]);
    mma<T>(c[n + 1], a, b[1]);
  }
}

// Sum or max over the 4 lanes of a quad (one fragment row).
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Writes acc x mul as the lane's two elements of each 8-column tile of row
// `half` (0: row g, 1: row g + 8) to dst (the row in global memory).
template <typename T, int kD>
__device__ __forceinline__ void store_row(T* dst, const float (&acc)[kD / 8][4], int half, float mul, const Lane& l) {
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
    *reinterpret_cast<uint32_t*>(dst + n * 8 + 2 * l.t) = pack<T>(acc[n][2 * half] * mul, acc[n][2 * half + 1] * mul);
}

template <int kN>
__device__ __forceinline__ void zero(float (&c)[kN][4]) {
#pragma unroll
  for (int n = 0; n < kN; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
}

// S (or dP) for the warp's 16 rows against a 64-row tile: c[n] = A_rows M^T,
// A's fragments for every k-step, M's rows are the tile's (load_b_rows).
template <typename T, int kD, int kN>
__device__ __forceinline__ void scores(float (&c)[kN / 8][4], const uint32_t (&a)[kD / 16][4], const T* m,
                                       const Lane& l) {
  zero<kN / 8>(c);
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
#pragma unroll
    for (int n = 0; n < kN / 8; n += 2) {
      uint32_t b[2][2];
      load_b_rows<T, kD>(b, m, n * 8, kk * 16, l);
      mma<T>(c[n], a[kk], b[0]);
      mma<T>(c[n + 1], a[kk], b[1]);
    }
}

// The warp's A fragments of 16 shared rows, every k-step.
template <typename T, int kD>
__device__ __forceinline__ void load_rows_a(uint32_t (&a)[kD / 16][4], const T* m, const Lane& l) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) load_a<T, kD>(a[kk], m, kk * 16, l);
}

// The double-buffer step of item `it` of `items`: starts copying item it + 1
// (load(it + 1, its buffer)) so it streams in during this item's products,
// then waits until item it has landed and every thread sees it.
template <typename Load>
__device__ __forceinline__ void next_item(int64_t it, int64_t items, Load&& load) {
  if (it + 1 < items) {
    load(it + 1, int((it + 1) & 1));
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    mma_forward_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                       const T* __restrict__ k, const T* __restrict__ v, Dims d, float scale) {
  constexpr int ld = kLd<kD>;
  ZT_SHARED_MEMORY(smem);
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK[2] = {sQ + kRows * ld, sQ + (kRows + kKeys) * ld};
  T* sV[2] = {sQ + (kRows + 2 * kKeys) * ld, sQ + (kRows + 3 * kKeys) * ld};
  const int warp = threadIdx.x >> 5;
  const Lane l;
  const int64_t qt = d.tiles(kRows) - 1 - blockIdx.x;  // the longest rows first
  const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / d.group(), q0 = qt * kRows;
  const int64_t kv_stride = d.Hkv * kD, tiles = (q0 + kRows - 1) / kKeys + 1;  // key tiles up to the diagonal
  auto load_kv = [&](int64_t kt, int buf) {
    const int64_t k0 = kt * kKeys, off = ((b * d.T + k0) * d.Hkv + kvh) * kD;
    load_tile_async<T, kD, kKeys>(sK[buf], k + off, kv_stride, d.T - k0);
    load_tile_async<T, kD, kKeys>(sV[buf], v + off, kv_stride, d.T - k0);
  };
  load_tile_async<T, kD, kRows>(sQ, q + ((b * d.T + q0) * d.Hq + h) * kD, d.Hq * kD, d.T - q0);
  load_kv(0, 0);
  cp_async_commit();
  uint32_t qa[kD / 16][4];
  float o[kD / 8][4];
  zero<kD / 8>(o);
  // Rows g and g + 8 of the warp: running max, and this lane's share of the running sum.
  float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f};
  const int64_t row0 = q0 + warp * 16 + l.g;

  for (int64_t kt = 0; kt < tiles; ++kt) {
    const int buf = int(kt & 1);
    next_item(kt, tiles, load_kv);
    if (kt == 0) load_rows_a<T, kD>(qa, sQ + warp * 16 * ld, l);
    const int64_t k0 = kt * kKeys;
    float s[kKeys / 8][4];
    scores<T, kD, kKeys>(s, qa, sK[buf], l);
    // Key k0 <= q0 <= every row's query: each row has a finite score in
    // every tile, so the max is finite and corr is 0 on the first tile.
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = k0 + n * 8 + 2 * l.t + (e & 1), qi = row0 + (e >> 1) * 8;
        s[n][e] = key <= qi && key < d.T ? s[n][e] * scale : -INFINITY;
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    float corr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(mx[r]));
      corr[r] = __expf(m[r] - m_new);
      m[r] = m_new;
      lsum[r] *= corr[r];
    }
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = __expf(s[n][e] - m[e >> 1]);
        lsum[e >> 1] += s[n][e];
      }
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      o[n][0] *= corr[0];
      o[n][1] *= corr[0];
      o[n][2] *= corr[1];
      o[n][3] *= corr[1];
    }
#pragma unroll
    for (int j = 0; j < kKeys / 16; ++j) {  // O += P V
      uint32_t pa[4];
      a_from_c<T>(pa, s[2 * j], s[2 * j + 1]);
      accumulate_cols<T, kD>(o, pa, sV[buf], j * 16, l);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float total = quad_sum(lsum[r]);
    const int64_t qi = row0 + 8 * r;
    if (qi < d.T) {
      store_row<T, kD>(out + ((b * d.T + qi) * d.Hq + h) * kD, o, r, 1.0f / total, l);
      if (l.t == 0) lse[(b * d.Hq + h) * d.T + qi] = m[r] + logf(total);
    }
  }
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    mma_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ dout, const T* __restrict__ q,
                    const T* __restrict__ k, const T* __restrict__ v, const float* __restrict__ lse,
                    const float* __restrict__ delta, Dims d, float scale) {
  constexpr int ld = kLd<kD>;
  ZT_SHARED_MEMORY(smem);
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kRows * ld;
  T* sQ[2] = {sV + kRows * ld, sV + (kRows + kQueries) * ld};
  T* sdO[2] = {sV + (kRows + 2 * kQueries) * ld, sV + (kRows + 3 * kQueries) * ld};
  float* stats = reinterpret_cast<float*>(sV + (kRows + 4 * kQueries) * ld);
  float* sL[2] = {stats, stats + kQueries};
  float* sDl[2] = {stats + 2 * kQueries, stats + 3 * kQueries};
  const int warp = threadIdx.x >> 5;
  const Lane l;
  const int64_t kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, k0 = kt * kRows;
  const int64_t kv_off = ((b * d.T + k0) * d.Hkv + kvh) * kD;
  // Items: (query head of the group, 32-query tile from the diagonal on);
  // queries before k0 see none of these keys.
  const int64_t qt0 = k0 / kQueries, per_head = d.tiles(kQueries) - qt0, items = d.group() * per_head;
  auto load_item = [&](int64_t it, int buf) {
    const int64_t h = kvh * d.group() + it / per_head, q0 = (qt0 + it % per_head) * kQueries;
    const int64_t q_off = ((b * d.T + q0) * d.Hq + h) * kD;
    load_tile_async<T, kD, kQueries>(sQ[buf], q + q_off, d.Hq * kD, d.T - q0);
    load_tile_async<T, kD, kQueries>(sdO[buf], dout + q_off, d.Hq * kD, d.T - q0);
    for (int c = threadIdx.x; c < kQueries; c += kThreads) {  // plain loads: read after the barrier
      const bool in = q0 + c < d.T;
      const int64_t row = (b * d.Hq + h) * d.T + q0 + c;
      sL[buf][c] = in ? lse[row] : 0.0f;
      sDl[buf][c] = in ? delta[row] : 0.0f;
    }
  };
  load_tile_async<T, kD, kRows>(sK, k + kv_off, d.Hkv * kD, d.T - k0);
  load_tile_async<T, kD, kRows>(sV, v + kv_off, d.Hkv * kD, d.T - k0);
  load_item(0, 0);
  cp_async_commit();
  uint32_t ka[kD / 16][4], va[kD / 16][4];  // the warp's 16 keys as A operands
  float dk_acc[kD / 8][4], dv_acc[kD / 8][4];
  zero<kD / 8>(dk_acc);
  zero<kD / 8>(dv_acc);
  const int64_t key0 = k0 + warp * 16 + l.g;  // the lane's keys: key0, key0 + 8

  for (int64_t it = 0; it < items; ++it) {
    const int buf = int(it & 1);
    next_item(it, items, load_item);
    if (it == 0) {
      load_rows_a<T, kD>(ka, sK + warp * 16 * ld, l);
      load_rows_a<T, kD>(va, sV + warp * 16 * ld, l);
    }
    const int64_t q0 = (qt0 + it % per_head) * kQueries;
    float st[kQueries / 8][4], dpt[kQueries / 8][4];  // S^T, dP^T: the warp's 16 keys x 32 queries
    scores<T, kD, kQueries>(st, ka, sQ[buf], l);
    scores<T, kD, kQueries>(dpt, va, sdO[buf], l);
#pragma unroll
    for (int n = 0; n < kQueries / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = n * 8 + 2 * l.t + (e & 1);
        const int64_t qi = q0 + c, key = key0 + (e >> 1) * 8;
        const float p = qi >= key && qi < d.T ? __expf(st[n][e] * scale - sL[buf][c]) : 0.0f;
        st[n][e] = p;                               // P^T
        dpt[n][e] = p * (dpt[n][e] - sDl[buf][c]);  // dS^T
      }
#pragma unroll
    for (int j = 0; j < kQueries / 16; ++j) {
      uint32_t pa[4], sa[4];
      a_from_c<T>(pa, st[2 * j], st[2 * j + 1]);
      a_from_c<T>(sa, dpt[2 * j], dpt[2 * j + 1]);
      accumulate_cols<T, kD>(dv_acc, pa, sdO[buf], j * 16, l);  // dV += P^T dO
      accumulate_cols<T, kD>(dk_acc, sa, sQ[buf], j * 16, l);   // dK += dS^T Q
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t key = key0 + 8 * r;
    if (key < d.T) {
      const int64_t row = ((b * d.T + key) * d.Hkv + kvh) * kD;
      store_row<T, kD>(dk + row, dk_acc, r, scale, l);
      store_row<T, kD>(dv + row, dv_acc, r, 1.0f, l);
    }
  }
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    mma_dq_kernel(T* __restrict__ dq, const T* __restrict__ dout, const T* __restrict__ q, const T* __restrict__ k,
                  const T* __restrict__ v, const float* __restrict__ lse, const float* __restrict__ delta, Dims d,
                  float scale) {
  constexpr int ld = kLd<kD>;
  ZT_SHARED_MEMORY(smem);
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kRows * ld;
  T* sK[2] = {sdO + kRows * ld, sdO + (kRows + kKeys) * ld};
  T* sV[2] = {sdO + (kRows + 2 * kKeys) * ld, sdO + (kRows + 3 * kKeys) * ld};
  const int warp = threadIdx.x >> 5;
  const Lane l;
  const int64_t qt = d.tiles(kRows) - 1 - blockIdx.x;  // the longest rows first
  const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / d.group(), q0 = qt * kRows;
  const int64_t q_off = ((b * d.T + q0) * d.Hq + h) * kD, kv_stride = d.Hkv * kD;
  const int64_t tiles = (q0 + kRows - 1) / kKeys + 1;  // key tiles up to the diagonal
  auto load_kv = [&](int64_t kt, int buf) {
    const int64_t k0 = kt * kKeys, off = ((b * d.T + k0) * d.Hkv + kvh) * kD;
    load_tile_async<T, kD, kKeys>(sK[buf], k + off, kv_stride, d.T - k0);
    load_tile_async<T, kD, kKeys>(sV[buf], v + off, kv_stride, d.T - k0);
  };
  load_tile_async<T, kD, kRows>(sQ, q + q_off, d.Hq * kD, d.T - q0);
  load_tile_async<T, kD, kRows>(sdO, dout + q_off, d.Hq * kD, d.T - q0);
  load_kv(0, 0);
  cp_async_commit();
  const int64_t row0 = q0 + warp * 16 + l.g;  // the lane's queries: row0, row0 + 8
  float L[2], Dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t qi = row0 + 8 * r;
    L[r] = qi < d.T ? lse[(b * d.Hq + h) * d.T + qi] : 0.0f;
    Dl[r] = qi < d.T ? delta[(b * d.Hq + h) * d.T + qi] : 0.0f;
  }
  uint32_t qa[kD / 16][4], oa[kD / 16][4];  // the warp's 16 queries of Q and dO as A operands
  float dq_acc[kD / 8][4];
  zero<kD / 8>(dq_acc);

  for (int64_t kt = 0; kt < tiles; ++kt) {
    const int buf = int(kt & 1);
    next_item(kt, tiles, load_kv);
    if (kt == 0) {
      load_rows_a<T, kD>(qa, sQ + warp * 16 * ld, l);
      load_rows_a<T, kD>(oa, sdO + warp * 16 * ld, l);
    }
    const int64_t k0 = kt * kKeys;
    float s[kKeys / 8][4], dp[kKeys / 8][4];
    scores<T, kD, kKeys>(s, qa, sK[buf], l);   // S = Q K^T
    scores<T, kD, kKeys>(dp, oa, sV[buf], l);  // dP = dO V^T
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t key = k0 + n * 8 + 2 * l.t + (e & 1), qi = row0 + 8 * r;
        const float p = key <= qi && qi < d.T ? __expf(s[n][e] * scale - L[r]) : 0.0f;
        dp[n][e] = p * (dp[n][e] - Dl[r]);  // dS
      }
#pragma unroll
    for (int j = 0; j < kKeys / 16; ++j) {  // dQ += dS K
      uint32_t da[4];
      a_from_c<T>(da, dp[2 * j], dp[2 * j + 1]);
      accumulate_cols<T, kD>(dq_acc, da, sK[buf], j * 16, l);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t qi = row0 + 8 * r;
    if (qi < d.T) store_row<T, kD>(dq + ((b * d.T + qi) * d.Hq + h) * kD, dq_acc, r, scale, l);
  }
}

// The three kernels and their shared memory (bytes): what the launcher
// (attention_launch.cuh) and the warp emulator's tests need.
template <typename T, int kD>
struct Kernels {
  static auto forward() { return &mma_forward_kernel<T, kD>; }
  static auto dkdv() { return &mma_dkdv_kernel<T, kD>; }
  static auto dq() { return &mma_dq_kernel<T, kD>; }
  static constexpr size_t forward_bytes = mma_attention::forward_bytes<kD>(sizeof(T));
  static constexpr size_t dkdv_bytes = mma_attention::dkdv_bytes<kD>(sizeof(T));
  static constexpr size_t dq_bytes = mma_attention::dq_bytes<kD>(sizeof(T));
  static constexpr int block_rows = kRows;  // query rows (forward, dQ) or keys (dK dV) per block
};

}  // namespace zt::cuda::mma_attention
