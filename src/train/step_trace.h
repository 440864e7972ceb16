// metrics.trace_step: one training step's timeline on every rank, written
// as a Chrome trace (RUN_DIR/trace.json; open it in https://ui.perfetto.dev)
// - each rank a process, each track (core/trace.h) a thread:
//   step       the trainer's compute phases by micro-batch (forward, head,
//              backward), placed by the device's clock like the ops; under
//              a pipeline its schedule's actions on this rank (forward,
//              backward or its input and weight passes, recv_wait) by the
//              host's
//   host       what the host waits for or runs itself: data loading, the
//              end of the gradient reduction, the optimizer step, a
//              pipeline's schedule
//   ops        every op (ops/op_profile.h), nested ones inside their outer op
//   comm NAME  every operation of the group NAME (dp, tp, cp, ep, ...), from
//              its start to its end on the group's thread (MPI groups; a
//              GPU's NCCL operations are not traced yet)
// Times are microseconds since the step began on this rank's host clock;
// ranks' clocks are not aligned with each other.
#pragma once

#include <string>
#include <vector>

#include "core/device.h"
#include "core/trace.h"
#include "parallel/mesh.h"

namespace zt::train {

struct RankTrace {
  int64_t rank = 0;  // world rank
  std::vector<TraceSpan> spans;
};

// Starts recording this process's trace (core/trace.h), the device's ops with it.
void begin_step_trace(Device device);
// Stops it (after the device's queued work) and gathers every rank's spans
// to every rank over the mesh's groups (a collective over the mesh; no mesh:
// this process alone).
std::vector<RankTrace> end_step_trace(Device device, const parallel::Mesh* mesh);
// The Chrome trace JSON of the ranks' spans.
std::string chrome_trace_json(const std::vector<RankTrace>& ranks);

}  // namespace zt::train
