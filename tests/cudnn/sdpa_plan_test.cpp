// cuDNN's fused attention graphs (backend/cuda/cudnn_sdpa.h) checked ahead of
// time, without a GPU: cuDNN's heuristics, given an H100's device properties,
// must offer engine configurations that pass cuDNN's own support checks for
// the forward and the backward graph of the model shapes we train. This
// catches graphs no engine fuses (an f32 probability operand in the forward,
// or the backward's row sums taken from the wrong tensor, leave none), not
// operand orientation or scale (a backward reading P for P^T still finds an
// engine): the numbers are checked on a GPU by tests/cuda/kernels_test.cpp
// against the CPU backend.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cudnn_sdpa.h"
#include "core/error.h"

namespace zt::cuda::cudnn {
namespace {

// An H100 SXM (80 GB) as cuDNN's device-properties JSON describes a GPU.
const char* kH100 = R"({"maxGridSize":[2147483647,65535,65535],"maxBlockSize":[1024,1024,64],
"regsPerBlock":65536,"multiProcessorCount":132,"warpSize":32,"maxSharedMemoryPerBlock":49152,
"maxSharedMemoryPerBlockOptin":232448,"reservedSharedMemoryPerBlock":1024,"maxRegistersPerSM":65536,
"maxCtasPerSM":32,"maxThreadsPerBlock":1024,"maxThreadsPerSM":2048,"pciDeviceId":0,"isTccDriver":0,
"supportCoopLaunch":1,"totalGlobalMem":85045870592,"smClockRateKHz":1980000,"memClockRateKHz":2619000,
"l2CacheSize":52428800,"cudaDeviceId":0,"deviceVer":900,"driverVer":13000,"deviceName":"NVIDIA H100 80GB HBM3"})";

// Appended to a failure: without a loadable CUDA driver library cuDNN's
// support checks refuse every engine.
std::string driver_note() {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY);
  if (lib) {
    dlclose(lib);
    return "";
  }
  return " (libcuda.so.1 cannot be loaded: run this through ctest, which puts the toolkit's stub driver on "
         "LD_LIBRARY_PATH)";
}

Target h100() {
  Target t;
  t.device_json = kH100;
  return t;
}

struct Case {
  const char* name;
  SdpaShape shape;
};

// GPT-2 124M; the Llama-3 1B shape (GQA 32/8); head dim 128 in f16; a length
// that is not a multiple of any tile; multi-query attention.
std::vector<Case> model_shapes() {
  return {{"gpt2-124M", {8, 1024, 12, 12, 64, CUDNN_DATA_BFLOAT16, 0.125f}},
          {"llama3-1B", {2, 2048, 32, 8, 64, CUDNN_DATA_BFLOAT16, 0.125f}},
          {"d128-f16", {1, 512, 16, 8, 128, CUDNN_DATA_HALF, 0.08838835f}},
          {"odd-length", {2, 130, 4, 2, 64, CUDNN_DATA_BFLOAT16, 0.125f}},
          {"multi-query", {3, 256, 8, 1, 32, CUDNN_DATA_BFLOAT16, 0.17677669f}}};
}

// q, k, v read in place from a fused qkv product's (B, T, Hq + 2 Hkv, D)
// output, and the backward's dq, dk, dv written into one of that shape:
// strided operands, which the H100's engines take as they take dense ones.
TEST(CudnnSdpaPlan, PackedQkvHasTheSameFusedEnginesOnH100) {
  for (const Case& c : model_shapes()) {
    SdpaShape packed = c.shape;
    packed.qkv_row = (c.shape.Hq + 2 * c.shape.Hkv) * c.shape.D;
    EXPECT_EQ(count_engine_configs(*sdpa_forward_graph(packed).graph, h100()),
              count_engine_configs(*sdpa_forward_graph(c.shape).graph, h100()))
        << c.name << " forward" << driver_note();
    for (const SdpaBackward algorithm : {SdpaBackward::deterministic, SdpaBackward::atomic}) {
      const int dense = count_engine_configs(*sdpa_backward_graph(c.shape, algorithm).graph, h100());
      EXPECT_GT(dense, 0) << c.name << driver_note();
      EXPECT_EQ(count_engine_configs(*sdpa_backward_graph(packed, algorithm).graph, h100()), dense)
          << c.name << (algorithm == SdpaBackward::atomic ? " (atomic dq)" : " (deterministic)") << driver_note();
    }
  }
}

