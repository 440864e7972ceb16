// The kernels of attention_flash.cu: CUDA causal GQA attention as one fused kernel per pass (the
// FlashAttention-2 schedule) on tensor cores through WMMA: the (T, T) score
// and probability matrices never reach global memory.
//
// forward   one block per (query tile of 64 rows, query head, batch row);
//           4 warps own 16 query rows each. For each key tile up to the
//           diagonal: S = Q K^T (f32 accumulators, to the warp's shared
//           scratch), the online softmax by lanes (running max m and sum l
//           per row; P rounded to the model dtype), O = corr O + P V with O
//           kept in shared f32. Writes O / l and lse = m + log l.
// backward  delta = rowsum(dO * O) (attention.cu), then two kernels, so that
//           every output element is summed by one warp in a fixed order
//           (deterministic, no atomics):
//   dK, dV  one block per (key tile, kv head, batch row); warps own 16 keys
//           and walk the group's query heads and the query tiles at or below
//           the diagonal: S^T = K Q^T, dP^T = V dO^T, P^T = exp(scale S^T -
//           lse), dS^T = P^T (dP^T - delta); dV += P^T dO, dK += dS^T Q in
//           accumulator fragments; dK scaled once at the end.
//   dQ      one block per (query tile, query head, batch row); walks the key
//           tiles to the diagonal: S and dP again, dQ += dS K.
//           Recomputing S and dP here costs 2 of 7 products (FlashAttention-2
//           does 5 and sums dQ with atomics): the price of determinism.
// Operands bf16 or f16 (WMMA), accumulation f32; head dims 16, 32, 64, 128.
// Other shapes and f32 go to the gemm path or the simple kernel (attention.cu
// chooses). Staging S and O through shared memory keeps the code free of the
// accumulator fragments' unspecified element layout.
//
// Layouts as attention.h: q, out, dq, dout (B, T, Hq, D); k, v, dk, dv
// (B, T, Hkv, D); lse, delta (B, Hq, T) f32.
//
// A header so that the warp emulator (tests/cuda_emu) can run these very
// kernels on the CPU: under ZT_WARP_EMULATION, `wmma` is its tile-level
// model of the WMMA API (the kernels never touch fragment elements).
#pragma once

#include <cstdint>

#include "backend/cuda/attention_tiles.cuh"

#if ZT_WARP_EMULATION
namespace zt::cuda::wmma_attention {
namespace wmma = ::zt::emu::wmma;
}
#else
#include <mma.h>
namespace zt::cuda::wmma_attention {
namespace wmma = nvcuda::wmma;
}
#endif

