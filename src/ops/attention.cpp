// Grouped-query attention (causal or unmasked): argument validation and
// device dispatch.
// The math (forward, and the gradient rule of the backward) is in
// backend/cpu/attention.cpp; the contract in ops/attention.h.
#include "ops/attention.h"

#include <cmath>
#include <cstdint>

#include "backend/cpu/attention.h"
#include "core/determinism.h"
#include "ops/check.h"
#include "ops/op_profile.h"
#if ZT_WITH_CUDA
#include "backend/cuda/attention.h"
#endif

namespace zt::ops {
namespace {

struct Dims {
  int64_t B, T, Hq, Hkv, D;
  int64_t Tk;  // keys: T when causal
};

// The forward's two products (q k^T, p v: 4 B Hq T Tk D), causal: over the
// half the kernels compute - the count FlashAttention's and our bench's
// rates use.
double forward_flops(const Dims& d, AttentionMask mask) {
  const double full = 4.0 * double(d.B) * double(d.Hq) * double(d.T) * double(d.Tk) * double(d.D);
  return mask == AttentionMask::causal ? full / 2 : full;
}
double causal_forward_flops(const Dims& d) { return forward_flops(d, AttentionMask::causal); }

// Checks q, k, v (and returns their dims): q (B, T, Hq, D), k = v (B, Tk, Hkv, D)
// with Tk == T when causal and Tk > 0 when not, Hq % Hkv == 0, one float
// dtype (f32 or bf16) and one device.
Dims check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
               AttentionMask mask = AttentionMask::causal) {
  check_ndim(op, "q", q, 4);
  check_ndim(op, "k", k, 4);
  check_ndim(op, "v", v, 4);
  const Dims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3),
               mask == AttentionMask::causal ? q.size(1) : k.size(1)};
  ZT_CHECK(d.D > 0, op, ": 'q' has shape ", q.shape().str(), "; the head dim (last) must be positive");
  ZT_CHECK(mask == AttentionMask::causal || d.Tk > 0, op, ": 'k' has shape ", k.shape().str(),
           " with no keys; an unmasked block needs at least one key to attend to");
  check_shape(op, "k", k, Shape{d.B, d.Tk, d.Hkv, d.D});
  check_shape(op, "v", v, k.shape());
  ZT_CHECK(d.Hkv > 0 && d.Hq % d.Hkv == 0, op, ": 'q' has ", d.Hq, " heads but 'k' and 'v' have ", d.Hkv,
           "; the query heads must be a positive multiple of the kv heads (q ", q.shape().str(), ", k ",
           k.shape().str(), ")");
  check_compute_dtype(op, "q", q);
  check_same_dtype(op, "k", k, "q", q);
  check_same_dtype(op, "v", v, "q", q);
  return d;
}

float resolve_scale(const char* op, float scale, int64_t D) {
  ZT_CHECK(!std::isnan(scale) && std::isfinite(scale), op, ": 'scale' is ", scale,
           "; pass a finite value (<= 0 selects 1/sqrt(D))");
  return scale > 0.0f ? scale : default_attention_scale(D);
}

// Checks qkv (B, T, Hq + 2 Hkv, D), the heads of q, k, v in one tensor, and
// returns the dims.
Dims check_packed(const char* op, const Tensor& qkv, int64_t Hq, int64_t Hkv) {
  check_ndim(op, "qkv", qkv, 4);
  ZT_CHECK(Hq > 0 && Hkv > 0 && Hq % Hkv == 0, op, ": Hq = ", Hq, " and Hkv = ", Hkv,
           "; the query heads must be a positive multiple of the kv heads");
  const Dims d{qkv.size(0), qkv.size(1), Hq, Hkv, qkv.size(3), qkv.size(1)};
  ZT_CHECK(qkv.size(2) == Hq + 2 * Hkv, op, ": 'qkv' has shape ", qkv.shape().str(), " but its third dim must hold ",
           Hq + 2 * Hkv, " heads: Hq = ", Hq, " query heads, then Hkv = ", Hkv, " key and ", Hkv, " value heads");
  ZT_CHECK(d.D > 0, op, ": 'qkv' has shape ", qkv.shape().str(), "; the head dim (last) must be positive");
  check_compute_dtype(op, "qkv", qkv);
  return d;
}

