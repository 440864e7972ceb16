// `zettatron info`: what a configuration costs before training it.
//   parameters by component, training FLOPs per token, and memory: an
//   analytic estimate next to the allocator's measurement of one real
//   forward/backward step for each recompute policy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/memory_plan.h"

namespace zt::train {

struct ComponentParams {
  std::string name;
  int64_t params;
};

struct PolicyMemory {
  nn::Recompute policy;
  int64_t estimated_activation_bytes;  // analytic, per micro-batch
  int64_t measured_activation_bytes;   // allocator peak of activations over one step (-1: not measured)
};

struct InfoReport {
  std::vector<ComponentParams> components;
  int64_t total_params = 0;
  int64_t non_embedding_params = 0;
  double flops_per_token = 0;
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  int64_t workspace_bytes = -1;  // the backend's (MemoryPlan::workspace); -1: not planned
  int64_t offload_bytes = 0;     // host memory holding offloaded state (MemoryPlan::offload)
  std::vector<PolicyMemory> activations;
  std::string measured_on;      // the device of the measured step ("" when it did not run)
  std::string measure_skipped;  // why it did not run (with Measure::when_affordable, or a failure)
};

// The measured step: off; when_affordable (the default: run it unless it
// needs more memory than the device has free, or, on a CPU, longer than
// kMeasureBudgetSeconds - the report then says why not); always.
enum class Measure { off, when_affordable, always };
constexpr double kMeasureBudgetSeconds = 120;

// Runs, unless `measure` says otherwise, one training step of a random
// micro-batch per recompute policy on the config's device (the CPU when it
// names a GPU this machine does not have).
InfoReport make_info(const Config& cfg, Measure measure);
// Why the measured step should not run, or "" when it may: it needs
// `need_bytes` on `device` but `available_bytes` are free (0: unknown, not
// checked; on the host a process past it is killed, not told), or it is
// `flops` of work on a CPU doing `gflops`, over kMeasureBudgetSeconds.
std::string measure_cost_verdict(Device device, int64_t need_bytes, int64_t available_bytes, double flops,
                                 double gflops);
// Bytes the measured step holds at its peak: weights, f32 gradients, the
// largest policy's activation estimate and the backend's workspace.
int64_t measured_step_bytes(const InfoReport& r);
// FLOPs of the measured step, all three policies (full recompute reruns the
// blocks' forward; selective's recompute is small and not counted).
double measured_step_flops(const Config& cfg);
std::string format_info(const Config& cfg, const InfoReport& r);
// The memory plan of every pipeline stage of a parallel layout (its largest
// tensor-parallel rank), which rank is the largest and whether it fits
// `capacity_bytes` of `device` (0: unknown, not said), then every other split
// of the same processes (plan_layouts) and whether it fits (unless
// list_splits is false).
std::string format_layout_plan(const Config& cfg, const PlanPlace& layout, Device device, int64_t capacity_bytes,
                               bool list_splits = true);

}  // namespace zt::train
