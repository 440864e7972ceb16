// The kernel of cross_entropy.cu (the fused classifier): a block per row at a
// time, the blocks striding over the rows; pass 1 is an online max/sum over
// the real vocabulary (per thread, then merged across the block), pass 2
// writes dlogits = (softmax - onehot) * grad_scale (in place allowed: each
// element is read before the same thread overwrites it). No probability
// matrix is stored. The vocabulary-parallel passes (ops/cross_entropy.h: max,
// then exp sums and the target logit, then losses and dlogits, the caller
// reducing over the tensor-parallel group in between) are one block per row
// each.
//
// R, the rows in flight per SM, trades latency hiding for L2 reuse. Between
// a row's passes its block stops to reduce across its warps; the other R - 1
// blocks on the SM keep loading meanwhile. Pass 2 re-reads the row: from the
// L2 when the R x SMs rows in flight fit there (4 bytes moved per bf16
// element), else from device memory (6). Measured (bench/results/): R = 1
// with 4 packs ahead per thread ran at 31-34% of the H200's copy rate; the
// kernel before it (a block per row, 4 resident per SM, a pack per thread:
// R = 4's occupancy) at about 93% of the H100's, counting 6 bytes. The
// kernel bench times every R (cross_entropy_fused_rows<R>).
//
// ce_staged_kernel moves the minimum, 4 bytes per bf16 element, whatever the
// L2 holds: a block stages its row's first packs in shared memory with
// cp.async (the whole row where it fits: GPT-2's 98 KiB; 224 KiB of Llama's
// 250.5), and both passes read them there; packs past those (the tail) come
// from memory in each pass. Each thread stages and alone reads the packs it
// sums (t, t + kThreads, ...), so no barrier guards them, and pass 2 refills
// each pack's slot with the block's next row right after reading it: the next
// row's loads stream in under this row's writes and reductions. Its bits are
// ce_kernel's (the same order of packs per thread, the same block sums; the
// sums' and dlogits' multiplies and adds are rounded intrinsics, which the
// compiler cannot contract into FMAs one way in one kernel and another way in
// the next).
//
// Rows are swept in packs of V elements (V = 1, or kPack16<T> when the launch
// checked that 16-byte packs tile the rows: one 128-bit memory instruction
// per pack; a GPT-2 row of 50304 bf16 is 6288 packs). The last real column
// need not end a pack: columns past it are masked. A header so that the warp
// emulator (tests/cuda_emu) runs them on the CPU.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::ce_kernels {

constexpr int kThreads = 512;
// R's choices: blocks of kThreads resident per SM (the register budget of
// __launch_bounds__: 128, 64 or 32 a thread), each thread 4 / R packs' loads
// ahead (16 bytes each), so 32 KiB of loads in flight per SM at any R.
// The default is ClassifierKernel's (cross_entropy.h).
constexpr int kRowsPerSmChoices[] = {1, 2, 4};
constexpr int packs_ahead(int rows_per_sm) { return 4 / rows_per_sm; }

// ce_kernel's grid at R rows per SM: R blocks per SM, no more than the rows.
// Bits do not depend on it: a row is one block's work.
inline unsigned ce_grid(int64_t rows, int sms, int rows_per_sm) {
  const int64_t grid = int64_t(sms) * rows_per_sm;
  return unsigned(grid < rows ? grid : rows);
}

// The packs holding columns [0, real) of a row.
__host__ __device__ constexpr int64_t packs_holding(int64_t real, int V) { return (real + V - 1) / V; }

// Pack j's elements (p) as f32, -inf past the real columns; returns their max.
template <typename T, int V>
__device__ __forceinline__ float real_values(float (&xs)[V], const Pack<T, V>& p, int64_t j, int64_t real) {
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    xs[k] = j * V + k < real ? to_f32(p.v[k]) : -INFINITY;
    m = fmaxf(m, xs[k]);
  }
  return m;
}

// The same, loading pack j of `row`.
template <typename T, int V>
__device__ __forceinline__ float load_real(float (&xs)[V], const T* row, int64_t j, int64_t real) {
  return real_values<T, V>(xs, load_pack<T, V>(row + j * V), j, real);
}

