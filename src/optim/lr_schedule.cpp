#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace zt::optim {

std::string_view lr_schedule_name(LrScheduleKind k) {
  switch (k) {
    case LrScheduleKind::cosine: return "cosine";
    case LrScheduleKind::wsd: return "wsd";
    case LrScheduleKind::constant: return "constant";
  }
  return "?";
}

LrScheduleKind parse_lr_schedule(std::string_view s) {
  if (s == "cosine") return LrScheduleKind::cosine;
  if (s == "wsd") return LrScheduleKind::wsd;
  if (s == "constant") return LrScheduleKind::constant;
  ZT_FAIL("unknown LR schedule '", s, "'; valid: cosine, wsd, constant");
}

void LrSchedule::validate() const {
  ZT_CHECK(lr > 0, "optim.lr must be positive, got ", lr);
  ZT_CHECK(min_lr >= 0 && min_lr <= lr, "optim.min_lr = ", min_lr, " must be in [0, optim.lr = ", lr, "]");
  ZT_CHECK(warmup_steps >= 0, "optim.warmup_steps must be >= 0");
  ZT_CHECK(kind != LrScheduleKind::wsd || (decay_steps > 0 && warmup_steps + decay_steps <= total_steps),
           "optim.decay_steps = ", decay_steps, " must be positive and warmup_steps + decay_steps <= train.steps = ",
           total_steps, " for the wsd schedule");
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * double(step + 1) / double(warmup_steps);
  switch (kind) {
    case LrScheduleKind::constant: return lr;
    case LrScheduleKind::cosine: {
      const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps);
      const double progress = std::clamp(double(step - warmup_steps) / double(span), 0.0, 1.0);
      return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
    }
    case LrScheduleKind::wsd: {
      const int64_t decay_start = total_steps - decay_steps;
      if (step < decay_start) return lr;
      const double progress = std::clamp(double(step - decay_start + 1) / double(decay_steps), 0.0, 1.0);
      return lr + (min_lr - lr) * progress;
    }
  }
  return lr;
}

}  // namespace zt::optim
