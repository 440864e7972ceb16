// GQA attention (causal, or an unmasked key block) through cuDNN's fused
// SDPA (graphs: cudnn_sdpa.h).
// Plans are built on first use of a shape (cuDNN's heuristics, then its
// runtime compilation: about a second) and cached per device, shape, dtype,
// scale, direction and backward algorithm (cudnn_sdpa.h: deterministic, or
// dq summed with atomics). A shape cuDNN has no engine for is remembered with
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
#include <numeric>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cudnn_sdpa.h"
#include "core/env.h"

namespace zt::cuda {

namespace {

using cudnn::Plan;

// (device, B, T, Hq, Hkv, D, dtype, scale bits, pass: 0 forward, 1 deterministic backward, 2 atomic backward,
// the packed qkv row or 0, the keys of an unmasked block or 0 when causal)
using PlanKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int, uint32_t, int, int64_t, int64_t>;
using Pass = AttentionPass;
int pass_key(Pass pass) { return !pass.backward ? 0 : pass.deterministic ? 1 : 2; }

struct CachedPlan {
  std::shared_ptr<const Plan> plan;  // null when cuDNN has no engine
  std::string unsupported;           // cuDNN's reason, when plan is null
  cudnnHandle_t handle = nullptr;    // of the key's device
  // The graph's caller-supplied tensors, in the order the entry points pass
  // their memory: forward q, k, v, out, lse; backward q, k, v, out, dout,
  // lse, dq, dk, dv, row sums (and the atomic backward's dq accumulator).
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

// ZT_CUDNN_FORWARD_CONFIG = n (ZT_CUDNN_BACKWARD_CONFIG = n): the forward
// (backward) plans take the n-th engine configuration cuDNN's heuristics
// offer (from 0) instead of the first that builds - to time the others
// (bench/gpu/run.sh attention); a plan with no such configuration is one
// cuDNN cannot take. Unset: -1.
int64_t forced_engine_config(bool backward) {
  const char* what = "the engine configuration of cuDNN's list to use, from 0";
  static const int64_t forward = env_whole_number("ZT_CUDNN_FORWARD_CONFIG", 0, what).value_or(-1);
  static const int64_t backward_config = env_whole_number("ZT_CUDNN_BACKWARD_CONFIG", 0, what).value_or(-1);
  return backward ? backward_config : forward;
}

// Why cuDNN cannot take this call before any plan is built (empty when it may).
std::string static_blocker(const AttentionShape& s) {
  if (s.dtype != DType::bf16 && s.dtype != DType::f16) return "cuDNN's fused attention takes bf16 or f16";
  if (s.D % 8 != 0 || s.D > 128) return "cuDNN's fused attention takes head dims that are multiples of 8 up to 128";
  return "";
}

// The cached plan for this call, building it on first use.
const CachedPlan& plan_for(const AttentionShape& a, float scale, Pass pass) {
  cudnn::SdpaShape s{a.B, a.T, a.Hq, a.Hkv, a.D, cudnn_type(a.dtype), scale, a.qkv_row};
  s.causal = a.causal;
  s.Tk = a.causal ? 0 : a.keys();
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &scale, sizeof(scale));
  const PlanKey key{a.device.index, s.B, s.T, s.Hq, s.Hkv, s.D, int(s.io), scale_bits, pass_key(pass), s.qkv_row,
                    s.Tk};
  static std::map<PlanKey, CachedPlan> cache;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const int64_t only_config = forced_engine_config(pass.backward);  // a bad value is an error, not "cuDNN cannot"
  CachedPlan entry;
  try {
    cudnn::Target target;
    target.handle = entry.handle = handle_of(a.device);
    std::shared_ptr<cudnn::Graph> graph;
    if (pass.backward) {
      const cudnn::SdpaBackwardGraph g = cudnn::sdpa_backward_graph(
          s, pass.deterministic ? cudnn::SdpaBackward::deterministic : cudnn::SdpaBackward::atomic);
      graph = g.graph;
      entry.uids = {g.q, g.k, g.v, g.out, g.dout, g.lse, g.dq, g.dk, g.dv, g.row_sums};
      if (pass.atomic()) entry.uids.push_back(g.dq_accum);
    } else {
      const cudnn::SdpaForwardGraph g = cudnn::sdpa_forward_graph(s);
      graph = g.graph;
      entry.uids = {g.q, g.k, g.v, g.out, g.lse};
    }
    entry.plan = std::make_shared<const Plan>(cudnn::make_plan(graph, target, only_config));
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

// The f32 dq accumulator of the atomic backward: (B, Hq, T, D).
int64_t dq_accum_elems(const AttentionShape& s) { return s.B * s.Hq * s.T * s.D; }

// The workspace a call of `s` allocates: its plan's, the backward's f32 row
// sums and the atomic backward's f32 dq accumulator (max int64 when cuDNN has
// no engine for it).
int64_t call_workspace_bytes(const AttentionShape& s, float scale, Pass pass) {
  const CachedPlan& p = plan_for(s, scale, pass);
  if (!p.plan) return std::numeric_limits<int64_t>::max();
  return plan_workspace_bytes(p) + (pass.backward ? 4 * s.B * s.Hq * s.T : 0) +
         (pass.atomic() ? 4 * dq_accum_elems(s) : 0);
}

AttentionShape with_batch(AttentionShape s, int64_t B) {
  s.B = B;
  return s;
}

// A chunk starting at sequence b0 reads lse at b0 x Hq x T f32 elements:
// 16-byte aligned, as the graphs promise cuDNN, when b0 is a multiple of
// this (q, k, v, out and their gradients are: D is a multiple of 8).
int64_t chunk_multiple(const AttentionShape& s) { return 4 / std::gcd<int64_t>(s.Hq * s.T, 4); }

// The sequences per call: all of the batch when its workspace fits `budget`,
// else the batch in equal chunks that do (a sequence's results do not depend
// on the others'; the deterministic backward's workspace, B x Hq x T^2 bf16
// on an H100, grows with the batch), each a multiple of chunk_multiple but
// the last; 0 when no such chunk fits.
int64_t sequences_per_call(const AttentionShape& s, float scale, Pass pass, int64_t budget) {
  const int64_t all = call_workspace_bytes(s, scale, pass), m = chunk_multiple(s);
  if (all <= budget || s.B <= m) return all <= budget ? s.B : 0;
  int64_t most = std::clamp<int64_t>(int64_t(double(s.B) * double(budget) / double(all)), 1, s.B - 1);
  most = std::max(m, most - most % m);
  while (most > m && call_workspace_bytes(with_batch(s, most), scale, pass) > budget) most -= m;
  if (call_workspace_bytes(with_batch(s, most), scale, pass) > budget) return 0;
  const int64_t calls = (s.B + most - 1) / most, balanced = (s.B + calls - 1) / calls;
  return (balanced + m - 1) / m * m;  // <= most, which is a multiple of m
}

// Calls fn(b0, b1) for the batch's chunks of sequences_per_call rows, in order.
template <typename F>
void for_each_batch_chunk(const AttentionShape& s, float scale, Pass pass, int64_t budget, F&& fn) {
  const int64_t rows = sequences_per_call(s, scale, pass, budget);
  ZT_CHECK(rows > 0, "attention: cuDNN cannot take this call: ", cudnn_attention_unsupported(s, scale, pass, budget));
  for (int64_t b0 = 0; b0 < s.B; b0 += rows) fn(b0, std::min(s.B, b0 + rows));
}

}  // namespace

void cudnn_read_environment() {
  (void)forced_engine_config(false);
  (void)forced_engine_config(true);
}

std::string cudnn_attention_unsupported(const AttentionShape& s, float scale, Pass pass, int64_t budget) {
  std::string blocker = static_blocker(s);
  if (!blocker.empty()) return blocker;
  const CachedPlan& p = plan_for(s, scale, pass);
  if (!p.plan) return p.unsupported;
  if (s.B > 0 && sequences_per_call(s, scale, pass, budget) == 0)
    return ::zt::detail::concat("one sequence needs ", call_workspace_bytes(with_batch(s, 1), scale, pass),
                                " bytes of cuDNN workspace at T = ", s.T,
                                pass.atomic() ? "" : " (its deterministic backward keeps Hq x T^2 scores)",
                                ", over attention's budget of ", budget, " bytes");
  return "";
}

int64_t cudnn_attention_workspace_bytes(const AttentionShape& s, float scale, Pass pass, int64_t budget) {
  int64_t most = 0;
  for_each_batch_chunk(s, scale, pass, budget, [&](int64_t b0, int64_t b1) {
    most = std::max(most, call_workspace_bytes(with_batch(s, b1 - b0), scale, pass));
  });
  return most;
}

namespace {

// Where a call's q, k, v (a backward's dq, dk, dv) are: three tensors, or
// three runs of heads in each row of one packed (B, T, Hq + 2 Hkv, D) tensor.
struct Heads {
  const Tensor *q = nullptr, *k = nullptr, *v = nullptr;
  const Tensor* packed = nullptr;
  int64_t Hq = 0, Hkv = 0;

