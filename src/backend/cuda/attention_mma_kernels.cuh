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
// Shared memory holds only the operand tiles (rows padded by 16 bytes).
// Head dims 16, 32, 64, 128; attention.cu chooses.
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
// kernels on the CPU: it defines ZT_WARP_EMULATION and provides mma, the
// shuffles, the barriers and the block's shared memory.
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

template <int kD>
constexpr size_t forward_bytes(size_t es) { return size_t(kRows + 2 * kKeys) * kLd<kD> * es; }
template <int kD>
constexpr size_t dkdv_bytes(size_t es) { return size_t(2 * kRows + 2 * kQueries) * kLd<kD> * es + 2 * kQueries * 4; }
template <int kD>
constexpr size_t dq_bytes(size_t es) { return size_t(2 * kRows + 2 * kKeys) * kLd<kD> * es; }

struct Lane {
  int g, t;
  __device__ Lane() : g((threadIdx.x & 31) >> 2), t(threadIdx.x & 3) {}
};

#if ZT_WARP_EMULATION
using ::zt::emu::mma;  // the emulator's warp-collective product with the same fragment layouts
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

template <typename T>
__device__ __forceinline__ uint32_t lds32(const T* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The A fragment of the 16 x 16 block at column k0 of 16 shared rows m.
template <typename T, int kD>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* m, int k0, const Lane& l) {
  constexpr int ld = kLd<kD>;
  a[0] = lds32(m + l.g * ld + k0 + 2 * l.t);
  a[1] = lds32(m + (l.g + 8) * ld + k0 + 2 * l.t);
  a[2] = lds32(m + l.g * ld + k0 + 8 + 2 * l.t);
  a[3] = lds32(m + (l.g + 8) * ld + k0 + 8 + 2 * l.t);
}

// The B fragment B[k][n] = M[n0 + n][k0 + k]: M's rows are B's columns
// (K in S = Q K^T, Q in S^T = K Q^T).
template <typename T, int kD>
__device__ __forceinline__ void load_b_rows(uint32_t (&b)[2], const T* m, int n0, int k0, const Lane& l) {
  const T* r = m + (n0 + l.g) * kLd<kD> + k0 + 2 * l.t;
  b[0] = lds32(r);
  b[1] = lds32(r + 8);
}

// The B fragment B[k][n] = M[k0 + k][n0 + n]: M's rows are B's rows (V in
// O = P V, dO and Q in dV = P^T dO and dK = dS^T Q, K in dQ = dS K).
template <typename T, int kD>
__device__ __forceinline__ void load_b_cols(uint32_t (&b)[2], const T* m, int k0, int n0, const Lane& l) {
  constexpr int ld = kLd<kD>;
  const uint16_t* u = reinterpret_cast<const uint16_t*>(m) + (k0 + 2 * l.t) * ld + n0 + l.g;
  b[0] = uint32_t(u[0]) | (uint32_t(u[ld]) << 16);
  b[1] = uint32_t(u[8 * ld]) | (uint32_t(u[9 * ld]) << 16);
}

