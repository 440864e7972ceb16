// cuDNN backend graph layer (contract: cudnn_graph.h).
#include "backend/cuda/cudnn_graph.h"

#include <string>

#include "core/error.h"

namespace zt::cuda::cudnn {

namespace {

std::string last_error() {
  char message[1024] = {0};
  cudnnGetLastErrorString(message, sizeof(message));
  return message;
}

constexpr int64_t kAlignment = 16;  // bytes; our device allocations are 256-aligned, views 16

}  // namespace

void check(cudnnStatus_t status, const char* expr) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  const std::string detail = last_error();
  ZT_FAIL("cuDNN: ", expr, " failed with ", cudnnGetErrorString(status), detail.empty() ? "" : " (", detail,
          detail.empty() ? "" : ")");
}

Descriptor::Descriptor(cudnnBackendDescriptorType_t type) {
  ZT_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_));
}

Descriptor::~Descriptor() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

Descriptor& Descriptor::operator=(Descriptor&& other) noexcept {
  if (this != &other) {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = other.d_;
    other.d_ = nullptr;
  }
  return *this;
}

void Descriptor::set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                     const void* values) {
  const cudnnStatus_t st = cudnnBackendSetAttribute(d_, name, type, count, values);
  if (st != CUDNN_STATUS_SUCCESS)
    ZT_FAIL("cuDNN: setting attribute ", int(name), " failed with ", cudnnGetErrorString(st), " (", last_error(), ")");
}

void Descriptor::finalize(const char* what) {
  const cudnnStatus_t st = cudnnBackendFinalize(d_);
  if (st != CUDNN_STATUS_SUCCESS)
    ZT_FAIL("cuDNN refused the ", what, ": ", cudnnGetErrorString(st), " (", last_error(), ")");
}

// ---- Graph ----

Uid Graph::add_tensor(const Layout& layout, cudnnDataType_t dtype, bool is_virtual, bool by_value, float value) {
  ZT_ASSERT(layout.dims.size() == layout.strides.size() && !layout.dims.empty(), "cuDNN tensor layout rank");
  const Uid uid = Uid(tensors_.size()) + 1;  // uids from 1: 0 reads as "unset" in some cuDNN tools
  Descriptor d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t rank = int64_t(layout.dims.size());
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dtype);
  d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, rank, layout.dims.data());
  d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, rank, layout.strides.data());
  d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &kAlignment);
  d.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
  if (by_value) d.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
  d.finalize("tensor descriptor");
  tensors_.push_back({std::move(d), layout, by_value, value});
  return uid;
}

Uid Graph::tensor(const Layout& layout, cudnnDataType_t dtype) { return add_tensor(layout, dtype, false, false, 0); }

Uid Graph::virtual_tensor(const Layout& layout, cudnnDataType_t dtype) {
  return add_tensor(layout, dtype, true, false, 0);
}

Uid Graph::scalar(float value) {
  return add_tensor({{1, 1, 1, 1}, {1, 1, 1, 1}}, CUDNN_DATA_FLOAT, false, true, value);
}

cudnnBackendDescriptor_t Graph::desc(Uid uid) const {
  ZT_ASSERT(uid >= 1 && size_t(uid) <= tensors_.size(), "cuDNN graph: unknown tensor uid ", uid);
  return tensors_[size_t(uid - 1)].desc.get();
}

void Graph::pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, Uid x, Uid b, Uid t, Uid y, int64_t axis) {
  Descriptor pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
  pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math);
  if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
  pw.finalize("pointwise descriptor");
  Descriptor op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  cudnnBackendDescriptor_t p = pw.get(), xd = desc(x), yd = desc(y);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &p);
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &xd);
  if (b != kNoTensor) {
    cudnnBackendDescriptor_t bd = desc(b);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bd);
  }
  if (t != kNoTensor) {
    cudnnBackendDescriptor_t td = desc(t);
    op.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &td);
  }
  op.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yd);
  op.finalize("pointwise operation");
  op_params_.push_back(std::move(pw));
  ops_.push_back(std::move(op));
}

void Graph::reduction(cudnnReduceTensorOp_t reduce, Uid x, Uid y) {
  Descriptor rd(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  const cudnnDataType_t math = CUDNN_DATA_FLOAT;
  rd.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
  rd.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math);
  rd.finalize("reduction descriptor");
  Descriptor op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  cudnnBackendDescriptor_t r = rd.get(), xd = desc(x), yd = desc(y);
  op.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
  op.set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &xd);
  op.set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yd);
  op.finalize("reduction operation");
  op_params_.push_back(std::move(rd));
  ops_.push_back(std::move(op));
}

void Graph::matmul(Uid a, Uid b, Uid c) {
  Descriptor md(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  const cudnnDataType_t math = CUDNN_DATA_FLOAT;
  md.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math);
  md.finalize("matmul descriptor");
  Descriptor op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  cudnnBackendDescriptor_t m = md.get(), ad = desc(a), bd = desc(b), cd = desc(c);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ad);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bd);
  op.set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cd);
  op.finalize("matmul operation");
  op_params_.push_back(std::move(md));
  ops_.push_back(std::move(op));
}

void Graph::reshape(Uid x, Uid y) {
  Descriptor op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
  cudnnBackendDescriptor_t xd = desc(x), yd = desc(y);
  op.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &xd);
  op.set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &yd);
  op.finalize("reshape operation");
  ops_.push_back(std::move(op));
}

std::vector<cudnnBackendDescriptor_t> Graph::operations() const {
  std::vector<cudnnBackendDescriptor_t> out;
  for (const Descriptor& op : ops_) out.push_back(op.get());
  return out;
}

