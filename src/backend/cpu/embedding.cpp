// CPU token + position embedding.
//
// Forward:  out[b, t, :] = wte[tokens[b, t], :] + wpe[t + pos_offset, :]
//           (one rounding to out's dtype; rows split over threads).
// Backward: dwte[v, :] += sum_{(b,t): tokens[b,t] == v} dout[b, t, :]
//           dwpe[t + pos_offset, :] += sum_b dout[b, t, :]
//
// Determinism of the scatter-add: the (token, position) pairs are sorted by
// token, then position (a key per position, so the order is unique). Each
// distinct token's rows are summed in f32 in position order by the one thread
// that owns that token, and the sum is added to dwte once (one rounding per
// row of dwte, also for bf16 grads). Likewise each position t of dwpe is owned
// by one thread that sums over b in order. Neither order depends on the
// thread count, so the result is bitwise reproducible.
#include "backend/cpu/embedding.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "backend/cpu/elementwise.h"
#include "backend/cpu/scratch.h"

namespace zt::cpu {

namespace {

// rows < 0: wte is the whole vocabulary; else it holds ids [start, start + rows)
// and other tokens' wte term is zero.
template <typename T>
void forward_kernel(T* out, const int32_t* tok, const T* wte, const T* wpe, int64_t BT, int64_t T_, int64_t C,
                    int64_t pos_offset, int64_t start, int64_t rows) {
#pragma omp parallel for schedule(static) if (BT * C >= 16384)
  for (int64_t i = 0; i < BT; ++i) {
    const int64_t v = int64_t(tok[i]) - start;
    T* o = out + i * C;
    if (rows >= 0 && (v < 0 || v >= rows)) {  // another rank's token: only the position term
      if (wpe == nullptr) {
        std::fill(o, o + C, store_as<T>(0.0f));
      } else {
        std::memcpy(o, wpe + (i % T_ + pos_offset) * C, size_t(C) * sizeof(T));
      }
      continue;
    }
    const T* w = wte + v * C;
    if (wpe == nullptr) {
      std::memcpy(o, w, size_t(C) * sizeof(T));
      continue;
    }
    const T* p = wpe + (i % T_ + pos_offset) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = store_as<T>(load_f32(w[c]) + load_f32(p[c]));
  }
}

// acc = dout row (first) or acc += dout row.
template <typename D>
inline void row_set(float* acc, const D* d, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) acc[c] = load_f32(d[c]);
}
template <typename D>
inline void row_add(float* acc, const D* d, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) acc[c] += load_f32(d[c]);
}
template <typename G>
inline void row_accumulate(G* g, const float* acc, int64_t C) {
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) g[c] = store_as<G>(load_f32(g[c]) + acc[c]);
}

// rows >= 0: dwte holds ids [start, start + rows); other tokens are skipped.
template <typename G, typename D>
void wte_backward(G* dwte, const D* dout, const int32_t* tok, int64_t BT, int64_t C, int64_t start, int64_t rows) {
  if (BT == 0) return;
  // keys = local token << 32 | position, sorted: positions grouped by token, in order.
  auto* keys = reinterpret_cast<uint64_t*>(thread_scratch(size_t(BT) * 2, 1));
  int64_t kept = 0;
  for (int64_t i = 0; i < BT; ++i) {
    const int64_t v = int64_t(tok[i]) - start;
    if (rows >= 0 && (v < 0 || v >= rows)) continue;
    keys[kept++] = (uint64_t(v) << 32) | uint64_t(i);
  }
  BT = kept;
  if (BT == 0) return;
  std::sort(keys, keys + BT);
  // run_start[r]: index in keys of the first entry of the r-th distinct token.
  auto* run_start = reinterpret_cast<int64_t*>(thread_scratch(size_t(BT + 1) * 2, 2));
  int64_t runs = 0;
  for (int64_t i = 0; i < BT; ++i)
    if (i == 0 || (keys[i] >> 32) != (keys[i - 1] >> 32)) run_start[runs++] = i;
  run_start[runs] = BT;
#pragma omp parallel if (runs > 1 && BT * C >= 16384)
  {
    float* acc = thread_scratch(size_t(C), 0);
#pragma omp for schedule(dynamic, 8)
    for (int64_t r = 0; r < runs; ++r) {
      const int64_t k0 = run_start[r], k1 = run_start[r + 1];
      const int64_t v = int64_t(keys[k0] >> 32);
      const D* first = dout + int64_t(keys[k0] & 0xffffffffu) * C;
      if (k1 == k0 + 1) {  // a token seen once: add its row directly
        G* gv = dwte + v * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) gv[c] = store_as<G>(load_f32(gv[c]) + load_f32(first[c]));
        continue;
      }
      row_set(acc, first, C);
      for (int64_t k = k0 + 1; k < k1; ++k) row_add(acc, dout + int64_t(keys[k] & 0xffffffffu) * C, C);
      row_accumulate(dwte + v * C, acc, C);
    }
  }
}

