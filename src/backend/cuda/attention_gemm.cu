// CUDA causal GQA attention on tensor cores: the score and probability
// matrices are products through cuBLASLt (strided batches over the heads of
// one batch row), with row kernels for the causal softmax and its backward.
//
// Per batch row b and kv-head chunk [h0, h0 + hc) (all g = Hq / Hkv query
// heads of each kv head):
//   forward   S = scale Q K^T   (f32, (g hc, T, T))      one product per group member j
//             P = causal softmax(S), lse = logsumexp     (P in the model dtype)
//             O = P V                                     one product per j
//   backward  S = scale Q K^T again, dP = dO V^T          (f32)
//             P = exp(S - lse), delta = rowsum(P dP),
//             dS = scale P (dP - delta)                   (model dtype)
//             dV += P^T dO, dK += dS^T Q                  (f32 accumulators, summed over j in order)
//             dQ = dS K
// Query head h = h' g + j of kv head h'. The masked upper triangle is
// computed and multiplied by zero (2x the FLOPs of a fused kernel, all of it
// on tensor cores); the (T, T) matrices cost memory traffic a fused flash
// kernel avoids. Deterministic: fixed products, fixed-order row reductions,
// group members accumulated in order.
//
// Layouts as attention.h: q, out, dq (B, T, Hq, D); k, v, dk, dv (B, T, Hkv, D);
// lse (B, Hq, T).
#include <algorithm>
#include <cstdint>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/matmul.h"

namespace zt::cuda {

namespace {

constexpr int kRowThreads = 256;

// One block per row r of S (local head r / T, query t = r % T): P[r, s] =
// exp(S[r, s] - m) / l for s <= t, 0 above; lse[lse_base + r] = m + log l.
template <typename T>
__global__ void causal_softmax_kernel(const float* __restrict__ S, T* __restrict__ P, float* __restrict__ lse,
                                      int64_t Tn, int64_t ld, int64_t lse_base) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, t = r % Tn;
  const float* s = S + r * ld;
  T* p = P + r * ld;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, s[j]);
  m = block_max(m, scratch);
  float l = 0.0f;
  for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) l += expf(s[j] - m);
  l = block_sum(l, scratch);
  const float inv = 1.0f / l;
  for (int64_t j = threadIdx.x; j < Tn; j += blockDim.x) p[j] = from_f32<T>(j <= t ? expf(s[j] - m) * inv : 0.0f);
  if (threadIdx.x == 0) lse[lse_base + r] = m + logf(l);
}

// One block per row: P = exp(S - lse) (causal), delta = sum_s P dP,
// dS = scale P (dP - delta); both 0 above the diagonal.
template <typename T>
__global__ void softmax_backward_kernel(const float* __restrict__ S, const float* __restrict__ dP,
                                        const float* __restrict__ lse, T* __restrict__ P, T* __restrict__ dS,
                                        int64_t Tn, int64_t ld, int64_t lse_base, float scale) {
  __shared__ float scratch[32];
  const int64_t r = blockIdx.x, t = r % Tn;
  const float* s = S + r * ld;
  const float* dp = dP + r * ld;
  const float L = lse[lse_base + r];
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j <= t; j += blockDim.x) acc += expf(s[j] - L) * dp[j];
  const float delta = block_sum(acc, scratch);
  T* p = P + r * ld;
  T* ds = dS + r * ld;
  for (int64_t j = threadIdx.x; j < Tn; j += blockDim.x) {
    const float pj = j <= t ? expf(s[j] - L) : 0.0f;
    p[j] = from_f32<T>(pj);
    ds[j] = from_f32<T>(j <= t ? scale * pj * (dp[j] - delta) : 0.0f);
  }
}

struct Dims {
  int64_t B, T, Hq, Hkv, D;
  int64_t g() const { return Hq / Hkv; }
  // Row stride of the (T, T) matrices: a multiple of 8 elements keeps every
  // row 16-byte aligned for the tensor-core products.
  int64_t ld() const { return (T + 7) / 8 * 8; }
  int64_t per_head() const { return T * ld(); }
};

Dims dims_of(const AttentionShape& s) { return {s.B, s.T, s.Hq, s.Hkv, s.D}; }
Dims dims_of(const Tensor& q, const Tensor& k) { return dims_of(attention_shape(q, k)); }

// Workspace bytes per (query head, T, ld) element: forward S (f32) + P;
// backward S, dP (f32) + P, dS.
int64_t bytes_per_score(DType dt, bool backward) {
  return backward ? 8 + 2 * int64_t(dtype_size(dt)) : 4 + int64_t(dtype_size(dt));
}

// kv heads per chunk so the score matrices fit the budget (0: not even one).
int64_t kv_heads_per_chunk(const Dims& d, DType dt, bool backward, int64_t budget) {
  const int64_t per_kv_head = d.g() * d.per_head() * bytes_per_score(dt, backward);
  return std::min(d.Hkv, budget / per_kv_head);
}

