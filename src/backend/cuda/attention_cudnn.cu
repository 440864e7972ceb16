// Causal GQA attention through cuDNN's fused SDPA (graphs: cudnn_sdpa.h).
// Plans are built on first use of a shape (cuDNN's heuristics, then its
// runtime compilation: about a second) and cached per device, shape, dtype,
// scale and direction. A shape cuDNN has no engine for is remembered with
// cuDNN's reason, and the dispatcher (attention.cu) uses our own kernels.
#include "backend/cuda/attention.h"

#include "core/error.h"

#if ZT_WITH_CUDNN

#include <algorithm>
#include <cstring>
#include <limits>
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

// The workspace a call of `s` allocates: its plan's and the backward's f32
// row sums (max int64 when cuDNN has no engine for it).
int64_t call_workspace_bytes(const AttentionShape& s, float scale, bool backward) {
  const CachedPlan& p = plan_for(s, scale, backward);
  if (!p.plan) return std::numeric_limits<int64_t>::max();
  return plan_workspace_bytes(p) + (backward ? 4 * s.B * s.Hq * s.T : 0);
}

AttentionShape with_batch(AttentionShape s, int64_t B) {
  s.B = B;
  return s;
}

// The sequences per call: all of the batch when its workspace fits `budget`,
// else the batch in equal chunks that do (a sequence's results do not depend
// on the others'; the deterministic backward's workspace, B x Hq x T^2 bf16
// on an H100, grows with the batch); 0 when one sequence alone does not fit.
int64_t sequences_per_call(const AttentionShape& s, float scale, bool backward, int64_t budget) {
  const int64_t all = call_workspace_bytes(s, scale, backward);
  if (all <= budget || s.B <= 1) return all <= budget ? s.B : 0;
  int64_t most = std::clamp<int64_t>(int64_t(double(s.B) * double(budget) / double(all)), 1, s.B - 1);
  while (most > 1 && call_workspace_bytes(with_batch(s, most), scale, backward) > budget) --most;
  if (call_workspace_bytes(with_batch(s, most), scale, backward) > budget) return 0;
  const int64_t calls = (s.B + most - 1) / most;
  return (s.B + calls - 1) / calls;  // balanced: <= most
}

// Calls fn(b0, b1) for the batch's chunks of sequences_per_call rows, in order.
template <typename F>
void for_each_batch_chunk(const AttentionShape& s, float scale, bool backward, int64_t budget, F&& fn) {
  const int64_t rows = sequences_per_call(s, scale, backward, budget);
  ZT_CHECK(rows > 0, "attention: cuDNN cannot take this call: ", cudnn_attention_unsupported(s, scale, backward, budget));
  for (int64_t b0 = 0; b0 < s.B; b0 += rows) fn(b0, std::min(s.B, b0 + rows));
}

}  // namespace

std::string cudnn_attention_unsupported(const AttentionShape& s, float scale, bool backward, int64_t budget) {
  std::string blocker = static_blocker(s);
  if (!blocker.empty()) return blocker;
  const CachedPlan& p = plan_for(s, scale, backward);
  if (!p.plan) return p.unsupported;
  if (s.B > 0 && sequences_per_call(s, scale, backward, budget) == 0)
    return ::zt::detail::concat("one sequence needs ", call_workspace_bytes(with_batch(s, 1), scale, backward),
                                " bytes of cuDNN workspace at T = ", s.T, " (its backward keeps Hq x T^2 scores), over ",
                                "attention's budget of ", budget, " bytes");
  return "";
}

int64_t cudnn_attention_workspace_bytes(const AttentionShape& s, float scale, bool backward, int64_t budget) {
  int64_t most = 0;
  for_each_batch_chunk(s, scale, backward, budget, [&](int64_t b0, int64_t b1) {
    most = std::max(most, call_workspace_bytes(with_batch(s, b1 - b0), scale, backward));
  });
  return most;
}

void cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             float scale, int64_t budget) {
  const AttentionShape s = attention_shape(q, k);
  for_each_batch_chunk(s, scale, false, budget, [&](int64_t b0, int64_t b1) {
    const Tensor qc = q.slice(b0, b1), kc = k.slice(b0, b1), vc = v.slice(b0, b1);
    const Tensor oc = out.slice(b0, b1), lc = lse.slice(b0, b1);
    run(plan_for(with_batch(s, b1 - b0), scale, false), q, {ptr(qc), ptr(kc), ptr(vc), ptr(oc), ptr(lc)});
  });
}

void cudnn_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              float scale, int64_t budget) {
  const AttentionShape s = attention_shape(q, k);
  for_each_batch_chunk(s, scale, true, budget, [&](int64_t b0, int64_t b1) {
    const Tensor lc = lse.slice(b0, b1);
    Tensor row_sums = Tensor::empty(lc.shape(), DType::f32, q.device(), MemCategory::workspace);
    std::vector<void*> pointers;
    for (const Tensor* t : {&q, &k, &v, &out, &dout})
      pointers.push_back(ptr(t->slice(b0, b1)));
    pointers.push_back(ptr(lc));
    for (const Tensor* t : {&dq, &dk, &dv}) pointers.push_back(ptr(t->slice(b0, b1)));
    pointers.push_back(ptr(row_sums));
    run(plan_for(with_batch(s, b1 - b0), scale, true), q, pointers);
  });
}

}  // namespace zt::cuda

#else  // no cuDNN in this build

namespace zt::cuda {

std::string cudnn_attention_unsupported(const AttentionShape&, float, bool, int64_t) {
  return "this build has no cuDNN (configure with cuDNN's headers and library found, e.g. CUDNN_ROOT)";
}
int64_t cudnn_attention_workspace_bytes(const AttentionShape&, float, bool, int64_t) {
  ZT_FAIL("attention: this build has no cuDNN");
}
void cudnn_attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float, int64_t) {
  ZT_FAIL("attention: this build has no cuDNN; choose another kernel (ZT_CUDA_ATTENTION)");
}
void cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, float, int64_t) {
  ZT_FAIL("attention: this build has no cuDNN; choose another kernel (ZT_CUDA_ATTENTION)");
}

}  // namespace zt::cuda

#endif
