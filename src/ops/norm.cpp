// LayerNorm / RMSNorm front end: validates every argument against the
// contract in ops/norm.h, then dispatches by device (CPU kernels in
// backend/cpu/norm.cpp). Math and gradient rules: see ops/norm.h and
// backend/cpu/norm.h.
//
// Error messages name the op as "layernorm_forward", "rmsnorm_backward",
// "residual_layernorm_forward", ... so the user sees which norm failed.
#include "ops/norm.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "backend/cpu/norm.h"
#include "ops/check.h"
#include "ops/elementwise.h"
#include "ops/op_profile.h"
#if ZT_WITH_CUDA
#include "backend/cuda/norm.h"
#endif

namespace zt::ops {

namespace {

enum class Entry { forward, backward, residual_forward };

const char* op_name(NormKind kind, Entry e) {
  const bool ln = kind == NormKind::layernorm;
  switch (e) {
    case Entry::forward: return ln ? "layernorm_forward" : "rmsnorm_forward";
    case Entry::backward: return ln ? "layernorm_backward" : "rmsnorm_backward";
    case Entry::residual_forward: return ln ? "residual_layernorm_forward" : "residual_rmsnorm_forward";
  }
  return "norm";
}

// x (..., C) with C >= 1, f32 or bf16. Returns C; N = numel / C.
int64_t check_input(const char* op, const char* name, const Tensor& x) {
  check_defined(op, name, x);
  ZT_CHECK(x.ndim() >= 1, op, ": '", name, "' has shape ", x.shape().str(),
           " but at least one dimension (..., C) is required");
  check_compute_dtype(op, name, x);
  const int64_t C = x.size(-1);
  ZT_CHECK(C >= 1, op, ": '", name, "' has shape ", x.shape().str(), "; the normalised dimension C must be >= 1");
  return C;
}

void check_like(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  check_shape(op, name, t, ref.shape());
  check_same_dtype(op, name, t, ref_name, ref);
}

// w (C), optional b (C) with w's dtype (b must be undefined for RMSNorm).
void check_params(const char* op, NormKind kind, const Tensor& w, const Tensor& b, int64_t C) {
  check_shape(op, "w", w, Shape{C});
  check_compute_dtype(op, "w", w);
  if (kind == NormKind::rmsnorm) {
    ZT_CHECK(!b.defined(), op, ": 'b' must be undefined for RMSNorm (it has no bias), got ", b.str());
  } else if (b.defined()) {
    check_shape(op, "b", b, Shape{C});
    check_same_dtype(op, "b", b, "w", w);
  }
}

// mean (N) f32 for LayerNorm (undefined for RMSNorm), rstd (N) f32.
void check_stats(const char* op, NormKind kind, const Tensor& mean, const Tensor& rstd, int64_t N) {
  if (kind == NormKind::rmsnorm) {
    ZT_CHECK(!mean.defined(), op, ": 'mean' must be undefined for RMSNorm, got ", mean.str());
  } else {
    check_shape(op, "mean", mean, Shape{N});
    check_dtype(op, "mean", mean, {DType::f32});
  }
  check_shape(op, "rstd", rstd, Shape{N});
  check_dtype(op, "rstd", rstd, {DType::f32});
  check_disjoint(op, "mean", mean, "rstd", rstd);
}

void check_eps(const char* op, float eps) {
  ZT_CHECK(std::isfinite(eps) && eps >= 0.0f, op, ": eps must be finite and >= 0, got ", eps);
}

}  // namespace

void norm_forward(NormKind kind, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                  const Tensor& w, const Tensor& b, float eps) {
  const char* op = op_name(kind, Entry::forward);
  const OpScope scope(op, y);
  const int64_t C = check_input(op, "x", x);
  const int64_t N = x.numel() / C;
  check_like(op, "y", y, "x", x);
  check_params(op, kind, w, b, C);
  check_stats(op, kind, mean, rstd, N);
  check_eps(op, eps);
  check_device(op, x.device(), {{"y", &y}, {"mean", &mean}, {"rstd", &rstd}, {"w", &w}, {"b", &b}});
  check_disjoint_from(op, "y", y, {{"x", &x}, {"w", &w}, {"b", &b}, {"mean", &mean}, {"rstd", &rstd}});
  check_disjoint_from(op, "mean", mean, {{"x", &x}, {"w", &w}, {"b", &b}});
  check_disjoint_from(op, "rstd", rstd, {{"x", &x}, {"w", &w}, {"b", &b}});
  if (x.device().is_cpu()) return cpu::norm_forward(kind == NormKind::rmsnorm, y, mean, rstd, x, w, b, eps);
#if ZT_WITH_CUDA
  if (use_cuda(op, x.device())) return cuda::norm_forward(kind == NormKind::rmsnorm, y, mean, rstd, x, w, b, eps);
#endif
  no_backend(op, x.device());
}

void norm_backward(NormKind kind, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add,
                   GradWrite weights) {
  const char* op = op_name(kind, Entry::backward);
  const OpScope scope(op, dy);
  const int64_t C = check_input(op, "x", x);
  const int64_t N = x.numel() / C;
  check_like(op, "dy", dy, "x", x);
  check_like(op, "dx", dx, "x", x);
  if (dx_add.defined()) check_like(op, "dx_add", dx_add, "x", x);
  check_params(op, kind, w, Tensor(), C);
  check_shape(op, "dw", dw, Shape{C});
  check_dtype(op, "dw", dw, {DType::f32, w.dtype()});
  if (kind == NormKind::rmsnorm) {
    ZT_CHECK(!db.defined(), op, ": 'db' must be undefined for RMSNorm (it has no bias), got ", db.str());
  } else if (db.defined()) {
    check_shape(op, "db", db, Shape{C});
    check_dtype(op, "db", db, {DType::f32, w.dtype()});
  }
  check_stats(op, kind, mean, rstd, N);
  check_device(op, x.device(),
               {{"dx", &dx}, {"dw", &dw}, {"db", &db}, {"dy", &dy}, {"w", &w}, {"mean", &mean}, {"rstd", &rstd},
                {"dx_add", &dx_add}});
  // dx: in place over dy and/or dx_add allowed; separate from everything else.
  check_alias_or_disjoint(op, "dx", dx, "dy", dy);
  check_alias_or_disjoint(op, "dx", dx, "dx_add", dx_add);
  check_disjoint_from(op, "dx", dx, {{"x", &x}, {"w", &w}, {"mean", &mean}, {"rstd", &rstd}, {"dw", &dw}, {"db", &db}});
  // dw, db: accumulated (or written), so separate from every other argument.
  check_disjoint_from(op, "dw", dw,
                      {{"dy", &dy}, {"x", &x}, {"w", &w}, {"mean", &mean}, {"rstd", &rstd}, {"dx_add", &dx_add},
                       {"db", &db}});
  check_disjoint_from(op, "db", db,
                      {{"dy", &dy}, {"x", &x}, {"w", &w}, {"mean", &mean}, {"rstd", &rstd}, {"dx_add", &dx_add}});
  const bool rms = kind == NormKind::rmsnorm, overwrite = weights == GradWrite::overwrite && N > 0;
  if (weights == GradWrite::overwrite && N == 0) {  // no rows: the sums written are zeros
    fill(dw, 0.0);
    if (db.defined()) fill(db, 0.0);
  }
  if (x.device().is_cpu()) return cpu::norm_backward(rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite);
#if ZT_WITH_CUDA
  if (use_cuda(op, x.device()))
    return cuda::norm_backward(rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite);
#endif
  no_backend(op, x.device());
}

void residual_norm_forward(NormKind kind, const Tensor& r_out, const Tensor& y, const Tensor& mean,
                           const Tensor& rstd, const Tensor& r_in, const Tensor& x, const Tensor& w,
                           const Tensor& b, float eps) {
  const char* op = op_name(kind, Entry::residual_forward);
  const OpScope scope(op, y);
  const int64_t C = check_input(op, "x", x);
  const int64_t N = x.numel() / C;
  check_like(op, "r_in", r_in, "x", x);
  check_like(op, "r_out", r_out, "x", x);
  check_like(op, "y", y, "x", x);
  check_params(op, kind, w, b, C);
  check_stats(op, kind, mean, rstd, N);
  check_eps(op, eps);
  check_device(op, x.device(),
               {{"r_out", &r_out}, {"y", &y}, {"mean", &mean}, {"rstd", &rstd}, {"r_in", &r_in}, {"w", &w},
                {"b", &b}});
  // r_out may be r_in (in place); every other output is separate memory.
  check_alias_or_disjoint(op, "r_out", r_out, "r_in", r_in);
  check_disjoint_from(op, "r_out", r_out,
                      {{"x", &x}, {"w", &w}, {"b", &b}, {"y", &y}, {"mean", &mean}, {"rstd", &rstd}});
  check_disjoint_from(op, "y", y,
                      {{"x", &x}, {"r_in", &r_in}, {"w", &w}, {"b", &b}, {"mean", &mean}, {"rstd", &rstd}});
  check_disjoint_from(op, "mean", mean, {{"x", &x}, {"r_in", &r_in}, {"w", &w}, {"b", &b}});
  check_disjoint_from(op, "rstd", rstd, {{"x", &x}, {"r_in", &r_in}, {"w", &w}, {"b", &b}});
  if (x.device().is_cpu())
    return cpu::residual_norm_forward(kind == NormKind::rmsnorm, r_out, y, mean, rstd, r_in, x, w, b, eps);
#if ZT_WITH_CUDA
  if (use_cuda(op, x.device()))
    return cuda::residual_norm_forward(kind == NormKind::rmsnorm, r_out, y, mean, rstd, r_in, x, w, b, eps);
#endif
  no_backend(op, x.device());
}

}  // namespace zt::ops