namespace zt::cuda::wmma_attention {

using attn::Dims;
using attn::kThreads;
using attn::kWarps;

constexpr int kTile = 64;             // rows of a query or key tile
constexpr int kM = 16;                // WMMA fragment edge (m = n = k = 16)

// Shared-memory geometry (elements, bytes). Rows are padded so that
// consecutive rows start in different banks; every region and every
// fragment start stays 32-byte aligned, as WMMA requires.
template <typename T, int kD>
struct Geometry {
  static constexpr int ldt = kD + 8;                  // (64, D) operand tiles
  static constexpr int ldp = kTile + 8;               // (16, 64) per-warp P or dS
  static constexpr int ldf = (kD > kTile ? kD : kTile) + 4;  // (16, 64) scores or (16, D) rows, f32
  static constexpr size_t tile_bytes = size_t(kTile) * ldt * sizeof(T);
  static constexpr size_t f32_bytes = size_t(kM) * ldf * sizeof(float);
  static constexpr size_t p_bytes = size_t(kM) * ldp * sizeof(T);
  static constexpr size_t row_stats_bytes = 2 * kTile * sizeof(float);  // lse, delta of a query tile
  // forward: Q, K, V tiles; per warp S, O (f32) and P
  static constexpr size_t forward_bytes = 3 * tile_bytes + kWarps * (2 * f32_bytes + p_bytes);
  // dK dV: K, V, Q, dO tiles, lse and delta; per warp S^T, dP^T (f32), P^T, dS^T
  static constexpr size_t dkdv_bytes = 4 * tile_bytes + row_stats_bytes + kWarps * (2 * f32_bytes + 2 * p_bytes);
  // dQ: Q, dO, K, V tiles; per warp S, dP (f32) and dS
  static constexpr size_t dq_bytes = 4 * tile_bytes + kWarps * (2 * f32_bytes + p_bytes);
  static_assert(kD % kM == 0 && tile_bytes % 128 == 0 && f32_bytes % 128 == 0 && p_bytes % 128 == 0);
};

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, kM, kM, kM, T, wmma::row_major>;
template <typename T, typename Layout>
using FragB = wmma::fragment<wmma::matrix_b, kM, kM, kM, T, Layout>;
using FragAcc = wmma::fragment<wmma::accumulator, kM, kM, kM, float>;

template <typename T, int kD>
__device__ __forceinline__ void load_tile(T* __restrict__ dst, const T* __restrict__ src, int64_t stride,
                                          int64_t valid) {
  attn::load_tile<T, kD, kTile>(dst, Geometry<T, kD>::ldt, src, stride, valid);
}

// out (16, 64) f32 = A B^T: A the warp's (16, D) rows at `a` (in a tile),
// B a (64, D) tile.
template <typename T, int kD>
__device__ __forceinline__ void product_abt(float* out, const T* a, const T* b) {
  using G = Geometry<T, kD>;
#pragma unroll
  for (int n = 0; n < kTile / kM; ++n) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int c = 0; c < kD / kM; ++c) {
      FragA<T> fa;
      FragB<T, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + c * kM, G::ldt);
      wmma::load_matrix_sync(fb, b + n * kM * G::ldt + c * kM, G::ldt);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * kM, acc, G::ldf, wmma::mem_row_major);
  }
}

