// Elementwise ops: argument validation, then dispatch by device.
// Math and conversion rules: ops/elementwise.h and backend/cpu/elementwise.cpp.
#include "ops/elementwise.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "backend/cpu/elementwise.h"
#include "ops/check.h"
#include "ops/op_profile.h"
#if ZT_WITH_CUDA
#include "backend/cuda/elementwise.h"
#endif

namespace zt::ops {

namespace {

constexpr std::initializer_list<DType> kFloat3 = {DType::f32, DType::bf16, DType::f16};

void check_same_numel(const char* op, const char* name_a, const Tensor& a, const char* name_b, const Tensor& b) {
  ZT_CHECK(a.numel() == b.numel(), op, ": '", name_a, "' has shape ", a.shape().str(), " (", a.numel(),
           " elements) but '", name_b, "' has shape ", b.shape().str(), " (", b.numel(),
           " elements); the element counts must match");
}

void check_float_dtype(const char* op, const char* name, const Tensor& t) {
  check_dtype(op, name, t, {DType::f32, DType::bf16, DType::f16, DType::f8e4m3, DType::f8e5m2});
}

}  // namespace

void cast(const Tensor& out, const Tensor& in) {
  const char* op = "cast";
  const OpScope scope(op, out);
  check_defined(op, "out", out);
  check_defined(op, "in", in);
  check_same_numel(op, "out", out, "in", in);
  check_device(op, out.device(), {{"out", &out}, {"in", &in}});
  check_alias_or_disjoint(op, "out", out, "in", in);
  if (out.device().is_cpu()) return cpu::cast(out, in);
#if ZT_WITH_CUDA
  if (use_cuda(op, out.device())) return cuda::cast(out, in);
#endif
  no_backend(op, out.device());
}

void add(const Tensor& out, const Tensor& a, const Tensor& b) {
  const char* op = "add";
  const OpScope scope(op, out);
  check_dtype(op, "a", a, kFloat3);
  check_shape(op, "b", b, a.shape());
  check_same_dtype(op, "a", a, "b", b);
  check_shape(op, "out", out, a.shape());
  check_same_dtype(op, "a", a, "out", out);
  check_device(op, out.device(), {{"out", &out}, {"a", &a}, {"b", &b}});
  check_alias_or_disjoint(op, "out", out, "a", a);
  check_alias_or_disjoint(op, "out", out, "b", b);
  if (out.device().is_cpu()) return cpu::add(out, a, b);
#if ZT_WITH_CUDA
  if (use_cuda(op, out.device())) return cuda::add(out, a, b);
#endif
  no_backend(op, out.device());
}

void scale(const Tensor& out, const Tensor& x, float alpha) {
  const char* op = "scale";
  const OpScope scope(op, out);
  check_dtype(op, "x", x, kFloat3);
  check_shape(op, "out", out, x.shape());
  check_same_dtype(op, "x", x, "out", out);
  check_device(op, out.device(), {{"out", &out}, {"x", &x}});
  check_alias_or_disjoint(op, "out", out, "x", x);
  if (out.device().is_cpu()) return cpu::scale(out, x, alpha);
#if ZT_WITH_CUDA
  if (use_cuda(op, out.device())) return cuda::scale(out, x, alpha);
#endif
  no_backend(op, out.device());
}

void axpy(const Tensor& y, float alpha, const Tensor& x) {
  const char* op = "axpy";
  const OpScope scope(op, y);
  check_dtype(op, "y", y, kFloat3);
  check_dtype(op, "x", x, kFloat3);
  check_same_numel(op, "y", y, "x", x);
  check_device(op, y.device(), {{"y", &y}, {"x", &x}});
  check_alias_or_disjoint(op, "y", y, "x", x);
  if (y.device().is_cpu()) return cpu::axpy(y, alpha, x);
#if ZT_WITH_CUDA
  if (use_cuda(op, y.device())) return cuda::axpy(y, alpha, x);
#endif
  no_backend(op, y.device());
}

void fill(const Tensor& out, double value) {
  const char* op = "fill";
  const OpScope scope(op, out);
  check_defined(op, "out", out);
  if (!dtype_is_float(out.dtype())) {
    double lo = 0, hi = 0;  // the integer type's range
    switch (out.dtype()) {
      case DType::i32: lo = -0x1p31, hi = 0x1p31 - 1; break;
      case DType::i64: lo = -0x1p63, hi = 0x1p63; break;  // doubles < 2^63 fit
      case DType::u16: lo = 0, hi = 65535; break;
      case DType::u32: lo = 0, hi = 0x1p32 - 1; break;
      default: break;
    }
    const bool in_range = out.dtype() == DType::i64 ? (value >= lo && value < hi) : (value >= lo && value <= hi);
    ZT_CHECK(std::isfinite(value) && std::trunc(value) == value && in_range, op, ": value ", value,
             " is not an integer representable in 'out' (", out.str(), ")");
  }
  if (out.device().is_cpu()) return cpu::fill(out, value);
#if ZT_WITH_CUDA
  if (use_cuda(op, out.device())) return cuda::fill(out, value);
#endif
  no_backend(op, out.device());
}

double sum_squares(const Tensor& x) {
  const char* op = "sum_squares";
  const OpScope scope(op, x);
  check_dtype(op, "x", x, kFloat3);
  if (x.device().is_cpu()) return cpu::sum_squares(x);
#if ZT_WITH_CUDA
  if (use_cuda(op, x.device())) return cuda::sum_squares(x);
#endif
  no_backend(op, x.device());
}

double global_norm(std::span<const Tensor> tensors) {
  const char* op = "global_norm";
  // Validate all before computing anything.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = "tensors[" + std::to_string(i) + "]";
    check_dtype(op, name.c_str(), tensors[i], kFloat3);
    ZT_CHECK(tensors[i].device() == tensors[0].device(), op, ": '", name, "' is on ", tensors[i].device().str(),
             " but 'tensors[0]' is on ", tensors[0].device().str(), "; all tensors must be on one device");
  }
  if (tensors.empty()) return 0.0;
#if ZT_WITH_CUDA
  if (use_cuda(op, tensors[0].device())) return std::sqrt(cuda::sum_squares_all(tensors));  // one sync for all
#endif
  if (!tensors[0].device().is_cpu()) no_backend(op, tensors[0].device());
  double total = 0.0;
  for (const Tensor& t : tensors) total += cpu::sum_squares(t);  // fixed order
  return std::sqrt(total);
}