TEST(CudnnSdpaPlan, ForwardHasAFusedEngineOnH100) {
  for (const Case& c : model_shapes()) {
    const SdpaForwardGraph f = sdpa_forward_graph(c.shape);
    EXPECT_GT(count_engine_configs(*f.graph, h100()), 0) << c.name << driver_note();
  }
}

TEST(CudnnSdpaPlan, BackwardHasAFusedEngineOnH100) {
  for (const SdpaBackward algorithm : {SdpaBackward::deterministic, SdpaBackward::atomic})
    for (const Case& c : model_shapes()) {
      const SdpaBackwardGraph b = sdpa_backward_graph(c.shape, algorithm);
      EXPECT_GT(count_engine_configs(*b.graph, h100()), 0)
          << c.name << (algorithm == SdpaBackward::atomic ? " (atomic dq)" : " (deterministic)") << driver_note();
    }
}

// What the two backward algorithms cost in workspace on an H100, as cuDNN's
// heuristics state it for the configuration make_plan tries first: the
// deterministic one keeps every head's bf16 score gradients (B x Hq x T^2 x
// 2 bytes: why a large batch runs in chunks, attention_cudnn.cu); the atomic
// one needs none of that (GPT-2: a few bytes; GQA: the per-query-head dK and
// dV before the group sum, B x T x Hq x D bf16 each) - its f32 dq
// accumulator is a tensor of the graph, which the caller provides.
TEST(CudnnSdpaPlan, OnlyTheDeterministicBackwardKeepsTheScoresInItsWorkspace) {
  struct Expect {
    const char* name;
    SdpaShape shape;
  };
  for (const Expect& c : {Expect{"gpt2 B=32", {32, 1024, 12, 12, 64, CUDNN_DATA_BFLOAT16, 0.125f}},
                          Expect{"llama B=11", {11, 1024, 32, 8, 64, CUDNN_DATA_BFLOAT16, 0.125f}}}) {
    const SdpaShape& s = c.shape;
    const int64_t scores = s.B * s.Hq * s.T * s.T * 2, per_head = s.B * s.T * s.Hq * s.D * 2;
    const int64_t gqa = s.Hq == s.Hkv ? 0 : 2 * per_head;
    const std::vector<int64_t> det =
        engine_config_workspaces(*sdpa_backward_graph(s, SdpaBackward::deterministic).graph, h100());
    const std::vector<int64_t> atomic =
        engine_config_workspaces(*sdpa_backward_graph(s, SdpaBackward::atomic).graph, h100());
    ASSERT_FALSE(det.empty()) << c.name << driver_note();
    ASSERT_FALSE(atomic.empty()) << c.name << driver_note();
    EXPECT_GE(det[0], scores + gqa) << c.name;
    EXPECT_LT(det[0], scores + gqa + (int64_t(1) << 20)) << c.name;
    EXPECT_GE(atomic[0], gqa) << c.name;
    EXPECT_LT(atomic[0], gqa + (int64_t(1) << 20)) << c.name;
  }
}

// Each caller-supplied tensor's (b, h, row, col) view must address exactly
// the elements of our buffer: offsets 0 .. numel-1, each once.
void expect_dense_view(const Layout& l, int64_t numel, const std::string& what) {
  std::vector<int64_t> offsets;
  std::vector<int64_t> idx(l.dims.size(), 0);
  const int64_t total = std::accumulate(l.dims.begin(), l.dims.end(), int64_t(1), std::multiplies<>());
  ASSERT_EQ(total, numel) << what;
  for (int64_t n = 0; n < total; ++n) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * l.strides[d];
    offsets.push_back(off);
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < l.dims[d]) break;
      idx[d] = 0;
    }
  }
  std::sort(offsets.begin(), offsets.end());
  for (int64_t n = 0; n < total; ++n) ASSERT_EQ(offsets[size_t(n)], n) << what << " misses or repeats an element";
}

