// CPU matmul / linear kernels: OpenBLAS sgemm plus the bf16 <-> f32 passes
// around it.
//
//   out_i = alpha * op(a_i) @ op(b_i) + beta * out_i + bias        (i over the batch)
//
// f32 in, f32 out: cblas_sgemm on the caller's buffers. With a bias (or a
//   separate c that beta scales instead of out), out is first set to
//   beta * out + bias (beta * c + bias; bias alone when beta = 0, never
//   reading out) and sgemm accumulates with beta = 1; that pass replaces the
//   one in which sgemm itself would scale or zero C, so it costs nothing extra.
// bf16 in: a and b are widened to f32 (exact) in per-thread scratch, each
//   element exactly once, and sgemm accumulates in f32. An f32 out is written
//   in place; a bf16 out gets an f32 tile C (= beta * out + bias when either is
//   present) which is rounded to nearest-even once at the end.
//   Problems whose widened operands and tile exceed the scratch budget are cut
//   into panels (rows of out, columns of out, or the reduction dim, which then
//   accumulates into C with beta = 1; whichever allows the widest panel);
//   panels along M or N leave the other operand widened once for all panels.
// A few rows (M <= 8, a decoding step's products): our own kernel instead of
//   sgemm (gemm_few_rows): B read once in its own dtype for all rows, each
//   output summed on one thread in a fixed order, so the bits do not depend
//   on the thread count (OpenBLAS's do for M = 1, sgemm and sgemv alike).
// Batches: many small products run one single-threaded sgemm per entry on the
//   OpenMP threads (OpenBLAS's OpenMP build stays on one thread inside a
//   parallel region); large ones run one threaded sgemm after another. A 2-D
//   b shared by the batch with an untransposed a is one (batch*M, K) product.
//
// Linear backward (y = x W^T + b; dy (N, OC), x (N, C), W (OC, C)):
//   dx = dy @ W  (NN)      dW += dy^T @ x  (TN, beta 1)      db += colsum(dy)
// A bf16 dy needed by both products is widened once and shared. db sums fixed
// row chunks (chunk size from the shape alone) into f32 partials and adds the
// partials in chunk order, so its bits do not depend on the thread count.
#include "backend/cpu/matmul.h"

#include <cblas.h>
#include <cstdint>
#include <cstring>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <type_traits>
#include <utility>

#include "backend/cpu/blas_kernels.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/simd.h"

namespace zt::cpu {

namespace {

// OpenBLAS's kernels are checked (and a stale pick replaced) while the
// process starts, before any thread can run a product (blas_kernels.h).
[[maybe_unused]] const bool g_blas_checked = (blas_kernels(), true);

std::atomic<size_t> g_scratch_budget{size_t(16) << 20};  // floats

constexpr int64_t kPieceCols = 8192;             // columns per task of an elementwise pass
constexpr int64_t kTaskElems = 16384;            // elements per task of an elementwise pass
constexpr int64_t kParallelMin = int64_t(1) << 16;  // smaller passes stay on one thread
constexpr int64_t kPanelAlign = 16;              // panel extents are multiples of this
constexpr int64_t kColBlock = 256;               // column block of the db reduction

// bf16 -> f32 is exact: the bf16 bits are the high half of the float.
inline float widen1(bf16 h) { return std::bit_cast<float>(uint32_t(h.bits) << 16); }

// f32 -> bf16 bits, round to nearest even, NaN -> quiet NaN: float_to_bf16
// without the early return, so that loops over it vectorise.
inline uint16_t narrow1(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// Calls f(r, c0, c1) for every row r of a rows x cols block, cut into pieces
// of at most kPieceCols columns; on all threads when `par` and the block is
// big. Tasks of ~kTaskElems elements are handed out dynamically, so a thread
// that the OS delays does not hold the others at the closing barrier with a
// fixed half of the work. Small or non-par blocks open no parallel region at
// all: even an if(false) region costs microseconds per tiny batch entry.
template <typename F>
void for_pieces(int64_t rows, int64_t cols, bool par, const F& f) {
  if (!par || rows * cols < kParallelMin) {
    for (int64_t r = 0; r < rows; ++r) f(r, int64_t(0), cols);
  } else if (cols <= kPieceCols) {
    const int64_t rows_per_task = std::max<int64_t>(1, kTaskElems / cols);
    const int64_t tasks = (rows + rows_per_task - 1) / rows_per_task;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t r1 = std::min(rows, (t + 1) * rows_per_task);
      for (int64_t r = t * rows_per_task; r < r1; ++r) f(r, int64_t(0), cols);
    }
  } else {
    const int64_t pieces = (cols + kPieceCols - 1) / kPieceCols;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t t = 0; t < rows * pieces; ++t) {
      const int64_t r = t / pieces, c0 = (t % pieces) * kPieceCols;
      f(r, c0, std::min(cols, c0 + kPieceCols));
    }
  }
}

// dst (rows, c1 - c0), dense = f32(src[r0:r1, c0:c1]); src has leading dim ld.
void widen_block(const bf16* src, int64_t ld, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* dst,
                 bool par) {
  const int64_t cols = c1 - c0;
  for_pieces(r1 - r0, cols, par, [&](int64_t r, int64_t j0, int64_t j1) {
    const bf16* __restrict s = src + (r0 + r) * ld + c0;
    float* __restrict d = dst + r * cols;
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) d[j] = widen1(s[j]);
  });
}