std::vector<std::pair<Uid, float>> Graph::scalars() const {
  std::vector<std::pair<Uid, float>> out;
  for (size_t i = 0; i < tensors_.size(); ++i)
    if (tensors_[i].by_value) out.emplace_back(Uid(i) + 1, tensors_[i].value);
  return out;
}

// ---- plans ----

namespace {

// The engine configurations cuDNN's heuristics offer for a graph on a target,
// with what they refer to (the device properties and the finalized graph).
struct EngineQuery {
  Descriptor device;                     // set when planning ahead of time
  std::shared_ptr<Descriptor> op_graph;  // finalized
  Descriptor heuristics;
  std::vector<Descriptor> configs;
};

void query_engines(EngineQuery& q, const Graph& graph, const Target& target) {
  ZT_ASSERT(graph.num_operations() > 0, "cuDNN plan of an empty graph");
  ZT_ASSERT(target.handle || !target.device_json.empty(), "cuDNN plan needs a handle or device properties");
  // Device properties stand in for a handle when planning ahead of time.
  if (!target.handle) {
    q.device = Descriptor(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR);
    q.device.set(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, int64_t(target.device_json.size() + 1),
                 target.device_json.c_str());
    q.device.finalize("device properties");
  }
  q.op_graph = std::make_shared<Descriptor>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  const std::vector<cudnnBackendDescriptor_t> ops = graph.operations();
  q.op_graph->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()), ops.data());
  if (target.handle) q.op_graph->set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle);
  q.op_graph->finalize("operation graph");

  q.heuristics = Descriptor(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendDescriptor_t og = q.op_graph->get();
  const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  q.heuristics.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
  q.heuristics.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (!target.handle) {
    cudnnBackendDescriptor_t dp = q.device.get();
    q.heuristics.set(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &dp);
  }
  q.heuristics.finalize("engine heuristics query");

  // cuDNN returns only configurations that passed its support checks.
  int64_t count = 0;
  ZT_CUDNN_CHECK(cudnnBackendGetAttribute(q.heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    q.configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(q.configs.back().get());
  }
  int64_t got = 0;
  if (count > 0)
    ZT_CUDNN_CHECK(cudnnBackendGetAttribute(q.heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, raw.data()));
  q.configs.resize(size_t(got));
}

}  // namespace

int64_t count_engine_configs(const Graph& graph, const Target& target) {
  EngineQuery q;
  query_engines(q, graph, target);
  return int64_t(q.configs.size());
}

std::vector<int64_t> engine_config_workspaces(const Graph& graph, const Target& target) {
  EngineQuery q;
  query_engines(q, graph, target);
  std::vector<int64_t> out;
  for (const Descriptor& cfg : q.configs) {
    int64_t bytes = 0, got = 0;
    ZT_CUDNN_CHECK(cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                            &bytes));
    out.push_back(bytes);
  }
  return out;
}

Plan make_plan(std::shared_ptr<const Graph> graph, const Target& target, int64_t only_config) {
  ZT_ASSERT(graph, "cuDNN plan of no graph");
  EngineQuery q;
  query_engines(q, *graph, target);
  Plan plan;
  plan.graph_ = graph;
  const int64_t got = int64_t(q.configs.size());
  ZT_CHECK(only_config < got, "cuDNN offers ", got, " engine configurations for this graph; there is no number ",
           only_config, " (they count from 0)");
  std::string refusals;
  const int64_t first = only_config >= 0 ? only_config : 0, end = only_config >= 0 ? only_config + 1 : got;
  for (int64_t i = first; i < end; ++i) {
    auto exec = std::make_shared<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    cudnnBackendDescriptor_t cfg = q.configs[size_t(i)].get();
    exec->set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    if (target.handle) {
      exec->set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &target.handle);
    } else {
      cudnnBackendDescriptor_t dp = q.device.get();
      exec->set(CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &dp);
    }
    if (cudnnBackendFinalize(exec->get()) != CUDNN_STATUS_SUCCESS) {
      refusals += "\n  engine config " + std::to_string(i) + ": " + last_error();
      continue;
    }
    int64_t elements = 0;
    ZT_CUDNN_CHECK(cudnnBackendGetAttribute(exec->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                            1, &elements, &plan.workspace_bytes_));
    plan.operation_graph_ = q.op_graph;
    plan.plan_ = exec;
    plan.scalars_ = graph->scalars();
    return plan;
  }
  ZT_FAIL("cuDNN has no engine for this graph on this GPU (", got, " engine configurations offered",
          refusals.empty() ? "" : "; refused:", refusals, ")");
}

void Plan::execute(cudnnHandle_t handle, const std::vector<Uid>& uids, const std::vector<void*>& pointers,
                   void* workspace) const {
  ZT_ASSERT(plan_ && uids.size() == pointers.size(), "cuDNN plan execute: no plan, or uids and pointers differ");
  std::vector<int64_t> all_uids(uids.begin(), uids.end());
  std::vector<void*> all_pointers(pointers.begin(), pointers.end());
  for (const auto& [uid, value] : scalars_) {  // by-value scalars: read from host memory during the call
    all_uids.push_back(uid);
    all_pointers.push_back(const_cast<float*>(&value));
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(all_uids.size()), all_uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(all_pointers.size()),
           all_pointers.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize("variant pack");
  ZT_CUDNN_CHECK(cudnnBackendExecute(handle, plan_->get(), pack.get()));
}

}  // namespace zt::cuda::cudnn
