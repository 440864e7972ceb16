// Grouped-query attention on the CPU, FlashAttention-2 style: causal, or
// unmasked with any number of keys (a block of context parallelism's ring).
//
// Math, per batch b and query head h (kv head g = h / (Hq / Hkv)), with
// S_ts = scale * q_t . k_s for keys s <= t (the causal mask; every key s
// when unmasked):
//   forward:  lse_t = log sum_{s<=t} exp(S_ts)      P_ts = exp(S_ts - lse_t)
//             out_t = sum_s P_ts v_s
//   backward: D_t   = dout_t . out_t
//             dP_ts = dout_t . v_s                  dS_ts = P_ts (dP_ts - D_t)
//             dq_t  = scale sum_s dS_ts k_s
//             dk_s  = scale sum_{h in group g} sum_t dS_ts q_t
//             dv_s  =       sum_{h in group g} sum_t P_ts dout_t
//
// Tiling: queries and keys are cut into tiles of kTile rows. Nothing T x T is
// ever stored: the forward keeps, per query tile, a running max m, running sum
// l and an unnormalised accumulator O, updated key tile by key tile (online
// softmax: m' = max(m, rowmax S), O = exp(m - m') O + exp(S - m') V); the
// backward recomputes P from lse. Score tiles are kept transposed (keys down,
// queries across), S^T = K Q^T, so the softmax reductions over keys are
// vertical and run along vectors of queries.
//
// Every tile product is C (+)= A B with B's rows contiguous and padded to a
// multiple of kLanes floats, computed by a register-blocked micro-kernel (MR rows
// x up to 64 columns of accumulators, A broadcast element by element, so A
// may be read transposed through its strides). On AVX-512 this runs near the
// FMA peak for 64-wide tiles, well above single-threaded sgemm calls on
// tiles that small. bf16 inputs are widened to f32 into contiguous scratch;
// outputs are rounded once.
//
// Parallelism:
//   forward:  one task per (query tile, batch, query head), heaviest (last)
//             query tiles first, dynamic schedule.
//   backward, fused schedule: one task per (batch, kv head): it owns dk and
//             dv of that kv head and dq of its query heads, so no two threads
//             write the same rows and every sum runs in a fixed order. Per
//             task (O(T) scratch): K, V, dK, dV of the kv head; Q, Q^T, dout,
//             dout^T, dQ of one query head. 5 tile products per tile pair.
//   backward, split schedule (when B * Hkv tasks would leave threads idle):
//             pass 1, one task per (batch, kv head, key tile) for dk, dv;
//             pass 2, one task per (batch, query head, query tile) for dq,
//             recomputing P and dS (7 tile products per tile pair).
//   Both schedules run the same tile steps in the same order for each output
//   row, so they agree to the bit: the result does not depend on the thread
//   count (which picks the schedule).
#include "backend/cpu/attention.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "backend/cpu/rope.h"
#include "backend/cpu/scratch.h"
#include "backend/cpu/simd.h"