TEST(CudnnSdpaPlan, TensorViewsCoverOurBuffersExactly) {
  const SdpaShape s{2, 5, 4, 2, 8, CUDNN_DATA_BFLOAT16, 0.35f};
  const int64_t nq = s.B * s.T * s.Hq * s.D, nkv = s.B * s.T * s.Hkv * s.D, nlse = s.B * s.Hq * s.T;
  const SdpaForwardGraph f = sdpa_forward_graph(s);
  for (auto [uid, n, what] : {std::tuple{f.q, nq, "q"}, {f.k, nkv, "k"}, {f.v, nkv, "v"}, {f.out, nq, "out"},
                              {f.lse, nlse, "lse"}})
    expect_dense_view(f.graph->layout(uid), n, std::string("forward ") + what);
  const SdpaBackwardGraph b = sdpa_backward_graph(s);
  for (auto [uid, n, what] :
       {std::tuple{b.q, nq, "q"}, {b.k, nkv, "k"}, {b.v, nkv, "v"}, {b.out, nq, "out"}, {b.dout, nq, "dout"},
        {b.lse, nlse, "lse"}, {b.dq, nq, "dq"}, {b.dk, nkv, "dk"}, {b.dv, nkv, "dv"}, {b.row_sums, nlse, "sums"}})
    expect_dense_view(b.graph->layout(uid), n, std::string("backward ") + what);
  EXPECT_EQ(b.dq_accum, kNoTensor);
  // The atomic backward's dq accumulator: a dense (B, Hq, T, D) buffer of its own.
  const SdpaBackwardGraph a = sdpa_backward_graph(s, SdpaBackward::atomic);
  ASSERT_NE(a.dq_accum, kNoTensor);
  expect_dense_view(a.graph->layout(a.dq_accum), nq, "atomic backward dq_accum");
  EXPECT_EQ(a.graph->layout(a.dq_accum).dims, (std::vector<int64_t>{s.B, s.Hq, s.T, s.D}));
  expect_dense_view(a.graph->layout(a.dq), nq, "atomic backward dq");
  // q's element (b, t, h, d) sits at ((b T + t) Hq + h) D + d: the view's
  // (b, h, t, d) strides say the same.
  EXPECT_EQ(f.graph->layout(f.q).strides, (std::vector<int64_t>{s.T * s.Hq * s.D, s.D, s.Hq * s.D, 1}));
  // k enters q k^T transposed: (b, h, d, t).
  EXPECT_EQ(f.graph->layout(f.k).dims, (std::vector<int64_t>{s.B, s.Hkv, s.D, s.T}));
}

// A plan asked for one engine configuration (the bench's sweep of them)
// takes only that one: a number past cuDNN's list is named as such, and one
// in it is tried alone (ahead of time no plan finalizes - that needs a GPU -,
// so the refusal names that configuration and no other).
TEST(CudnnSdpaPlan, APlanOfOneEngineConfigurationTriesOnlyThatOne) {
  const SdpaShape s = model_shapes()[0].shape;
  const auto graph = sdpa_forward_graph(s).graph;
  const int64_t offered = count_engine_configs(*graph, h100());
  ASSERT_GE(offered, 2) << driver_note();
  try {
    make_plan(graph, h100(), offered);
    FAIL() << "a configuration past cuDNN's list was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("there is no number " + std::to_string(offered)), std::string::npos)
        << e.what();
  }
  try {
    make_plan(graph, h100(), 1);
    FAIL() << "an execution plan finalized without a GPU";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("engine config 1:"), std::string::npos) << what;
    EXPECT_EQ(what.find("engine config 0:"), std::string::npos) << what;
  }
}