// The forward's outputs: out (B, T, Hq, D) in `like`'s dtype, lse (B, Hq, T) f32.
void check_forward_outputs(const char* op, const Dims& d, const Tensor& out, const Tensor& lse, const char* like_name,
                           const Tensor& like) {
  check_shape(op, "out", out, Shape{d.B, d.T, d.Hq, d.D});
  check_same_dtype(op, "out", out, like_name, like);
  check_shape(op, "lse", lse, Shape{d.B, d.Hq, d.T});
  check_dtype(op, "lse", lse, {DType::f32});
}

// The backward's inputs besides q, k, v: out and dout as forward's out, lse.
void check_backward_inputs(const char* op, const Dims& d, const Tensor& dout, const Tensor& out, const Tensor& lse,
                           const char* like_name, const Tensor& like) {
  check_forward_outputs(op, d, out, lse, like_name, like);
  check_shape(op, "dout", dout, out.shape());
  check_same_dtype(op, "dout", dout, like_name, like);
}

}  // namespace

float default_attention_scale(int64_t D) { return float(1.0 / std::sqrt(double(D))); }

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       float scale, AttentionMask mask) {
  const char* op = "attention_forward";
  OpScope scope(op, out);
  const Dims d = check_qkv(op, q, k, v, mask);
  check_forward_outputs(op, d, out, lse, "q", q);
  check_device(op, q.device(), {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}});
  check_disjoint_from(op, "out", out, {{"q", &q}, {"k", &k}, {"v", &v}, {"lse", &lse}});
  check_disjoint_from(op, "lse", lse, {{"q", &q}, {"k", &k}, {"v", &v}});
  const float s = resolve_scale(op, scale, d.D);
  scope.add_flops(forward_flops(d, mask));
  if (q.device().is_cpu()) {
    cpu::attention_forward(out, lse, q, k, v, s, mask == AttentionMask::causal);
#if ZT_WITH_CUDA
  } else if (use_cuda(op, q.device())) {
    cuda::attention_forward(out, lse, q, k, v, s, cuda::AttentionKernel::automatic, mask == AttentionMask::causal);
#endif
  } else {
    no_backend(op, q.device());
  }
}

