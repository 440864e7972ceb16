// The search over layouts: every way to run a config on a cluster's
// devices - dp x tp x pp x cp (x ep for MoE models), each ZeRO stage,
// micro-batch, recompute policy and pipeline schedule the trainer accepts,
// offloading where nothing else fits -, with its memory
// plan (train/memory_plan.h) and predicted step (step_model.h); the ones
// that fit the devices' memory ranked by predicted tokens/s.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/cluster.h"
#include "plan/step_model.h"
#include "train/config.h"
#include "train/memory_plan.h"

namespace zt::plan {

struct Candidate {
  train::Config cfg;            // the config with this layout's settings
  parallel::MeshShape mesh;
  train::MemoryPlan memory;     // of the layout's largest rank
  bool fits = false;            // within the devices' memory (train::plan_fits)
  StepEstimate step;
};

// The config as it is, on `world` of the cluster's devices (its
// parallel.dp = 0 takes the rest). Throws zt::Error when the trainer would
// refuse the layout.
Candidate evaluate_layout(const train::Config& cfg, const Cluster& cluster, int64_t world);

struct SearchOptions {
  int64_t world = 0;            // devices to use (0: all of the cluster's)
  bool vary_zero = true, vary_micro_batch = true, vary_recompute = true;
  // Pipelines: 1F1B, zero bubble and interleaved with 2 chunks a rank too
  // (the config's schedule and chunks otherwise).
  bool vary_schedule = true;
  // Offloading the optimizer's state, the kept activations or both, for
  // layouts that do not fit without (a config that offloads keeps its own).
  bool vary_offload = true;
};
// Every layout that runs and fits, fastest first (within 1%: the lower ZeRO
// stage, less recomputation and offloading, the more rows a micro-batch
// gives each product, the smaller cp group, less memory).
std::vector<Candidate> search_layouts(const train::Config& cfg, const Cluster& cluster, const SearchOptions& options);

// The first candidate of each mesh (dp, tp, pp, cp, ep), in order.
std::vector<Candidate> best_per_mesh(const std::vector<Candidate>& candidates);

// A table of candidates: the layout's settings, its largest rank's memory,
// the predicted step split by where its time goes, tokens/s and MFU.
std::string format_candidates(const std::vector<Candidate>& candidates, size_t limit);

}  // namespace zt::plan
