// Timing shared by the GPU benchmarks (attention_bench.cpp, kernels_bench.cpp):
// the median of `reps` runs after `warmups`, each between two marks on the
// device's stream (CUDA events on a GPU, the host clock on the CPU).
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
  std::vector<double> s;
  for (int i = 0; i < reps; ++i) {
    const ops::DeviceMark start(dev);
    run();
    s.push_back(ops::DeviceMark(dev).seconds_since(start));
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

}  // namespace zt::bench