// out (rows, cols; leading dim ldo) = bf16(C) (leading dim ldc).
void narrow_block(const float* C, int64_t ldc, bf16* out, int64_t ldo, int64_t rows, int64_t cols, bool par) {
  for_pieces(rows, cols, par, [&](int64_t r, int64_t j0, int64_t j1) {
    const float* __restrict s = C + r * ldc;
    bf16* __restrict d = out + r * ldo;
#pragma omp simd
    for (int64_t j = j0; j < j1; ++j) d[j].bits = narrow1(s[j]);
  });
}

// C (rows, cols) = beta * prev + bias, with beta = 0 never reading prev.
// prev is the out block (C itself for an f32 out, in place; the bf16 out
// else), or the block of a separate c (matmul's c, a residual).
// bias (cols) is already offset to the block's first column, or null.
template <typename TPrev, typename TBias>
void prefill(float* C, int64_t ldc, const TPrev* prev, int64_t ldp, int64_t rows, int64_t cols, float beta,
             const TBias* bias, bool par) {
  for_pieces(rows, cols, par, [&](int64_t r, int64_t j0, int64_t j1) {
    float* c = C + r * ldc;  // may alias p (same index only)
    const TPrev* p = prev + r * ldp;
    if (beta == 0.0f) {
      if (bias) {
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) c[j] = to_float(bias[j]);
      } else {
#pragma omp simd
        for (int64_t j = j0; j < j1; ++j) c[j] = 0.0f;
      }
    } else if (bias) {
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) c[j] = beta * to_float(p[j]) + to_float(bias[j]);
    } else {
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) c[j] = beta * to_float(p[j]);
    }
  });
}

// A row-major input matrix, f32 or bf16: element (r, c) at p + r * ld + c.
struct Operand {
  const void* p;
  bool bf;
  int64_t ld;
};

// An f32 view of rows [r0, r1) x cols [c0, c1) of m: m itself when it is f32,
// else a widened dense copy in scratch `slot`. Sets ld_out.
const float* f32_view(const Operand& m, int64_t r0, int64_t r1, int64_t c0, int64_t c1, int slot, bool par,
                      int64_t& ld_out) {
  if (!m.bf) {
    ld_out = m.ld;
    return static_cast<const float*>(m.p) + r0 * m.ld + c0;
  }
  const int64_t cols = c1 - c0;
  float* dst = thread_scratch(size_t(std::max<int64_t>(1, (r1 - r0) * cols)), slot);
  widen_block(static_cast<const bf16*>(m.p), m.ld, r0, r1, c0, c1, dst, par);
  ld_out = cols;
  return dst;
}

void sgemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

constexpr int64_t kFewRows = 8;  // products of up to this many rows run in gemm_few_rows

// x (M, K) = op(A)'s rows in f32, dense.
template <typename TA>
void rows_of_a(const GemmDesc& d, const TA* a, int64_t lda, float* x) {
  for (int64_t m = 0; m < d.M; ++m)
    for (int64_t k = 0; k < d.K; ++k) x[m * d.K + k] = to_float(d.trans_a ? a[k * lda + m] : a[m * lda + k]);
}

// A few rows of out (M <= kFewRows: a decoding step's products, one row a
// sequence): out (M, N) = alpha * x op(B) + beta * prev + bias, x op(A)'s
// rows. Each output's sum runs in f32 lanes in a fixed order on one thread:
// the same bits on any number of threads (OpenBLAS's sgemm and sgemv with
// M = 1 give other bits on other thread counts). B is read once, in its own
// dtype, each element used for all M rows: sgemm would pack it first
// (OpenBLAS's incopy: twice the product's own time at M = 1), after a bf16
// B's widening. prev: out itself or a separate c, read only when beta != 0.
template <int kM, typename TOut, typename TBias, typename TA, typename TB>
void gemm_few_rows(const GemmDesc& d, const TA* a, int64_t lda, const TB* b, int64_t ldb, TOut* out,
                   const TBias* bias, const TOut* prev, bool par) {
  using namespace simd;
  const int64_t N = d.N, K = d.K;
  float* x = thread_scratch(size_t(kM * K), 0);
  rows_of_a(d, a, lda, x);
  auto finish = [&](int64_t m, int64_t j, float sum) {
    const int64_t o = m * N + j;
    float base = d.beta != 0.0f ? d.beta * to_float(prev[o]) : 0.0f;
    if (bias) base += to_float(bias[j]);
    const float r = d.alpha * sum + base;
    if constexpr (std::is_same_v<TOut, bf16>)
      out[o].bits = narrow1(r);
    else
      out[o] = r;
  };
  // Tasks of fixed outputs on all threads for a large product (no parallel
  // region at all for a small one: even an if(false) region costs microseconds).
  const bool threaded = par && kM * N * K >= kParallelMin && !omp_in_parallel();
  auto for_tasks = [threaded](int64_t tasks, const auto& task) {
    if (!threaded) {
      for (int64_t t = 0; t < tasks; ++t) task(t);
      return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tasks; ++t) task(t);
  };
  if (d.trans_b) {  // B (N, K): output (m, j) the dot product of B's row j with x's row m
    // Two accumulators per row for one row (hides the add latency), one for more.
    constexpr int kAcc = kM == 1 ? 2 : 1;
    constexpr int64_t kRows = 16;  // B rows per task
    for_tasks((N + kRows - 1) / kRows, [&](int64_t t) {
      for (int64_t j = t * kRows; j < std::min(N, (t + 1) * kRows); ++j) {
        const TB* row = b + j * ldb;
        f32v acc[kM][kAcc] = {};
        int64_t k = 0;
        for (; k + kAcc * kV <= K; k += kAcc * kV)
          for (int u = 0; u < kAcc; ++u) {
            const f32v bv = load(row + k + u * kV);
            for (int m = 0; m < kM; ++m) acc[m][u] += bv * load(x + m * K + k + u * kV);
          }
        for (; k < K; k += kV) {
          const int64_t n = std::min(kV, K - k);
          const f32v bv = load_partial(row + k, n);
          for (int m = 0; m < kM; ++m) acc[m][0] += bv * load_partial(x + m * K + k, n);
        }
        for (int m = 0; m < kM; ++m) {
          f32v sum = acc[m][0];
          for (int u = 1; u < kAcc; ++u) sum += acc[m][u];
          finish(m, j, hsum(sum));
        }
      }
    });
  } else {  // B (K, N): a block of columns at a time, x's elements times B's rows added in k order
    constexpr int64_t kVecs = kM == 1 ? 8 : kM <= 2 ? 4 : 2, kCols = kVecs * kV;  // columns per task
    for_tasks((N + kCols - 1) / kCols, [&](int64_t t) {
      const int64_t j0 = t * kCols, cols = std::min(kCols, N - j0);
      f32v acc[kM][kVecs] = {};
      for (int64_t k = 0; k < K; ++k) {
        const TB* row = b + k * ldb + j0;
        f32v bv[kVecs];
        if (cols == kCols) {
          for (int64_t v = 0; v < kVecs; ++v) bv[v] = load(row + v * kV);
        } else {
          for (int64_t v = 0; v < kVecs; ++v)
            bv[v] = v * kV < cols ? load_partial(row + v * kV, std::min(kV, cols - v * kV)) : f32v{};
        }
        for (int m = 0; m < kM; ++m) {
          const f32v xk = splat(x[m * K + k]);
          for (int64_t v = 0; v < kVecs; ++v) acc[m][v] += bv[v] * xk;
        }
      }
      for (int m = 0; m < kM; ++m) {
        float sums[kCols];
        std::memcpy(sums, acc[m], sizeof sums);
        for (int64_t c = 0; c < cols; ++c) finish(m, j0 + c, sums[c]);
      }
    });
  }
}

