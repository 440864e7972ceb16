// A small C++ layer over cuDNN's backend (graph) API: tensors, pointwise,
// reduction, matmul and reshape operations, and execution plans found through
// cuDNN's heuristics. Host-only (no kernels); compiled when cuDNN is found
// (ZT_WITH_CUDNN). Used by attention_cudnn.cpp to build the fused SDPA graphs.
//
// A plan is built either for a live GPU (a cudnnHandle_t) or ahead of time for
// a GPU described by its properties (cuDNN's device-properties JSON), which
// lets the CPU-only CI check that cuDNN has an engine for a graph on H100.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace zt::cuda::cudnn {

// Throws zt::Error naming the call, the cuDNN status and cuDNN's last message.
void check(cudnnStatus_t status, const char* expr);
#define ZT_CUDNN_CHECK(expr) ::zt::cuda::cudnn::check((expr), #expr)

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(cudnnBackendDescriptorType_t type);
  ~Descriptor();
  Descriptor(Descriptor&& other) noexcept : d_(other.d_) { other.d_ = nullptr; }
  Descriptor& operator=(Descriptor&& other) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values);
  // Finalizes; the error says which descriptor (`what`) cuDNN refused and why.
  void finalize(const char* what);

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Uid = int64_t;  // a graph's tensors are numbered from 1
constexpr Uid kNoTensor = -1;

// Dims and strides in elements (cuDNN wants rank >= 3; we use 4: b, h, rows, cols).
struct Layout {
  std::vector<int64_t> dims, strides;
};

// The GPU a plan is built for: a live handle, or device properties (JSON as
// cudnnBackend's CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION reads it).
struct Target {
  cudnnHandle_t handle = nullptr;
  std::string device_json;
};

class Plan;
class Graph;
// The operation graph of `graph`, finalized, and the first execution plan
// cuDNN's heuristics offer that finalizes for `target` (`only_config` >= 0:
// that configuration of the heuristics' list and no other - to time the
// others against cuDNN's first choice). Throws zt::Error listing why each
// engine configuration was refused when none is usable.
Plan make_plan(std::shared_ptr<const Graph> graph, const Target& target, int64_t only_config = -1);
// How many engine configurations cuDNN's heuristics offer for the graph on
// the target after cuDNN's support checks (0: no engine supports it). Checking
// support needs the CUDA driver library loaded, not a GPU.
int64_t count_engine_configs(const Graph& graph, const Target& target);
// The workspace (bytes) each of those configurations needs, in the
// heuristics' order (make_plan takes the first that finalizes): answered
// ahead of time too, so the CPU can check what a graph costs an H100.
std::vector<int64_t> engine_config_workspaces(const Graph& graph, const Target& target);

// An operation graph under construction. Tensors are named by uid; an op's
// output tensor is created first (tensor/virtual_tensor) and passed in.
class Graph {
 public:
  // A tensor the caller supplies memory for at execution (16-byte aligned).
  Uid tensor(const Layout& layout, cudnnDataType_t dtype);
  // An intermediate that lives only inside the fused kernel.
  Uid virtual_tensor(const Layout& layout, cudnnDataType_t dtype);
  // A by-value f32 scalar (passed in the variant pack, broadcast over any shape).
  Uid scalar(float value);

  // y = mode(x[, b[, t]]) elementwise; `math` is the compute type; axis is for
  // GEN_INDEX (the dimension whose index is generated), -1 otherwise.
  void pointwise(cudnnPointwiseMode_t mode, cudnnDataType_t math, Uid x, Uid b, Uid t, Uid y, int64_t axis = -1);
  // y = reduce(x) over the dimensions where y's size is 1 (or a group of them).
  void reduction(cudnnReduceTensorOp_t op, Uid x, Uid y);
  // c = a @ b over the last two dimensions, batched (and broadcast) over the rest; f32 math.
  void matmul(Uid a, Uid b, Uid c);
  // y is x with other dims/strides (a transpose expressed as a view).
  void reshape(Uid x, Uid y);

  const Layout& layout(Uid uid) const { return tensors_.at(size_t(uid - 1)).layout; }
  size_t num_operations() const { return ops_.size(); }

  // The descriptors an operation graph needs (finalized, in order).
  std::vector<cudnnBackendDescriptor_t> operations() const;
  // The by-value scalars: their uids and values.
  std::vector<std::pair<Uid, float>> scalars() const;

 private:
  struct TensorEntry {
    Descriptor desc;
    Layout layout;
    bool by_value;
    float value;  // by-value scalars
  };
  Uid add_tensor(const Layout& layout, cudnnDataType_t dtype, bool is_virtual, bool by_value, float value);
  cudnnBackendDescriptor_t desc(Uid uid) const;

  std::vector<TensorEntry> tensors_;
  std::vector<Descriptor> ops_, op_params_;  // operation nodes; their pointwise/matmul/reduction descriptors
};

// A finalized execution plan with the uids it reads and writes. Holds the
// graph whose descriptors it was built from.
class Plan {
 public:
  Plan() = default;
  int64_t workspace_bytes() const { return workspace_bytes_; }
  // Runs on the handle's stream. pointers[i] is the memory of uids[i]; every
  // non-virtual tensor of the graph must be given; scalars are added here.
  void execute(cudnnHandle_t handle, const std::vector<Uid>& uids, const std::vector<void*>& pointers,
               void* workspace) const;

 private:
  friend Plan make_plan(std::shared_ptr<const Graph> graph, const Target& target, int64_t only_config);
  std::shared_ptr<const Graph> graph_;
  std::shared_ptr<Descriptor> operation_graph_, plan_;
  int64_t workspace_bytes_ = 0;
  std::vector<std::pair<Uid, float>> scalars_;  // the graph's by-value scalars
};

}  // namespace zt::cuda::cudnn
