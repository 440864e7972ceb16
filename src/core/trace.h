// A timeline of a stretch of work (metrics.trace_step: one training step):
// spans on named tracks ("step", "ops", "comm dp", ...) recorded by any
// thread while the trace is on, in microseconds since trace_begin() on the
// host's steady clock. The op profiler records every op (GPU ops placed by
// the device's clock: ops/op_profile.h), the comm groups every operation,
// the trainer its phases; train/ writes them as a Chrome trace.
// Off by default: a recording call then costs one relaxed atomic load.
// Like the op profile, process-wide: one trace at a time.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace zt {

using TraceClock = std::chrono::steady_clock;

struct TraceSpan {
  std::string track, name;
  double start_us = 0, dur_us = 0;  // since trace_begin()
};

// Clears the spans, sets the origin (now) and turns recording on.
void trace_begin();
bool trace_on();
TraceClock::time_point trace_origin();
// A span from `start` to `end` (host clock); ignored while the trace is off.
void trace_span(std::string_view track, std::string_view name, TraceClock::time_point start,
                TraceClock::time_point end);
// A span placed by other means (a device's clock), in microseconds since the origin.
void trace_span_us(std::string_view track, std::string_view name, double start_us, double dur_us);
// Turns recording off and returns the spans, in recording order.
std::vector<TraceSpan> trace_end();

}  // namespace zt
