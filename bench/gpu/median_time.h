// Timing shared by the GPU benchmarks (attention_bench.cpp, kernels_bench.cpp):
// the median of `reps` runs after `warmups`, queued back to back, each
// between two marks on the device's stream (CUDA events on a GPU, the host
// clock on the CPU).
//
// ZT_BENCH_PROFILE=1 (bench/gpu/run.sh ncu) runs each op once after one
// warmup (plans, scratch and first-use allocations made outside) and tells
// the profiler to capture that run alone: under ncu --profile-from-start off,
// each profiled kernel is one run of one op, and the replays ncu needs per
// kernel stay few.
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "core/env.h"
#include "ops/device.h"

namespace zt::bench {

inline bool profiling_run() {
  static const bool on = env_switch(
      "ZT_BENCH_PROFILE", "1: each op runs once after one warmup, captured by a profiler (bench/gpu/run.sh ncu)");
  return on;
}

inline double median_seconds(Device dev, const std::function<void()>& run, int reps = 10, int warmups = 3) {
  if (profiling_run()) {
    run();  // launched before the capture starts: not captured
    ops::profiler_capture(dev, true);
    const ops::DeviceMark start(dev);
    run();
    const double seconds = ops::DeviceMark(dev).seconds_since(start);
    ops::profiler_capture(dev, false);
    return seconds;
  }
  for (int i = 0; i < warmups; ++i) run();
  // The runs queue back to back and their marks are read after the last: each
  // interval is the device's time for one run, as in a training step, where
  // the host runs ahead. (Waiting for each run before the next would add the
  // launch delay of work started on an idle GPU, some microseconds: a sixth
  // of GPT-2's smallest rows, and a different share for kernels with
  // different host work.)
  std::vector<ops::DeviceMark> marks;
  marks.reserve(size_t(reps) + 1);
  marks.emplace_back(dev);
  for (int i = 0; i < reps; ++i) {
    run();
    marks.emplace_back(dev);
  }
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) s.push_back(marks[size_t(i) + 1].seconds_since(marks[size_t(i)]));
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

}  // namespace zt::bench
