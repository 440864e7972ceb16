// Data parallelism over a ProcessGroup: gradient reduction overlapped with
// backward, and ZeRO-1 optimizer-state sharding.
//
// Every rank computes gradients of its rows of the global batch, scaled by
// 1 / (tokens in the global batch), so the SUM over ranks is the gradient of
// the global batch: reductions are sums, never averages.
//
// zero_stage 0: each layer's flat f32 gradient buffer is all-reduced in place
//   in chunks of at most bucket_bytes, launched as soon as backward of the
//   last micro-batch finishes that layer (Transformer::on_grads_ready), on
//   the group's communication thread while backward goes on. Every rank
//   then holds the full gradient and updates every parameter.
// zero_stage 1: the flat buffers are padded to a multiple of 16 dp
//   (zero_pad_multiple); rank r owns elements [r n/dp, (r+1) n/dp) of every
//   layer. A layer's gradient is reduce-scattered into the rank's shard
//   (MemCategory::grads), AdamW keeps master weights and moments for the
//   shard only (1/dp of the optimizer memory), and after the update the
//   parameter shards are all-gathered.
// zero_stage 2: as 1, and the full gradient buffers exist only while a layer
//   is in backward: every micro-batch reduce-scatters each layer as soon as
//   its backward is done (Transformer::on_grads_ready) and adds the result
//   to the rank's shard in issue order; the layer's full buffer is released
//   then (Transformer::on_grads_needed brings it back, zeroed). Gradient
//   memory is the shards (1/dp) plus the layers in flight. More traffic than
//   ZeRO-1 with gradient accumulation (one reduce-scatter per micro-batch).
// zero_stage 3: as 2, and the parameters are sharded too: each rank keeps
//   its slice of every layer (MemCategory::params, updated in place by
//   AdamW); a layer's full weights are all-gathered just before use
//   (Transformer::on_params_needed) - the next layer's gather is issued at
//   once, so it overlaps this layer's compute - and freed after it
//   (on_params_done). Forward and backward each gather every layer once
//   (plus the tied embedding for the LM head).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "core/allocator.h"
#include "nn/params.h"
#include "optim/adamw.h"

namespace zt::parallel {

struct DataParallelOptions {
  int64_t zero_stage = 0;
  int64_t bucket_bytes = 25 << 20;
  // Hybrid sharding (HSDP): ZeRO shards span groups of this many
  // consecutive dp ranks and are replicated across the groups (reduce-scatter
  // inside a group, then all-reduce of the shard across groups), for
  // clusters whose links between groups are slow. 0: the whole dp group.
  int64_t shard_group = 0;
};

// What each layer's flat buffers are padded to a multiple of (elements),
// for a dp group of `dp` ranks: under ZeRO every rank's shard is an equal
// slice, and a whole number of 16-byte packs of the narrowest dtype a shard
// travels in (bf16 weights, f32 gradients: 16 elements covers both and
// 1-byte dtypes), so each shard starts 16-byte aligned and NCCL takes its
// aligned path. Hybrid shard groups divide dp, so their shards are too.
// 1 without ZeRO (whole buffers are reduced).
int64_t zero_pad_multiple(int64_t zero_stage, int64_t dp);

// Expert parallelism: the sets of a mixture-of-experts model's experts
// are held by fewer ranks than the rest (each ep rank its own experts), so
// they reduce and shard over a group of their own - the ranks holding the
// same experts (Mesh::ep_dp) -, and their gradient norm is summed over the
// ranks holding the others (Mesh::ep).
struct SetGroups {
  std::vector<comm::ProcessGroup*> groups;  // per set: its own group, or null (the data-parallel group)
  comm::ProcessGroup* norm_group = nullptr;  // the sets with a group of their own: norm summed over it
};

class DataParallel {
 public:
  // sets: the model's layers (flat buffers padded to a multiple of
  // group.size() when zero_stage >= 1). own: sets with a group of their
  // own (no hybrid sharding for them).
  DataParallel(std::vector<nn::ParamSet*> sets, comm::ProcessGroup& group, const DataParallelOptions& options,
               SetGroups own = {});

  int64_t size() const { return group_->size(); }
  int64_t rank() const { return group_->rank(); }
  int64_t zero_stage() const { return opt_.zero_stage; }
  // The ranks ZeRO shards are spread over (== size() unless hybrid), and
  // this rank's shard index.
  int64_t shard_size() const { return shard_group_->size(); }
  int64_t shard_rank() const { return shard_group_->rank(); }
  // Whether this rank writes its optimizer shard of set `set` into
  // checkpoints (one replica of each shard does).
  bool writes_checkpoint_part(size_t set) const;

  // The shards AdamW should update (whole sets under zero_stage 0).
  std::vector<optim::OptimShard> optimizer_shards() const;

