// Timing shared by the GPU benchmarks (attention_bench.cpp, kernels_bench.cpp):
// the median of `reps` runs after `warmups`, each between two marks on the
// device's stream (CUDA events on a GPU, the host clock on the CPU).
#pragma once

#include <algorithm>
#include <functional>
#include <vector>

#include "ops/device.h"

namespace zt::bench {

inline double median_seconds(Device dev, const std::function<void()>& run, int reps = 10, int warmups = 3) {
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
