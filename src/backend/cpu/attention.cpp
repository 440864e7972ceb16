// Causal grouped-query attention on the CPU, FlashAttention-2 style.
//
// Math, per batch b and query head h (kv head g = h / (Hq / Hkv)), with
// S_ts = scale * q_t . k_s for keys s <= t (the causal mask):
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
// multiple of 16 floats, computed by a register-blocked micro-kernel (MR rows
// x up to 64 columns of accumulators, A broadcast element by element, so A
// may be read transposed through its strides). On AVX-512 this runs near the
// FMA peak for 64-wide tiles, well above single-threaded sgemm calls on
// tiles that small. bf16 inputs are widened to f32 into contiguous scratch;
// outputs are rounded once.
//
// Parallelism:
//   forward:  one task per (query tile, batch, query head), heaviest (last)
//             query tiles first, dynamic schedule.
//   backward: one task per (batch, kv head): it owns dk and dv of that kv
//             head and dq of its query heads, so no two threads write the same
//             rows and every sum runs in a fixed order. The result does not
//             depend on the thread count. Per task (O(T) scratch): K, V, dK,
//             dV of the kv head; Q, Q^T, dout, dout^T, dQ of one query head.
#include "backend/cpu/attention.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/scratch.h"

namespace zt::cpu {
namespace {

constexpr int64_t kTile = 64;  // rows of a query tile and of a key tile
constexpr int64_t kLanes = 16;  // floats per vector

using vf = float __attribute__((vector_size(64)));
using vi = int32_t __attribute__((vector_size(64)));
using vf_unaligned = float __attribute__((vector_size(64), aligned(4), may_alias));

inline vf vload(const float* p) { return *reinterpret_cast<const vf_unaligned*>(p); }
inline void vstore(float* p, vf x) { *reinterpret_cast<vf_unaligned*>(p) = x; }
inline vf vsplat(float x) { return vf{} + x; }
inline vf vmax(vf a, vf b) { return a > b ? a : b; }

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// exp(x) per lane, relative error ~1e-7 (a few ulp). x < -87.3 (including -inf)
// gives exactly 0; x is clamped to <= 88. exp(x) = 2^n exp(r), n = round(x /
// ln 2), r = x - n ln 2 (ln 2 split in two so n ln2_hi is exact), exp(r) by
// its Taylor series to r^7 (|r| <= 0.347: truncation error < 6e-9).
inline vf vexp(vf x) {
  const vf lo = vsplat(-87.33654f), hi = vsplat(88.0f);
  const vi underflow = x < lo;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const vf magic = vsplat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  vf n = x * 1.44269504088896341f + magic;
  n = n - magic;
  vf r = x - n * 0.693359375f;  // ln2_hi (9 significant bits)
  r = r + n * 2.12194440054690583e-4f;  // -ln2_lo
  vf p = vsplat(1.0f / 5040.0f);
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
  const vf result = p * __builtin_bit_cast(vf, bits);
  return underflow ? vf{} : result;
}

// ---------------------------------------------------------------------------
// Tile products: C[M x N] (+)= A[M x K] B[K x N], A(m, k) = A[m*rs + k*cs],
// B rows contiguous (ldb), N a multiple of 16; C must not overlap A or B.

template <int MR, int NV, bool ACC>
inline __attribute__((always_inline)) void micro_kernel(int64_t K, const float* __restrict A, int64_t rs,
                                                        int64_t cs, const float* __restrict B, int64_t ldb,
                                                        float* __restrict C, int64_t ldc) {
  vf c[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) c[r][v] = ACC ? vload(C + r * ldc + v * kLanes) : vf{};
  for (int64_t k = 0; k < K; ++k) {
    vf b[NV];
    for (int v = 0; v < NV; ++v) b[v] = vload(B + k * ldb + v * kLanes);
    for (int r = 0; r < MR; ++r) {
      const vf a = vsplat(A[r * rs + k * cs]);
      for (int v = 0; v < NV; ++v) c[r][v] += a * b[v];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) vstore(C + r * ldc + v * kLanes, c[r][v]);
}

// Rows of one micro-kernel call for NV vectors of columns: 24 accumulators
// for NV = 3, 4 (plus NV loads and one broadcast: within 32 registers).
template <int NV>
constexpr int kRows = NV >= 3 ? 6 : 8;

// The last M % MR rows (R counts down to 1).
template <int R, int NV, bool ACC>
void gemm_tail(int64_t rem, int64_t K, const float* A, int64_t rs, int64_t cs, const float* B, int64_t ldb,
               float* C, int64_t ldc) {
  if constexpr (R > 0) {
    if (rem == R) {
      micro_kernel<R, NV, ACC>(K, A, rs, cs, B, ldb, C, ldc);
    } else {
      gemm_tail<R - 1, NV, ACC>(rem, K, A, rs, cs, B, ldb, C, ldc);
    }
  }
}

template <int NV, bool ACC>
void gemm_panel(int64_t M, int64_t K, const float* A, int64_t rs, int64_t cs, const float* B, int64_t ldb,
                float* C, int64_t ldc) {
  constexpr int MR = kRows<NV>;
  int64_t m = 0;
  for (; m + MR <= M; m += MR) micro_kernel<MR, NV, ACC>(K, A + m * rs, rs, cs, B, ldb, C + m * ldc, ldc);
  gemm_tail<MR - 1, NV, ACC>(M - m, K, A + m * rs, rs, cs, B, ldb, C + m * ldc, ldc);
}

template <bool ACC>
void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t rs, int64_t cs, const float* B, int64_t ldb,
          float* C, int64_t ldc) {
  for (int64_t n = 0; n < N; n += 4 * kLanes) {
    switch (std::min<int64_t>(4, (N - n) / kLanes)) {
      case 4: gemm_panel<4, ACC>(M, K, A, rs, cs, B + n, ldb, C + n, ldc); break;
      case 3: gemm_panel<3, ACC>(M, K, A, rs, cs, B + n, ldb, C + n, ldc); break;
      case 2: gemm_panel<2, ACC>(M, K, A, rs, cs, B + n, ldb, C + n, ldc); break;
      default: gemm_panel<1, ACC>(M, K, A, rs, cs, B + n, ldb, C + n, ldc); break;
    }
  }
}

// In-register transpose of a 16 x 16 block held as 16 row vectors: at each
// level W (8, 4, 2, 1) rows r and r + W (r & W == 0) swap their off-diagonal
// W x W blocks; after all four levels x[c][r] holds the old x[r][c].
template <int W, bool kHigh>
constexpr std::array<int32_t, kLanes> swap_mask() {
  std::array<int32_t, kLanes> m{};
  for (int l = 0; l < int(kLanes); ++l) {
    // Lanes 0..15 pick from the upper row a, 16..31 from the lower row b.
    if (!kHigh) m[size_t(l)] = (l & W) ? int32_t(kLanes) + l - W : l;
    else m[size_t(l)] = (l & W) ? int32_t(kLanes) + l : l + W;
  }
  return m;
}

template <int W, bool kHigh>
inline vf swap_blocks(vf a, vf b) {
  constexpr std::array<int32_t, kLanes> m = swap_mask<W, kHigh>();
  return __builtin_shuffle(a, b, vi{m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8], m[9], m[10], m[11],
                                    m[12], m[13], m[14], m[15]});
}

template <int W>
inline void transpose_level(vf* x) {
  for (int r = 0; r < int(kLanes); ++r) {
    if (r & W) continue;
    const vf a = x[r], b = x[r + W];
    x[r] = swap_blocks<W, false>(a, b);
    x[r + W] = swap_blocks<W, true>(a, b);
  }
}

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (both multiples of 16).
void transpose(const float* __restrict src, int64_t lds, float* __restrict dst, int64_t ldd, int64_t rows,
               int64_t cols) {
  for (int64_t r0 = 0; r0 < rows; r0 += kLanes) {
    for (int64_t c0 = 0; c0 < cols; c0 += kLanes) {
      vf x[kLanes];
      for (int r = 0; r < int(kLanes); ++r) x[r] = vload(src + (r0 + r) * lds + c0);
      transpose_level<8>(x);
      transpose_level<4>(x);
      transpose_level<2>(x);
      transpose_level<1>(x);
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
                  float scale) {
  const int64_t B = q.size(0), T_ = q.size(1), Hq = q.size(2), D = q.size(3), Hkv = k.size(2);
  if (B == 0 || T_ == 0 || Hq == 0) return;
  const int64_t G = Hq / Hkv, Dp = round_up(D, kLanes), nt = (T_ + kTile - 1) / kTile;
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
      std::fill(O, O + nq * Dp, 0.0f);

      for (int64_t j = 0; j <= qi; ++j) {
        const int64_t j0 = j * kTile, nk = std::min(kTile, T_ - j0);
        const T* ksrc = kp + ((b * T_ + j0) * Hkv + g) * D;  // row s at + s * Hkv * D
        const T* vsrc = vp + ((b * T_ + j0) * Hkv + g) * D;
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
        gemm<false>(nk, ncol, D, Kb, k_rs, 1, QT, kTile, ST, kTile);
        if (j == qi) {  // diagonal tile (same start): key s > query i is masked
          for (int64_t s = 1; s < nk; ++s)
            for (int64_t i = 0; i < s; ++i) ST[s * kTile + i] = -INFINITY;
        }
        // Online softmax, vertical over keys, 16 queries at a time.
        for (int64_t c = 0; c < ncol; c += kLanes) {
          const vf m_old = vload(m + c);
          vf m_new = m_old;
          for (int64_t s = 0; s < nk; ++s) m_new = vmax(m_new, vload(ST + s * kTile + c));
          vf sum = vf{};
          for (int64_t s = 0; s < nk; ++s) {
            const vf p = vexp(vload(ST + s * kTile + c) - m_new);
            vstore(ST + s * kTile + c, p);
            sum += p;
          }
          const vf a = vexp(m_old - m_new);  // 0 on the first tile (m_old = -inf)
          vstore(alpha + c, a);
          vstore(l + c, a * vload(l + c) + sum);
          vstore(m + c, m_new);
        }
        if (j > 0) {
          for (int64_t i = 0; i < nq; ++i) {
            const vf a = vsplat(alpha[i]);
            for (int64_t d = 0; d < Dp; d += kLanes) vstore(O + i * Dp + d, a * vload(O + i * Dp + d));
          }
        }
        // O (nq, Dp) += P V_j, P(i, s) = P^T[s][i].
        gemm<true>(nq, Dp, nk, ST, 1, kTile, Vb, v_rs, O, Dp);
      }

      for (int64_t i = 0; i < nq; ++i) {
        narrow_row(op + ((b * T_ + i0 + i) * Hq + h) * D, O + i * Dp, D, 1.0f / l[i]);
        lp[(b * Hq + h) * T_ + i0 + i] = m[i] + std::log(l[i]);
      }
    }
  }
}

template <typename T>
void backward_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                   const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale) {
  const int64_t B = q.size(0), T_ = q.size(1), Hq = q.size(2), D = q.size(3), Hkv = k.size(2);
  if (B == 0 || T_ == 0) return;
  const int64_t G = Hq / Hkv, Dp = round_up(D, kLanes), nt = (T_ + kTile - 1) / kTile, Tp = nt * kTile;
  const T* qp = q.data<T>();
  const T* kp = k.data<T>();
  const T* vp = v.data<T>();
  const T* op = out.data<T>();
  const T* dop = dout.data<T>();
  const float* lp = lse.data<float>();
  T* dqp = dq.data<T>();
  T* dkp = dk.data<T>();
  T* dvp = dv.data<T>();

  // Per-thread scratch, f32:
  //   kv head:    K, V, dK, dV             (Tp, Dp) each
  //   query head: Q (scaled), dO, dQ       (Tp, Dp) each
  //               Q^T (scaled), dO^T       (Dp, Tp) each
  //               lse, D_t                 (Tp) each
  //   tiles:      S^T -> P^T, dP^T -> dS^T (kTile, kTile) each
  const size_t n_row = size_t(Tp * Dp), n_col = size_t(Dp * Tp), n_tile = size_t(kTile * kTile);
  const size_t total = 7 * n_row + 2 * n_col + 2 * size_t(Tp) + 2 * n_tile;
  const int64_t ntasks = B * Hkv;

#pragma omp parallel
  {
    float* Kw = thread_scratch(total, 0);
    float* Vw = Kw + n_row;
    float* dKa = Vw + n_row;
    float* dVa = dKa + n_row;
    float* Qw = dVa + n_row;
    float* dOw = Qw + n_row;
    float* dQa = dOw + n_row;
    float* QTw = dQa + n_row;
    float* dOTw = QTw + n_col;
    float* Lw = dOTw + n_col;
    float* Dw = Lw + Tp;
    float* ST = Dw + Tp;
    float* dPT = ST + n_tile;

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < ntasks; ++task) {
      const int64_t b = task / Hkv, g = task % Hkv;
      for (int64_t t = 0; t < T_; ++t) {
        const int64_t off = ((b * T_ + t) * Hkv + g) * D;
        widen_row(Kw + t * Dp, kp + off, D, Dp);
        widen_row(Vw + t * Dp, vp + off, D, Dp);
      }
      std::fill(dKa, dKa + T_ * Dp, 0.0f);
      std::fill(dVa, dVa + T_ * Dp, 0.0f);

      for (int64_t h = g * G; h < (g + 1) * G; ++h) {
        // Widen this query head; padded columns t >= T of the transposed
        // copies are zero (they feed only score columns that are never used).
        for (int64_t t = 0; t < T_; ++t) {
          const int64_t off = ((b * T_ + t) * Hq + h) * D;
          widen_row(Qw + t * Dp, qp + off, D, Dp, scale);
          widen_row(dOw + t * Dp, dop + off, D, Dp);
          const float* g = dOw + t * Dp;
          const T* o = op + off;
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += g[d] * to_float(o[d]);
          Dw[t] = dot;
          Lw[t] = lp[(b * Hq + h) * T_ + t];
        }
        std::fill(Qw + T_ * Dp, Qw + Tp * Dp, 0.0f);
        std::fill(dOw + T_ * Dp, dOw + Tp * Dp, 0.0f);
        for (int64_t t = T_; t < Tp; ++t) Lw[t] = Dw[t] = 0.0f;
        transpose(Qw, Dp, QTw, Tp, Tp, Dp);
        transpose(dOw, Dp, dOTw, Tp, Tp, Dp);
        std::fill(dQa, dQa + T_ * Dp, 0.0f);

        for (int64_t j = 0; j < nt; ++j) {
          const int64_t j0 = j * kTile, nk = std::min(kTile, T_ - j0);
          const float* Kj = Kw + j0 * Dp;
          for (int64_t i = j; i < nt; ++i) {
            const int64_t i0 = i * kTile, nq = std::min(kTile, T_ - i0), ncol = round_up(nq, kLanes);
            // S^T = K_j Q_i^T, dP^T = V_j dO_i^T   (nk, ncol)
            gemm<false>(nk, ncol, D, Kj, Dp, 1, QTw + i0, Tp, ST, kTile);
            gemm<false>(nk, ncol, D, Vw + j0 * Dp, Dp, 1, dOTw + i0, Tp, dPT, kTile);
            // P^T = exp(S^T - lse), dS^T = P^T (dP^T - D); key s > query i masked on the diagonal.
            for (int64_t s = 0; s < nk; ++s) {
              for (int64_t c = 0; c < ncol; c += kLanes) {
                vf p = vexp(vload(ST + s * kTile + c) - vload(Lw + i0 + c));
                if (i == j) {
                  vi col = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
                  col += int32_t(c);
                  p = col < (vi{} + int32_t(s)) ? vf{} : p;
                }
                vstore(ST + s * kTile + c, p);
                vstore(dPT + s * kTile + c, p * (vload(dPT + s * kTile + c) - vload(Dw + i0 + c)));
              }
            }
            // dV_j += P^T dO_i, dK_j += dS^T (scale Q_i)   (nk, Dp)
            gemm<true>(nk, Dp, nq, ST, kTile, 1, dOw + i0 * Dp, Dp, dVa + j0 * Dp, Dp);
            gemm<true>(nk, Dp, nq, dPT, kTile, 1, Qw + i0 * Dp, Dp, dKa + j0 * Dp, Dp);
            // dQ_i += dS K_j, dS(i, s) = dS^T[s][i]   (nq, Dp)
            gemm<true>(nq, Dp, nk, dPT, 1, kTile, Kj, Dp, dQa + i0 * Dp, Dp);
          }
        }
        for (int64_t t = 0; t < T_; ++t) narrow_row(dqp + ((b * T_ + t) * Hq + h) * D, dQa + t * Dp, D, scale);
      }
      for (int64_t t = 0; t < T_; ++t) {
        const int64_t off = ((b * T_ + t) * Hkv + g) * D;
        narrow_row(dkp + off, dKa + t * Dp, D, 1.0f);
        narrow_row(dvp + off, dVa + t * Dp, D, 1.0f);
      }
    }
  }
}

}  // namespace

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       float scale) {
  if (q.dtype() == DType::bf16) {
    forward_impl<bf16>(out, lse, q, k, v, scale);
  } else {
    forward_impl<float>(out, lse, q, k, v, scale);
  }
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale) {
  if (q.dtype() == DType::bf16) {
    backward_impl<bf16>(dq, dk, dv, dout, q, k, v, out, lse, scale);
  } else {
    backward_impl<float>(dq, dk, dv, dout, q, k, v, out, lse, scale);
  }
}

}  // namespace zt::cpu