// Element pointer arithmetic on untyped device pointers.
const void* at(const void* p, int64_t elems, size_t es) { return static_cast<const char*>(p) + elems * int64_t(es); }
void* at(void* p, int64_t elems, size_t es) { return static_cast<char*>(p) + elems * int64_t(es); }

// The (T, T) score products of one chunk: out[(h' - h0) g + j] =
// alpha x_{h' g + j} y_{h'}^T for every j (x: rows of q or dout at the
// chunk's first head, y: rows of k or v at kv head h0).
void score_products(const Dims& d, int64_t hc, DType dt, const void* x, const void* y, float* out, float alpha,
                    Device dev) {
  const size_t es = dtype_size(dt);
  const int64_t g = d.g(), TT = d.per_head();
  for (int64_t j = 0; j < g; ++j) {
    StridedGemm gm;
    gm.M = d.T, gm.N = d.T, gm.K = d.D, gm.batch = hc;
    gm.trans_b = true;
    gm.lda = d.Hq * d.D, gm.ldb = d.Hkv * d.D, gm.ldc = d.ld();
    gm.stride_a = g * d.D, gm.stride_b = d.D, gm.stride_c = g * TT;
    gm.alpha = alpha;
    strided_gemm(gm, dt, at(x, j * d.D, es), y, DType::f32, out + j * TT, dev);
  }
}

// One chunk of kv heads [h0, h0 + hc) of batch row b: the element offsets of
// its first query head's row 0 (q, out, dq, dout) and of its first kv head's
// row 0 (k, v, dk, dv), and the lse index of its first row.
struct Chunk {
  int64_t b, h0, hc, qrow, kvrow, lse_base;
};

// What a pass derives from the shapes: the dims, the model dtype and its
// size, the device, and the kv heads per chunk (an error when not even one
// fits the budget).
struct Pass {
  Dims d;
  DType dt;
  size_t es;
  Device dev;
  int64_t g, TT, chunk;
  Pass(const Tensor& q, const Tensor& k, bool backward, int64_t budget)
      : d(dims_of(q, k)), dt(q.dtype()), es(dtype_size(dt)), dev(q.device()), g(d.g()), TT(d.per_head()),
        chunk(kv_heads_per_chunk(d, dt, backward, budget)) {
    ZT_CHECK(chunk >= 1, "attention: T = ", d.T, " needs more workspace than the tensor-core path's budget of ",
             budget, " bytes (the simple kernel takes any T)");
  }
  // A workspace of one chunk's (T, ld) matrices.
  Tensor matrices(DType type) const {
    return Tensor::empty(Shape{chunk * g * TT}, type, dev, MemCategory::workspace);
  }
};

// out_h = A_h Y_h' (T, D) for query head h = h' g + j of every kv head h' of
// chunk c: A the chunk's (T, T) matrices in the model dtype (P or dS), Y
// (T, D) rows of v or k, out rows of out or dq.
void query_rows_product(const Pass& p, const Chunk& c, int64_t j, const void* a, const void* y, void* out) {
  const Dims& d = p.d;
  StridedGemm gm;
  gm.M = d.T, gm.N = d.D, gm.K = d.T, gm.batch = c.hc;
  gm.lda = d.ld(), gm.ldb = d.Hkv * d.D, gm.ldc = d.Hq * d.D;
  gm.stride_a = p.g * p.TT, gm.stride_b = d.D, gm.stride_c = p.g * d.D;
  strided_gemm(gm, p.dt, at(a, j * p.TT, p.es), at(y, c.kvrow, p.es), p.dt, at(out, c.qrow + j * d.D, p.es), p.dev);
}

// Calls fn(c) for every chunk of `chunk` kv heads of every batch row, in order.
template <typename F>
void for_each_chunk(const Dims& d, int64_t chunk, F&& fn) {
  const int64_t g = d.g();
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h0 = 0; h0 < d.Hkv; h0 += chunk)
      fn(Chunk{b, h0, std::min(chunk, d.Hkv - h0), b * d.T * d.Hq * d.D + h0 * g * d.D, b * d.T * d.Hkv * d.D + h0 * d.D,
               (b * d.Hq + h0 * g) * d.T});
}

}  // namespace

bool gemm_attention_fits(const AttentionShape& s, bool backward, int64_t budget) {
  return kv_heads_per_chunk(dims_of(s), s.dtype, backward, budget) >= 1;
}

int64_t gemm_attention_workspace_bytes(const AttentionShape& s, bool backward, int64_t budget) {
  const Dims d = dims_of(s);
  if (d.B * d.T * d.Hq * d.D == 0) return 0;  // the passes return before allocating
  // As the passes allocate: one chunk's matrices (Pass::matrices), and in
  // backward the f32 dK, dV sums unless dk, dv are f32 themselves.
  const int64_t matrices = kv_heads_per_chunk(d, s.dtype, backward, budget) * d.g() * d.per_head() *
                           bytes_per_score(s.dtype, backward);
  const int64_t sums = backward && s.dtype != DType::f32 ? 2 * 4 * d.B * d.T * d.Hkv * d.D : 0;
  return matrices + sums;
}

