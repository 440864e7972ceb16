// Pipeline parallelism: runs one rank's part of a schedule
// (pipeline_schedule.h) over its model chunks (nn::Transformer parts),
// moving activations forward and gradients backward between neighbouring
// stages with non-blocking point-to-point transfers: receives are posted a
// few actions ahead and waited for when needed, sends are waited for only
// when their buffer is released. Shapes are known in advance (B, T, C and
// sequence parallelism), so no message carries a header.
//
// Rank r of p holds chunks c = 0 .. v-1, chunk c being model stage c p + r;
// stage s sends its output to the rank of stage s + 1 ((r + 1) mod p).
// A model with tied embeddings keeps a copy of embed.wte on the head stage;
// sync_tied_embedding() sums the two gradients (first and last rank) so
// both copies take the same optimizer step.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "nn/transformer.h"
#include "parallel/pipeline_schedule.h"

namespace zt::parallel {

struct PipelineMicroBatch {
  Tensor tokens, targets;  // (B, T) i32, the same shapes for every micro-batch
};

// One timed action of a step, for the bubble and the Chrome trace.
struct PipelineEvent {
  std::string name;          // forward, backward, backward_input, backward_weight, recv_wait (no spaces)
  int64_t micro_batch = -1;  // -1: none
  int64_t chunk = 0;
  double start = 0, end = 0;  // seconds since the step began
};

class PipelineRunner {
 public:
  // pp: the pipeline group (rank = stage rank). chunks: this rank's model
  // chunks in order (v of them, chunk c = stage c p + rank). Collective
  // over pp when the model ties its embeddings (the first and last rank
  // form a group).
  PipelineRunner(comm::ProcessGroup& pp, std::vector<nn::Transformer*> chunks, PipelineSchedule kind);

  // Receives are posted this many actions ahead, each an (R, C) buffer.
  static constexpr size_t kRecvLookahead = 3;

  int64_t stages() const { return pp_->size() * int64_t(chunks_.size()); }
  bool first_rank() const { return pp_->rank() == 0; }
  bool last_rank() const { return pp_->rank() == pp_->size() - 1; }

  // Called before each pass that completes gradients (backward, or under zb
  // backward_weight) with its chunk and whether it is the chunk's last
  // micro-batch of the step (data parallelism reduces then).
  std::function<void(int64_t chunk, bool last_micro_batch)> before_backward;

  struct StepResult {
    double loss_sum = 0;      // the head stage's summed token loss (0 on other ranks)
    int64_t loss_tokens = 0;
    double aux_weighted = 0;     // MoE: this stage's load-balancing losses times their passes' tokens (B T)
    double expert_load_max = 0;  // MoE: the busiest expert over the mean, worst block and micro-batch here
    double expert_dropped_max = 0;  // MoE: the largest share of a block's slots dropped, likewise
    double seconds = 0;          // the whole of run(): compute, waits, transfers
    double idle_seconds = 0;     // time blocked waiting for a neighbour's transfer
    double compute_seconds = 0;  // forward + backward passes
    double forward_seconds = 0;
    int64_t peak_in_flight = 0;  // micro-batch chunks forwarded, backward (zb: its weight pass) not yet run
  };
  // Forward and backward of every micro-batch (each rank passes all of
  // them; stages read the tokens and targets they need), in the schedule's
  // order, gradients accumulating (scaled by grad_scale).
  StepResult run(const std::vector<PipelineMicroBatch>& micro_batches, float grad_scale);

  // Forward passes only (evaluation): each micro-batch through every stage
  // in order; loss_sum / loss_tokens on the last rank.
  StepResult evaluate(const std::vector<PipelineMicroBatch>& micro_batches);

  // Inference: the logits of each sequence's last position of tokens
  // (B, T) i32, as (B, padded vocabulary) f32 on the host, on every pipeline
  // rank (each stage runs its chunks in order; the head stage broadcasts the
  // rows). A collective over the pipeline (and tensor-parallel) group. With
  // caches (make_kv_caches(B[, positions]): one per chunk of this rank) the tokens
  // continue their sequences (nn::Transformer::last_logits with a cache).
  Tensor last_logits(const Tensor& tokens, std::vector<nn::KvCache>* caches = nullptr);
  std::vector<nn::KvCache> make_kv_caches(int64_t batch, int64_t capacity = 0) const;

  // Sums the tied embedding's gradient over the first and last rank (each
  // holds a share); a no-op without tied embeddings or with one rank.
  void sync_tied_embedding();

  // The last step's timed actions on this rank.
  const std::vector<PipelineEvent>& events() const { return events_; }

 private:
  comm::ProcessGroup* pp_;
  std::vector<nn::Transformer*> chunks_;
  PipelineSchedule kind_;
  std::unique_ptr<comm::ProcessGroup> tied_group_;  // first and last rank
  std::vector<PipelineEvent> events_;
};

// A Chrome trace (the JSON the Perfetto UI and chrome://tracing open) of one
// step: events[r] on "rank r" tracks, microseconds.
std::string chrome_trace_json(const std::vector<std::vector<PipelineEvent>>& events);
// Every pipeline rank's events of the last step, on every rank (a
// collective over the pipeline group).
std::vector<std::vector<PipelineEvent>> gather_pipeline_events(comm::ProcessGroup& pp,
                                                               const std::vector<PipelineEvent>& mine);

}  // namespace zt::parallel