namespace zt::cpu {
namespace {

constexpr int64_t kTile = 64;  // rows of a query tile and of a key tile
// Floats per vector: the target's widest (simd.h says why).
constexpr int64_t kLanes = simd::kV;

using vf = simd::f32v;
using vi = simd::i32v;

inline vf vload(const float* p) { return simd::load(p); }
inline void vstore(float* p, vf x) { simd::store(p, x); }

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// ---------------------------------------------------------------------------
// Tile products: C[M x N] = A[M x K] B[K x N]            (kSet)
//                C[M x N] += A B                         (kAdd)
//                C[M x N] = diag(row_scale) C + A B      (kScaleAdd)
// with A(m, k) = A[m*rs + k*cs], B rows contiguous (ldb), N a multiple of kLanes;
// C must not overlap A or B.

enum class Update { kSet, kAdd, kScaleAdd };

template <int MR, int NV, Update U>
inline __attribute__((always_inline)) void micro_kernel(int64_t K, const float* __restrict A, int64_t rs, int64_t cs,
                                                        const float* __restrict B, int64_t ldb, float* __restrict C,
                                                        int64_t ldc, const float* __restrict row_scale) {
  vf c[MR][NV];
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < NV; ++v) {
      if constexpr (U == Update::kSet) {
        c[r][v] = vf{};
      } else if constexpr (U == Update::kAdd) {
        c[r][v] = vload(C + r * ldc + v * kLanes);
      } else {
        c[r][v] = vload(C + r * ldc + v * kLanes) * row_scale[r];
      }
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    vf b[NV];
    for (int v = 0; v < NV; ++v) b[v] = vload(B + k * ldb + v * kLanes);
    for (int r = 0; r < MR; ++r) {
      const vf a = simd::splat(A[r * rs + k * cs]);
      for (int v = 0; v < NV; ++v) c[r][v] += a * b[v];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) vstore(C + r * ldc + v * kLanes, c[r][v]);
}

// Rows of one micro-kernel call for NV vectors of columns: 24 accumulators
// for NV = 3, 4 (plus NV loads and one broadcast: within AVX-512's 32
// registers); half that with AVX2's 16.
template <int NV>
constexpr int kRows = kLanes == 16 ? (NV >= 3 ? 6 : 8) : (NV >= 3 ? 3 : 4);

// Which k of a row block contribute on a diagonal tile, where row m and
// column k index the same positions (the terms outside are exactly zero, so
// skipping them leaves the sums unchanged):
//   kAll:  every k
//   kUpTo: k <= m   (rows are queries, k keys: P V, dS K)
//   kFrom: k >= m   (rows are keys, k queries: P^T dO, dS^T Q)
enum class Band { kAll, kUpTo, kFrom };

template <int R, int NV, Update U, Band W>
inline __attribute__((always_inline)) void micro_kernel_band(int64_t m, int64_t K, const float* A, int64_t rs,
                                                             int64_t cs, const float* B, int64_t ldb, float* C,
                                                             int64_t ldc, const float* row_scale) {
  int64_t k0 = 0, k1 = K;
  if constexpr (W == Band::kUpTo) k1 = std::min(K, m + R);
  if constexpr (W == Band::kFrom) k0 = std::min(K, m);
  micro_kernel<R, NV, U>(k1 - k0, A + m * rs + k0 * cs, rs, cs, B + k0 * ldb, ldb, C + m * ldc, ldc,
                         row_scale ? row_scale + m : nullptr);
}

// The last M % MR rows, from row m (R counts down to 1).
template <int R, int NV, Update U, Band W>
void gemm_tail(int64_t rem, int64_t m, int64_t K, const float* A, int64_t rs, int64_t cs, const float* B, int64_t ldb,
               float* C, int64_t ldc, const float* row_scale) {
  if constexpr (R > 0) {
    if (rem == R) {
      micro_kernel_band<R, NV, U, W>(m, K, A, rs, cs, B, ldb, C, ldc, row_scale);
    } else {
      gemm_tail<R - 1, NV, U, W>(rem, m, K, A, rs, cs, B, ldb, C, ldc, row_scale);
    }
  }
}

template <int NV, Update U, Band W>
void gemm_panel(int64_t M, int64_t K, const float* A, int64_t rs, int64_t cs, const float* B, int64_t ldb, float* C,
                int64_t ldc, const float* row_scale) {
  constexpr int MR = kRows<NV>;
  int64_t m = 0;
  for (; m + MR <= M; m += MR) micro_kernel_band<MR, NV, U, W>(m, K, A, rs, cs, B, ldb, C, ldc, row_scale);
  gemm_tail<MR - 1, NV, U, W>(M - m, m, K, A, rs, cs, B, ldb, C, ldc, row_scale);
}

template <Update U, Band W = Band::kAll>
void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t rs, int64_t cs, const float* B, int64_t ldb,
          float* C, int64_t ldc, const float* row_scale = nullptr) {
  for (int64_t n = 0; n < N; n += 4 * kLanes) {
    switch (std::min<int64_t>(4, (N - n) / kLanes)) {
      case 4:
        gemm_panel<4, U, W>(M, K, A, rs, cs, B + n, ldb, C + n, ldc, row_scale);
        break;
      case 3:
        gemm_panel<3, U, W>(M, K, A, rs, cs, B + n, ldb, C + n, ldc, row_scale);
        break;
      case 2:
        gemm_panel<2, U, W>(M, K, A, rs, cs, B + n, ldb, C + n, ldc, row_scale);
        break;
      default:
        gemm_panel<1, U, W>(M, K, A, rs, cs, B + n, ldb, C + n, ldc, row_scale);
        break;
    }
  }
}

// In-register transpose of a kLanes x kLanes block held as kLanes row
// vectors: at each level W (kLanes / 2, ..., 2, 1) rows r and r + W
// (r & W == 0) swap their off-diagonal W x W blocks; after all levels
// x[c][r] holds the old x[r][c].
template <int W, bool kHigh>
constexpr std::array<int32_t, kLanes> swap_mask() {
  std::array<int32_t, kLanes> m{};
  for (int l = 0; l < int(kLanes); ++l) {
    // Lanes 0..kLanes-1 pick from the upper row a, kLanes..2 kLanes-1 from the lower row b.
    if (!kHigh)
      m[size_t(l)] = (l & W) ? int32_t(kLanes) + l - W : l;
    else
      m[size_t(l)] = (l & W) ? int32_t(kLanes) + l : l + W;
  }
  return m;
}

template <int W, bool kHigh, size_t... L>
inline vf swap_blocks(vf a, vf b, std::index_sequence<L...>) {
  constexpr std::array<int32_t, kLanes> m = swap_mask<W, kHigh>();
  return __builtin_shuffle(a, b, vi{m[L]...});
}

template <int W, bool kHigh>
inline vf swap_blocks(vf a, vf b) {
  return swap_blocks<W, kHigh>(a, b, std::make_index_sequence<size_t(kLanes)>());
}

// Levels W, W / 2, ..., 1 (W < kLanes).
template <int W>
inline void transpose_levels(vf* x) {
  for (int r = 0; r < int(kLanes); ++r) {
    if (r & W) continue;
    const vf a = x[r], b = x[r + W];
    x[r] = swap_blocks<W, false>(a, b);
    x[r + W] = swap_blocks<W, true>(a, b);
  }
  if constexpr (W > 1) transpose_levels<W / 2>(x);
}

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (both multiples of kLanes).
void transpose(const float* __restrict src, int64_t lds, float* __restrict dst, int64_t ldd, int64_t rows,
               int64_t cols) {
  for (int64_t r0 = 0; r0 < rows; r0 += kLanes) {
    for (int64_t c0 = 0; c0 < cols; c0 += kLanes) {
      vf x[kLanes];
      for (int r = 0; r < int(kLanes); ++r) x[r] = vload(src + (r0 + r) * lds + c0);
      transpose_levels<int(kLanes) / 2>(x);
      for (int c = 0; c < int(kLanes); ++c) vstore(dst + (c0 + c) * ldd + r0, x[c]);
    }
  }
}

// dst[0..n) = scale * src[0..n) widened to f32; dst[n..n_pad) = 0.
template <typename T>
inline void widen_row(float* __restrict dst, const T* __restrict src, int64_t n, int64_t n_pad, float scale = 1.0f) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]) * scale;
  for (int64_t i = n; i < n_pad; ++i) dst[i] = 0.0f;
}