// acc[n] += A B for the n-th 16 columns: A the warp's (16, 64) P or dS rows,
// B a (64, D) tile.
template <typename T, int kD>
__device__ __forceinline__ void accumulate_ab(FragAcc (&acc)[kD / kM], const T* a, const T* b) {
  using G = Geometry<T, kD>;
#pragma unroll
  for (int c = 0; c < kTile / kM; ++c) {
    FragA<T> fa;
    wmma::load_matrix_sync(fa, a + c * kM, G::ldp);
#pragma unroll
    for (int n = 0; n < kD / kM; ++n) {
      FragB<T, wmma::row_major> fb;
      wmma::load_matrix_sync(fb, b + c * kM * G::ldt + n * kM, G::ldt);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Lanes split the warp's 16 rows two to a row: lane 2r + half takes row r,
// columns half, half + 2, ... (interleaved: the pair hits adjacent banks).
struct LaneRow {
  int r, half;
  __device__ LaneRow() : r((threadIdx.x & 31) >> 1), half(threadIdx.x & 1) {}
};

// Writes `mul` x the lane's half of row r of the (16, D) f32 scratch to
// dst (the row's D contiguous elements in global memory).
template <typename T, int kD>
__device__ __forceinline__ void write_row(T* __restrict__ dst, const float* scratch, const LaneRow& lr, float mul) {
  const float* row = scratch + lr.r * Geometry<T, kD>::ldf;
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) {
    const int c = 2 * i + lr.half;
    dst[c] = from_f32<T>(row[c] * mul);
  }
}

// Stores the accumulators, times `mul`, as the warp's (16, D) output rows
// through the f32 scratch: each lane writes its half of its row to dst (the
// row's place in global memory) when the row exists (keep).
template <typename T, int kD>
__device__ __forceinline__ void store_rows(FragAcc (&acc)[kD / kM], float* scratch, float mul, const LaneRow& lr,
                                           bool keep, T* dst) {
  using G = Geometry<T, kD>;
#pragma unroll
  for (int n = 0; n < kD / kM; ++n) wmma::store_matrix_sync(scratch + n * kM, acc[n], G::ldf, wmma::mem_row_major);
  __syncwarp();
  if (keep) write_row<T, kD>(dst, scratch, lr, mul);
  __syncwarp();
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(T* __restrict__ out, float* __restrict__ lse, const T* __restrict__ q,
                         const T* __restrict__ k, const T* __restrict__ v, Dims d, float scale) {
  using G = Geometry<T, kD>;
  ZT_SHARED_MEMORY(smem);
  const int warp = threadIdx.x >> 5;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = reinterpret_cast<T*>(smem + G::tile_bytes);
  T* sV = reinterpret_cast<T*>(smem + 2 * G::tile_bytes);
  unsigned char* mine = smem + 3 * G::tile_bytes + warp * (2 * G::f32_bytes + G::p_bytes);
  float* sS = reinterpret_cast<float*>(mine);
  float* sO = reinterpret_cast<float*>(mine + G::f32_bytes);
  T* sP = reinterpret_cast<T*>(mine + 2 * G::f32_bytes);

  const int64_t qt = d.tiles(kTile) - 1 - blockIdx.x;  // the longest rows first
  const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / d.group(), q0 = qt * kTile;
  load_tile<T, kD>(sQ, q + ((b * d.T + q0) * d.Hq + h) * kD, d.Hq * kD, d.T - q0);
  const LaneRow lr;
  for (int e = threadIdx.x & 31; e < kM * G::ldf; e += 32) sO[e] = 0.0f;
  const int64_t qi = q0 + warp * kM + lr.r;  // the lane's query
  float m = -INFINITY, l = 0.0f;             // running max and sum of the row

  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();  // every warp is done with the previous K, V (and Q is loaded)
    load_tile<T, kD>(sK, k + ((b * d.T + k0) * d.Hkv + kvh) * kD, d.Hkv * kD, d.T - k0);
    load_tile<T, kD>(sV, v + ((b * d.T + k0) * d.Hkv + kvh) * kD, d.Hkv * kD, d.T - k0);
    __syncthreads();
    product_abt<T, kD>(sS, sQ + warp * kM * G::ldt, sK);  // S = Q K^T
    __syncwarp();
    // Online softmax. Key k0 <= q0 <= qi exists, so every row has a finite
    // score in every tile and m stays finite after the first.
    const float* srow = sS + lr.r * G::ldf;
    float s[kTile / 2];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kTile / 2; ++i) {
      const int c = 2 * i + lr.half;
      const int64_t key = k0 + c;
      s[i] = key <= qi && key < d.T ? srow[c] * scale : -INFINITY;
      mx = fmaxf(mx, s[i]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    const float corr = __expf(m - m_new);  // 0 on the first tile
    T* prow = sP + lr.r * G::ldp;
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kTile / 2; ++i) {
      const float p = __expf(s[i] - m_new);
      sum += p;
      prow[2 * i + lr.half] = from_f32<T>(p);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * corr + sum;
    m = m_new;
    float* orow = sO + lr.r * G::ldf;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) orow[2 * i + lr.half] *= corr;
    __syncwarp();
    FragAcc o[kD / kM];  // O += P V
#pragma unroll
    for (int n = 0; n < kD / kM; ++n) wmma::load_matrix_sync(o[n], sO + n * kM, G::ldf, wmma::mem_row_major);
    accumulate_ab<T, kD>(o, sP, sV);
#pragma unroll
    for (int n = 0; n < kD / kM; ++n) wmma::store_matrix_sync(sO + n * kM, o[n], G::ldf, wmma::mem_row_major);
    __syncwarp();
  }
  if (qi < d.T) {
    write_row<T, kD>(out + ((b * d.T + qi) * d.Hq + h) * kD, sO, lr, 1.0f / l);
    if (lr.half == 0) lse[(b * d.Hq + h) * d.T + qi] = m + logf(l);
  }
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_dkdv_kernel(T* __restrict__ dk, T* __restrict__ dv, const T* __restrict__ dout, const T* __restrict__ q,
                      const T* __restrict__ k, const T* __restrict__ v, const float* __restrict__ lse,
                      const float* __restrict__ delta, Dims d, float scale) {
  using G = Geometry<T, kD>;
  ZT_SHARED_MEMORY(smem);
  const int warp = threadIdx.x >> 5;
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = reinterpret_cast<T*>(smem + G::tile_bytes);
  T* sQ = reinterpret_cast<T*>(smem + 2 * G::tile_bytes);
  T* sdO = reinterpret_cast<T*>(smem + 3 * G::tile_bytes);
  float* sLse = reinterpret_cast<float*>(smem + 4 * G::tile_bytes);
  float* sDelta = sLse + kTile;
  unsigned char* mine = smem + 4 * G::tile_bytes + G::row_stats_bytes + warp * (2 * G::f32_bytes + 2 * G::p_bytes);
  float* sS = reinterpret_cast<float*>(mine);
  float* sdP = reinterpret_cast<float*>(mine + G::f32_bytes);
  T* sP = reinterpret_cast<T*>(mine + 2 * G::f32_bytes);
  T* sdS = reinterpret_cast<T*>(mine + 2 * G::f32_bytes + G::p_bytes);

  const int64_t kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, k0 = kt * kTile;
  const int64_t kv_off = ((b * d.T + k0) * d.Hkv + kvh) * kD;
  load_tile<T, kD>(sK, k + kv_off, d.Hkv * kD, d.T - k0);
  load_tile<T, kD>(sV, v + kv_off, d.Hkv * kD, d.T - k0);
  const LaneRow lr;
  const int64_t key = k0 + warp * kM + lr.r;  // the lane's key
  FragAcc dk_acc[kD / kM], dv_acc[kD / kM];
#pragma unroll
  for (int n = 0; n < kD / kM; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.0f);
    wmma::fill_fragment(dv_acc[n], 0.0f);
  }
  for (int64_t h = kvh * d.group(); h < (kvh + 1) * d.group(); ++h) {
    for (int64_t qt = kt; qt < d.tiles(kTile); ++qt) {
      const int64_t q0 = qt * kTile, q_off = ((b * d.T + q0) * d.Hq + h) * kD;
      __syncthreads();  // every warp is done with the previous Q, dO, lse, delta
      load_tile<T, kD>(sQ, q + q_off, d.Hq * kD, d.T - q0);
      load_tile<T, kD>(sdO, dout + q_off, d.Hq * kD, d.T - q0);
      for (int t = threadIdx.x; t < kTile; t += kThreads) {
        const bool in = q0 + t < d.T;
        const int64_t row = (b * d.Hq + h) * d.T + q0 + t;
        sLse[t] = in ? lse[row] : 0.0f;
        sDelta[t] = in ? delta[row] : 0.0f;
      }
      __syncthreads();
      product_abt<T, kD>(sS, sK + warp * kM * G::ldt, sQ);    // S^T = K Q^T
      product_abt<T, kD>(sdP, sV + warp * kM * G::ldt, sdO);  // dP^T = V dO^T
      __syncwarp();
      const float* srow = sS + lr.r * G::ldf;
      const float* dprow = sdP + lr.r * G::ldf;
#pragma unroll
      for (int i = 0; i < kTile / 2; ++i) {
        const int c = 2 * i + lr.half;
        const int64_t qi = q0 + c;
        const float p = qi >= key && qi < d.T ? __expf(srow[c] * scale - sLse[c]) : 0.0f;
        sP[lr.r * G::ldp + c] = from_f32<T>(p);
        sdS[lr.r * G::ldp + c] = from_f32<T>(p * (dprow[c] - sDelta[c]));
      }
      __syncwarp();
      accumulate_ab<T, kD>(dv_acc, sP, sdO);  // dV += P^T dO
      accumulate_ab<T, kD>(dk_acc, sdS, sQ);  // dK += dS^T Q
    }
  }
  const bool keep = key < d.T;
  const int64_t row = ((b * d.T + key) * d.Hkv + kvh) * kD;
  store_rows<T, kD>(dk_acc, sS, scale, lr, keep, dk + row);
  store_rows<T, kD>(dv_acc, sS, 1.0f, lr, keep, dv + row);
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads)
    flash_dq_kernel(T* __restrict__ dq, const T* __restrict__ dout, const T* __restrict__ q,
                    const T* __restrict__ k, const T* __restrict__ v, const float* __restrict__ lse,
                    const float* __restrict__ delta, Dims d, float scale) {
  using G = Geometry<T, kD>;
  ZT_SHARED_MEMORY(smem);
  const int warp = threadIdx.x >> 5;
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = reinterpret_cast<T*>(smem + G::tile_bytes);
  T* sK = reinterpret_cast<T*>(smem + 2 * G::tile_bytes);
  T* sV = reinterpret_cast<T*>(smem + 3 * G::tile_bytes);
  unsigned char* mine = smem + 4 * G::tile_bytes + warp * (2 * G::f32_bytes + G::p_bytes);
  float* sS = reinterpret_cast<float*>(mine);
  float* sdP = reinterpret_cast<float*>(mine + G::f32_bytes);
  T* sdS = reinterpret_cast<T*>(mine + 2 * G::f32_bytes);

  const int64_t qt = d.tiles(kTile) - 1 - blockIdx.x;  // the longest rows first
  const int64_t h = blockIdx.y, b = blockIdx.z, kvh = h / d.group(), q0 = qt * kTile;
  const int64_t q_off = ((b * d.T + q0) * d.Hq + h) * kD;
  load_tile<T, kD>(sQ, q + q_off, d.Hq * kD, d.T - q0);
  load_tile<T, kD>(sdO, dout + q_off, d.Hq * kD, d.T - q0);
  const LaneRow lr;
  const int64_t qi = q0 + warp * kM + lr.r;  // the lane's query
  const bool in = qi < d.T;
  const float L = in ? lse[(b * d.Hq + h) * d.T + qi] : 0.0f;
  const float dl = in ? delta[(b * d.Hq + h) * d.T + qi] : 0.0f;
  FragAcc dq_acc[kD / kM];
#pragma unroll
  for (int n = 0; n < kD / kM; ++n) wmma::fill_fragment(dq_acc[n], 0.0f);
  for (int64_t kt = 0; kt <= qt; ++kt) {
    const int64_t k0 = kt * kTile, kv_off = ((b * d.T + k0) * d.Hkv + kvh) * kD;
    __syncthreads();  // every warp is done with the previous K, V (and Q, dO are loaded)
    load_tile<T, kD>(sK, k + kv_off, d.Hkv * kD, d.T - k0);
    load_tile<T, kD>(sV, v + kv_off, d.Hkv * kD, d.T - k0);
    __syncthreads();
    product_abt<T, kD>(sS, sQ + warp * kM * G::ldt, sK);    // S = Q K^T
    product_abt<T, kD>(sdP, sdO + warp * kM * G::ldt, sV);  // dP = dO V^T
    __syncwarp();
    const float* srow = sS + lr.r * G::ldf;
    const float* dprow = sdP + lr.r * G::ldf;
#pragma unroll
    for (int i = 0; i < kTile / 2; ++i) {
      const int c = 2 * i + lr.half;
      const float p = in && k0 + c <= qi ? __expf(srow[c] * scale - L) : 0.0f;
      sdS[lr.r * G::ldp + c] = from_f32<T>(p * (dprow[c] - dl));
    }
    __syncwarp();
    accumulate_ab<T, kD>(dq_acc, sdS, sK);  // dQ += dS K
  }
  store_rows<T, kD>(dq_acc, sS, scale, lr, in, dq + ((b * d.T + qi) * d.Hq + h) * kD);
}

// The three kernels and their shared memory (bytes): what the launcher
// (attention_launch.cuh) and the warp emulator's tests need.
template <typename T, int kD>
struct Kernels {
  static auto forward() { return &flash_forward_kernel<T, kD>; }
  static auto dkdv() { return &flash_dkdv_kernel<T, kD>; }
  static auto dq() { return &flash_dq_kernel<T, kD>; }
  static constexpr size_t forward_bytes = Geometry<T, kD>::forward_bytes;
  static constexpr size_t dkdv_bytes = Geometry<T, kD>::dkdv_bytes;
  static constexpr size_t dq_bytes = Geometry<T, kD>::dq_bytes;
  static constexpr int block_rows = kTile;  // query rows (forward, dQ) or keys (dK dV) per block
};

}  // namespace zt::cuda::wmma_attention