  // The three pointers of sequences [b0, b1), appended in the graph's order.
  void append(std::vector<void*>& to, int64_t b0, int64_t b1) const {
    if (!packed) {
      for (const Tensor* t : {q, k, v}) to.push_back(ptr(t->slice(b0, b1)));
      return;
    }
    char* row = static_cast<char*>(ptr(packed->slice(b0, b1)));
    const int64_t head_bytes = packed->size(3) * int64_t(dtype_size(packed->dtype()));
    for (const int64_t first_head : {int64_t(0), Hq, Hq + Hkv}) to.push_back(row + first_head * head_bytes);
  }
};

Heads separate(const Tensor& q, const Tensor& k, const Tensor& v) { return {&q, &k, &v, nullptr, 0, 0}; }
Heads packed(const Tensor& qkv, int64_t Hq, int64_t Hkv) { return {nullptr, nullptr, nullptr, &qkv, Hq, Hkv}; }

void forward_on(const AttentionShape& s, const Heads& in, const Tensor& out, const Tensor& lse, float scale,
                int64_t budget) {
  for_each_batch_chunk(s, scale, Pass{}, budget, [&](int64_t b0, int64_t b1) {
    std::vector<void*> pointers;
    in.append(pointers, b0, b1);
    pointers.push_back(ptr(out.slice(b0, b1)));
    pointers.push_back(ptr(lse.slice(b0, b1)));
    run(plan_for(with_batch(s, b1 - b0), scale, Pass{}), out, pointers);
  });
}

void backward_on(const AttentionShape& s, const Heads& in, const Heads& grads, const Tensor& dout, const Tensor& out,
                 const Tensor& lse, float scale, int64_t budget, bool deterministic) {
  const Pass pass{true, deterministic};
  for_each_batch_chunk(s, scale, pass, budget, [&](int64_t b0, int64_t b1) {
    const AttentionShape chunk = with_batch(s, b1 - b0);
    const Tensor lc = lse.slice(b0, b1);
    Tensor row_sums = Tensor::empty(lc.shape(), DType::f32, out.device(), MemCategory::workspace);
    std::vector<void*> pointers;
    in.append(pointers, b0, b1);
    for (const Tensor* t : {&out, &dout}) pointers.push_back(ptr(t->slice(b0, b1)));
    pointers.push_back(ptr(lc));
    grads.append(pointers, b0, b1);
    pointers.push_back(ptr(row_sums));
    Tensor dq_accum;  // the atomic backward adds into it
    if (pass.atomic()) {
      dq_accum = Tensor::empty(Shape{dq_accum_elems(chunk)}, DType::f32, out.device(), MemCategory::workspace);
      // cuDNN zeroes the accumulator itself from 9.6 on (its frontend
      // memsets it only for older versions): before that, zero it here.
      static const bool zero_it = cudnnGetVersion() < 90600;
      if (zero_it)
        ZT_CUDA_CHECK(cudaMemsetAsync(ptr(dq_accum), 0, size_t(4 * dq_accum_elems(chunk)), stream_of(out)));
      pointers.push_back(ptr(dq_accum));
    }
    run(plan_for(chunk, scale, pass), out, pointers);
  });
}

}  // namespace

void cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             float scale, int64_t budget, bool causal) {
  forward_on(attention_shape(q, k, causal), separate(q, k, v), out, lse, scale, budget);
}

void cudnn_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              float scale, int64_t budget, bool deterministic, bool causal) {
  backward_on(attention_shape(q, k, causal), separate(q, k, v), separate(dq, dk, dv), dout, out, lse, scale, budget,
              deterministic);
}

void cudnn_attention_forward_packed(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t Hq, int64_t Hkv,
                                    float scale, int64_t budget) {
  forward_on(packed_attention_shape(qkv, Hq, Hkv), packed(qkv, Hq, Hkv), out, lse, scale, budget);
}

void cudnn_attention_backward_packed(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                     const Tensor& lse, int64_t Hq, int64_t Hkv, float scale, int64_t budget,
                                     bool deterministic) {
  backward_on(packed_attention_shape(qkv, Hq, Hkv), packed(qkv, Hq, Hkv), packed(dqkv, Hq, Hkv), dout, out, lse,
              scale, budget, deterministic);
}

}  // namespace zt::cuda

