// Dynamic loss scaling (fp16 training): the loss gradient is multiplied by
// scale() so that small activation gradients stay representable in fp16;
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

// The scaler's state, saved in checkpoints (exact resume).
struct LossScaleState {
  double scale = 1.0;
  int64_t good_steps = 0;  // consecutive steps without overflow since the last change
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleConfig& config);  // throws zt::Error naming a bad setting
  double scale() const { return state_.scale; }
  // After a step: an overflow divides the scale (it may go below 1: the
  // gradients are then scaled down), else counts towards growth.
  void update(bool overflow);
  const LossScaleState& state() const { return state_; }
  void set_state(const LossScaleState& s);

 private:
  LossScaleConfig config_;
  LossScaleState state_;
};

}  // namespace zt::optim