// gemm_few_rows for this product's M (1 .. kFewRows).
template <typename TOut, typename TBias, typename TA, typename TB>
void gemm_few_rows_of(const GemmDesc& d, const TA* a, int64_t lda, const TB* b, int64_t ldb, TOut* out,
                      const TBias* bias, const TOut* prev, bool par) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    ((d.M == I + 1 ? gemm_few_rows<I + 1, TOut, TBias>(d, a, lda, b, ldb, out, bias, prev, par) : void()), ...);
  }(std::make_integer_sequence<int, int(kFewRows)>());
}

// One product out (M, N) = alpha * op(A) @ op(B) + beta * prev + bias, prev
// out itself, or c (M, N) when given (then read by the prefill, never written).
// A is stored (M, K) or (K, M) per d.trans_a, B (K, N) or (N, K) per d.trans_b.
// par: this call may use all threads (threaded passes, panels); false inside
// a batch-parallel region, where everything stays on the calling thread.
template <typename TOut, typename TBias>
void gemm_one(const GemmDesc& d, const Operand& A, const Operand& B, TOut* out, const TBias* bias, bool par,
              const TOut* c = nullptr) {
  constexpr bool wc = std::is_same_v<TOut, bf16>;  // out needs an f32 tile
  const int64_t M = d.M, N = d.N, K = d.K;
  if (M == 0 || N == 0) return;
  if (M <= kFewRows && K > 0) {
    const TOut* prev = c ? c : out;
    auto run = [&]<typename TA, typename TB>(const TA* a, const TB* b) {
      gemm_few_rows_of<TOut, TBias>(d, a, A.ld, b, B.ld, out, bias, prev, par);
    };
    if (A.bf) {
      if (B.bf)
        run(static_cast<const bf16*>(A.p), static_cast<const bf16*>(B.p));
      else
        run(static_cast<const bf16*>(A.p), static_cast<const float*>(B.p));
    } else {
      if (B.bf)
        run(static_cast<const float*>(A.p), static_cast<const bf16*>(B.p));
      else
        run(static_cast<const float*>(A.p), static_cast<const float*>(B.p));
    }
    return;
  }

  // Panel extents: whole problem unless the scratch would exceed the budget.
  int64_t pm = M, pn = N, pk = std::max<int64_t>(K, 1);
  const size_t budget = g_scratch_budget.load(std::memory_order_relaxed);
  const size_t sa = A.bf ? size_t(M * K) : 0, sb = B.bf ? size_t(K * N) : 0, sc = wc ? size_t(M * N) : 0;
  if (par && sa + sb + sc > budget) {
    // Candidates: panels of rows of out (B widened once, A and C per panel),
    // of columns (A widened once), or of the reduction dim (C held whole and
    // accumulated panel by panel). Each fits fixed + extent * unit floats;
    // take the one allowing the widest panel (sgemm wants big panels).
    struct Cand {
      size_t fixed, unit;
      int64_t ext, *panel;
    };
    const Cand cands[3] = {{sb, size_t((A.bf ? K : 0) + (wc ? N : 0)), M, &pm},
                           {sa, size_t((B.bf ? K : 0) + (wc ? M : 0)), N, &pn},
                           {sc, size_t((A.bf ? M : 0) + (B.bf ? N : 0)), K, &pk}};
    const Cand* best = nullptr;
    int64_t best_p = 0;
    for (const Cand& c : cands) {
      if (c.ext <= 1) continue;
      int64_t p = c.unit == 0 ? c.ext : int64_t((budget > c.fixed ? budget - c.fixed : 0) / c.unit);
      p = std::min(c.ext, std::max(kPanelAlign, p / kPanelAlign * kPanelAlign));
      if (!best || p > best_p || (p == best_p && c.ext > best->ext)) best = &c, best_p = p;
    }
    if (best) *best->panel = best_p;
  }

  // Panels along M reuse all of B, panels along N all of A: widen it once.
  Operand Aw = A, Bw = B;
  if (pm < M && B.bf && K > 0) {
    int64_t ld = 0;
    const float* f = d.trans_b ? f32_view(B, 0, N, 0, K, 1, par, ld) : f32_view(B, 0, K, 0, N, 1, par, ld);
    Bw = Operand{f, false, ld};
  }
  if (pn < N && A.bf && K > 0) {
    int64_t ld = 0;
    const float* f = d.trans_a ? f32_view(A, 0, K, 0, M, 0, par, ld) : f32_view(A, 0, M, 0, K, 0, par, ld);
    Aw = Operand{f, false, ld};
  }

  for (int64_t m0 = 0; m0 < M; m0 += pm) {
    const int64_t m1 = std::min(M, m0 + pm), mb = m1 - m0;
    for (int64_t n0 = 0; n0 < N; n0 += pn) {
      const int64_t n1 = std::min(N, n0 + pn), nb = n1 - n0;
      TOut* out_blk = out + m0 * N + n0;
      const TOut* prev_blk = c ? c + m0 * N + n0 : out_blk;
      float* C;
      int64_t ldc;
      if constexpr (wc) {
        C = thread_scratch(size_t(mb * nb), 2);
        ldc = nb;
      } else {
        C = out_blk;
        ldc = N;
      }
      for (int64_t k0 = 0;; k0 += pk) {  // at least once, also for K = 0
        const int64_t k1 = std::min(K, k0 + pk), kb = k1 - k0;
        float beta = d.beta;
        if (k0 == 0) {
          if (bias || kb == 0 || (beta != 0.0f && (wc || c))) {
            prefill(C, ldc, prev_blk, N, mb, nb, beta, bias ? bias + n0 : bias, par);
            beta = 1.0f;
          }
        } else {
          beta = 1.0f;  // later reduction panels accumulate
        }
        if (kb > 0) {
          int64_t lda = 0, ldb = 0;
          const float* Af = d.trans_a ? f32_view(Aw, k0, k1, m0, m1, 0, par, lda)
                                      : f32_view(Aw, m0, m1, k0, k1, 0, par, lda);
          const float* Bf = d.trans_b ? f32_view(Bw, n0, n1, k0, k1, 1, par, ldb)
                                      : f32_view(Bw, k0, k1, n0, n1, 1, par, ldb);
          sgemm(d.trans_a, d.trans_b, mb, nb, kb, d.alpha, Af, lda, Bf, ldb, beta, C, ldc);
        }
        if (k1 >= K) break;
      }
      if constexpr (wc) narrow_block(C, ldc, out_blk, N, mb, nb, par);
    }
  }
}

