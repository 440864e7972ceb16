// Learning-rate schedules, as a pure function of the (0-based) step.
//   cosine:   linear warmup to lr over warmup_steps, then cosine decay to
//             min_lr at total_steps (min_lr afterwards)
//   wsd:      warmup, stable at lr, then linear decay to min_lr over the last
//             decay_steps steps (warmup-stable-decay)
//   constant: warmup, then lr
// Warmup: step s < warmup_steps uses lr * (s + 1) / warmup_steps.
#pragma once

#include <cstdint>
#include <string_view>

namespace zt::optim {

enum class LrScheduleKind { cosine, wsd, constant };
std::string_view lr_schedule_name(LrScheduleKind k);
LrScheduleKind parse_lr_schedule(std::string_view s);

struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::cosine;
  double lr = 3e-4;          // peak
  double min_lr = 3e-5;      // floor
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  int64_t decay_steps = 0;   // wsd only

  double at(int64_t step) const;
  void validate() const;     // throws zt::Error naming the bad setting
};

}  // namespace zt::optim
