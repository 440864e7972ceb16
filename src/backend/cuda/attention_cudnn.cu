// Causal GQA attention through cuDNN's fused SDPA (graphs: cudnn_sdpa.h).
// Plans are built on first use of a shape (cuDNN's heuristics, then its
// runtime compilation: about a second) and cached per device, shape, dtype,
// scale and direction. A shape cuDNN has no engine for is remembered with
// cuDNN's reason, and the dispatcher (attention.cu) uses our own kernels.
#include "backend/cuda/attention.h"

#include "core/error.h"

#if ZT_WITH_CUDNN

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cudnn_sdpa.h"

namespace zt::cuda {

namespace {

using cudnn::Plan;

// (device, B, T, Hq, Hkv, D, dtype, scale bits, backward)
using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int, uint32_t, bool>;

struct CachedPlan {
  std::shared_ptr<const Plan> plan;  // null when cuDNN has no engine
  std::string unsupported;           // cuDNN's reason, when plan is null
  cudnnHandle_t handle = nullptr;    // of the key's device
  // The graph's caller-supplied tensors, in the order the entry points pass
  // their memory: forward q, k, v, out, lse; backward q, k, v, out, dout,
  // lse, dq, dk, dv, row sums.
  std::vector<cudnn::Uid> uids;
};

std::mutex g_mutex;  // guards the handles and the plan cache

cudnnHandle_t handle_of(Device device) {
  static std::map<int, cudnnHandle_t> handles;  // per device, for the process's lifetime
  auto it = handles.find(device.index);
  if (it != handles.end()) return it->second;
  compute_stream(device);  // initialises the device and makes it current
  cudnnHandle_t h = nullptr;
  ZT_CUDNN_CHECK(cudnnCreate(&h));
  handles.emplace(device.index, h);
  return h;
}

cudnnDataType_t cudnn_type(DType t) { return t == DType::f16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16; }

// Why cuDNN cannot take this call before any plan is built (empty when it may).
std::string static_blocker(const AttentionShape& s) {
  if (s.dtype != DType::bf16 && s.dtype != DType::f16) return "cuDNN's fused attention takes bf16 or f16";
  if (s.D % 8 != 0 || s.D > 128) return "cuDNN's fused attention takes head dims that are multiples of 8 up to 128";
  return "";
}

// The cached plan for this call, building it on first use.
const CachedPlan& plan_for(const AttentionShape& a, float scale, bool backward) {
  const cudnn::SdpaShape s{a.B, a.T, a.Hq, a.Hkv, a.D, cudnn_type(a.dtype), scale};
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &scale, sizeof(scale));
  const PlanKey key{a.device.index, s.B, s.T, s.Hq, s.Hkv, s.D, int(s.io), scale_bits, backward};
  static std::map<PlanKey, CachedPlan> cache;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  CachedPlan entry;
  try {
    cudnn::Target target;
    target.handle = entry.handle = handle_of(a.device);
    std::shared_ptr<cudnn::Graph> graph;
    if (backward) {
      const cudnn::SdpaBackwardGraph g = cudnn::sdpa_backward_graph(s);
      graph = g.graph;
      entry.uids = {g.q, g.k, g.v, g.out, g.dout, g.lse, g.dq, g.dk, g.dv, g.row_sums};
    } else {
      const cudnn::SdpaForwardGraph g = cudnn::sdpa_forward_graph(s);
      graph = g.graph;
      entry.uids = {g.q, g.k, g.v, g.out, g.lse};
    }
    entry.plan = std::make_shared<const Plan>(cudnn::make_plan(graph, target));
  } catch (const Error& e) {
    entry.plan.reset();
    entry.unsupported = e.what();
  }
  return cache.emplace(key, std::move(entry)).first->second;
}

void* ptr(const Tensor& t) { return const_cast<void*>(t.data_ptr()); }

// The memory a call allocates for its plan: whole f32 words of its workspace.
int64_t plan_workspace_bytes(const CachedPlan& p) { return (p.plan->workspace_bytes() + 3) / 4 * 4; }

// Runs a cached plan on the compute stream of `any`'s device; pointers in the order of p.uids.
void run(const CachedPlan& p, const Tensor& any, const std::vector<void*>& pointers) {
  ZT_CHECK(p.plan, "attention: cuDNN cannot take this call: ", p.unsupported);
  ZT_CUDNN_CHECK(cudnnSetStream(p.handle, stream_of(any)));
  Tensor workspace;
  if (p.plan->workspace_bytes() > 0)
    workspace = Tensor::empty(Shape{plan_workspace_bytes(p) / 4}, DType::f32, any.device(), MemCategory::workspace);
  p.plan->execute(p.handle, p.uids, pointers, workspace.defined() ? ptr(workspace) : nullptr);
}

}  // namespace

std::string cudnn_attention_unsupported(const AttentionShape& s, float scale, bool backward) {
  std::string blocker = static_blocker(s);
  if (!blocker.empty()) return blocker;
  const CachedPlan& p = plan_for(s, scale, backward);
  return p.plan ? "" : p.unsupported;
}

int64_t cudnn_attention_workspace_bytes(const AttentionShape& s, float scale, bool backward) {
  const CachedPlan& p = plan_for(s, scale, backward);
  ZT_CHECK(p.plan, "attention: cuDNN cannot take this shape: ", p.unsupported);
  return plan_workspace_bytes(p) + (backward ? 4 * s.B * s.Hq * s.T : 0);  // + the backward's f32 row sums
}

void cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             float scale) {
  run(plan_for(attention_shape(q, k), scale, false), q, {ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse)});
}

void cudnn_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              float scale) {
  Tensor row_sums = Tensor::empty(lse.shape(), DType::f32, q.device(), MemCategory::workspace);
  run(plan_for(attention_shape(q, k), scale, true), q,
      {ptr(q), ptr(k), ptr(v), ptr(out), ptr(dout), ptr(lse), ptr(dq), ptr(dk), ptr(dv), ptr(row_sums)});
}

}  // namespace zt::cuda

#else  // no cuDNN in this build

namespace zt::cuda {

std::string cudnn_attention_unsupported(const AttentionShape&, float, bool) {
  return "this build has no cuDNN (configure with cuDNN's headers and library found, e.g. CUDNN_ROOT)";
}
int64_t cudnn_attention_workspace_bytes(const AttentionShape&, float, bool) {
  ZT_FAIL("attention: this build has no cuDNN");
}
void cudnn_attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) {
  ZT_FAIL("attention: this build has no cuDNN; choose another kernel (ZT_CUDA_ATTENTION)");
}
void cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, float) {
  ZT_FAIL("attention: this build has no cuDNN; choose another kernel (ZT_CUDA_ATTENTION)");
}

}  // namespace zt::cuda

#endif