#else  // no cuDNN in this build

namespace zt::cuda {

void cudnn_read_environment() {}

std::string cudnn_attention_unsupported(const AttentionShape&, float, AttentionPass, int64_t) {
  return "this build has no cuDNN (configure with cuDNN's headers and library found, e.g. CUDNN_ROOT)";
}
int64_t cudnn_attention_workspace_bytes(const AttentionShape&, float, AttentionPass, int64_t) {
  ZT_FAIL("attention: this build has no cuDNN");
}
void cudnn_attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, float, int64_t,
                             bool) {
  ZT_FAIL("attention: this build has no cuDNN; choose another kernel (ZT_CUDA_ATTENTION)");
}
void cudnn_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, float, int64_t, bool, bool) {
  ZT_FAIL("attention: this build has no cuDNN; choose another kernel (ZT_CUDA_ATTENTION)");
}
void cudnn_attention_forward_packed(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, float, int64_t) {
  ZT_FAIL("attention: this build has no cuDNN; choose another kernel (ZT_CUDA_ATTENTION)");
}
void cudnn_attention_backward_packed(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                                     int64_t, float, int64_t, bool) {
  ZT_FAIL("attention: this build has no cuDNN; choose another kernel (ZT_CUDA_ATTENTION)");
}

}  // namespace zt::cuda

#endif
