// Dynamic loss scaling (fp16 training): the loss gradient is multiplied by
// the scale so that small activation gradients stay representable in fp16;
// the trainer divides the gradients by it again before clipping and the
// update. A step whose gradients overflow (inf or NaN anywhere: the global
// gradient norm is not finite, the same verdict on every rank) is skipped
// and the scale divided by `factor`; after `window` consecutive steps
// without overflow it is multiplied by `factor`. Powers of two keep the
// scaling exact: with no overflow, scaled and unscaled training give the
// same bits.
#pragma once

#include <cstdint>

namespace zt::optim {

struct LossScaleConfig {
  double init = 65536.0;  // 2^16
  int64_t window = 2000;  // good steps before growing
  double factor = 2.0;
  double max_scale = 16777216.0;  // 2^24: growth stops here
};

// The scaler's state: part of the trainer's progress (checkpointed).
struct LossScaleState {
  double scale = 0.0;      // 0: loss scaling off
  int64_t good_steps = 0;  // consecutive steps without overflow since the last change
};

// The policy; the state it moves lives with the caller.
class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& config);  // throws zt::Error naming a bad setting
  LossScaleState initial() const { return {config_.init, 0}; }
  // After a step: an overflow divides the scale (it may go below 1: the
  // gradients are then scaled down), else counts towards growth.
  void update(LossScaleState& s, bool overflow) const;
  // A restored state must be a positive power of two (throws naming the damage).
  void check(const LossScaleState& s) const;

 private:
  LossScaleConfig config_;
};

}  // namespace zt::optim
