// Per-step metrics: what the console line, metrics.jsonl and hooks see.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "core/allocator.h"
#include "ops/op_profile.h"

namespace zt::train {

// One parallel dimension's communication in a step (this rank): payload
// bytes sent, the time its operations were in flight, and the part of that
// the step waited for (not hidden behind compute).
struct CommTraffic {
  int64_t size = 1;             // ranks in the dimension's group (1: no traffic)
  int64_t bytes = 0;
  double busy_seconds = 0, exposed_seconds = 0;
  // Adds a group's counters' growth from `start` to `now`.
  void add(const comm::CommStats& now, const comm::CommStats& start);
  // The share of the time in flight the step did not wait for, in [0, 1]
  // (1 - exposed / busy, clamped: a caller queued behind other operations
  // can wait longer than its own ran).
  double overlap() const;
};

struct StepMetrics {
  int64_t step = 0;            // 1-based optimizer step just taken
  int64_t total_steps = 0;
  double loss = 0;             // mean token loss of the global batch
  // MoE: the blocks' load-balancing losses (nn/moe.h) summed over blocks,
  // averaged over the step's tokens as the objective counts them (0: none).
  double router_aux_loss = 0;
  // MoE: the busiest expert's share of the routed slots over the mean share
  // (1: balanced; E / k: every token to the same k), worst block,
  // micro-batch and rank (every rank reports the same).
  double expert_load_max = 0;
  // MoE under a capacity: the largest share of a block's routed slots its
  // experts dropped, over blocks, micro-batches and ranks (0: none dropped).
  double expert_dropped_max = 0;
  double lr = 0;
  double grad_norm = 0;        // before clipping
  bool skipped = false;        // non-finite loss or gradient: no update
  bool overflow = false;       // skipped for a gradient overflow under dynamic loss scaling
  double loss_scale = 0;       // the step's loss scale (0: loss scaling off)
  int64_t tokens = 0;          // tokens in this step's global batch
  int64_t tokens_seen = 0;     // cumulative
  double step_seconds = 0;
  // forward: embeddings and blocks; head: the LM head, its loss and its own
  // backward, fused in the forward pass (0 under a pipeline, whose passes
  // count the head's work in forward and backward).
  double forward_seconds = 0, head_seconds = 0, backward_seconds = 0, optimizer_seconds = 0, data_seconds = 0;
  double tokens_per_second = 0;
  double mfu = 0;              // model FLOPs utilisation, 0..1
  int64_t world = 1;           // the job's processes (one device each): MFU's devices
  double elapsed_seconds = 0;  // since training started
  MemStats memory;             // peaks are over this step
  // Offloading (optim.offload, train.offload_activations): the blocks' kept
  // activations this rank moved to the host in the step (bytes; as many
  // came back), and the host memory holding offloaded state at its end
  // (MemCategory::offload of the host's allocator: on a CPU also in memory).
  int64_t offloaded_activation_bytes = 0;
  int64_t offload_host_bytes = 0;
  // Data-parallel communication: the gradients' reductions (and ZeRO-3's
  // gathers), hidden behind backward when they overlap.
  CommTraffic dp_comm;
  // The data-parallel rank with the highest peak this step, and its peaks
  // by category (every rank's memory differs under ZeRO; the worst matters).
  int64_t max_peak_rank = 0;
  MemStats max_peak_memory;
  // Pipeline (this rank's stage): the schedule's span, its compute, time
  // blocked on a neighbour, the most micro-batch chunks in flight; per stage
  // (gathered on every rank) and the schedule's theoretical bubble.
  int64_t pp_size = 1;
  double pp_run_seconds = 0, pp_compute_seconds = 0, pp_idle_seconds = 0;
  int64_t pp_peak_in_flight = 0;
  // 1 - compute / span, span = the longest rank's schedule: what the theory
  // counts (idle before the first and after the last pass included).
  std::vector<double> pp_bubble_per_stage;   // pipeline rank order
  std::vector<double> pp_wait_per_stage;     // blocked on a neighbour's transfer / span
  std::vector<int64_t> pp_in_flight_per_stage;
  double pp_bubble_theory = 0;               // the schedule's idle / span with balanced stages
  // Tensor-parallel communication (the model's tp groups).
  CommTraffic tp_comm;
  // Context-parallel ring traffic (this rank's k, v and gradient sends over
  // the cp group).
  CommTraffic cp_comm;
  // Expert-parallel traffic: the tokens' rows to their experts' owners and
  // back, forward and backward, the per-expert counts gathered before each
  // exchange, and the experts' gradient norm's squares (the ep group).
  CommTraffic ep_comm;
  // metrics.op_profile: this step's time per op (outermost ops; GPU time on
  // a GPU), largest first. Empty when profiling is off.
  std::vector<ops::OpTotal> op_totals;
};

// Appends one JSON object per line to run_dir/metrics.jsonl.
class MetricsLog {
 public:
  // append: keep the records already there (a resumed run).
  explicit MetricsLog(const std::string& path, bool append = false);
  void write_step(const StepMetrics& m);
  // by_dataset (a blend's datasets alone, train.eval_each_dataset): written
  // as val_loss_by_dataset {name: loss} when not empty.
  void write_eval(int64_t step, double val_loss, int64_t val_tokens,
                  const std::vector<std::pair<std::string, double>>& by_dataset = {});

 private:
  std::ofstream out_;
};

// Adds one step's op totals to a run's (by name).
void add_op_totals(std::vector<ops::OpTotal>& run, const std::vector<ops::OpTotal>& step);
// The run's op totals as a table per step: name, calls, milliseconds, share
// of the step time (`steps` steps taking `step_seconds` in all), the achieved
// TFLOP/s of ops that report their arithmetic, the most workspace one call
// held (MiB), allocator cache misses, largest time first, and the share no op
// accounts for.
std::string format_op_profile(std::vector<ops::OpTotal> run, int64_t steps, double step_seconds);

// "step 12/300 | loss 5.4321 | lr 3.00e-04 | ..." with an ETA.
std::string format_step_line(const StepMetrics& m);

}  // namespace zt::train