  // Before the first micro-batch of a step (ZeRO-2 zeroes the shards).
  void begin_step();
  // Arms the reductions for the micro-batch about to run backward: only the
  // last micro-batch of a step reduces under ZeRO 0 and 1 (earlier ones
  // accumulate locally); every one under ZeRO-2.
  void begin_backward(bool last_micro_batch);
  // Transformer::on_grads_needed (ZeRO-2: the layer's buffer, zeroed).
  void grads_needed(size_t set_index);
  // Transformer::on_params_needed / on_params_done (ZeRO-3).
  void params_needed(size_t set_index);
  void params_done(size_t set_index);
  // ZeRO-3 prefetch direction for the pass about to run: +1 forward, -1
  // backward, 0 none (evaluation, generation).
  void set_prefetch(int direction) {
    prefetch_ = direction;
    last_needed_ = direction > 0 ? -1 : int64_t(sets_.size());
  }
  // ZeRO-3: every layer's full weights resident (to save or generate); a
  // collective. hold_full_params(false) frees them again.
  void hold_full_params(bool hold);
  // Transformer::on_grads_ready: starts reducing that layer when armed.
  void grads_ready(size_t set_index);
  // Waits for every reduction of the step (starting any not yet started).
  void finish_reduction();
  // The global gradient norm after finish_reduction: this rank's reduced
  // gradients (ZeRO 0; NaN on every replica when any replica's is not
  // finite) or the shards' squares summed over one shard group,
  // then summed over each model-parallel group given (tensor- and pipeline-
  // parallel ranks hold other parts of the model; null entries are skipped).
  double grad_norm(const optim::AdamW& opt, const std::vector<comm::ProcessGroup*>& model_parallel = {});
  // zero 1: every rank's updated parameter shards to every rank.
  void gather_params(const optim::AdamW& opt);
  // Sum over the group (losses, token counts), blocking; the same on every rank.
  double sum(double v);
  // The largest of the group's values, blocking; the same on every rank.
  double max(double v);
  // The peaks of the rank whose total peak is highest (every rank's differ
  // under ZeRO; the worst matters), and that rank. A collective.
  MemStats highest_peak(const MemStats& mine, int64_t* rank);

  // Bytes this rank sent and seconds it waited (not hidden behind compute)
  // since the last call.
  struct StepComm {
    int64_t bytes = 0;
    double busy_seconds = 0, wait_seconds = 0;
  };
  StepComm take_step_comm();

 private:
  void start(size_t set_index);
  // Retires finished reductions, oldest first (a fixed order: ZeRO-2's sums
  // into the shards are deterministic): waits for the first `wait_first`
  // (wait(); NCCL's does not block the host), then takes
  // those that test() finished, up to the first that has not.
  void drain(size_t wait_first);
  std::vector<nn::ParamSet*> sets_;
  comm::ProcessGroup* group_;
  SetGroups own_;
  // Per set: the group its gradient is reduced over and the one its ZeRO
  // shards span (a set of its own: its group for both).
  bool has_own_group(size_t set) const { return set < own_.groups.size() && own_.groups[set]; }
  comm::ProcessGroup& reduce_group(size_t set) const { return has_own_group(set) ? *own_.groups[set] : *group_; }
  comm::ProcessGroup& shard_group(size_t set) const { return has_own_group(set) ? *own_.groups[set] : *shard_group_; }
  DataParallelOptions opt_;
  std::unique_ptr<comm::ProcessGroup> own_shard_group_, replica_group_;  // hybrid sharding
  comm::ProcessGroup* shard_group_ = nullptr;                            // group_ unless hybrid
  // Hybrid on one shared queue (NCCL; shares_one_queue): a set's replica
  // all-reduce is issued right behind its reduce-scatter, the same place on
  // every rank, and the queue runs it after. Otherwise it starts when the
  // reduce-scatter is seen finished, which differs between ranks: harmless
  // where each group has its own queue, a cycle of waits on a shared one.
  bool replica_behind_scatter_ = false;
  void start_gather(size_t set_index);
  std::vector<Tensor> grad_shards_;       // zero >= 1: per set, (numel / dp) f32
  std::vector<Tensor> param_shards_;      // zero 3: per set, (numel / dp) compute dtype
  std::vector<comm::WorkHandle> gathers_; // zero 3: a layer's gather in flight
  int prefetch_ = 0;
  int64_t last_needed_ = -1;  // the pass's progress: only a forward-moving pass prefetches
  bool hold_ = false;
  struct Pending {
    comm::WorkHandle work;
    size_t set = 0;
    Tensor replica_reduce;  // hybrid: all-reduce this across replicas once `work` is done
    Tensor shard_part;  // ZeRO-2: this micro-batch's reduced shard, added on completion
    Tensor full;        // ZeRO-2: the released full buffer, kept alive until the op completes
  };
  std::vector<Pending> pending_;
  std::vector<bool> started_;
  bool armed_ = false;
  std::vector<comm::CommStats> last_;  // per group in groups()
  std::vector<comm::ProcessGroup*> groups() const;
};

}  // namespace zt::parallel