template <typename TOut, typename TBias>
void run_matmul(GemmDesc d, const Tensor& out, const Tensor& a, const Tensor& b, const TBias* bias,
                const Tensor& c) {
  // A shared b with an untransposed a: the batch is just more rows of a.
  if (d.b_shared && !d.trans_a && d.batch > 1) {
    d.M *= d.batch;
    d.batch = 1;
  }
  if (d.batch == 0 || d.M == 0 || d.N == 0) return;
  const bool bf = a.dtype() == DType::bf16;
  const size_t es = dtype_size(a.dtype());
  const char* ap = static_cast<const char*>(a.data_ptr());
  const char* bp = static_cast<const char*>(b.data_ptr());
  TOut* op = out.data<TOut>();
  const TOut* cp = c.defined() ? c.data<TOut>() : nullptr;
  const int64_t lda = d.trans_a ? d.M : d.K, ldb = d.trans_b ? d.K : d.N;
  const int64_t stride_a = d.M * d.K, stride_b = d.b_shared ? 0 : d.K * d.N, stride_o = d.M * d.N;

  Operand b0{bp, bf, ldb};
  const size_t budget = g_scratch_budget.load(std::memory_order_relaxed);
  if (d.b_shared && bf && d.batch > 1 && size_t(d.K * d.N) <= budget) {
    // Widen the shared b once for the whole batch (dense: same leading dim).
    float* wb = thread_scratch(size_t(d.K * d.N), 3);
    widen_block(reinterpret_cast<const bf16*>(bp), ldb, 0, d.trans_b ? d.N : d.K, 0, ldb, wb, true);
    b0 = Operand{wb, false, ldb};
  }
  auto entry = [&](int64_t i, bool par) {
    const Operand A{ap + size_t(i * stride_a) * es, bf, lda};
    const Operand B{static_cast<const char*>(b0.p) + size_t(i * stride_b) * es, b0.bf, ldb};
    gemm_one<TOut, TBias>(d, A, B, op + i * stride_o, bias, par, cp ? cp + i * stride_o : nullptr);
  };
  if (matmul_batch_parallel(d, bf, omp_get_max_threads())) {
    // Dynamic: a thread the OS delays does not hold back a fixed share.
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < d.batch; ++i) entry(i, false);
  } else {
    for (int64_t i = 0; i < d.batch; ++i) entry(i, true);
  }
}

