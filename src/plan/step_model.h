// A training step's time on a cluster, predicted from the config and its
// layout: the model's FLOPs at the cluster's measured step rate, the
// pipeline's bubble from the schedule's own simulator, and each parallel
// dimension's traffic - the bytes the comm layer will count for it
// (process_group.h's ring volumes), derived from the same parameter specs
// and activation shapes the trainer uses - over the link that dimension's
// group spans, with the part the trainer hides behind compute taken off.
//
// The volumes are exact where the traffic does not depend on the data
// (tests/parallel/plan_test.cpp checks them against the trainer's counters
// on 2 and 4 ranks); expert parallelism's depend on the routing (balanced by
// default). The times are a model: bench/plan checks them against runs.
#pragma once

#include <cstdint>

#include "parallel/mesh.h"
#include "plan/cluster.h"
#include "train/config.h"

namespace zt::plan {

// What one rank sends in a step, by dimension: payload bytes as the comm
// layer counts them, and the operations (each pays the link's latency).
struct StepVolumes {
  double dp_bytes = 0, tp_bytes = 0, cp_bytes = 0, ep_bytes = 0, pp_bytes = 0;
  double dp_ops = 0, tp_ops = 0, cp_ops = 0, ep_ops = 0, pp_ops = 0;
  double dp_gather_bytes = 0;  // of dp_bytes: ZeRO-1/2's gathers of the updated weights (after the optimizer)
};
// Balanced routing's rows sent per MoE block and forward pass, over the
// rank's N k slots: its dispatch out and the returns of what it received,
// (ep-1)/ep each.
double balanced_ep_rows(int64_t ep);
// mesh: the resolved sizes (dp, tp, pp, cp, ep). pp_rank: the stage whose
// rank is counted (its layers, embedding and head). ep_rows: rows sent per
// MoE block and forward pass over N k (< 0: balanced_ep_rows).
StepVolumes step_volumes(const train::Config& cfg, const parallel::MeshShape& mesh, int64_t pp_rank = 0,
                         double ep_rows = -1);

// One dimension's communication time in a step and the part of it the step
// waits for.
struct CommTime {
  double seconds = 0, exposed_seconds = 0;
};

struct StepEstimate {
  parallel::MeshShape mesh;
  double flops = 0;             // model FLOPs one rank computes per step, recomputation included
  double compute_seconds = 0;   // those at the cluster's step rate
  double bubble_seconds = 0;    // pipeline idle: compute x the schedule's bubble
  StepVolumes volumes;          // of the stage with the most traffic
  CommTime dp, tp, cp, ep, pp;
  double optimizer_seconds = 0; // AdamW's passes over this rank's share of the state (on the host: + its copies)
  double offload_bytes = 0;     // train.offload_activations: kept activations over the host link, both ways
  double offload_seconds = 0;   // their copies (exposed: the trainer waits for them)
  double step_seconds = 0;
  double tokens_per_second = 0; // the job's
  double mfu = 0;               // model FLOPs (no recomputation) per second over the devices' peak
};
// Throws zt::Error when the layout needs more devices than the cluster has.
StepEstimate estimate_step(const train::Config& cfg, const parallel::MeshShape& mesh, const Cluster& cluster);

}  // namespace zt::plan