void fill_normal(const Tensor& out, Generator& gen, float mean, float std) {
  const char* op = "fill_normal";
  check_float_dtype(op, "out", out);
  ZT_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0.0f, op, ": mean ", mean, " and std ", std,
           " must be finite with std >= 0");
  const bool on_gpu = use_cuda(op, out.device());
  if (!out.device().is_cpu() && !on_gpu) no_backend(op, out.device());
  const uint64_t offset = gen.reserve(out.numel());
#if ZT_WITH_CUDA
  if (on_gpu) return cuda::fill_normal(out, gen.seed(), offset, mean, std);
#endif
  cpu::fill_normal(out, gen.seed(), offset, mean, std);
}

void fill_uniform(const Tensor& out, Generator& gen, float lo, float hi) {
  const char* op = "fill_uniform";
  check_float_dtype(op, "out", out);
  ZT_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi, op, ": range [", lo, ", ", hi,
           ") must be finite with lo <= hi");
  const bool on_gpu = use_cuda(op, out.device());
  if (!out.device().is_cpu() && !on_gpu) no_backend(op, out.device());
  const uint64_t offset = gen.reserve(out.numel());
#if ZT_WITH_CUDA
  if (on_gpu) return cuda::fill_uniform(out, gen.seed(), offset, lo, hi);
#endif
  cpu::fill_uniform(out, gen.seed(), offset, lo, hi);
}

}  // namespace zt::ops
