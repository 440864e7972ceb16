// GeLU / SwiGLU front end: validates every argument against the contract in
// ops/activation.h, then dispatches by device (CPU kernels in
// backend/cpu/activation.cpp). Math and gradient rules: see
// backend/cpu/activation.h.
#include "ops/activation.h"

#include "backend/cpu/activation.h"
#include "ops/check.h"
#include "ops/op_profile.h"
#if ZT_WITH_CUDA
#include "backend/cuda/activation.h"
#endif

namespace zt::ops {

namespace {

void check_float_input(const char* op, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  check_compute_dtype(op, name, t);
}

void check_like(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  check_shape(op, name, t, ref.shape());
  check_same_dtype(op, name, t, ref_name, ref);
}

// x (..., 2H): returns the shape of y (..., H).
Shape swiglu_out_shape(const char* op, const Tensor& x) {
  ZT_CHECK(x.ndim() >= 1 && x.size(-1) % 2 == 0, op, ": 'x' has shape ", x.shape().str(),
           " but (..., 2H) with an even last dimension [gate | up] is required");
  Shape s = x.shape();
  s[-1] = x.size(-1) / 2;
  return s;
}

}  // namespace

void gelu_forward(const Tensor& y, const Tensor& x) {
  const char* op = "gelu_forward";
  const OpScope scope(op, y);
  check_float_input(op, "x", x);
  check_like(op, "y", y, "x", x);
  check_device(op, x.device(), {{"y", &y}});
  check_alias_or_disjoint(op, "y", y, "x", x);
  if (x.device().is_cpu()) return cpu::gelu_forward(y, x);
#if ZT_WITH_CUDA
  if (use_cuda(op, x.device())) return cuda::gelu_forward(y, x);
#endif
  no_backend(op, x.device());
}

void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const char* op = "gelu_backward";
  const OpScope scope(op, dx);
  check_float_input(op, "x", x);
  check_like(op, "dy", dy, "x", x);
  check_like(op, "dx", dx, "x", x);
  check_device(op, x.device(), {{"dx", &dx}, {"dy", &dy}});
  check_alias_or_disjoint(op, "dx", dx, "dy", dy);
  check_disjoint(op, "dx", dx, "x", x);
  if (x.device().is_cpu()) return cpu::gelu_backward(dx, dy, x);
#if ZT_WITH_CUDA
  if (use_cuda(op, x.device())) return cuda::gelu_backward(dx, dy, x);
#endif
  no_backend(op, x.device());
}

void swiglu_forward(const Tensor& y, const Tensor& x) {
  const char* op = "swiglu_forward";
  const OpScope scope(op, y);
  check_float_input(op, "x", x);
  check_shape(op, "y", y, swiglu_out_shape(op, x));
  check_same_dtype(op, "y", y, "x", x);
  check_device(op, x.device(), {{"y", &y}});
  check_disjoint(op, "y", y, "x", x);
  if (x.device().is_cpu()) return cpu::swiglu_forward(y, x);
#if ZT_WITH_CUDA
  if (use_cuda(op, x.device())) return cuda::swiglu_forward(y, x);
#endif
  no_backend(op, x.device());
}

void swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const char* op = "swiglu_backward";
  const OpScope scope(op, dx);
  check_float_input(op, "x", x);
  check_shape(op, "dy", dy, swiglu_out_shape(op, x));
  check_same_dtype(op, "dy", dy, "x", x);
  check_like(op, "dx", dx, "x", x);
  check_device(op, x.device(), {{"dx", &dx}, {"dy", &dy}});
  check_alias_or_disjoint(op, "dx", dx, "x", x);
  check_disjoint(op, "dx", dx, "dy", dy);
  if (x.device().is_cpu()) return cpu::swiglu_backward(dx, dy, x);
#if ZT_WITH_CUDA
  if (use_cuda(op, x.device())) return cuda::swiglu_backward(dx, dy, x);
#endif
  no_backend(op, x.device());
}

}  // namespace zt::ops