template <typename T>
inline void narrow_row(T* __restrict dst, const float* __restrict src, int64_t n, float scale) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = from_float<T>(src[i] * scale);
}

// ---------------------------------------------------------------------------

template <typename T>
void forward_impl(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                  float scale, bool causal) {
  // T_: queries; Tk: keys (== T_ when causal).
  const int64_t B = q.size(0), T_ = q.size(1), Hq = q.size(2), D = q.size(3), Hkv = k.size(2), Tk = k.size(1);
  if (B == 0 || T_ == 0 || Hq == 0) return;
  const int64_t G = Hq / Hkv, Dp = round_up(D, kLanes), nt = (T_ + kTile - 1) / kTile, ntk = (Tk + kTile - 1) / kTile;
  const T* qp = q.data<T>();
  const T* kp = k.data<T>();
  const T* vp = v.data<T>();
  T* op = out.data<T>();
  float* lp = lse.data<float>();
  // f32 with whole vectors per row: K and V tiles are read in place.
  const bool in_place_kv = std::is_same_v<T, float> && D % kLanes == 0;

  // Per-thread scratch: Q tile (kTile, Dp) and its transpose QT (Dp, kTile),
  // K tile (kTile, D), V tile (kTile, Dp), S^T / P^T tile (kTile, kTile),
  // O (kTile, Dp), m, l, alpha (kTile each).
  const size_t n_qt = size_t(Dp * kTile), n_kt = size_t(kTile * D), n_vt = size_t(kTile * Dp),
               n_st = size_t(kTile * kTile), n_o = size_t(kTile * Dp);
  const size_t total = 2 * n_qt + n_kt + n_vt + n_st + n_o + 3 * kTile;
  const int64_t ntasks = nt * B * Hq;

#pragma omp parallel
  {
    float* Qt = thread_scratch(total, 0);
    float* QT = Qt + n_qt;
    float* Kt = QT + n_qt;
    float* Vt = Kt + n_kt;
    float* ST = Vt + n_vt;
    float* O = ST + n_st;
    float* m = O + n_o;
    float* l = m + kTile;
    float* alpha = l + kTile;

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task) {
      const int64_t qi = nt - 1 - task / (B * Hq);  // heaviest tiles first
      const int64_t bh = task % (B * Hq), b = bh / Hq, h = bh % Hq, g = h / G;
      const int64_t i0 = qi * kTile, nq = std::min(kTile, T_ - i0), ncol = round_up(nq, kLanes);

      // QT[d][i] = scale * q[b, i0 + i, h, d]; columns nq..ncol zero.
      for (int64_t i = 0; i < nq; ++i) widen_row(Qt + i * Dp, qp + ((b * T_ + i0 + i) * Hq + h) * D, D, Dp, scale);
      std::fill(Qt + nq * Dp, Qt + ncol * Dp, 0.0f);
      transpose(Qt, Dp, QT, kTile, ncol, Dp);
      for (int64_t i = 0; i < kTile; ++i) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
      }

      const int64_t last = causal ? qi : ntk - 1;  // the last key tile these queries see
      for (int64_t j = 0; j <= last; ++j) {
        const int64_t j0 = j * kTile, nk = std::min(kTile, Tk - j0);
        const bool diagonal = causal && j == qi;  // same start: key s > query i is masked
        const T* ksrc = kp + ((b * Tk + j0) * Hkv + g) * D;  // row s at + s * Hkv * D
        const T* vsrc = vp + ((b * Tk + j0) * Hkv + g) * D;
        const float* Kb = Kt;
        const float* Vb = Vt;
        int64_t k_rs = D, v_rs = Dp;
        if (in_place_kv) {
          Kb = reinterpret_cast<const float*>(ksrc);
          Vb = reinterpret_cast<const float*>(vsrc);
          k_rs = v_rs = Hkv * D;
        } else {
          for (int64_t s = 0; s < nk; ++s) {
            widen_row(Kt + s * D, ksrc + s * Hkv * D, D, D);
            widen_row(Vt + s * Dp, vsrc + s * Hkv * D, D, Dp);
          }
        }

        // S^T (nk, ncol) = K_j Q_i^T (already scaled).
        gemm<Update::kSet>(nk, ncol, D, Kb, k_rs, 1, QT, kTile, ST, kTile);
        if (diagonal) {
          for (int64_t s = 1; s < nk; ++s)
            for (int64_t i = 0; i < s; ++i) ST[s * kTile + i] = -INFINITY;
        }
        // Online softmax, vertical over keys, kLanes queries at a time.
        for (int64_t c = 0; c < ncol; c += kLanes) {
          const vf m_old = vload(m + c);
          vf m_new = m_old;
          for (int64_t s = 0; s < nk; ++s) m_new = simd::vmax(vload(ST + s * kTile + c), m_new);  // NaN scores propagate
          vf sum = vf{};
          for (int64_t s = 0; s < nk; ++s) {
            const vf p = simd::exp_flush(vload(ST + s * kTile + c) - m_new);
            vstore(ST + s * kTile + c, p);
            sum += p;
          }
          const vf a = simd::exp_flush(m_old - m_new);  // 0 on the first tile (m_old = -inf)
          vstore(alpha + c, a);
          vstore(l + c, a * vload(l + c) + sum);
          vstore(m + c, m_new);
        }
        // O (nq, Dp) = diag(alpha) O + P V_j, P(i, s) = P^T[s][i]; on the
        // diagonal tile only keys s <= i contribute.
        if (j == 0 && diagonal) {
          gemm<Update::kSet, Band::kUpTo>(nq, Dp, nk, ST, 1, kTile, Vb, v_rs, O, Dp);
        } else if (j == 0) {
          gemm<Update::kSet>(nq, Dp, nk, ST, 1, kTile, Vb, v_rs, O, Dp);
        } else if (diagonal) {
          gemm<Update::kScaleAdd, Band::kUpTo>(nq, Dp, nk, ST, 1, kTile, Vb, v_rs, O, Dp, alpha);
        } else {
          gemm<Update::kScaleAdd>(nq, Dp, nk, ST, 1, kTile, Vb, v_rs, O, Dp, alpha);
        }
      }

      for (int64_t i = 0; i < nq; ++i) {
        narrow_row(op + ((b * T_ + i0 + i) * Hq + h) * D, O + i * Dp, D, 1.0f / l[i]);
        lp[(b * Hq + h) * T_ + i0 + i] = m[i] + std::log(l[i]);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Backward.

// Inputs and outputs of one backward call, and its per-thread f32 workspace
// (rows indexed by absolute position t, so every schedule addresses a tile
// the same way; Tp and Tkp are the query and key counts rounded up to tiles):
//   kv head:    K, V, dK, dV             (Tkp, Dp) each
//   query head: Q (scaled), dO, dQ       (Tp, Dp) each
//               Q^T (scaled), dO^T       (Dp, Tp) each
//               lse, D_t                 (Tp) each
//   tiles:      S^T -> P^T, dP^T -> dS^T (kTile, kTile) each
// Causal: Tk == T_ and query tile i sees key tiles j <= i, the diagonal one
// masked; unmasked: every query tile sees every key tile in full.
template <typename T>
struct Backward {
  const T *q, *k, *v, *out, *dout;
  const float* lse;
  T *dq, *dk, *dv;
  int64_t B, T_, Tk, Hq, Hkv, D, G, Dp, nt, ntk, Tp, Tkp;
  float scale;
  bool causal;

  size_t workspace_floats() const {
    return 4 * size_t(Tkp * Dp) + 3 * size_t(Tp * Dp) + 2 * size_t(Dp * Tp) + 2 * size_t(Tp) +
           2 * size_t(kTile * kTile);
  }

  // The first query tile that sees key tile j, and the last key tile query tile i sees.
  int64_t first_query_tile(int64_t j) const { return causal ? j : 0; }
  int64_t last_key_tile(int64_t i) const { return causal ? i : ntk - 1; }

  struct Work {
    float *K, *V, *dK, *dV, *Q, *dO, *dQ, *QT, *dOT, *L, *Dt, *ST, *dPT;
  };
  Work carve(float* p) const {
    Work w;
    const size_t krow = size_t(Tkp * Dp), row = size_t(Tp * Dp), col = size_t(Dp * Tp), tile = size_t(kTile * kTile);
    for (float** f : {&w.K, &w.V, &w.dK, &w.dV}) {
      *f = p;
      p += krow;
    }
    for (float** f : {&w.Q, &w.dO, &w.dQ}) {
      *f = p;
      p += row;
    }
    w.QT = p;
    w.dOT = p + col;
    w.L = p + 2 * col;
    w.Dt = w.L + Tp;
    w.ST = w.Dt + Tp;
    w.dPT = w.ST + tile;
    return w;
  }

  // Widen rows [t0, t1) of kv head (b, g) into K, V.
  void load_kv(const Work& w, int64_t b, int64_t g, int64_t t0, int64_t t1) const {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t off = ((b * Tk + t) * Hkv + g) * D;
      widen_row(w.K + t * Dp, k + off, D, Dp);
      widen_row(w.V + t * Dp, v + off, D, Dp);
    }
  }

  // Widen rows [t0, t1) of query head (b, h) (t0 a tile start): Q (scaled),
  // dO, lse, D_t = dO . out, and the transposes of Q and dO. Rows T..Tp are
  // zero when t1 = T (they feed only score columns that are never used).
  void load_q(const Work& w, int64_t b, int64_t h, int64_t t0, int64_t t1) const {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t off = ((b * T_ + t) * Hq + h) * D;
      widen_row(w.Q + t * Dp, q + off, D, Dp, scale);
      widen_row(w.dO + t * Dp, dout + off, D, Dp);
      const float* g = w.dO + t * Dp;
      const T* o = out + off;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += g[d] * to_float(o[d]);
      w.Dt[t] = dot;
      w.L[t] = lse[(b * Hq + h) * T_ + t];
    }
    int64_t t_end = t1;
    if (t1 == T_) {
      std::fill(w.Q + T_ * Dp, w.Q + Tp * Dp, 0.0f);
      std::fill(w.dO + T_ * Dp, w.dO + Tp * Dp, 0.0f);
      std::fill(w.L + T_, w.L + Tp, 0.0f);
      std::fill(w.Dt + T_, w.Dt + Tp, 0.0f);
      t_end = Tp;
    }
    transpose(w.Q + t0 * Dp, Dp, w.QT + t0, Tp, t_end - t0, Dp);
    transpose(w.dO + t0 * Dp, Dp, w.dOT + t0, Tp, t_end - t0, Dp);
  }

  // Query tile i against key tile j (j <= i when causal) of the loaded heads:
  //   S^T = K_j Q_i^T, P^T = exp(S^T - lse), dP^T = V_j dO_i^T, dS^T = P^T (dP^T - D)
  //   kDKV: dV_j += P^T dO_i, dK_j += dS^T Q_i     kDQ: dQ_i += dS K_j
  // Every schedule runs the same calls in the same order per output tile, so
  // the results agree to the bit.
  template <bool kDQ, bool kDKV>
  void tile_step(const Work& w, int64_t i, int64_t j) const {
    const int64_t j0 = j * kTile, nk = std::min(kTile, Tk - j0);
    const int64_t i0 = i * kTile, nq = std::min(kTile, T_ - i0), ncol = round_up(nq, kLanes);
    const bool diagonal = causal && i == j;
    const float* Kj = w.K + j0 * Dp;
    gemm<Update::kSet>(nk, ncol, D, Kj, Dp, 1, w.QT + i0, Tp, w.ST, kTile);
    gemm<Update::kSet>(nk, ncol, D, w.V + j0 * Dp, Dp, 1, w.dOT + i0, Tp, w.dPT, kTile);
    for (int64_t s = 0; s < nk; ++s) {
      for (int64_t c = 0; c < ncol; c += kLanes) {
        vf p = simd::exp_flush(vload(w.ST + s * kTile + c) - vload(w.L + i0 + c));
        if (diagonal) {  // key s > query c + lane is masked
          const vi col = simd::iota() + int32_t(c);
          p = col < (vi{} + int32_t(s)) ? vf{} : p;
        }
        vstore(w.ST + s * kTile + c, p);
        vstore(w.dPT + s * kTile + c, p * (vload(w.dPT + s * kTile + c) - vload(w.Dt + i0 + c)));
      }
    }
    // On the diagonal tile only pairs with key s <= query i contribute.
    if constexpr (kDKV) {
      if (diagonal) {
        gemm<Update::kAdd, Band::kFrom>(nk, Dp, nq, w.ST, kTile, 1, w.dO + i0 * Dp, Dp, w.dV + j0 * Dp, Dp);
        gemm<Update::kAdd, Band::kFrom>(nk, Dp, nq, w.dPT, kTile, 1, w.Q + i0 * Dp, Dp, w.dK + j0 * Dp, Dp);
      } else {
        gemm<Update::kAdd>(nk, Dp, nq, w.ST, kTile, 1, w.dO + i0 * Dp, Dp, w.dV + j0 * Dp, Dp);
        gemm<Update::kAdd>(nk, Dp, nq, w.dPT, kTile, 1, w.Q + i0 * Dp, Dp, w.dK + j0 * Dp, Dp);
      }
    }
    if constexpr (kDQ) {
      if (diagonal) {
        gemm<Update::kAdd, Band::kUpTo>(nq, Dp, nk, w.dPT, 1, kTile, Kj, Dp, w.dQ + i0 * Dp, Dp);
      } else {
        gemm<Update::kAdd>(nq, Dp, nk, w.dPT, 1, kTile, Kj, Dp, w.dQ + i0 * Dp, Dp);
      }
    }
  }

  void store_dq(const Work& w, int64_t b, int64_t h, int64_t t0, int64_t t1) const {
    for (int64_t t = t0; t < t1; ++t) narrow_row(dq + ((b * T_ + t) * Hq + h) * D, w.dQ + t * Dp, D, scale);
  }
  void store_dkv(const Work& w, int64_t b, int64_t g, int64_t t0, int64_t t1) const {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t off = ((b * Tk + t) * Hkv + g) * D;
      narrow_row(dk + off, w.dK + t * Dp, D, 1.0f);
      narrow_row(dv + off, w.dV + t * Dp, D, 1.0f);
    }
  }

  // Fused: one task per (b, kv head) computes its dk, dv and the dq of its
  // query heads (5 tile products per tile pair).
  void run_fused() const {
#pragma omp parallel
    {
      const Work w = carve(thread_scratch(workspace_floats(), 0));
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < B * Hkv; ++task) {
        const int64_t b = task / Hkv, g = task % Hkv;
        load_kv(w, b, g, 0, Tk);
        std::fill(w.dK, w.dK + Tk * Dp, 0.0f);
        std::fill(w.dV, w.dV + Tk * Dp, 0.0f);
        for (int64_t h = g * G; h < (g + 1) * G; ++h) {
          load_q(w, b, h, 0, T_);
          std::fill(w.dQ, w.dQ + T_ * Dp, 0.0f);
          for (int64_t j = 0; j < ntk; ++j)
            for (int64_t i = first_query_tile(j); i < nt; ++i) tile_step<true, true>(w, i, j);
          store_dq(w, b, h, 0, T_);
        }
        store_dkv(w, b, g, 0, Tk);
      }
    }
  }

  // Split: pass 1, one task per (b, kv head, key tile j) for dk, dv; pass 2,
  // one task per (b, query head, query tile i) for dq (recomputing S, P, dP:
  // 7 tile products per tile pair instead of 5, but nt times the tasks).
  void run_split() const {
#pragma omp parallel
    {
      const Work w = carve(thread_scratch(workspace_floats(), 0));
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < ntk * B * Hkv; ++task) {
        const int64_t j = task / (B * Hkv);  // heaviest (first) key tiles first
        const int64_t b = task % (B * Hkv) / Hkv, g = task % Hkv;
        const int64_t j0 = j * kTile, j1 = std::min(Tk, j0 + kTile), i_first = first_query_tile(j);
        load_kv(w, b, g, j0, j1);
        std::fill(w.dK + j0 * Dp, w.dK + j1 * Dp, 0.0f);
        std::fill(w.dV + j0 * Dp, w.dV + j1 * Dp, 0.0f);
        for (int64_t h = g * G; h < (g + 1) * G; ++h) {
          load_q(w, b, h, i_first * kTile, T_);
          for (int64_t i = i_first; i < nt; ++i) tile_step<false, true>(w, i, j);
        }
        store_dkv(w, b, g, j0, j1);
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < nt * B * Hq; ++task) {
        const int64_t i = nt - 1 - task / (B * Hq);  // heaviest (last) query tiles first
        const int64_t b = task % (B * Hq) / Hq, h = task % Hq;
        const int64_t i0 = i * kTile, i1 = std::min(T_, i0 + kTile), j_last = last_key_tile(i);
        load_kv(w, b, h / G, 0, std::min(Tk, (j_last + 1) * kTile));
        load_q(w, b, h, i0, i1);
        std::fill(w.dQ + i0 * Dp, w.dQ + i1 * Dp, 0.0f);
        for (int64_t j = 0; j <= j_last; ++j) tile_step<true, false>(w, i, j);
        store_dq(w, b, h, i0, i1);
      }
    }
  }
};