template <typename G, typename D>
void wpe_backward(G* dwpe, const D* dout, int64_t B, int64_t T_, int64_t C, int64_t pos_offset) {
  if (B == 0) return;
#pragma omp parallel if (T_ > 1 && B * T_ * C >= 16384)
  {
    float* acc = thread_scratch(size_t(C), 0);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T_; ++t) {
      row_set(acc, dout + t * C, C);
      for (int64_t b = 1; b < B; ++b) row_add(acc, dout + (b * T_ + t) * C, C);
      row_accumulate(dwpe + (t + pos_offset) * C, acc, C);
    }
  }
}

template <typename D>
void backward_typed(const Tensor& dwte, const Tensor& dwpe, const D* dout, const Tensor& tokens, int64_t pos_offset,
                    int64_t C, int64_t start, bool sliced) {
  const int64_t B = tokens.size(0), T_ = tokens.size(1);
  if (dwte.defined()) {
    const int64_t rows = sliced ? dwte.size(0) : -1;
    if (dwte.dtype() == DType::f32)
      wte_backward(dwte.data<float>(), dout, tokens.data<int32_t>(), B * T_, C, start, rows);
    else
      wte_backward(dwte.data<D>(), dout, tokens.data<int32_t>(), B * T_, C, start, rows);
  }
  if (dwpe.defined()) {
    if (dwpe.dtype() == DType::f32)
      wpe_backward(dwpe.data<float>(), dout, B, T_, C, pos_offset);
    else
      wpe_backward(dwpe.data<D>(), dout, B, T_, C, pos_offset);
  }
}

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset, int64_t vocab_start, bool sliced) {
  const int64_t B = tokens.size(0), T_ = tokens.size(1), C = wte.size(1), rows = sliced ? wte.size(0) : -1;
  if (out.dtype() == DType::f32) {
    forward_kernel(out.data<float>(), tokens.data<int32_t>(), wte.data<float>(),
                   wpe.defined() ? wpe.data<float>() : nullptr, B * T_, T_, C, pos_offset, vocab_start, rows);
  } else {
    ZT_ASSERT(out.dtype() == DType::bf16, "embedding_forward: dtype ", dtype_name(out.dtype()));
    forward_kernel(out.data<bf16>(), tokens.data<int32_t>(), wte.data<bf16>(),
                   wpe.defined() ? wpe.data<bf16>() : nullptr, B * T_, T_, C, pos_offset, vocab_start, rows);
  }
}

void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& tokens,
                        int64_t pos_offset, int64_t vocab_start, bool sliced) {
  const int64_t C = dout.size(2);
  if (dout.dtype() == DType::f32) {
    backward_typed(dwte, dwpe, dout.data<float>(), tokens, pos_offset, C, vocab_start, sliced);
  } else {
    ZT_ASSERT(dout.dtype() == DType::bf16, "embedding_backward: dtype ", dtype_name(dout.dtype()));
    backward_typed(dwte, dwpe, dout.data<bf16>(), tokens, pos_offset, C, vocab_start, sliced);
  }
}

}  // namespace zt::cpu