// Context parallelism's ring blocks (nn/ring_attention.h): c queries
// against 2c keys and 2c queries against c keys, no mask, for GPT-2's and
// Llama's heads: cuDNN offers fused engines for the forward and both
// backward algorithms, and the graphs' tensors cover our buffers of those
// shapes (q, out, lse: T rows; k, v: Tk rows).
std::vector<Case> ring_block_shapes() {
  std::vector<Case> cases;
  const std::pair<const char*, SdpaShape> bases[] = {
      {"gpt2 c=512", {4, 512, 12, 12, 64, CUDNN_DATA_BFLOAT16, 0.125f}},
      {"llama c=1024", {1, 1024, 32, 8, 64, CUDNN_DATA_BFLOAT16, 0.125f}},
      {"d128 f16 c=96", {2, 96, 16, 8, 128, CUDNN_DATA_HALF, 0.088f}}};
  for (const auto& [name, base] : bases) {
    SdpaShape more_keys = base, more_queries = base;
    more_keys.causal = more_queries.causal = false;
    more_keys.Tk = 2 * base.T;  // c queries x 2c keys
    more_queries.T = 2 * base.T;
    more_queries.Tk = base.T;   // 2c queries x c keys
    cases.push_back({name, more_keys});
    cases.push_back({name, more_queries});
  }
  return cases;
}

TEST(CudnnSdpaPlan, UnmaskedKeyBlocksHaveFusedEnginesOnH100) {
  for (const Case& c : ring_block_shapes()) {
    const std::string what = std::string(c.name) + " T=" + std::to_string(c.shape.T) + " Tk=" +
                             std::to_string(c.shape.Tk);
    EXPECT_GT(count_engine_configs(*sdpa_forward_graph(c.shape).graph, h100()), 0) << what << driver_note();
    for (const SdpaBackward algorithm : {SdpaBackward::deterministic, SdpaBackward::atomic})
      EXPECT_GT(count_engine_configs(*sdpa_backward_graph(c.shape, algorithm).graph, h100()), 0)
          << what << (algorithm == SdpaBackward::atomic ? " (atomic dq)" : " (deterministic)") << driver_note();
  }
}

TEST(CudnnSdpaPlan, UnmaskedViewsCoverBuffersOfTwoLengths) {
  SdpaShape s{2, 6, 4, 2, 8, CUDNN_DATA_BFLOAT16, 0.35f};
  s.causal = false;
  s.Tk = 10;
  const int64_t nq = s.B * s.T * s.Hq * s.D, nkv = s.B * s.Tk * s.Hkv * s.D, nlse = s.B * s.Hq * s.T;
  const SdpaForwardGraph f = sdpa_forward_graph(s);
  for (auto [uid, n, what] : {std::tuple{f.q, nq, "q"}, {f.k, nkv, "k"}, {f.v, nkv, "v"}, {f.out, nq, "out"},
                              {f.lse, nlse, "lse"}})
    expect_dense_view(f.graph->layout(uid), n, std::string("forward ") + what);
  for (const SdpaBackward algorithm : {SdpaBackward::deterministic, SdpaBackward::atomic}) {
    const SdpaBackwardGraph b = sdpa_backward_graph(s, algorithm);
    for (auto [uid, n, what] :
         {std::tuple{b.q, nq, "q"}, {b.k, nkv, "k"}, {b.v, nkv, "v"}, {b.out, nq, "out"}, {b.dout, nq, "dout"},
          {b.lse, nlse, "lse"}, {b.dq, nq, "dq"}, {b.dk, nkv, "dk"}, {b.dv, nkv, "dv"}, {b.row_sums, nlse, "sums"}})
      expect_dense_view(b.graph->layout(uid), n, std::string("backward ") + what);
    if (algorithm == SdpaBackward::atomic) expect_dense_view(b.graph->layout(b.dq_accum), nq, "dq_accum");
  }
  EXPECT_EQ(f.graph->layout(f.k).dims, (std::vector<int64_t>{s.B, s.Hkv, s.D, s.Tk}));
}

TEST(CudnnSdpaPlan, ARefusedDescriptorNamesTheProblem) {
  Graph g;
  try {
    g.tensor({{1, 1, -4, 4}, {16, 16, 4, 1}}, CUDNN_DATA_FLOAT);
    FAIL() << "cuDNN accepted a tensor with a negative dimension";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuDNN refused the tensor descriptor: CUDNN_STATUS_BAD_PARAM"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace zt::cuda::cudnn
