// Mixture-of-experts routing, dispatch and combine: argument validation, then
// dispatch by device (CPU kernels: backend/cpu/moe.cpp, CUDA:
// backend/cuda/moe.cu; contract: ops/moe.h). The dispatch plan lives on the
// host, where it is made and validated; a GPU op uploads the index tensor it
// reads (no wait: the host copy outlives the upload).
#include "ops/moe.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cpu/moe.h"
#include "core/error.h"
#include "ops/check.h"
#include "ops/device.h"
#include "ops/op_profile.h"
#if ZT_WITH_CUDA
#include "backend/cuda/moe.h"
#endif

namespace zt::ops {

namespace {

// Slots index tensors (order, where): (N k) i32 on the host.
void check_slots(const char* op, const char* name, const Tensor& t, int64_t NK) {
  check_shape(op, name, t, Shape{NK});
  check_dtype(op, name, t, {DType::i32});
  ZT_CHECK(t.device().is_cpu(), op, ": '", name, "' must be on the host (the dispatch plan is read there), got ",
           t.device().str());
}

// A plan's index tensor read by an op: (n) i32 on the host, every value in
// [lo, hi) (from moe_dispatch_plan; checked, as rows are read and written
// through them). `range` names the interval in the message.
void check_plan(const char* op, const char* name, const Tensor& t, int64_t n, int64_t lo, int64_t hi,
                const char* range) {
  check_slots(op, name, t, n);
  const int32_t* v = t.data<int32_t>();
  for (int64_t i = 0; i < n; ++i)
    ZT_CHECK(v[i] >= lo && v[i] < hi, op, ": '", name, "'[", i, "] = ", v[i], " is outside ", range, " = [", lo,
             ", ", hi, "); pass the plan moe_dispatch_plan made");
}

// The slots' sorted positions (N k): each a row of the R sorted rows, or -1
// for a slot its expert dropped.
void check_where(const char* op, const Tensor& where, int64_t NK, int64_t R) {
  ZT_CHECK(R <= NK, op, ": ", R, " sorted rows for ", NK, " slots; a plan keeps at most every slot");
  check_plan(op, "where", where, NK, -1, R, "[-1, R)");
}

void check_cpu(const char* op, const Tensor& on) {
  if (!on.device().is_cpu()) no_backend(op, on.device());
}

// Rows of tokens: (rows, C), f32 or bf16 (or f16 on a GPU).
void check_rows(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t C) {
  check_shape(op, name, t, Shape{rows, C});
  check_compute_dtype(op, name, t);
}

#if ZT_WITH_CUDA
// A plan's index tensor (validated on the host) where a GPU kernel reads it.
Tensor uploaded(const Tensor& plan, Device device) { return on_device(plan, device, MemCategory::workspace); }
#endif

}  // namespace

void moe_route(const Tensor& probs, const Tensor& choice, const Tensor& weight, const Tensor& logits,
               bool normalize, const Tensor& lse, const Tensor& bias) {
  const char* op = "moe_route";
  const OpScope scope(op, logits);
  check_ndim(op, "logits", logits, 2);
  check_dtype(op, "logits", logits, {DType::f32});
  const int64_t N = logits.size(0), E = logits.size(1);
  check_ndim(op, "choice", choice, 2);
  const int64_t k = choice.size(1);
  ZT_CHECK(E >= 1 && k >= 1 && k <= E, op, ": top-", k, " of ", E, " experts; need 1 <= k <= E");
  check_shape(op, "probs", probs, Shape{N, E});
  check_dtype(op, "probs", probs, {DType::f32});
  check_shape(op, "choice", choice, Shape{N, k});
  check_dtype(op, "choice", choice, {DType::i32});
  check_shape(op, "weight", weight, Shape{N, k});
  check_dtype(op, "weight", weight, {DType::f32});
  if (lse.defined()) {
    check_shape(op, "lse", lse, Shape{N});
    check_dtype(op, "lse", lse, {DType::f32});
  }
  if (bias.defined()) {
    check_shape(op, "bias", bias, Shape{E});
    check_dtype(op, "bias", bias, {DType::f32});
  }
  check_device(op, logits.device(),
               {{"probs", &probs}, {"choice", &choice}, {"weight", &weight}, {"lse", &lse}, {"bias", &bias}});
  check_all_disjoint(op, {{"probs", &probs}, {"choice", &choice}, {"weight", &weight}, {"logits", &logits},
                          {"lse", &lse}});
#if ZT_WITH_CUDA
  if (use_cuda(op, logits.device())) return cuda::moe_route(probs, choice, weight, logits, normalize, lse, bias);
#endif
  check_cpu(op, logits);
  cpu::moe_route(probs, choice, weight, logits, normalize, lse, bias);
}

void moe_route_backward(const Tensor& dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& choice,
                        const Tensor& weight, bool normalize, const Tensor& aux_dprob, const Tensor& dlse) {
  const char* op = "moe_route_backward";
  const OpScope scope(op, probs);
  check_ndim(op, "probs", probs, 2);
  check_dtype(op, "probs", probs, {DType::f32});
  const int64_t N = probs.size(0), E = probs.size(1);
  check_ndim(op, "choice", choice, 2);
  const int64_t k = choice.size(1);
  check_shape(op, "choice", choice, Shape{N, k});
  check_dtype(op, "choice", choice, {DType::i32});
  for (auto [name, t] : {NamedTensor{"weight", &weight}, NamedTensor{"dweight", &dweight}}) {
    check_shape(op, name, *t, Shape{N, k});
    check_dtype(op, name, *t, {DType::f32});
  }
  check_shape(op, "dlogits", dlogits, Shape{N, E});
  check_dtype(op, "dlogits", dlogits, {DType::f32});
  if (aux_dprob.defined()) {
    check_shape(op, "aux_dprob", aux_dprob, Shape{E});
    check_dtype(op, "aux_dprob", aux_dprob, {DType::f32});
  }
  if (dlse.defined()) {
    check_shape(op, "dlse", dlse, Shape{N});
    check_dtype(op, "dlse", dlse, {DType::f32});
  }
  check_device(op, probs.device(),
               {{"dlogits", &dlogits}, {"dweight", &dweight}, {"choice", &choice}, {"weight", &weight},
                {"aux_dprob", &aux_dprob}, {"dlse", &dlse}});
  check_disjoint_from(op, "dlogits", dlogits,
                      {{"dweight", &dweight}, {"probs", &probs}, {"choice", &choice}, {"weight", &weight},
                       {"aux_dprob", &aux_dprob}, {"dlse", &dlse}});
#if ZT_WITH_CUDA
  if (use_cuda(op, probs.device()))
    return cuda::moe_route_backward(dlogits, dweight, probs, choice, weight, normalize, aux_dprob, dlse);
#endif
  check_cpu(op, probs);
  cpu::moe_route_backward(dlogits, dweight, probs, choice, weight, normalize, aux_dprob, dlse);
}

void moe_dispatch_plan(const Tensor& order, const Tensor& where, std::vector<int64_t>& offsets,
                       const Tensor& choice, int64_t E, int64_t capacity, std::vector<int64_t>* routed,
                       const SlotRuns* runs) {
  const char* op = "moe_dispatch_plan";
  check_ndim(op, "choice", choice, 2);
  check_dtype(op, "choice", choice, {DType::i32});
  const int64_t NK = choice.numel();
  ZT_CHECK(NK < (int64_t(1) << 31), op, ": ", NK, " slots is too many (limit 2^31)");
  ZT_CHECK(capacity >= -1, op, ": capacity ", capacity, " must be >= 0 slots an expert, or -1 for none");
  check_slots(op, "order", order, NK);
  check_slots(op, "where", where, NK);
  check_all_disjoint(op, {{"order", &order}, {"where", &where}, {"choice", &choice}});
  // A GPU's choice comes to the host (the step waits for the routing here:
  // the experts' row counts size their products and exchanges).
  const Tensor host_choice = on_device(choice, Device::cpu(), MemCategory::workspace);
  const int32_t* ch = host_choice.data<int32_t>();
  for (int64_t s = 0; s < NK; ++s)
    ZT_CHECK(ch[s] >= 0 && ch[s] < E, op, ": slot ", s, " (token ", s / choice.size(1), ") chose expert ", ch[s],
             ", outside [0, E) with E = ", E);
  // No runs: the slots are the call, one run with none ahead.
  const SlotRuns whole{{0}, std::vector<int64_t>(size_t(E), 0)};
  const SlotRuns& r = runs ? *runs : whole;
  ZT_CHECK(!r.start.empty() && r.start.front() == 0 && std::is_sorted(r.start.begin(), r.start.end()) &&
               r.start.back() <= NK && r.ahead.size() == r.start.size() * size_t(E),
           op, ": the slot runs (", r.start.size(), " starting at ", r.start.empty() ? -1 : r.start.front(), ", ",
           r.ahead.size(), " counts ahead) must start at 0, ascend within the ", NK, " slots and give E = ", E,
           " counts a run");
  for (int64_t a : r.ahead) ZT_CHECK(a >= 0, op, ": a run has ", a, " slots ahead of it; counts are >= 0");
  cpu::moe_dispatch_plan(order, where, offsets, host_choice, E, capacity, routed, r.start, r.ahead);
}

void moe_gather(const Tensor& xs, const Tensor& x, const Tensor& order, int64_t k) {
  const char* op = "moe_gather";
  const OpScope scope(op, x);
  check_ndim(op, "x", x, 2);
  const int64_t N = x.size(0), C = x.size(1);
  ZT_CHECK(k >= 1, op, ": k = ", k, " must be >= 1");
  check_rows(op, "x", x, N, C);
  check_ndim(op, "xs", xs, 2);
  const int64_t R = xs.size(0);
  ZT_CHECK(R <= N * k, op, ": 'xs' has ", R, " rows, more than the N k = ", N * k, " slots");
  check_rows(op, "xs", xs, R, C);
  check_same_dtype(op, "x", x, "xs", xs);
  check_plan(op, "order", order, R, 0, N * k, "[0, N k)");
  check_disjoint(op, "xs", xs, "x", x);
  check_device(op, x.device(), {{"xs", &xs}});
#if ZT_WITH_CUDA
  if (use_cuda(op, x.device())) return cuda::moe_gather(xs, x, uploaded(order, x.device()), k);
#endif
  check_cpu(op, x);
  cpu::moe_gather(xs, x, order, k);
}

void moe_gather_backward(const Tensor& dx, const Tensor& dxs, const Tensor& where, int64_t k, bool accumulate) {
  const char* op = "moe_gather_backward";
  const OpScope scope(op, dx);
  check_ndim(op, "dx", dx, 2);
  const int64_t N = dx.size(0), C = dx.size(1);
  ZT_CHECK(k >= 1, op, ": k = ", k, " must be >= 1");
  check_rows(op, "dx", dx, N, C);
  check_ndim(op, "dxs", dxs, 2);
  check_rows(op, "dxs", dxs, dxs.size(0), C);
  check_same_dtype(op, "dx", dx, "dxs", dxs);
  check_where(op, where, N * k, dxs.size(0));
  check_disjoint(op, "dx", dx, "dxs", dxs);
  check_device(op, dx.device(), {{"dxs", &dxs}});
#if ZT_WITH_CUDA
  if (use_cuda(op, dx.device())) return cuda::moe_gather_backward(dx, dxs, uploaded(where, dx.device()), k, accumulate);
#endif
  check_cpu(op, dx);
  cpu::moe_gather_backward(dx, dxs, where, k, accumulate);
}

void moe_combine(const Tensor& out, const Tensor& ys, const Tensor& weight, const Tensor& where,
                 const Tensor& residual) {
  const char* op = "moe_combine";
  const OpScope scope(op, out);
  check_ndim(op, "out", out, 2);
  check_ndim(op, "weight", weight, 2);
  const int64_t N = out.size(0), C = out.size(1), k = weight.size(1);
  check_rows(op, "out", out, N, C);
  check_ndim(op, "ys", ys, 2);
  check_rows(op, "ys", ys, ys.size(0), C);
  check_same_dtype(op, "out", out, "ys", ys);
  check_shape(op, "weight", weight, Shape{N, k});
  check_dtype(op, "weight", weight, {DType::f32});
  check_where(op, where, N * k, ys.size(0));
  if (residual.defined()) {
    check_rows(op, "residual", residual, N, C);
    check_same_dtype(op, "out", out, "residual", residual);
  }
  check_disjoint_from(op, "out", out, {{"ys", &ys}, {"weight", &weight}, {"residual", &residual}});
  check_device(op, out.device(), {{"ys", &ys}, {"weight", &weight}, {"residual", &residual}});
#if ZT_WITH_CUDA
  if (use_cuda(op, out.device()))
    return cuda::moe_combine(out, ys, weight, uploaded(where, out.device()), residual);
#endif
  check_cpu(op, out);
  cpu::moe_combine(out, ys, weight, where, residual);
}

void moe_combine_backward(const Tensor& dys, const Tensor& dweight, const Tensor& dout, const Tensor& ys,
                          const Tensor& weight, const Tensor& where) {
  const char* op = "moe_combine_backward";
  const OpScope scope(op, dout);
  check_ndim(op, "dout", dout, 2);
  check_ndim(op, "weight", weight, 2);
  const int64_t N = dout.size(0), C = dout.size(1), k = weight.size(1);
  check_rows(op, "dout", dout, N, C);
  check_ndim(op, "ys", ys, 2);
  const int64_t R = ys.size(0);
  check_rows(op, "ys", ys, R, C);
  check_rows(op, "dys", dys, R, C);
  check_same_dtype(op, "dout", dout, "ys", ys);
  check_same_dtype(op, "dout", dout, "dys", dys);
  for (auto [name, t] : {NamedTensor{"weight", &weight}, NamedTensor{"dweight", &dweight}}) {
    check_shape(op, name, *t, Shape{N, k});
    check_dtype(op, name, *t, {DType::f32});
  }
  check_where(op, where, N * k, R);
  check_all_disjoint(op, {{"dys", &dys}, {"dweight", &dweight}, {"dout", &dout}, {"ys", &ys}, {"weight", &weight}});
  check_device(op, dout.device(), {{"dys", &dys}, {"dweight", &dweight}, {"ys", &ys}, {"weight", &weight}});
#if ZT_WITH_CUDA
  if (use_cuda(op, dout.device()))
    return cuda::moe_combine_backward(dys, dweight, dout, ys, weight, uploaded(where, dout.device()));
#endif
  check_cpu(op, dout);
  cpu::moe_combine_backward(dys, dweight, dout, ys, weight, where);
}

}  // namespace zt::ops
