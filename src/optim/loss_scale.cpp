#include "optim/loss_scale.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace zt::optim {

namespace {

bool power_of_two(double x) {
  int e = 0;
  return x > 0 && std::isfinite(x) && std::frexp(x, &e) == 0.5;
}

}  // namespace

LossScaler::LossScaler(const LossScaleConfig& config) : config_(config) {
  ZT_CHECK(power_of_two(config.init), "train.loss_scale_init = ", config.init,
           " must be a positive power of two (scaling by one is exact; 65536 is the usual start)");
  ZT_CHECK(config.window > 0, "train.loss_scale_window = ", config.window, " must be positive");
  ZT_CHECK(power_of_two(config.factor) && config.factor > 1, "the loss-scale factor must be a power of two > 1");
  ZT_CHECK(power_of_two(config.max_scale) && config.max_scale >= config.init, "the largest loss scale (",
           config.max_scale, ") must be a power of two >= train.loss_scale_init");
}

void LossScaler::update(LossScaleState& s, bool overflow) const {
  if (overflow) {
    s.scale /= config_.factor;
    s.good_steps = 0;
    return;
  }
  if (++s.good_steps >= config_.window) {
    s.scale = std::min(s.scale * config_.factor, config_.max_scale);
    s.good_steps = 0;
  }
}

void LossScaler::check(const LossScaleState& s) const {
  ZT_CHECK(power_of_two(s.scale) && s.good_steps >= 0, "checkpointed loss scale ", s.scale, " (", s.good_steps,
           " good steps) is not a positive power of two; the checkpoint's state.progress is damaged");
}

}  // namespace zt::optim
