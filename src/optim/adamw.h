// AdamW over a model's flat parameter sets, with mixed-precision masters.
//
// State per ParamSet (MemCategory::optimizer): m and v (f32), and when the
// model computes in bf16 an f32 master copy of the weights; the bf16 weights
// are rewritten from the master after every step. With f32 weights the
// parameters are their own master.
// Weight decay is decoupled and applied per tensor: not to tensors whose
// ParamSpec says decay = false (norms, biases, embeddings) unless
// decay_embeddings is set, which re-enables it for "embed.*".
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "nn/params.h"

namespace zt::optim {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool decay_embeddings = false;
};

class AdamW {
 public:
  AdamW(std::vector<nn::ParamSet*> sets, const AdamWConfig& cfg);

  // One update with learning rate lr; gradients are multiplied by grad_scale
  // first (the clipping factor).
  void step(double lr, float grad_scale);
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t s) { step_ = s; }

  // State of set i (for checkpoints): master (f32; the params themselves when
  // they are f32), m, v - all (numel) f32.
  Tensor master(size_t i) const;
  Tensor exp_avg(size_t i) const { return m_[i]; }
  Tensor exp_avg_sq(size_t i) const { return v_[i]; }
  size_t num_sets() const { return sets_.size(); }

 private:
  std::vector<nn::ParamSet*> sets_;
  AdamWConfig cfg_;
  std::vector<Tensor> master_, m_, v_;  // per set; master_ undefined when params are f32
  int64_t step_ = 0;
};

// Global L2 norm of every gradient in the sets.
double grad_norm(const std::vector<nn::ParamSet*>& sets);
// PyTorch's clip_grad_norm_ rule: max_norm / (norm + 1e-6) when that is < 1,
// else 1; max_norm <= 0 disables clipping.
float clip_scale(double norm, double max_norm);

}  // namespace zt::optim