// The A fragment of k-step j from the C fragments of n-tiles 2j and 2j+1.
template <typename T>
__device__ __forceinline__ void a_from_c(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack<T>(c0[0], c0[1]);
  a[1] = pack<T>(c0[2], c0[3]);
  a[2] = pack<T>(c1[0], c1[1]);
  a[3] = pack<T>(c1[2], c1[3]);
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

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    mma_forward_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                       const T* __restrict__ k, const T* __restrict__ v, Dims d, float scale) {
  constexpr int ld = kLd<kD>;
  ZT_SHARED_MEMORY(smem);
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kRows * ld;
  T* sV = sK + kKeys * ld;
  const int warp = threadIdx.x >> 5;
  const Lane l;
  const int64_t qt = d.tiles(kRows) - 1 - blockIdx.x;  // the longest rows first
  const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / d.group(), q0 = qt * kRows;
  attn::load_tile<T, kD, kRows>(sQ, ld, q + ((b * d.T + q0) * d.Hq + h) * kD, d.Hq * kD, d.T - q0);
  __syncthreads();
  uint32_t qa[kD / 16][4];
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) load_a<T, kD>(qa[kk], sQ + warp * 16 * ld, kk * 16, l);
  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // Rows g and g + 8 of the warp: running max, and this lane's share of the running sum.
  float m[2] = {-INFINITY, -INFINITY}, lsum[2] = {0.0f, 0.0f};
  const int64_t row0 = q0 + warp * 16 + l.g;

  for (int64_t kt = 0; kt * kKeys <= q0 + kRows - 1 && kt * kKeys < d.T; ++kt) {
    const int64_t k0 = kt * kKeys;
    __syncthreads();  // every warp is done with the previous K, V
    attn::load_tile<T, kD, kKeys>(sK, ld, k + ((b * d.T + k0) * d.Hkv + kvh) * kD, d.Hkv * kD, d.T - k0);
    attn::load_tile<T, kD, kKeys>(sV, ld, v + ((b * d.T + k0) * d.Hkv + kvh) * kD, d.Hkv * kD, d.T - k0);
    __syncthreads();
    float s[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t bk[2];
        load_b_rows<T, kD>(bk, sK, n * 8, kk * 16, l);
        mma<T>(s[n], qa[kk], bk);
      }
    }
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
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        uint32_t bv[2];
        load_b_cols<T, kD>(bv, sV, j * 16, n * 8, l);
        mma<T>(o[n], pa, bv);
      }
    }
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
  T* sQ = sV + kRows * ld;
  T* sdO = sQ + kQueries * ld;
  float* sL = reinterpret_cast<float*>(sdO + kQueries * ld);
  float* sDl = sL + kQueries;
  const int warp = threadIdx.x >> 5;
  const Lane l;
  const int64_t kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, k0 = kt * kRows;
  const int64_t kv_off = ((b * d.T + k0) * d.Hkv + kvh) * kD;
  attn::load_tile<T, kD, kRows>(sK, ld, k + kv_off, d.Hkv * kD, d.T - k0);
  attn::load_tile<T, kD, kRows>(sV, ld, v + kv_off, d.Hkv * kD, d.T - k0);
  const T* kw = sK + warp * 16 * ld;
  const T* vw = sV + warp * 16 * ld;
  float dk_acc[kD / 8][4], dv_acc[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.0f;
  const int64_t key0 = k0 + warp * 16 + l.g;  // the lane's keys: key0, key0 + 8

  for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
    for (int64_t qt = k0 / kQueries; qt < d.tiles(kQueries); ++qt) {  // queries before k0 see none of these keys
      const int64_t q0 = qt * kQueries, q_off = ((b * d.T + q0) * d.Hq + h) * kD;
      __syncthreads();  // every warp is done with the previous Q, dO, lse, delta
      attn::load_tile<T, kD, kQueries>(sQ, ld, q + q_off, d.Hq * kD, d.T - q0);
      attn::load_tile<T, kD, kQueries>(sdO, ld, dout + q_off, d.Hq * kD, d.T - q0);
      for (int c = threadIdx.x; c < kQueries; c += kThreads) {
        const bool in = q0 + c < d.T;
        const int64_t row = (b * d.Hq + h) * d.T + q0 + c;
        sL[c] = in ? lse[row] : 0.0f;
        sDl[c] = in ? delta[row] : 0.0f;
      }
      __syncthreads();
      float st[kQueries / 8][4], dpt[kQueries / 8][4];  // S^T, dP^T: the warp's 16 keys x 32 queries
#pragma unroll
      for (int n = 0; n < kQueries / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[n][e] = dpt[n][e] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk) {
        uint32_t ka[4], va[4];
        load_a<T, kD>(ka, kw, kk * 16, l);
        load_a<T, kD>(va, vw, kk * 16, l);
#pragma unroll
        for (int n = 0; n < kQueries / 8; ++n) {
          uint32_t bq[2], bo[2];
          load_b_rows<T, kD>(bq, sQ, n * 8, kk * 16, l);
          mma<T>(st[n], ka, bq);
          load_b_rows<T, kD>(bo, sdO, n * 8, kk * 16, l);
          mma<T>(dpt[n], va, bo);
        }
      }
#pragma unroll
      for (int n = 0; n < kQueries / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n * 8 + 2 * l.t + (e & 1);
          const int64_t qi = q0 + c, key = key0 + (e >> 1) * 8;
          const float p = qi >= key && qi < d.T ? __expf(st[n][e] * scale - sL[c]) : 0.0f;
          st[n][e] = p;                          // P^T
          dpt[n][e] = p * (dpt[n][e] - sDl[c]);  // dS^T
        }
#pragma unroll
      for (int j = 0; j < kQueries / 16; ++j) {
        uint32_t pa[4], sa[4];
        a_from_c<T>(pa, st[2 * j], st[2 * j + 1]);
        a_from_c<T>(sa, dpt[2 * j], dpt[2 * j + 1]);
#pragma unroll
        for (int n = 0; n < kD / 8; ++n) {
          uint32_t bo[2], bq[2];
          load_b_cols<T, kD>(bo, sdO, j * 16, n * 8, l);
          mma<T>(dv_acc[n], pa, bo);  // dV += P^T dO
          load_b_cols<T, kD>(bq, sQ, j * 16, n * 8, l);
          mma<T>(dk_acc[n], sa, bq);  // dK += dS^T Q
        }
      }
    }
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
  T* sK = sdO + kRows * ld;
  T* sV = sK + kKeys * ld;
  const int warp = threadIdx.x >> 5;
  const Lane l;
  const int64_t qt = d.tiles(kRows) - 1 - blockIdx.x;  // the longest rows first
  const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / d.group(), q0 = qt * kRows;
  const int64_t q_off = ((b * d.T + q0) * d.Hq + h) * kD;
  attn::load_tile<T, kD, kRows>(sQ, ld, q + q_off, d.Hq * kD, d.T - q0);
  attn::load_tile<T, kD, kRows>(sdO, ld, dout + q_off, d.Hq * kD, d.T - q0);
  const int64_t row0 = q0 + warp * 16 + l.g;  // the lane's queries: row0, row0 + 8
  float L[2], Dl[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t qi = row0 + 8 * r;
    L[r] = qi < d.T ? lse[(b * d.Hq + h) * d.T + qi] : 0.0f;
    Dl[r] = qi < d.T ? delta[(b * d.Hq + h) * d.T + qi] : 0.0f;
  }
  float dq_acc[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) dq_acc[n][0] = dq_acc[n][1] = dq_acc[n][2] = dq_acc[n][3] = 0.0f;
  const T* qw = sQ + warp * 16 * ld;
  const T* ow = sdO + warp * 16 * ld;

  for (int64_t kt = 0; kt * kKeys <= q0 + kRows - 1 && kt * kKeys < d.T; ++kt) {
    const int64_t k0 = kt * kKeys, kv_off = ((b * d.T + k0) * d.Hkv + kvh) * kD;
    __syncthreads();  // every warp is done with the previous K, V (and Q, dO are loaded)
    attn::load_tile<T, kD, kKeys>(sK, ld, k + kv_off, d.Hkv * kD, d.T - k0);
    attn::load_tile<T, kD, kKeys>(sV, ld, v + kv_off, d.Hkv * kD, d.T - k0);
    __syncthreads();
    float s[kKeys / 8][4], dp[kKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      uint32_t qa[4], oa[4];
      load_a<T, kD>(qa, qw, kk * 16, l);
      load_a<T, kD>(oa, ow, kk * 16, l);
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n) {
        uint32_t bk[2], bv[2];
        load_b_rows<T, kD>(bk, sK, n * 8, kk * 16, l);
        mma<T>(s[n], qa, bk);  // S = Q K^T
        load_b_rows<T, kD>(bv, sV, n * 8, kk * 16, l);
        mma<T>(dp[n], oa, bv);  // dP = dO V^T
      }
    }
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
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        uint32_t bk[2];
        load_b_cols<T, kD>(bk, sK, j * 16, n * 8, l);
        mma<T>(dq_acc[n], da, bk);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t qi = row0 + 8 * r;
    if (qi < d.T) store_row<T, kD>(dq + ((b * d.T + qi) * d.Hq + h) * kD, dq_acc, r, scale, l);
  }
}

}  // namespace zt::cuda::mma_attention
