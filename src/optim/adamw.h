// AdamW over a model's flat parameter sets, with mixed-precision masters.
//
// State per ParamSet (MemCategory::optimizer): m and v (f32), and when the
// model computes in bf16 an f32 master copy of the weights; the bf16 weights
// are rewritten from the master after every step. With f32 weights the
// parameters are their own master.
// Weight decay is decoupled and applied per tensor: not to tensors whose
// ParamSpec says decay = false (norms, biases, embeddings) unless
// decay_embeddings is set, which re-enables it for "embed.*".
// stochastic_rounding rounds the bf16 weights from the master stochastically
// (unbiased: E[weight] = master) instead of to nearest. The random bits of an
// element are a function of (seed, its set's first parameter name, step, its
// offset in the set's flat buffer): the same under any data-parallel / ZeRO
// layout and on resume; tensor parallelism (local offsets) draws others.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/params.h"
#include "ops/adamw.h"

namespace zt::optim {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool decay_embeddings = false;
  bool stochastic_rounding = false;  // of bf16 weights; needs a bf16 model
  uint64_t seed = 0;                 // of the rounding's random bits
  bool offload = false;              // state in host memory, the update on the host (see above)
  // Elements per offloaded chunk: the host's staging holds one chunk's
  // gradient (f32) and weights (compute dtype).
  int64_t offload_chunk_elems = int64_t(1) << 24;
};

// The part of a ParamSet's flat buffer this process updates: [begin, end)
// and its gradient (end - begin, f32). The whole set by default; a ZeRO
// shard under data parallelism (the gradient is then the reduce-scattered
// shard, not the set's full buffer).
struct OptimShard {
  int64_t begin = 0, end = 0;
  Tensor grad;
  // Where the shard's weights live (compute dtype, end - begin): undefined
  // means the set's own flat buffer; ZeRO-3 passes its persistent shard.
  Tensor param = {};
};

class AdamW {
 public:
  // shards: one per set, or empty for whole sets.
  AdamW(std::vector<nn::ParamSet*> sets, const AdamWConfig& cfg, std::vector<OptimShard> shards = {});

  // One update with learning rate lr; gradients are multiplied by grad_scale
  // first (the clipping factor).
  void step(double lr, float grad_scale);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }

  // State of set i's shard (for checkpoints): master (f32; a view of the
  // params themselves when they are f32 and not offloaded), m, v - all
  // (end - begin) f32, element k belonging to flat element begin + k; in
  // host memory when offloaded.
  Tensor master(size_t i) const;
  // `values` (f32, host) of set i's flat elements [offset, offset + n) in
  // `dtype`, rounded as the last step rounded the weights: to nearest, or
  // stochastically with that step's bits (what a restore writes, so that a
  // resumed run continues bit for bit). A new host tensor.
  Tensor rounded_weights(size_t i, int64_t offset, const Tensor& values, DType dtype) const;
  // The Philox key of set i's stochastic rounding (stream = the step count,
  // counter = the element's flat offset in the set).
  uint64_t rounding_seed(size_t i) const { return rounding_seeds_[i]; }
  Tensor exp_avg(size_t i) const { return m_[i]; }
  Tensor exp_avg_sq(size_t i) const { return v_[i]; }
  const OptimShard& shard(size_t i) const { return shards_[i]; }
  size_t num_sets() const { return sets_.size(); }
  const nn::ParamSet& set(size_t i) const { return *sets_[i]; }
  bool offloaded() const { return cfg_.offload; }

 private:
  // The offloaded update of set i's state elements [off, off + n) (p as for
  // the device's one call over them), chunk by chunk through the staging.
  void update_offloaded(size_t i, int64_t off, int64_t n, const ops::AdamWParams& p);

  std::vector<nn::ParamSet*> sets_;
  AdamWConfig cfg_;
  std::vector<OptimShard> shards_;
  std::vector<Tensor> master_, m_, v_;  // per set shard; master_ undefined when params are f32 (not offloaded)
  // Offloaded: the host's staging of one chunk, the gradient (f32) and the
  // updated weights (in the parameters' dtype).
  Tensor grad_stage_, weight_stage_;
  std::vector<uint64_t> rounding_seeds_;  // per set: stochastic rounding's Philox key
  int64_t step_ = 0;
};

// L2 norm of the gradients the optimizer updates from: every gradient of the
// sets, or under ZeRO this process's shards of them, and under tensor
// parallelism only the elements this rank counts (ParamSet::norm_ranges):
// its part of the global norm.
double grad_norm(const AdamW& opt);
// The same over the sets marked in `sets` only (one flag per set).
double grad_norm(const AdamW& opt, const std::vector<bool>& sets);
// PyTorch's clip_grad_norm_ rule: max_norm / (norm + 1e-6) when that is < 1,
// else 1; max_norm <= 0 disables clipping.
float clip_scale(double norm, double max_norm);

}  // namespace zt::optim