template <typename TOut>
void gemm_out(const Tensor& out, const GemmDesc& d, const Operand& A, const Operand& B) {
  gemm_one<TOut, float>(d, A, B, out.data<TOut>(), nullptr, true);
}

void gemm_any_out(const Tensor& out, const GemmDesc& d, const Operand& A, const Operand& B) {
  if (out.dtype() == DType::bf16) {
    gemm_out<bf16>(out, d, A, B);
  } else {
    gemm_out<float>(out, d, A, B);
  }
}

// db (cols) += column sums of dy (rows, cols), f32, thread-count independent
// (overwrite: =, db not read).
template <typename TDy, typename TDb>
void colsum_accumulate(TDb* db, const TDy* dy, int64_t rows, int64_t cols, bool overwrite) {
  if (cols == 0) return;
  const int64_t chunk = std::max<int64_t>(256, (rows + 31) / 32);  // <= 32 partials
  const int64_t nch = std::max<int64_t>(1, (rows + chunk - 1) / chunk);
  float* part = thread_scratch(size_t(nch * cols), 0);
  const bool threaded = rows * cols >= kParallelMin;
#pragma omp parallel for schedule(static) if (threaded)
  for (int64_t c = 0; c < nch; ++c) {
    float* __restrict p = part + c * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) p[j] = 0.0f;
    const int64_t r1 = std::min(rows, (c + 1) * chunk);
    for (int64_t r = c * chunk; r < r1; ++r) {
      const TDy* __restrict s = dy + r * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) p[j] += to_float(s[j]);
    }
  }