void attention_forward_packed(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t Hq, int64_t Hkv,
                              float scale) {
  const char* op = "attention_forward";  // the same op in the profile as with separate q, k, v
  OpScope scope(op, out);
  const Dims d = check_packed(op, qkv, Hq, Hkv);
  check_forward_outputs(op, d, out, lse, "qkv", qkv);
  check_device(op, qkv.device(), {{"qkv", &qkv}, {"out", &out}, {"lse", &lse}});
  check_all_disjoint(op, {{"out", &out}, {"lse", &lse}, {"qkv", &qkv}});
  const float s = resolve_scale(op, scale, d.D);
  scope.add_flops(causal_forward_flops(d));
  if (qkv.device().is_cpu()) {
    cpu::attention_forward_packed(out, lse, qkv, Hq, Hkv, s);
#if ZT_WITH_CUDA
  } else if (use_cuda(op, qkv.device())) {
    cuda::attention_forward_packed(out, lse, qkv, Hq, Hkv, s);
#endif
  } else {
    no_backend(op, qkv.device());
  }
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale,
                        AttentionMask mask) {
  const char* op = "attention_backward";
  OpScope scope(op, dq);
  const Dims d = check_qkv(op, q, k, v, mask);
  check_backward_inputs(op, d, dout, out, lse, "q", q);
  check_shape(op, "dq", dq, q.shape());
  check_same_dtype(op, "dq", dq, "q", q);
  check_shape(op, "dk", dk, k.shape());
  check_same_dtype(op, "dk", dk, "q", q);
  check_shape(op, "dv", dv, v.shape());
  check_same_dtype(op, "dv", dv, "q", q);
  check_device(op, q.device(),
               {{"dq", &dq},
                {"dk", &dk},
                {"dv", &dv},
                {"dout", &dout},
                {"q", &q},
                {"k", &k},
                {"v", &v},
                {"out", &out},
                {"lse", &lse}});
  check_all_disjoint(op, {{"dq", &dq}, {"dk", &dk}, {"dv", &dv}});
  for (const auto& [grad, g] : {NamedTensor{"dq", &dq}, {"dk", &dk}, {"dv", &dv}})
    check_disjoint_from(op, grad, *g, {{"dout", &dout}, {"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}});
  const float s = resolve_scale(op, scale, d.D);
  scope.add_flops(2.5 * forward_flops(d, mask));  // dv, dp, dq, dk and the recomputed scores: 5 products to 2
  if (q.device().is_cpu()) {
    cpu::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, mask == AttentionMask::causal);
#if ZT_WITH_CUDA
  } else if (use_cuda(op, q.device())) {
    cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, cuda::AttentionKernel::automatic,
                             deterministic(), mask == AttentionMask::causal);
#endif
  } else {
    no_backend(op, q.device());
  }
}

void attention_backward_packed(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                               const Tensor& lse, int64_t Hq, int64_t Hkv, float scale) {
  const char* op = "attention_backward";  // the same op in the profile as with separate q, k, v
  OpScope scope(op, dqkv);
  const Dims d = check_packed(op, qkv, Hq, Hkv);
  check_backward_inputs(op, d, dout, out, lse, "qkv", qkv);
  check_shape(op, "dqkv", dqkv, qkv.shape());
  check_same_dtype(op, "dqkv", dqkv, "qkv", qkv);
  check_device(op, qkv.device(), {{"dqkv", &dqkv}, {"dout", &dout}, {"qkv", &qkv}, {"out", &out}, {"lse", &lse}});
  check_disjoint_from(op, "dqkv", dqkv, {{"dout", &dout}, {"qkv", &qkv}, {"out", &out}, {"lse", &lse}});
  const float s = resolve_scale(op, scale, d.D);
  scope.add_flops(2.5 * causal_forward_flops(d));
  if (qkv.device().is_cpu()) {
    cpu::attention_backward_packed(dqkv, dout, qkv, out, lse, Hq, Hkv, s);
#if ZT_WITH_CUDA
  } else if (use_cuda(op, qkv.device())) {
    cuda::attention_backward_packed(dqkv, dout, qkv, out, lse, Hq, Hkv, s, cuda::AttentionKernel::automatic,
                                    deterministic());
#endif
  } else {
    no_backend(op, qkv.device());
  }
}

void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& part, const Tensor& part_lse, int64_t row0) {
  const char* op = "attention_merge";
  OpScope scope(op, out);
  check_ndim(op, "out", out, 4);
  check_ndim(op, "part", part, 4);
  check_dtype(op, "out", out, {DType::f32});
  check_compute_dtype(op, "part", part);
  const int64_t B = out.size(0), T = out.size(1), H = out.size(2), D = out.size(3), n = part.size(1);
  check_shape(op, "part", part, Shape{B, n, H, D});
  check_shape(op, "lse", lse, Shape{B, H, T});
  check_dtype(op, "lse", lse, {DType::f32});
  check_shape(op, "part_lse", part_lse, Shape{B, H, n});
  check_dtype(op, "part_lse", part_lse, {DType::f32});
  ZT_CHECK(row0 >= 0 && row0 + n <= T, op, ": rows [", row0, ", ", row0 + n, ") of 'part' ", part.shape().str(),
           " must lie within the ", T, " rows of 'out' ", out.shape().str());
  check_device(op, out.device(), {{"lse", &lse}, {"part", &part}, {"part_lse", &part_lse}});
  check_all_disjoint(op, {{"out", &out}, {"lse", &lse}, {"part", &part}, {"part_lse", &part_lse}});
  if (out.device().is_cpu()) {
    cpu::attention_merge(out, lse, part, part_lse, row0);
#if ZT_WITH_CUDA
  } else if (use_cuda(op, out.device())) {
    cuda::attention_merge(out, lse, part, part_lse, row0);
#endif
  } else {
    no_backend(op, out.device());
  }
}

}  // namespace zt::ops
