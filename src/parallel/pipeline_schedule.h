// Pipeline schedules as data: for each pipeline rank, the ordered list of
// compute actions it runs in one optimizer step. The schedules know nothing
// of attention or layers; an executor runs the actions (posting the
// point-to-point transfers each one implies) and the simulator here runs
// them with nominal costs to check them and to predict the bubble.
//
// p ranks, m micro-batches, v model chunks per rank ("virtual stages"):
// the model is cut into p v stages and rank r holds stages r, r + p, ...,
// r + (v-1) p (chunk c of rank r is model stage c p + r), so every chunk
// boundary is a transfer to the next rank.
//
//   afab         all forwards, then all backwards (GPipe): every rank keeps
//                the activations of all m micro-batches; bubble (p-1)/m.
//   1f1b         p - r - 1 warm-up forwards, then one forward / one backward,
//                then the remaining backwards: at most p - r micro-batches in
//                flight on rank r; bubble (p-1)/m.
//   interleaved  1F1B over v chunks per rank (Megatron's order): warm-up and
//                cool-down shrink by v; bubble (p-1)/(v m). m must be a
//                multiple of p.
//   zb           ZB-H1 (zero bubble, Qi et al. 2023): backward split into the
//                input-gradient pass B (on the critical path: the previous
//                stage waits for it) and the weight-gradient pass W (needed
//                only by the optimizer); rank r runs W of micro-batch k after
//                B of k + r, so later stages send gradients upstream sooner
//                and fill their cool-down with the W passes they held back.
//                At most p micro-batches in flight per rank (1F1B's
//                first-stage bound; held ones keep only what W reads). Bubble
//                (p-1)(F + B - W) / (m (F + B + W)) for m >= p: a third of
//                1F1B's when F = B = W.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zt::parallel {

enum class PipelineSchedule { afab, one_f_one_b, interleaved, zero_bubble };
std::string_view pipeline_schedule_name(PipelineSchedule s);
// "afab" | "1f1b" | "interleaved" | "zb"; anything else throws zt::Error listing them.
PipelineSchedule parse_pipeline_schedule(std::string_view s);

enum class ActionKind {
  forward,
  backward,         // input and weight gradients together (afab, 1f1b, interleaved)
  backward_input,   // zb: the input gradient (sent to the previous stage)
  backward_weight,  // zb: the weight gradients of a backward_input already run
};
std::string_view action_name(ActionKind k);

struct Action {
  ActionKind kind = ActionKind::forward;
  int64_t micro_batch = 0;
  int64_t chunk = 0;  // 0 .. v-1: model stage chunk * p + rank
  bool operator==(const Action&) const = default;
};

// The (R, C) tensors an action moves between neighbouring stages: stage
// `stage` of `stages` receives one before it (a forward's input from the
// stage before, a backward's output gradient from the stage after) and
// sends one after it (its output onward, its input gradient back); a zb
// weight pass moves none.
bool receives_before(const Action& a, int64_t stage, int64_t stages);
bool sends_after(const Action& a, int64_t stage, int64_t stages);

struct PipelineShape {
  int64_t stages = 1;          // p: pipeline ranks
  int64_t micro_batches = 1;   // m
  int64_t virtual_stages = 1;  // v: model chunks per rank (interleaved; 1 otherwise)
};

// Throws zt::Error naming the setting and the fix when the schedule cannot
// run this shape (sizes < 1; interleaved with v < 2 or m not a multiple of
// p; v > 1 for the others). Pure: the same verdict on every rank.
void check_pipeline_schedule(PipelineSchedule kind, const PipelineShape& shape);

// schedule[r]: rank r's actions in order. Every (micro-batch, chunk) is
// run forward once and backward once (zb: backward_input then
// backward_weight).
std::vector<std::vector<Action>> build_pipeline_schedule(PipelineSchedule kind, const PipelineShape& shape);

// Nominal durations of one chunk's passes (arbitrary units).
struct PassCosts {
  double forward = 1, backward_input = 1, backward_weight = 1;  // backward = input + weight
};

struct PipelineSimulation {
  double makespan = 0;                 // the step, start to the last rank's end
  double work_per_rank = 0;            // compute time of one rank (the same on every rank)
  double bubble = 0;                   // (makespan - work) / work
  std::vector<double> idle;            // per rank: makespan - work
  std::vector<int64_t> peak_in_flight; // per rank: most micro-batch chunks forwarded, backward not finished
};

// Runs the schedule with zero-cost transfers: each rank runs its actions in
// order, each as soon as its inputs exist (the previous stage's forward, the
// next stage's backward). Throws zt::InternalError if the schedule deadlocks
// or misses an action (a schedule bug).
PipelineSimulation simulate_pipeline(const std::vector<std::vector<Action>>& schedule, const PipelineShape& shape,
                                     const PassCosts& costs = {});

// The bubble theory predicts for the schedule: (p-1)/m for afab and 1f1b,
// (p-1)/(v m) interleaved, (p-1)(F + B - W)/(m (F + B + W)) for zb with
// its F, B, W costs.
double theoretical_bubble(PipelineSchedule kind, const PipelineShape& shape, const PassCosts& costs = {});

}  // namespace zt::parallel
