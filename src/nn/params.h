// Parameters and gradients of one layer in two flat buffers.
//
// Each layer (the embeddings, each transformer block, the head) owns one
// contiguous parameter buffer in the compute dtype and one contiguous f32
// gradient buffer; every named parameter is a view into them. Data
// parallelism buckets and ZeRO shards are then views too, and the optimizer
// walks flat memory.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "ops/grad_write.h"

namespace zt::nn {

enum class Init {
  normal,           // N(0, std)
  zeros,
  ones,
};

// Under tensor parallelism a rank holds part of a global tensor: runs of
// indices along one dimension (`split_dim`, any of the tensor's), each a
// piece. A piece maps local indices [local, local + length) to global
// [global, global + length). `owner` marks the one rank that counts a piece
// held by several ranks (replicated kv heads) in checkpoints and in the
// gradient norm. A tensor split along a later dimension may also hold a run
// of dim 0 (`dim0_start`: a mixture-of-experts block's experts under both
// expert and tensor parallelism, (E/ep, ...) of (E, ...)).
struct SlicePiece {
  int64_t local = 0, global = 0, length = 0;
  bool owner = true;
};

struct ParamSpec {
  std::string name;  // global name, e.g. "layers.3.attn.qkv.weight"
  Shape shape;       // this rank's tensor
  Init init = Init::normal;
  float std = 0.0f;   // for Init::normal
  bool decay = true;  // AdamW weight decay applies (false for norms, biases, embeddings)
  // Tensor parallelism (defaults: the whole tensor, held by this rank alone).
  Shape global_shape = {};         // empty: == shape
  int split_dim = 0;               // the dimension pieces run along
  std::vector<SlicePiece> pieces;  // empty: the whole tensor (global_shape == shape)
  int64_t dim0_start = 0;          // split_dim > 0: the global index of local index 0 along dim 0
  bool owner = true;               // whole tensors replicated over the tp group: true on one rank

  const Shape& global() const { return global_shape.ndim() == 0 ? shape : global_shape; }
  bool sliced() const { return !pieces.empty(); }
};

// Copies between a rank's tensor and the global tensor it is part of, piece
// by piece (local <- global when to_local, else global <- local); local
// indices no piece covers (vocabulary padding of the last rank) are left
// alone. Both tensors on one device, of one dtype.
void copy_pieces(const ParamSpec& spec, const Tensor& local, const Tensor& global, bool to_local);

// A contiguous box of a local tensor (start, extent as in ckpt manifests)
// as boxes of the global tensor: (offset in elements into the local box's
// data, global start, extent) for every owned piece it meets.
struct GlobalBox {
  int64_t offset = 0;
  std::vector<int64_t> start;
  Shape extent;
};
std::vector<GlobalBox> to_global_boxes(const ParamSpec& spec, const std::vector<int64_t>& start, const Shape& extent,
                                       bool owned_only);

class ParamSet {
 public:
  ParamSet() = default;
  // pad_multiple: the flat buffers are padded with zeros to a multiple of
  // it (data-parallel shards are then equal); padding belongs to no tensor.
  ParamSet(std::vector<ParamSpec> specs, DType dtype, Device device, int64_t pad_multiple = 1);

  size_t size() const { return specs_.size(); }
  const ParamSpec& spec(size_t i) const { return specs_[i]; }
  int64_t offset(size_t i) const { return offsets_[i]; }  // elements into the flat buffers
  int64_t numel() const { return numel_; }  // buffer length, padding included

  const Tensor& flat() const { return params_; }      // (numel) compute dtype, MemCategory::params
  const Tensor& grad_flat() const { return grads_; }  // (numel) f32, MemCategory::grads
  // ZeRO-2 keeps a layer's full gradient buffer only while its gradients
  // are produced and reduced: release drops it (memory returns when the
  // last user - a pending reduction - lets go), ensure brings back a zeroed one.
  bool has_grads() const { return grads_.defined(); }
  // ZeRO-3 likewise keeps the full parameter buffer only while the layer is
  // in use: release drops it, ensure_param_storage allocates it (contents
  // undefined: the caller all-gathers the shards into it).
  bool has_params() const { return params_.defined(); }
  void release_params() { params_ = Tensor(); }
  void ensure_param_storage();
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  void release_grads() { grads_ = Tensor(); }
  void ensure_grads();
  Tensor param(size_t i) const { return params_.flat_view(offsets_[i], specs_[i].shape); }
  Tensor grad(size_t i) const { return grads_.flat_view(offsets_[i], specs_[i].shape); }
  // Index of a parameter by name; throws zt::Error if absent.
  size_t index(std::string_view name) const;

  void zero_grads();
  // A step's gradients without a zero-fill first (PyTorch's set_to_none
  // does as much): in a lazy set (set_lazy_grads: one whose every writer
  // claims its writes) begin_grads leaves the buffer as the last step left
  // it, and each element's first write of the step overwrites it
  // (claim_grads); other sets are zeroed as zero_grads does. finish_grads
  // zeroes what no write claimed (padding; a tensor no write reached), before
  // anything reads the gradients. zero_grads and ensure_grads end a lazy
  // step: the zeros are then added into.
  void set_lazy_grads(bool lazy) { lazy_grads_ = lazy; }
  void begin_grads();
  // How the next write into `view` goes: overwrite for the step's first write
  // into its elements (then marked written), else accumulate. `view` is a
  // gradient view of this set - a tensor, or a run of its rows - that either
  // covers no element written this step or lies within one earlier claim.
  ops::GradWrite claim_grads(const Tensor& view);
  void finish_grads();
  // Fills every parameter per its Init; tensor `name` draws from a Philox
  // stream seeded by (seed, hash(name)), so values do not depend on the
  // layout or on which other tensors exist (a tensor-parallel rank draws
  // the global tensor and keeps its pieces).
  void init(uint64_t seed);
  // Flat [begin, end) ranges of the elements whose gradients this rank
  // counts in the global gradient norm (each element of the global model
  // counted on exactly one tensor-parallel rank); adjacent ranges merged.
  const std::vector<std::pair<int64_t, int64_t>>& norm_ranges() const { return norm_ranges_; }

 private:
  std::vector<ParamSpec> specs_;
  std::vector<int64_t> offsets_;
  std::vector<std::pair<int64_t, int64_t>> norm_ranges_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_;
  Tensor params_;
  Tensor grads_;
  bool lazy_grads_ = false;
  bool stale_ = false;                               // a lazy step is under way: unclaimed elements are stale
  std::vector<std::pair<int64_t, int64_t>> written_;  // [begin, end) elements claimed this step
};

// The per-tensor seed used by ParamSet::init (exposed for tests and for
// sharded initialisation later).
uint64_t param_seed(uint64_t seed, std::string_view name);

}  // namespace zt::nn
