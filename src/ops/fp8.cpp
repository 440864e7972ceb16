// Per-tensor fp8 quantisation and the linear layer on fp8 operands: argument
// validation, then the kernels by device (backend/cpu/fp8.cpp,
// backend/cuda/fp8.cu; contract: ops/fp8.h). On a GPU the products run on
// the fp8 tensor cores; on the CPU, and on a GPU for a shape cuBLASLt has no
// fp8 algorithm for, they dequantise to f32 and run the f32 linear ops.
#include "ops/fp8.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/fp8.h"
#include "core/error.h"
#include "ops/check.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/op_profile.h"
#if ZT_WITH_CUDA
#include "backend/cuda/fp8.h"
#endif

namespace zt::ops {

namespace {

constexpr std::initializer_list<DType> kFp8 = {DType::f8e4m3, DType::f8e5m2};
constexpr std::initializer_list<DType> kWide = {DType::f32, DType::bf16};

void check_scale(const char* op, const char* name, const Tensor& s) {
  check_shape(op, name, s, Shape{1});
  check_dtype(op, name, s, {DType::f32});
}

// An fp8 tensor's values, f32, in the workspace.
Tensor dequantized(const Tensor& q, const Tensor& scale_inv) {
  const Tensor out = Tensor::empty(q.shape(), DType::f32, q.device(), MemCategory::workspace);
  dequantize_fp8(out, q, scale_inv);
  return out;
}

// `t` as f32: itself, or a workspace copy.
Tensor as_f32(const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::f32) return t;
  const Tensor out = Tensor::empty(t.shape(), DType::f32, t.device(), MemCategory::workspace);
  cast(out, t);
  return out;
}

// A conversion's arguments: `wide` (f32 or bf16) and its codes q (fp8, the
// same shape) with their scale, on one device, none sharing memory.
void check_conversion(const char* op, const char* wide_name, const Tensor& wide, const Tensor& q,
                      const Tensor& scale_inv) {
  check_defined(op, wide_name, wide);
  check_dtype(op, wide_name, wide, kWide);
  check_shape(op, "q", q, wide.shape());
  check_dtype(op, "q", q, kFp8);
  check_scale(op, "scale_inv", scale_inv);
  check_device(op, wide.device(), {{"q", &q}, {"scale_inv", &scale_inv}});
  check_all_disjoint(op, {{wide_name, &wide}, {"q", &q}, {"scale_inv", &scale_inv}});
}

// xq (..., I) against wq (O, I) and an output of (..., O).
void check_linear(const char* op, const Tensor& xq, const Tensor& wq, const char* out_name, const Tensor& out) {
  check_dtype(op, "xq", xq, kFp8);
  check_dtype(op, "wq", wq, kFp8);
  check_ndim(op, "wq", wq, 2);
  ZT_CHECK(xq.ndim() >= 1 && xq.size(-1) == wq.size(1), op, ": xq ", xq.shape().str(), " and wq ", wq.shape().str(),
           " do not share their last dimension");
  if (!out.defined()) return;
  Shape s(xq.shape().begin(), xq.shape().end() - 1);
  s.push_back(wq.size(0));
  check_shape(op, out_name, out, s);
  check_dtype(op, out_name, out, kWide);
}

}  // namespace

float fp8_scale(float amax, DType format) {
  ZT_CHECK(format == DType::f8e4m3 || format == DType::f8e5m2, "fp8_scale: format must be f8e4m3 or f8e5m2, got ",
           dtype_name(format));
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  const double max = format == DType::f8e4m3 ? 448.0 : 57344.0;
  int e = 0;
  std::frexp(max / double(amax), &e);  // max / amax = f 2^e, f in [0.5, 1): floor(log2) = e - 1
  return float(std::ldexp(1.0, std::clamp(e - 1, -126, 127)));
}

void quantize_fp8(const Tensor& q, const Tensor& scale_inv, const Tensor& x) {
  const char* op = "quantize_fp8";
  const OpScope scope(op, x);
  check_conversion(op, "x", x, q, scale_inv);
#if ZT_WITH_CUDA
  if (use_cuda(op, x.device())) return cuda::quantize_fp8(q, scale_inv, x);
#endif
  const float amax = cpu::abs_max(x);
  const float scale = fp8_scale(amax, q.dtype());
  cpu::encode_fp8(q, x, scale);
  scale_inv.data<float>()[0] = 1.0f / scale;  // a power of two: exact
}

void dequantize_fp8(const Tensor& out, const Tensor& q, const Tensor& scale_inv) {
  const char* op = "dequantize_fp8";
  const OpScope scope(op, q);
  check_conversion(op, "out", out, q, scale_inv);
#if ZT_WITH_CUDA
  if (use_cuda(op, q.device())) return cuda::dequantize_fp8(out, q, scale_inv);
#endif
  const float s = scale_inv.data<float>()[0];
  if (out.dtype() == DType::f32) {
    cast(out, q);  // every fp8 value is an f32 exactly
    scale(out, out, s);
  } else {
    const Tensor wide = dequantized(q, scale_inv);  // one rounding, to bf16, of the exact value
    cast(out, wide);
  }
}