// Adds pack j (p) to a thread's running max m and sum s of exp(x - m) over
// the row's `real` columns.
template <typename T, int V>
__device__ __forceinline__ void online_add(float& m, float& s, const Pack<T, V>& p, int64_t j, int64_t real) {
  float xs[V];
  const float pm = real_values<T, V>(xs, p, j, real);
  if (pm == -INFINITY) return;  // nothing to add (and -inf - -inf is NaN)
  if (pm > m) {
    s = __fmul_rn(s, __expf(m - pm));  // 0 while m is still -inf
    m = pm;
  }
#pragma unroll
  for (int k = 0; k < V; ++k) s = __fadd_rn(s, __expf(xs[k] - m));
}

// Pack j of a row's dlogits from the same pack of its logits (p):
// exp(x - m) * r - grad_scale [column is the target], r = grad_scale / (the
// row's sum of exp(x - m)); 0 past the `real` columns and in an ignored row.
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> dlogits_pack(const Pack<T, V>& p, int64_t j, int64_t real, int64_t target,
                                                   bool ignored, float m, float r, float grad_scale) {
  Pack<T, V> out;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t c = j * V + k;
    float g = 0.0f;
    if (!ignored && c < real) g = __fsub_rn(__fmul_rn(__expf(to_f32(p.v[k]) - m), r), c == target ? grad_scale : 0.0f);
    out.v[k] = from_f32<T>(g);
  }
  return out;
}

// The thread's U packs j0 + u * blockDim.x (u < U) of `row` that are below
// `end`, loaded at once (their latencies overlap).
template <typename T, int V, int U>
__device__ __forceinline__ void load_ahead(Pack<T, V> (&p)[U], const T* row, int64_t j0, int64_t end) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t j = j0 + u * int64_t(blockDim.x);
    if (j < end) p[u] = load_pack<T, V>(row + j * V);
  }
}

// Pass 1 over the thread's packs j0, j0 + blockDim.x, ... below `end` of
// `row`, U loaded ahead; `ahead` holds the first U already.
template <typename T, int V, int U>
__device__ __forceinline__ void sum_from_memory(float& m, float& s, Pack<T, V> (&ahead)[U], const T* row, int64_t j0,
                                                int64_t end, int64_t real) {
  for (int64_t ju = j0; ju < end; ju += U * int64_t(blockDim.x)) {
    if (ju != j0) load_ahead<T, V, U>(ahead, row, ju, end);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = ju + u * int64_t(blockDim.x);
      if (j >= end) break;
      online_add<T, V>(m, s, ahead[u], j, real);
    }
  }
}

// Pass 2 over the thread's packs j0, j0 + blockDim.x, ... below `end`: dr's
// dlogits from lr's logits (dr may be lr: a thread reads each pack before it
// writes it), U loaded ahead; `ahead` holds the first U already.
template <typename T, int V, int U>
__device__ __forceinline__ void write_from_memory(T* dr, Pack<T, V> (&ahead)[U], const T* lr, int64_t j0, int64_t end,
                                                  int64_t real, int64_t target, bool ignored, float m, float r,
                                                  float grad_scale) {
  for (int64_t ju = j0; ju < end; ju += U * int64_t(blockDim.x)) {
    if (ju != j0) load_ahead<T, V, U>(ahead, lr, ju, end);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t j = ju + u * int64_t(blockDim.x);
      if (j >= end) break;
      store_pack<T, V>(dr + j * V, dlogits_pack<T, V>(ahead[u], j, real, target, ignored, m, r, grad_scale));
    }
  }
}

// dlogits of one row (may be the logits themselves), all its cols / V packs,
// U packs' loads ahead per thread.
template <typename T, int V, int U>
__device__ __forceinline__ void write_dlogits(T* dr, const T* lr, int64_t cols, int64_t real, int64_t target,
                                              bool ignored, float m, float r, float grad_scale) {
  Pack<T, V> ahead[U]{};
  load_ahead<T, V, U>(ahead, lr, threadIdx.x, cols / V);
  write_from_memory<T, V, U>(dr, ahead, lr, threadIdx.x, cols / V, real, target, ignored, m, r, grad_scale);
}

