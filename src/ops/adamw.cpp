// AdamW: argument validation, then dispatch by device.
// Math: ops/adamw.h and backend/cpu/adamw.cpp.
#include "ops/adamw.h"

#include <cmath>
#include <cstdint>

#include "backend/cpu/adamw.h"
#include "ops/check.h"
#include "ops/op_profile.h"
#if ZT_WITH_CUDA
#include "backend/cuda/adamw.h"
#endif

namespace zt::ops {

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const AdamWParams& p) {
  const char* op = "adamw_step";
  const OpScope scope(op, master);
  check_dtype(op, "master", master, {DType::f32});
  check_dtype(op, "m", m, {DType::f32});
  check_dtype(op, "v", v, {DType::f32});
  check_dtype(op, "grad", grad, {DType::f32, DType::bf16});
  if (model_copy.defined()) check_dtype(op, "model_copy", model_copy, {DType::bf16, DType::f16, DType::f32});
  const int64_t n = master.numel();
  auto check_numel = [&](const char* name, const Tensor& t) {
    ZT_CHECK(t.numel() == n, op, ": '", name, "' has shape ", t.shape().str(), " (", t.numel(),
             " elements) but 'master' has shape ", master.shape().str(), " (", n, " elements); they must match");
  };
  check_numel("grad", grad);
  check_numel("m", m);
  check_numel("v", v);
  if (model_copy.defined()) check_numel("model_copy", model_copy);
  check_device(op, master.device(),
               {{"master", &master}, {"grad", &grad}, {"m", &m}, {"v", &v}, {"model_copy", &model_copy}});
  check_all_disjoint(op, {{"master", &master}, {"grad", &grad}, {"m", &m}, {"v", &v}, {"model_copy", &model_copy}});
  ZT_CHECK(p.step >= 1, op, ": step is ", p.step, " but must be >= 1 (1-based, for bias correction)");
  ZT_CHECK(p.beta1 >= 0.0f && p.beta1 < 1.0f, op, ": beta1 is ", p.beta1, " but must be in [0, 1)");
  ZT_CHECK(p.beta2 >= 0.0f && p.beta2 < 1.0f, op, ": beta2 is ", p.beta2, " but must be in [0, 1)");
  ZT_CHECK(p.eps >= 0.0f && std::isfinite(p.eps), op, ": eps is ", p.eps, " but must be finite and >= 0");
  ZT_CHECK(std::isfinite(p.lr) && p.lr >= 0.0f, op, ": lr is ", p.lr, " but must be finite and >= 0");
  ZT_CHECK(std::isfinite(p.weight_decay) && p.weight_decay >= 0.0f, op, ": weight_decay is ", p.weight_decay,
           " but must be finite and >= 0");
  ZT_CHECK(std::isfinite(p.grad_scale), op, ": grad_scale is ", p.grad_scale, " but must be finite");
  if (p.stochastic_rounding) {
    ZT_CHECK(model_copy.defined() && model_copy.dtype() == DType::bf16, op,
             ": stochastic rounding writes a bf16 model copy, but 'model_copy' is ",
             model_copy.defined() ? dtype_name(model_copy.dtype()) : "undefined",
             "; round to nearest instead, or keep the model in bf16");
    ZT_CHECK(p.rounding_offset >= 0, op, ": rounding_offset is ", p.rounding_offset, " but must be >= 0");
  }
  for (size_t i = 0; i < p.no_decay.size(); ++i) {
    const auto [begin, end] = p.no_decay[i];
    const int64_t prev_end = i == 0 ? 0 : p.no_decay[i - 1].second;
    ZT_CHECK(begin >= prev_end && begin < end && end <= n, op, ": no_decay span ", i, " [", begin, ", ", end,
             ") must be non-empty, within the ", n, " elements and after the previous span (end ", prev_end,
             "); pass spans sorted and disjoint");
  }
  const cpu::AdamWHyper h{p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.step, p.grad_scale,
                          p.stochastic_rounding, p.rounding_seed, p.rounding_offset, p.no_decay};
#if ZT_WITH_CUDA
  if (use_cuda(op, master.device()))
    return cuda::adamw_step(master, grad, m, v, model_copy, h);
#endif
  if (!master.device().is_cpu()) no_backend(op, master.device());
  cpu::adamw_step(master, grad, m, v, model_copy, h);
}

}  // namespace zt::ops