template <typename T>
void backward_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale,
                   bool causal, BackwardSchedule schedule) {
  Backward<T> a;
  a.q = q.data<T>();
  a.k = k.data<T>();
  a.v = v.data<T>();
  a.out = out.data<T>();
  a.dout = dout.data<T>();
  a.lse = lse.data<float>();
  a.dq = dq.data<T>();
  a.dk = dk.data<T>();
  a.dv = dv.data<T>();
  a.B = q.size(0);
  a.T_ = q.size(1);
  a.Tk = k.size(1);
  a.Hq = q.size(2);
  a.Hkv = k.size(2);
  a.D = q.size(3);
  if (a.B == 0 || a.Tk == 0) return;  // no keys: nothing to write (no queries either, ops checks)
  a.G = a.Hq / a.Hkv;
  a.Dp = round_up(a.D, kLanes);
  a.nt = (a.T_ + kTile - 1) / kTile;
  a.ntk = (a.Tk + kTile - 1) / kTile;
  a.Tp = a.nt * kTile;
  a.Tkp = a.ntk * kTile;
  a.scale = scale;
  a.causal = causal;
  if (schedule == BackwardSchedule::automatic) {
    // Fused unless its B * Hkv equal tasks would leave over a quarter of the
    // threads idle and there is more than one key tile to split over.
    const int64_t threads = omp_get_max_threads(), tasks = a.B * a.Hkv;
    const int64_t rounds = (tasks + threads - 1) / threads;
    const bool busy = 4 * tasks >= 3 * rounds * threads;
    schedule = busy || (a.nt <= 1 && a.ntk == 1) ? BackwardSchedule::fused : BackwardSchedule::split;
  }
  if (schedule == BackwardSchedule::split) {
    a.run_split();
  } else {
    a.run_fused();
  }
}