// After pass 1: the row's log-sum-exp from the threads' (m, s), for every
// thread; its loss written by thread 0. The target logit is read before the
// closing barrier, so pass 2 may then overwrite the row in place.
template <typename T>
__device__ __forceinline__ float row_lse(float m, float s, float* scratch, const T* lr, int32_t target, float* loss) {
  const float row_max = block_max(m, scratch);
  const float sum = block_sum(m == -INFINITY ? 0.0f : __fmul_rn(s, __expf(m - row_max)), scratch);
  const float lse = row_max + logf(sum);
  const bool ignored = target < 0;
  const float target_logit = ignored ? 0.0f : to_f32(lr[target]);
  __syncthreads();
  if (threadIdx.x == 0) *loss = ignored ? 0.0f : lse - target_logit;
  return lse;
}

// logits, dlogits: (N, Vp); losses, targets: (N). R rows in flight per SM
// (launched on ce_grid's blocks).
template <typename T, int V, int R>
__global__ void __launch_bounds__(kThreads, R)
    ce_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N, int64_t Vp,
              int64_t vocab, float grad_scale) {
  constexpr int U = packs_ahead(R);
  __shared__ float scratch[32];
  const int64_t packs = packs_holding(vocab, V);
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* lr = logits + row * Vp;
    const int32_t target = targets[row];
    // Per-thread running max m and sum of exp(x - m), a pack at a time in
    // the order j, j + blockDim.x, ... whatever U (so R does not change the
    // bits); U packs loaded ahead, as bf16 (the f32 values are made one
    // pack at a time: fewer registers).
    float m = -INFINITY, s = 0.0f;
    Pack<T, V> ahead[U]{};
    load_ahead<T, V, U>(ahead, lr, threadIdx.x, packs);
    sum_from_memory<T, V, U>(m, s, ahead, lr, threadIdx.x, packs, vocab);
    const float lse = row_lse(m, s, scratch, lr, target, losses + row);
    if (dlogits != nullptr)
      write_dlogits<T, V, U>(dlogits + row * Vp, lr, Vp, vocab, target, target < 0, lse, grad_scale, grad_scale);
  }
}

// The packs of a row ce_staged_kernel stages: all `packs` where they fit in
// `shared_bytes` (16 each), else the most whole sweeps of kThreads that do
// (so every thread's tail starts at staged + its index). 0: none fit.
__host__ __device__ constexpr int64_t staged_packs(int64_t packs, int64_t shared_bytes) {
  const int64_t fit = shared_bytes / 16;
  return packs <= fit ? packs : fit / kThreads * kThreads;
}

// The fused classifier with each row's first `staged` 16-byte packs (V =
// kPack16<T>; staged_packs) staged in dynamic shared memory (16 x staged
// bytes); as many blocks as the SMs hold, striding over the rows: two of 64
// registers a thread where two rows fit an SM (GPT-2's 98 KiB; no spills on
// sm_90a), else one.
template <typename T>
__global__ void __launch_bounds__(kThreads, 2)
    ce_staged_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N, int64_t Vp,
                     int64_t vocab, float grad_scale, int64_t staged) {
  constexpr int V = kPack16<T>, U = 4;  // U: tail packs loaded ahead per thread
  using P = Pack<T, V>;
  ZT_SHARED_MEMORY(shared);
  P* const slots = reinterpret_cast<P*>(shared);  // packs [0, staged) of the block's current row
  __shared__ float scratch[32];
  const int64_t t = threadIdx.x, packs = Vp / V, real_packs = packs_holding(vocab, V);
  const int64_t staged_real = staged < real_packs ? staged : real_packs;
  const auto stage = [&](int64_t row) {  // this thread's slots, from `row`
    for (int64_t j = t; j < staged; j += blockDim.x) cp_async16(slots + j, logits + row * Vp + j * V, true);
    cp_async_commit();
  };
  if (blockIdx.x < N) stage(blockIdx.x);
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* lr = logits + row * Vp;
    const int32_t target = targets[row];
    const int64_t next = row + gridDim.x;
    // Pass 1: the tail's first loads go out before the wait, so their
    // latency passes while the staged packs are summed.
    P ahead[U]{};
    load_ahead<T, V, U>(ahead, lr, staged + t, real_packs);
    cp_async_wait<0>();
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = t; j < staged_real; j += blockDim.x) {
      P p = slots[j];  // one 16-byte shared load (keep_packed)
      keep_packed(p);
      online_add<T, V>(m, s, p, j, vocab);
    }
    sum_from_memory<T, V, U>(m, s, ahead, lr, staged + t, real_packs, vocab);
    const float lse = row_lse(m, s, scratch, lr, target, losses + row);
    if (dlogits == nullptr) {
      if (next < N) stage(next);
      continue;
    }
    // Pass 2: each slot read, its dlogits written, then refilled from the
    // next row (the fence keeps the refill after the read).
    T* dr = dlogits + row * Vp;
    const bool ignored = target < 0;
    load_ahead<T, V, U>(ahead, lr, staged + t, packs);
    for (int64_t j = t; j < staged; j += blockDim.x) {
      P p = slots[j];
      keep_packed(p);
      store_pack<T, V>(dr + j * V, dlogits_pack<T, V>(p, j, vocab, target, ignored, lse, grad_scale, grad_scale));
      if (next < N) {
        compiler_memory_fence();
        cp_async16(slots + j, logits + next * Vp + j * V, true);
      }
    }
    if (next < N) cp_async_commit();
    write_from_memory<T, V, U>(dr, ahead, lr, staged + t, packs, vocab, target, ignored, lse, grad_scale, grad_scale);
  }
}

