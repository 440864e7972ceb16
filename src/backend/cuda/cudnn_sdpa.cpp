// cuDNN SDPA graphs (contract: cudnn_sdpa.h).
#include "backend/cuda/cudnn_sdpa.h"

#include <limits>

#include "core/error.h"

namespace zt::cuda::cudnn {

namespace {

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

// Sequence lengths: n = s.T for query rows (q, out, dout, dq, lse), s.keys()
// for key rows (k, v, dk, dv).
// (B, n, H, D) memory as a (b, h, t, d) view: out, dout (and dense virtual tensors).
Layout rows_of(const SdpaShape& s, int64_t H) {
  return {{s.B, H, s.T, s.D}, {s.T * H * s.D, s.D, H * s.D, 1}};
}
// q, k, v and their gradients: (B, n, H, D) memory, or H heads of each
// token's qkv_row elements (a fused product's output), as (b, h, t, d).
int64_t qkv_row(const SdpaShape& s, int64_t H) { return s.qkv_row > 0 ? s.qkv_row : H * s.D; }
Layout qkv_rows(const SdpaShape& s, int64_t H, int64_t n) {
  const int64_t row = qkv_row(s, H);
  return {{s.B, H, n, s.D}, {n * row, s.D, row, 1}};
}
// The same memory as (b, h, d, t): the transposed operand of q k^T and dout v^T.
Layout qkv_transposed(const SdpaShape& s, int64_t H, int64_t n) {
  const int64_t row = qkv_row(s, H);
  return {{s.B, H, s.D, n}, {n * row, s.D, 1, row}};
}
// (B, Hq, T, Tk) scores, row-major; and the same values read transposed (Tk, T).
Layout scores(const SdpaShape& s) {
  const int64_t T = s.T, Tk = s.keys();
  return {{s.B, s.Hq, T, Tk}, {s.Hq * T * Tk, T * Tk, Tk, 1}};
}
Layout scores_transposed(const SdpaShape& s) {
  const int64_t T = s.T, Tk = s.keys();
  return {{s.B, s.Hq, Tk, T}, {s.Hq * T * Tk, T * Tk, 1, Tk}};
}
// (B, Hq, T, 1) per-row statistics: our lse layout (B, Hq, T).
Layout row_stats(const SdpaShape& s) { return {{s.B, s.Hq, s.T, 1}, {s.Hq * s.T, s.T, 1, 1}}; }
// (B, Hq, n, D) per-query-head values (the GQA products before the group
// sum, n = Tk; the atomic dq accumulator, n = T).
Layout per_head(const SdpaShape& s, int64_t n) { return {{s.B, s.Hq, n, s.D}, {s.Hq * n * s.D, n * s.D, s.D, 1}}; }

void check_shape(const SdpaShape& s) {
  ZT_ASSERT(s.B > 0 && s.T > 0 && s.Hq > 0 && s.Hkv > 0 && s.D > 0 && s.Hq % s.Hkv == 0, "cuDNN SDPA shape");
  ZT_ASSERT(s.causal ? s.Tk == 0 || s.Tk == s.T : s.Tk > 0, "cuDNN SDPA keys: Tk = T when causal, > 0 when not");
  ZT_ASSERT(s.io == CUDNN_DATA_BFLOAT16 || s.io == CUDNN_DATA_HALF, "cuDNN SDPA takes bf16 or f16");
  ZT_ASSERT(s.qkv_row == 0 || s.qkv_row >= (s.Hq + 2 * s.Hkv) * s.D, "cuDNN SDPA packed qkv row");
}

// Scores where the key index exceeds the query index become -inf (causal);
// unmasked, the scores themselves.
Uid causal_mask(Graph& g, Uid scores_in, const Layout& layout, bool causal) {
  if (!causal) return scores_in;
  const Uid row = g.virtual_tensor(layout, CUDNN_DATA_INT32), col = g.virtual_tensor(layout, CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, kF32, scores_in, kNoTensor, kNoTensor, row, /*axis=*/2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, kF32, scores_in, kNoTensor, kNoTensor, col, /*axis=*/3);
  const Uid keep = g.virtual_tensor(layout, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, row, col, kNoTensor, keep);
  const Uid masked = g.virtual_tensor(layout, kF32);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, kF32, scores_in, g.scalar(-std::numeric_limits<float>::infinity()),
              keep, masked);
  return masked;
}

// out = x * scalar, a new f32 virtual tensor of x's layout.
Uid scaled(Graph& g, Uid x, float factor) {
  const Uid y = g.virtual_tensor(g.layout(x), kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, x, g.scalar(factor), kNoTensor, y);
  return y;
}

// grad (B, Hkv, Tk, D) = lhs^T-view @ rhs, summed over each kv head's group
// of query heads (a per-query-head product, then a reduction) when Hq > Hkv.
void grouped_product(Graph& g, const SdpaShape& s, Uid lhs, Uid rhs, Uid grad) {
  if (s.Hq == s.Hkv) return g.matmul(lhs, rhs, grad);
  const Uid full = g.virtual_tensor(per_head(s, s.keys()), s.io);
  g.matmul(lhs, rhs, full);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, grad);
}

}  // namespace

