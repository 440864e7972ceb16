#include "ops/check.h"

#if ZT_WITH_CUDA
#include "backend/cuda/runtime.h"
#endif

namespace zt::ops {

void check_defined(const char* op, const char* name, const Tensor& t) {
  ZT_CHECK(t.defined(), op, ": argument '", name, "' is required but undefined");
}

void check_shape(const char* op, const char* name, const Tensor& t, const Shape& shape) {
  check_defined(op, name, t);
  ZT_CHECK(t.shape() == shape, op, ": '", name, "' has shape ", t.shape().str(), " but ", shape.str(),
           " is required");
}

void check_ndim(const char* op, const char* name, const Tensor& t, int ndim) {
  check_defined(op, name, t);
  ZT_CHECK(t.ndim() == ndim, op, ": '", name, "' has shape ", t.shape().str(), " but a ", ndim,
           "-dimensional tensor is required");
}

void check_dtype(const char* op, const char* name, const Tensor& t, std::initializer_list<DType> allowed) {
  check_defined(op, name, t);
  for (DType d : allowed)
    if (t.dtype() == d) return;
  std::string list;
  for (DType d : allowed) list += std::string(list.empty() ? "" : ", ") + std::string(dtype_name(d));
  ZT_FAIL(op, ": '", name, "' has dtype ", dtype_name(t.dtype()), " but one of {", list, "} is required");
}

bool bytes_overlap(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.device() != b.device() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* pa = static_cast<const char*>(a.data_ptr());
  const auto* pb = static_cast<const char*>(b.data_ptr());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

void check_disjoint(const char* op, const char* name_a, const Tensor& a, const char* name_b, const Tensor& b) {
  ZT_CHECK(!bytes_overlap(a, b), op, ": '", name_a, "' ", a.str(), " overlaps '", name_b, "' ", b.str(),
           "; they must be separate memory");
}

void check_alias_or_disjoint(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                             const Tensor& b) {
  if (!bytes_overlap(a, b)) return;
  ZT_CHECK(a.data_ptr() == b.data_ptr() && dtype_size(a.dtype()) == dtype_size(b.dtype()) && a.nbytes() == b.nbytes(),
           op, ": '", name_a, "' ", a.str(), " partially overlaps '", name_b, "' ", b.str(),
           "; it must be the same memory (in place) or separate memory");
}

void check_all_disjoint(const char* op, std::initializer_list<NamedTensor> ts) {
  for (auto i = ts.begin(); i != ts.end(); ++i)
    for (auto j = i + 1; j != ts.end(); ++j) check_disjoint(op, i->first, *i->second, j->first, *j->second);
}

void check_disjoint_from(const char* op, const char* name_a, const Tensor& a,
                         std::initializer_list<NamedTensor> others) {
  for (const auto& [name_b, b] : others) check_disjoint(op, name_a, a, name_b, *b);
}

void check_compute_dtype(const char* op, const char* name, const Tensor& t) {
  if (t.dtype() == DType::f16) {
    ZT_CHECK(!t.device().is_cpu(), op, ": '", name, "' is f16 on the CPU, whose kernels compute in f32 or bf16 (f16 "
             "runs on CUDA devices); use bf16 or f32 on the CPU");
    return;
  }
  check_dtype(op, name, t, {DType::f32, DType::bf16});
}

void check_device(const char* op, Device device, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  for (auto& [name, t] : ts) {
    if (t->defined())
      ZT_CHECK(t->device() == device, op, ": '", name, "' is on ", t->device().str(), " but the op runs on ",
               device.str(), "; move all arguments to one device");
  }
}

void check_ids_device(const char* op, const char* name, const Tensor& ids, Device device) {
  if (ids.defined())
    ZT_CHECK(ids.device() == device || ids.device().is_cpu(), op, ": '", name, "' is on ", ids.device().str(),
             " but the op runs on ", device.str(), "; pass ids on that device or on the host");
}

void check_same_dtype(const char* op, const char* name_a, const Tensor& a, const char* name_b, const Tensor& b) {
  ZT_CHECK(a.dtype() == b.dtype(), op, ": '", name_a, "' is ", dtype_name(a.dtype()), " but '", name_b, "' is ",
           dtype_name(b.dtype()), "; they must match");
}

bool use_cuda(const char* op, Device device) {
  if (!device.is_cuda()) return false;
#if ZT_WITH_CUDA
  try {
    cuda::ensure_initialized(device);
  } catch (const Error& e) {
    ZT_FAIL(op, ": ", e.what());
  }
  return true;
#else
  (void)op;
  return false;
#endif
}

void no_backend(const char* op, Device device) {
  ZT_FAIL(op, ": no kernel for device ", device.str(), " in this build");
}

}  // namespace zt::ops