void fp8_linear_forward(const Tensor& y, const Tensor& xq, const Tensor& x_scale_inv, const Tensor& wq,
                        const Tensor& w_scale_inv, const Tensor& b, const Tensor& residual) {
  const char* op = "fp8_linear_forward";
  const OpScope scope(op, xq);
  check_defined(op, "y", y);
  check_linear(op, xq, wq, "y", y);
  check_scale(op, "x_scale_inv", x_scale_inv);
  check_scale(op, "w_scale_inv", w_scale_inv);
  if (b.defined()) {
    check_shape(op, "b", b, Shape{wq.size(0)});
    ZT_CHECK(b.dtype() == DType::f32 || b.dtype() == y.dtype(), op, ": b is ", dtype_name(b.dtype()),
             "; it must be f32 or y's ", dtype_name(y.dtype()));
  }
  if (residual.defined()) {
    check_shape(op, "residual", residual, y.shape());
    check_same_dtype(op, "residual", residual, "y", y);
  }
  check_device(op, xq.device(), {{"y", &y}, {"wq", &wq}, {"x_scale_inv", &x_scale_inv},
                                 {"w_scale_inv", &w_scale_inv}, {"b", &b}, {"residual", &residual}});
  check_all_disjoint(op, {{"y", &y}, {"xq", &xq}, {"wq", &wq}, {"b", &b}, {"residual", &residual}});
#if ZT_WITH_CUDA
  if (use_cuda(op, xq.device()) && cuda::fp8_linear_forward(y, xq, x_scale_inv, wq, w_scale_inv, b, residual)) return;
#endif
  const Tensor x = dequantized(xq, x_scale_inv), w = dequantized(wq, w_scale_inv);
  if (y.dtype() == DType::f32) return linear_forward(y, x, w, as_f32(b), residual);
  const Tensor wide = Tensor::empty(y.shape(), DType::f32, y.device(), MemCategory::workspace);
  linear_forward(wide, x, w, as_f32(b), as_f32(residual));
  cast(y, wide);  // the one rounding
}

void fp8_linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& dyq, const Tensor& dy_scale_inv,
                         const Tensor& xq, const Tensor& x_scale_inv, const Tensor& wq, const Tensor& w_scale_inv,
                         GradWrite weights) {
  const char* op = "fp8_linear_backward";
  const OpScope scope(op, dyq);
  check_defined(op, "dyq", dyq);
  check_dtype(op, "dyq", dyq, kFp8);
  check_scale(op, "dy_scale_inv", dy_scale_inv);
  ZT_CHECK(dyq.ndim() >= 1, op, ": dyq must have at least one dimension");
  const int64_t O = dyq.size(-1), N = dyq.numel() / std::max<int64_t>(O, 1);
  const Shape lead(dyq.shape().begin(), dyq.shape().end() - 1);
  if (dx.defined()) {  // dx = dy W reads wq (O, I)
    check_defined(op, "wq", wq);
    check_dtype(op, "wq", wq, kFp8);
    check_ndim(op, "wq", wq, 2);
    ZT_CHECK(wq.size(0) == O, op, ": wq ", wq.shape().str(), " does not have dyq's ", O, " output rows");
    check_scale(op, "w_scale_inv", w_scale_inv);
    Shape s = lead;
    s.push_back(wq.size(1));
    check_shape(op, "dx", dx, s);
    check_dtype(op, "dx", dx, kWide);
  }
  if (dw.defined()) {  // dw += dy^T x reads xq (..., I)
    check_defined(op, "xq", xq);
    check_dtype(op, "xq", xq, kFp8);
    ZT_CHECK(xq.ndim() == dyq.ndim() && Shape(xq.shape().begin(), xq.shape().end() - 1) == lead, op, ": xq ",
             xq.shape().str(), " and dyq ", dyq.shape().str(), " differ but in their last dimension");
    check_scale(op, "x_scale_inv", x_scale_inv);
    check_shape(op, "dw", dw, Shape{O, xq.size(-1)});
    check_dtype(op, "dw", dw, {DType::f32});
  }
  check_device(op, dyq.device(), {{"dx", &dx}, {"dw", &dw}, {"xq", &xq}, {"wq", &wq}, {"dy_scale_inv", &dy_scale_inv},
                                  {"x_scale_inv", &x_scale_inv}, {"w_scale_inv", &w_scale_inv}});
  check_all_disjoint(op, {{"dx", &dx}, {"dw", &dw}, {"dyq", &dyq}, {"xq", &xq}, {"wq", &wq}});
  bool dx_done = !dx.defined(), dw_done = !dw.defined();
#if ZT_WITH_CUDA
  if (use_cuda(op, dyq.device())) {
    dx_done = dx_done || cuda::fp8_linear_input_gradient(dx, dyq, dy_scale_inv, wq, w_scale_inv);
    dw_done = dw_done || cuda::fp8_linear_weight_gradient(dw, dyq, dy_scale_inv, xq, x_scale_inv,
                                                          weights == GradWrite::overwrite);
  }
#endif
  if (dx_done && dw_done) return;
  const Tensor dy_rows = dequantized(dyq, dy_scale_inv).view(Shape{N, O});
  if (!dx_done) {
    const int64_t I = wq.size(1);
    const Tensor w = dequantized(wq, w_scale_inv);
    const Tensor wide = dx.dtype() == DType::f32 ? dx
                                                 : Tensor::empty(dx.shape(), DType::f32, dx.device(), MemCategory::workspace);
    matmul(wide.view(Shape{N, I}), dy_rows, w);  // (N, O) (O, I)
    if (dx.dtype() != DType::f32) cast(dx, wide);
  }
  if (!dw_done) {
    const Tensor x = dequantized(xq, x_scale_inv).view(Shape{N, xq.size(-1)});
    matmul(dw, dy_rows, x, /*trans_a=*/true, false, 1.0f, weights == GradWrite::accumulate ? 1.0f : 0.0f);
  }
}

}  // namespace zt::ops
