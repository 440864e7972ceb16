// What one training process holds at its peak, predicted from the config
// before anything is allocated: weights, gradients, optimizer state and
// activations - for one process, or for one rank
// of a data x tensor x pipeline parallel layout (ZeRO 0-3 and hybrid
// sharding, sequence parallelism, every pipeline schedule). The trainer
// checks the plan of its largest rank before allocating (the same verdict on
// every rank, before any collective); `zettatron info` prints it.
//
// Parameter counts come from the very specs the model is built from
// (nn/tensor_parallel.h), pipeline stages from the stage planner and the
// micro-batches a rank keeps in flight from the schedule's simulator, so the
// plan follows the code rather than a second description of it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "nn/transformer.h"
#include "train/config.h"

namespace zt::train {

// The mesh sizes a plan is for and the rank whose memory it predicts
// (ranks of one pipeline stage and tensor-parallel rank hold the same
// bytes whatever their dp rank: ZeRO shards are equal).
struct PlanPlace {
  int64_t dp = 1, tp = 1, pp = 1;
  int64_t tp_rank = 0, pp_rank = 0;
  // Context parallelism's group, as context_parallel_view counts it: dp
  // holds its ranks already; cp > 1 adds the ring attention's buffers.
  int64_t cp = 1;
};
// The sizes of cfg's layout on `world` processes (parallel.dp = 0 takes the
// rest); throws zt::Error as the mesh would when they do not multiply to it.
PlanPlace plan_layout(const Config& cfg, int64_t world);

// A layout with context parallelism as the plan counts it (the identity at
// parallel.cp = 1): a cp rank holds what a rank of dp x cp data-parallel
// replicas of seq_len / cp tokens would - weights whole, ZeRO shards over
// dp x cp, activations of its seq_len / cp rows - plus, while a layer's
// attention runs, the ring's buffers (layout.cp: MemoryPlan::ring_comm and
// ring_workspace) and its blocks' backend workspace (causal and unmasked).
struct PlanView {
  Config cfg;
  PlanPlace layout;
};
PlanView context_parallel_view(const Config& cfg, PlanPlace layout);

// Bytes by category, as the allocator counts them (MemCategory params,
// grads, optimizer, activations, workspace): each item is that category's
// peak over a step, so the total bounds the step's peak from above (the
// categories peak at nearly the same time). The comm category holds the
// ring's receive slots under context parallelism (ring_comm) and otherwise
// only the few bytes of scalar exchanges (loss and norm sums): not planned. The workspace is the backend's own (ops/workspace.h): asked of
// the GPU's backend (cuDNN's plan for the rank's attention shape), -1 (not
// planned) on the CPU, whose per-thread scratch it leaves out (133 MiB for
// GPT-2 124M on 2 threads), and off the GPU's machine.
struct MemoryPlan {
  int64_t weights = 0, gradients = 0, optimizer = 0, activations = 0;
  int64_t workspace = -1;
  // The gradients' bytes every step's peak holds whatever the reductions'
  // timing: under ZeRO-2/3 the shards plus the largest layer's full buffer
  // beside its reduce-scatter result (`gradients` is the bound with the
  // layers in flight); with a shard group of one, or below ZeRO-2,
  // `gradients` itself.
  int64_t gradients_floor = 0;
  // Host memory holding what offloading moved (MemCategory::offload): the
  // optimizer's master weights and moments with its staging (optim.offload)
  // and the blocks' kept activations of the micro-batches in flight
  // (train.offload_activations). Part of total() where the device is the
  // host (offload_on_device); a GPU's plan leaves it to the host.
  int64_t offload = 0;
  bool offload_on_device = false;
  // Context parallelism (PlanPlace::cp > 1): the ring attention's transient
  // buffers while a layer's attention runs (nn::ring_attention_buffers) -
  // receive slots in MemCategory::comm, the blocks' outputs, row copies and
  // f32 sums in workspace, beside the backend's own (`workspace`).
  int64_t ring_comm = 0, ring_workspace = 0;
  int64_t total() const {
    return weights + gradients + optimizer + activations + std::max<int64_t>(workspace, 0) + ring_comm +
           ring_workspace + (offload_on_device ? offload : 0);
  }
};
// One process running the whole model (no parallelism).
MemoryPlan plan_memory(const Config& cfg);
// The rank at `at`.
MemoryPlan plan_memory(const Config& cfg, const PlanPlace& at);
// The rank of the layout with the largest total (its place in *where).
MemoryPlan largest_rank_plan(const Config& cfg, const PlanPlace& layout, PlanPlace* where = nullptr);

// The model chunks the rank at `at` holds, as the trainer builds them: the
// whole model, or stage c pp + pp_rank for chunk c of parallel.virtual_stages.
std::vector<nn::ModelPart> rank_parts(const Config& cfg, const PlanPlace& at);

// A rank's parameter elements as the trainer lays them out (each set's flat
// buffer, padding included): the sets reduced over the data-parallel group,
// and a mixture-of-experts model's experts' sets (reduced over the ranks
// holding the same experts), and how many sets of each.
struct RankParams {
  int64_t dense = 0, experts = 0;
  int64_t dense_sets = 0, expert_sets = 0;
  int64_t embedding = 0;              // of dense: the embedding's set, when this rank holds it
  bool head_reads_embedding = false;  // a tied embedding read again by the head of the same chunk
};
RankParams rank_params(const Config& cfg, const PlanPlace& at);

// Every dp x tp x pp split of `world` processes the config can run (tensor
// parallelism dividing its heads, at most one pipeline stage per block, the
// batch dividing into micro-batches, the schedule's constraints), with the
// plan of its largest rank: data parallelism first, then pipeline before
// tensor parallelism. An order of communication cost, not a throughput model.
struct LayoutPlan {
  PlanPlace layout, largest;
  MemoryPlan plan;
};
std::vector<LayoutPlan> plan_layouts(const Config& cfg, int64_t world);

// train.offload_activations: the kept activations the rank at `at` moves
// to the host per micro-batch (its chunks' blocks; as many come back), as
// the plan counts them; 0 without offloading.
int64_t offloaded_activation_bytes(const Config& cfg, const PlanPlace& at);

// Analytic activation bytes one process running the whole model keeps for
// backward at its peak, for one micro-batch under `policy`.
int64_t estimate_activation_bytes(const Config& cfg, nn::Recompute policy);

// The memory `device` holds for one of `processes_sharing` processes on it:
// a GPU's total, or the host's physical memory (0 when unknown), divided
// among the processes that share it.
int64_t device_capacity_bytes(Device device, int64_t processes_sharing = 1);

// The memory one of `processes_sharing` training processes on `device` can
// plan in now (bytes), and the device's total share. A GPU: its free memory
// shared among them, plus what this process's allocator already holds (live
// or cached), at most the total's share - what the CUDA context, the
// libraries' own buffers (cuBLAS, cuDNN, NCCL's communicators) and other
// processes hold is not there for the plan. The host: device_capacity_bytes
// for both.
struct TrainingMemory {
  int64_t usable = 0, total = 0;
  // A GPU's free bytes and its bytes outside this process's allocator when
  // measured (the CUDA context, the libraries' buffers, other processes:
  // total - free - held); -1 for the host.
  int64_t free = -1, outside = -1;
};
TrainingMemory training_memory(Device device, int64_t processes_sharing);
// Its rule: min(total / sharing, free / sharing + held).
int64_t usable_share(int64_t free, int64_t total, int64_t held, int64_t processes_sharing);

// A line of /proc/meminfo in bytes ("MemTotal", "MemAvailable"; 0 when it
// does not say), and bytes as "12.3 GiB".
int64_t host_meminfo_bytes(const std::string& name);
std::string format_gib(double bytes);

// Whether a plan of `total_bytes` fits `capacity_bytes` (0: unknown, taken
// as fitting): within the estimate's 2% margin.
bool plan_fits(int64_t total_bytes, int64_t capacity_bytes);
// The plan of pipeline stage `pp_rank`'s largest tensor-parallel rank (its
// place in *where).
MemoryPlan stage_plan(const Config& cfg, const PlanPlace& layout, int64_t pp_rank, PlanPlace* where = nullptr);

// "" when the largest rank's plan fits `capacity_bytes` (0: unknown, not
// checked); else the error a run stops with before allocating anything: what
// it needs, item by item, what the device holds, and what would fit - a
// smaller micro-batch dividing the batch, another recompute policy, a higher
// ZeRO stage, on a GPU offloading (the optimizer's state, the kept
// activations or both), another split of the same processes (plan_layouts'
// order), or more devices. A plan within 2% over still passes (the
// estimate's margin), and one that fits may still fail: the CUDA context and
// workspaces are not in it. Pure: the same text on every rank of a layout
// (given the same capacity).
std::string memory_plan_verdict(const Config& cfg, const PlanPlace& layout, Device device, int64_t capacity_bytes);
// The plan, item by item, in GiB or MiB, and the capacity when known.
std::string format_memory_plan(const MemoryPlan& p, Device device, int64_t capacity_bytes);
// The allocator's account of a run (category, current and peak MiB) with
// this rank's plan beside the peaks of the four planned categories: how far
// the pre-flight estimate was from what the run used.
std::string format_memory_against_plan(const MemStats& stats, const MemoryPlan& plan);

// "pp stage 1, tp rank 0" ("every rank" under data parallelism alone, ""
// for one process), and "dp 2 x tp 2 x pp 2".
std::string describe_place(const PlanPlace& at);
std::string describe_layout(const PlanPlace& at);

}  // namespace zt::train