SdpaForwardGraph sdpa_forward_graph(const SdpaShape& s) {
  check_shape(s);
  SdpaForwardGraph f;
  f.graph = std::make_shared<Graph>();
  Graph& g = *f.graph;
  const int64_t T = s.T, Tk = s.keys();
  f.q = g.tensor(qkv_rows(s, s.Hq, T), s.io);
  f.k = g.tensor(qkv_transposed(s, s.Hkv, Tk), s.io);
  f.v = g.tensor(qkv_rows(s, s.Hkv, Tk), s.io);
  f.out = g.tensor(rows_of(s, s.Hq), s.io);
  f.lse = g.tensor(row_stats(s), kF32);

  const Layout sc = scores(s), rs = row_stats(s);
  const Uid qk = g.virtual_tensor(sc, kF32);
  g.matmul(f.q, f.k, qk);
  const Uid masked = causal_mask(g, scaled(g, qk, s.scale), sc, s.causal);
  // softmax with its log-sum-exp: max, x - max, exp, sum, lse = max + log(sum), p = exp / sum
  const Uid row_max = g.virtual_tensor(rs, kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, row_max);
  const Uid shifted = g.virtual_tensor(sc, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, kF32, masked, row_max, kNoTensor, shifted);
  const Uid e = g.virtual_tensor(sc, kF32);
  g.pointwise(CUDNN_POINTWISE_EXP, kF32, shifted, kNoTensor, kNoTensor, e);
  const Uid row_sum = g.virtual_tensor(rs, kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
  const Uid log_sum = g.virtual_tensor(rs, kF32);
  g.pointwise(CUDNN_POINTWISE_LOG, kF32, row_sum, kNoTensor, kNoTensor, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, kF32, row_max, log_sum, kNoTensor, f.lse);
  const Uid p = g.virtual_tensor(sc, s.io);  // the second product's operand type
  g.pointwise(CUDNN_POINTWISE_DIV, kF32, e, row_sum, kNoTensor, p);
  g.matmul(p, f.v, f.out);
  return f;
}

SdpaBackwardGraph sdpa_backward_graph(const SdpaShape& s, SdpaBackward algorithm) {
  check_shape(s);
  SdpaBackwardGraph b;
  b.graph = std::make_shared<Graph>();
  Graph& g = *b.graph;
  const int64_t T = s.T, Tk = s.keys();
  b.q = g.tensor(qkv_rows(s, s.Hq, T), s.io);
  b.k = g.tensor(qkv_transposed(s, s.Hkv, Tk), s.io);
  b.v = g.tensor(qkv_transposed(s, s.Hkv, Tk), s.io);
  b.out = g.tensor(rows_of(s, s.Hq), s.io);
  b.dout = g.tensor(rows_of(s, s.Hq), s.io);
  b.lse = g.tensor(row_stats(s), kF32);
  b.dq = g.tensor(qkv_rows(s, s.Hq, T), s.io);
  b.dk = g.tensor(qkv_rows(s, s.Hkv, Tk), s.io);
  b.dv = g.tensor(qkv_rows(s, s.Hkv, Tk), s.io);
  b.row_sums = g.tensor(row_stats(s), kF32);
  const Layout sc = scores(s), rs = row_stats(s);

  // row_sums = sum_d dout * out (the softmax backward's per-row term)
  const Uid prod = g.virtual_tensor(rows_of(s, s.Hq), kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, b.dout, b.out, kNoTensor, prod);
  const Uid sums = g.virtual_tensor(rs, kF32);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, sums);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, sums, g.scalar(1.0f), kNoTensor, b.row_sums);

  // p = exp(mask(scale * q k^T) - lse), recomputed from the saved statistics
  const Uid qk = g.virtual_tensor(sc, kF32);
  g.matmul(b.q, b.k, qk);
  const Uid shifted = g.virtual_tensor(sc, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, kF32, scaled(g, qk, s.scale), b.lse, kNoTensor, shifted);
  const Uid p = g.virtual_tensor(sc, kF32);
  g.pointwise(CUDNN_POINTWISE_EXP, kF32, causal_mask(g, shifted, sc, s.causal), kNoTensor, kNoTensor, p);

  // dv = p^T dout
  const Uid p_t = g.virtual_tensor(scores_transposed(s), s.io);
  g.reshape(p, p_t);
  grouped_product(g, s, p_t, b.dout, b.dv);

  // ds = scale * p * (dout v^T - row_sums)
  const Uid dp = g.virtual_tensor(sc, kF32);
  g.matmul(b.dout, b.v, dp);
  const Uid centred = g.virtual_tensor(sc, kF32);
  g.pointwise(CUDNN_POINTWISE_SUB, kF32, dp, b.row_sums, kNoTensor, centred);
  const Uid dsp = g.virtual_tensor(sc, kF32);
  g.pointwise(CUDNN_POINTWISE_MUL, kF32, centred, p, kNoTensor, dsp);
  const Uid ds = scaled(g, dsp, s.scale);

  // dk = ds^T q
  const Uid ds_t = g.virtual_tensor(scores_transposed(s), s.io);
  g.reshape(ds, ds_t);
  grouped_product(g, s, ds_t, b.q, b.dk);

  // dq = ds k (k read in its row layout: the same memory as b.k, so the
  // strides of a packed k too). Deterministic: a plain product
  // output, for which cuDNN keeps ds in its workspace (B x Hq x T^2 io
  // elements) and runs dq as a second pass. Atomic: cuDNN adds each key
  // tile's share into an f32 accumulator zeroed before the call, then copies
  // it into dq.
  const Uid k_rows = g.virtual_tensor(qkv_rows(s, s.Hkv, Tk), s.io);
  g.reshape(b.k, k_rows);
  if (algorithm == SdpaBackward::deterministic) {
    g.matmul(ds, k_rows, b.dq);
  } else {
    b.dq_accum = g.tensor(per_head(s, T), kF32);
    g.matmul(ds, k_rows, b.dq_accum);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, kF32, b.dq_accum, kNoTensor, kNoTensor, b.dq);
  }
  return b;
}

}  // namespace zt::cuda::cudnn