#pragma omp parallel for schedule(static) if (threaded)
  for (int64_t j0 = 0; j0 < cols; j0 += kColBlock) {
    const int64_t n = std::min(cols, j0 + kColBlock) - j0;
    float acc[kColBlock];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) acc[j] = part[j0 + j];
    for (int64_t c = 1; c < nch; ++c) {
      const float* __restrict p = part + c * cols + j0;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) acc[j] += p[j];
    }
    for (int64_t j = 0; j < n; ++j) db[j0 + j] = from_float<TDb>(overwrite ? acc[j] : to_float(db[j0 + j]) + acc[j]);
  }
}

template <typename TDy>
void colsum_any_db(const Tensor& db, const TDy* dy, int64_t rows, int64_t cols, bool overwrite) {
  if (db.dtype() == DType::bf16) {
    colsum_accumulate(db.data<bf16>(), dy, rows, cols, overwrite);
  } else {
    colsum_accumulate(db.data<float>(), dy, rows, cols, overwrite);
  }
}

}  // namespace

bool matmul_batch_parallel(const GemmDesc& d, bool widens, int threads) {
  if (threads < 2 || d.batch < 2) return false;
  // Each thread holds its own widened operands and tile.
  const size_t per_thread = size_t(d.M * d.K + d.K * d.N + d.M * d.N);
  if (widens && size_t(threads) * per_thread > g_scratch_budget.load(std::memory_order_relaxed)) return false;
  // Small products: a threaded sgemm would mostly synchronise.
  if (double(d.M) * double(d.N) * double(d.K) <= double(1 << 21)) return true;
  // Large ones: only when the batch splits evenly enough over the threads
  // (at most ~10% idle), else one threaded sgemm after another.
  const int64_t rounds = (d.batch + threads - 1) / threads;
  return double(rounds * threads) <= 1.1 * double(d.batch);
}

size_t set_matmul_scratch_budget(size_t floats) { return g_scratch_budget.exchange(floats); }
size_t matmul_scratch_budget() { return g_scratch_budget.load(); }

void matmul(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmDesc& d,
            const Tensor& c) {
  const bool bias_bf = bias.defined() && bias.dtype() == DType::bf16;
  const void* bp = bias.defined() ? bias.data_ptr() : nullptr;
  if (out.dtype() == DType::bf16) {
    if (bias_bf) {
      run_matmul<bf16, bf16>(d, out, a, b, static_cast<const bf16*>(bp), c);
    } else {
      run_matmul<bf16, float>(d, out, a, b, static_cast<const float*>(bp), c);
    }
  } else {
    run_matmul<float, float>(d, out, a, b, static_cast<const float*>(bp), c);
  }
}

void linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, bool overwrite) {
  const int64_t N = dy.size(0), OC = dy.size(1), C = w.size(1);
  const bool bf = dy.dtype() == DType::bf16;
  Operand DY{dy.data_ptr(), bf, OC};
  if (bf && dx.defined() && dw.defined() && size_t(N * OC) <= g_scratch_budget.load()) {
    // dy feeds both products: widen it once.
    float* f = thread_scratch(size_t(std::max<int64_t>(1, N * OC)), 3);
    widen_block(dy.data<bf16>(), OC, 0, N, 0, OC, f, true);
    DY = Operand{f, false, OC};
  }
  if (dx.defined()) {  // dx (N, C) = dy (N, OC) @ w (OC, C)
    GemmDesc d;
    d.M = N, d.N = C, d.K = OC;
    gemm_any_out(dx, d, DY, Operand{w.data_ptr(), bf, C});
  }
  if (dw.defined()) {  // dw (OC, C) += dy^T (OC, N) @ x (N, C)  (=, when overwriting)
    GemmDesc d;
    d.M = OC, d.N = C, d.K = N, d.trans_a = true, d.beta = overwrite ? 0.0f : 1.0f;
    gemm_any_out(dw, d, DY, Operand{x.data_ptr(), bf, C});
  }
  if (db.defined()) {
    if (DY.bf) {
      colsum_any_db(db, static_cast<const bf16*>(DY.p), N, OC, overwrite);
    } else {
      colsum_any_db(db, static_cast<const float*>(DY.p), N, OC, overwrite);
    }
  }
}

}  // namespace zt::cpu