// Vocabulary-parallel pass 1: row_max[row] = max of the row's `real` columns
// (this rank's columns below the vocabulary; -inf if none).
template <typename T, int V>
__global__ void vp_max_kernel(float* row_max, const T* logits, int64_t Vl, int64_t real) {
  __shared__ float scratch[32];
  const T* lr = logits + int64_t(blockIdx.x) * Vl;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < packs_holding(real, V); j += blockDim.x) {
    float xs[V];
    m = fmaxf(m, load_real<T, V>(xs, lr, j, real));
  }
  m = block_max(m, scratch);
  if (threadIdx.x == 0) row_max[blockIdx.x] = m;
}

// Pass 2, after the max is reduced over the group: sum_exp = sum over the
// real columns of exp(x - row_max) (0 if none); target_logit = x[target] where
// this rank holds the target (global id - col_start in [0, real)), else 0.
template <typename T, int V>
__global__ void vp_sums_kernel(float* sum_exp, float* target_logit, const T* logits, const float* row_max,
                               const int32_t* targets, int64_t Vl, int64_t col_start, int64_t real) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const T* lr = logits + row * Vl;
  const float m = row_max[row];
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < packs_holding(real, V); j += blockDim.x) {
    float xs[V];
    load_real<T, V>(xs, lr, j, real);
#pragma unroll
    for (int k = 0; k < V; ++k) s += __expf(xs[k] - m);  // 0 past the real columns
  }
  s = block_sum(s, scratch);
  if (threadIdx.x == 0) {
    const int64_t t = int64_t(targets[row]) - col_start;
    target_logit[row] = targets[row] >= 0 && t >= 0 && t < real ? to_f32(lr[t]) : 0.0f;
    sum_exp[row] = s;
  }
}

// Pass 3, after the sums are reduced: losses = row_max + log(sum_exp) -
// target_logit (0 for ignored rows); dlogits (may be logits itself: each
// element is read before the same thread overwrites it) = grad_scale *
// (exp(x - row_max) / sum_exp - [column is the target]), 0 in padding
// columns and ignored rows.
template <typename T, int V>
__global__ void vp_finish_kernel(float* losses, T* dlogits, const T* logits, const float* row_max,
                                 const float* sum_exp, const float* target_logit, const int32_t* targets, int64_t Vl,
                                 int64_t col_start, int64_t real, float grad_scale) {
  const int64_t row = blockIdx.x;
  const bool ignored = targets[row] < 0;
  const float m = row_max[row], S = sum_exp[row];
  if (threadIdx.x == 0) losses[row] = ignored ? 0.0f : (m - target_logit[row]) + logf(S);
  if (dlogits == nullptr) return;
  const int64_t t = int64_t(targets[row]) - col_start;  // this rank's column of the target, if it holds it
  write_dlogits<T, V, 1>(dlogits + row * Vl, logits + row * Vl, Vl, real, t, ignored, m, grad_scale / S, grad_scale);
}

}  // namespace zt::cuda::ce_kernels
