// Calibrating a cluster's step efficiency from a measured run: the share
// of the GEMM rate that makes the step model predict the run's own
// tokens/s, so the other layouts of a search are predicted from one
// measurement on the same machines.
#pragma once

#include <string>

#include "parallel/mesh.h"
#include "plan/cluster.h"
#include "train/config.h"

namespace zt::plan {

// A finished (or running) run: its resolved config (run_dir/config.toml),
// its processes, and its median tokens/s over the steps after the first two
// (allocation and warm-up) in run_dir/metrics.jsonl.
struct MeasuredRun {
  std::string dir;
  train::Config cfg;
  parallel::MeshShape mesh;
  double tokens_per_second = 0;
  int64_t steps = 0;  // the steps the median is over
};
// Throws zt::Error naming the file and what is missing (no such run, fewer
// than 3 steps, no "world" field: a run from before metrics.jsonl had it).
MeasuredRun read_measured_run(const std::string& run_dir);

// `c` with step_efficiency solved from the run: the run's step less the
// model's predicted communication, optimizer and (times the bubble) its
// compute is that compute at the new rate. Throws zt::Error when the run
// needs more devices than `c` has or the model's other terms already
// exceed the measured step (a run on other machines than `c`). On a CPU
// cluster (one host shared by its processes) the run is predicted on the
// host shared by the run's own processes.
Cluster calibrate(const Cluster& c, const MeasuredRun& run);

}  // namespace zt::plan