// q, k, v copied apart from the heads of qkv (B, T, Hq + 2 Hkv, D), in the
// workspace category; and empty tensors of their shapes (the gradients).
struct Heads {
  Tensor q, k, v;
};
Heads empty_heads(const Tensor& qkv, int64_t Hq, int64_t Hkv) {
  auto make = [&](int64_t H) {
    return Tensor::empty(Shape{qkv.size(0), qkv.size(1), H, qkv.size(3)}, qkv.dtype(), Device::cpu(),
                         MemCategory::workspace);
  };
  return {make(Hq), make(Hkv), make(Hkv)};
}
Heads split_heads(const Tensor& qkv, int64_t Hq, int64_t Hkv) {
  Heads h = empty_heads(qkv, Hq, Hkv);
  rope_split_qkv(qkv, h.q, h.k, h.v, Tensor(), 0, /*backward=*/false);
  return h;
}

// The merge of ops::attention_merge; the rows of (b, h) are independent.
template <typename T>
void merge_impl(const Tensor& out, const Tensor& lse, const Tensor& part, const Tensor& part_lse, int64_t row0) {
  const int64_t B = part.size(0), n = part.size(1), H = part.size(2), D = part.size(3), T_all = out.size(1);
  const T* ob = part.data<T>();
  const float* lb = part_lse.data<float>();
  float* o = out.data<float>();
  float* l = lse.data<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n; ++i) {
        float& run = l[(b * H + h) * T_all + row0 + i];
        const float blk = lb[(b * H + h) * n + i];
        const float hi = std::max(run, blk);
        const float merged = hi + std::log1p(std::exp(std::min(run, blk) - hi));  // log(e^run + e^blk)
        const float w_run = std::exp(run - merged), w_blk = std::exp(blk - merged);
        float* dst = o + ((b * T_all + row0 + i) * H + h) * D;
        const T* src = ob + ((b * n + i) * H + h) * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) dst[d] = w_run * dst[d] + w_blk * to_float(src[d]);
        run = merged;
      }
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       float scale, bool causal) {
  if (q.dtype() == DType::bf16) {
    forward_impl<bf16>(out, lse, q, k, v, scale, causal);
  } else {
    forward_impl<float>(out, lse, q, k, v, scale, causal);
  }
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale,
                        bool causal, BackwardSchedule schedule) {
  if (q.dtype() == DType::bf16) {
    backward_impl<bf16>(dq, dk, dv, dout, q, k, v, out, lse, scale, causal, schedule);
  } else {
    backward_impl<float>(dq, dk, dv, dout, q, k, v, out, lse, scale, causal, schedule);
  }
}

void attention_forward_packed(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t Hq, int64_t Hkv,
                              float scale) {
  const Heads h = split_heads(qkv, Hq, Hkv);
  attention_forward(out, lse, h.q, h.k, h.v, scale, /*causal=*/true);
}

void attention_backward_packed(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                               const Tensor& lse, int64_t Hq, int64_t Hkv, float scale) {
  const Heads h = split_heads(qkv, Hq, Hkv), g = empty_heads(qkv, Hq, Hkv);
  attention_backward(g.q, g.k, g.v, dout, h.q, h.k, h.v, out, lse, scale, /*causal=*/true);
  rope_split_qkv(dqkv, g.q, g.k, g.v, Tensor(), 0, /*backward=*/true);
}

void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& part, const Tensor& part_lse, int64_t row0) {
  if (part.dtype() == DType::bf16) {
    merge_impl<bf16>(out, lse, part, part_lse, row0);
  } else {
    merge_impl<float>(out, lse, part, part_lse, row0);
  }
}

}  // namespace zt::cpu