void gemm_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                            float scale, int64_t budget) {
  if (q.numel() == 0) return;
  const Pass pass(q, k, false, budget);
  const auto& [d, dt, es, dev, g, TT, chunk] = pass;
  Tensor S = pass.matrices(DType::f32), P = pass.matrices(dt);
  cudaStream_t stream = stream_of(out);
  for_each_chunk(d, chunk, [&](const Chunk& c) {
    score_products(d, c.hc, dt, at(q.data_ptr(), c.qrow, es), at(k.data_ptr(), c.kvrow, es), S.data<float>(), scale,
                   dev);
    ZT_CUDA_DISPATCH_FLOAT(dt, "attention_forward", [&] {
      causal_softmax_kernel<T><<<unsigned(c.hc * g * d.T), kRowThreads, 0, stream>>>(
          S.data<float>(), static_cast<T*>(P.data_ptr()), lse.data<float>(), d.T, d.ld(), c.lse_base);
    });
    ZT_CUDA_CHECK_LAUNCH("causal_softmax_kernel");
    for (int64_t j = 0; j < g; ++j) query_rows_product(pass, c, j, P.data_ptr(), v.data_ptr(), out.data_ptr());  // O = P V
  });
}

void gemm_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                             const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse, float scale,
                             int64_t budget) {
  if (q.numel() == 0) return;
  const Pass pass(q, k, true, budget);
  const auto& [d, dt, es, dev, g, TT, chunk] = pass;
  Tensor S = pass.matrices(DType::f32), dP = pass.matrices(DType::f32), P = pass.matrices(dt), dS = pass.matrices(dt);
  // dK, dV summed over the group in f32, rounded once into dk, dv.
  const bool direct = dt == DType::f32;
  Tensor dk_acc = direct ? dk : Tensor::empty(dk.shape(), DType::f32, dev, MemCategory::workspace);
  Tensor dv_acc = direct ? dv : Tensor::empty(dv.shape(), DType::f32, dev, MemCategory::workspace);
  const size_t acc_es = dtype_size(dk_acc.dtype());
  cudaStream_t stream = stream_of(dq);
  for_each_chunk(d, chunk, [&](const Chunk& c) {
    score_products(d, c.hc, dt, at(q.data_ptr(), c.qrow, es), at(k.data_ptr(), c.kvrow, es), S.data<float>(), scale,
                   dev);
    score_products(d, c.hc, dt, at(dout.data_ptr(), c.qrow, es), at(v.data_ptr(), c.kvrow, es), dP.data<float>(), 1.0f,
                   dev);
    ZT_CUDA_DISPATCH_FLOAT(dt, "attention_backward", [&] {
      softmax_backward_kernel<T><<<unsigned(c.hc * g * d.T), kRowThreads, 0, stream>>>(
          S.data<float>(), dP.data<float>(), lse.data<float>(), static_cast<T*>(P.data_ptr()),
          static_cast<T*>(dS.data_ptr()), d.T, d.ld(), c.lse_base, scale);
    });
    ZT_CUDA_CHECK_LAUNCH("softmax_backward_kernel");
    for (int64_t j = 0; j < g; ++j) {
      // dV_h' (+)= P_h^T dO_h and dK_h' (+)= dS_h^T Q_h: (T keys, D), summed over j.
      StridedGemm kvg;
      kvg.M = d.T, kvg.N = d.D, kvg.K = d.T, kvg.batch = c.hc;
      kvg.trans_a = true;
      kvg.lda = d.ld(), kvg.ldb = d.Hq * d.D, kvg.ldc = d.Hkv * d.D;
      kvg.stride_a = g * TT, kvg.stride_b = g * d.D, kvg.stride_c = d.D;
      kvg.beta = j == 0 ? 0.0f : 1.0f;
      strided_gemm(kvg, dt, at(P.data_ptr(), j * TT, es), at(dout.data_ptr(), c.qrow + j * d.D, es), dv_acc.dtype(),
                   at(dv_acc.data_ptr(), c.kvrow, acc_es), dev);
      strided_gemm(kvg, dt, at(dS.data_ptr(), j * TT, es), at(q.data_ptr(), c.qrow + j * d.D, es), dk_acc.dtype(),
                   at(dk_acc.data_ptr(), c.kvrow, acc_es), dev);
      query_rows_product(pass, c, j, dS.data_ptr(), k.data_ptr(), dq.data_ptr());  // dQ = dS K
    }
  });
  if (!direct) {
    cast(dk, dk_acc);
    cast(dv, dv_acc);
  }
}

}  // namespace zt::cuda
