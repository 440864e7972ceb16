// The training configuration: typed structs bound to a TOML file.
//
// Every key lives in exactly one section and has a type and a comment; the
// binder (config.cpp) is one table of fields, used both to read a TOML file
// (rejecting unknown keys with the closest valid one, and wrong types) and to
// write the resolved configuration back out (run_dir/config.toml).
//
//   [model]     preset = "gpt2-124m" | ... and any ModelConfig field to override
//   [data]      where the token shards are and how to tokenize samples
//   [train]     batch geometry, steps, precision, recompute, eval/sample cadence
//   [optim]     AdamW and the LR schedule, clipping
//   [sample]    text generation during training
//   [metrics]   MFU reference
//   [parallel]  the device mesh (dp, tp, pp, cp, ep), ZeRO stage, buckets
//   [checkpoint] how often to save, what to keep, background writes
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/blend.h"
#include "nn/model_config.h"
#include "nn/transformer.h"
#include "optim/adamw.h"
#include "optim/loss_scale.h"
#include "optim/lr_schedule.h"
#include "parallel/mesh.h"

namespace zt::train {

struct DataSettings {
  std::string dir;                    // prepared shards (`zettatron prepare` output)
  // Instead of dir: a weighted mix of prepared datasets, "DIR WEIGHT, DIR
  // WEIGHT, ..." (weights normalised; data/loader.h's blend).
  std::string blend;
  std::string tokenizer = "gpt2";     // for samples: gpt2, llama3, or a path
};

struct TrainSettings {
  std::string device = "cpu";         // cpu | cuda[:N]
  std::string dtype = "f32";          // f32 | bf16 | f16 (CUDA) for weights and activations; master weights are f32
  int64_t seq_len = 1024;             // T
  int64_t global_batch = 8;           // sequences per optimizer step (all ranks)
  int64_t micro_batch = 8;            // sequences per forward/backward pass on one rank
  int64_t steps = 100;                // optimizer steps
  int64_t seed = 1337;                // initialisation, data order, stochastic rounding
  std::string recompute = "none";     // none | selective | full
  // What each block keeps for its backward (after recompute's choice) goes
  // to host memory once the block's forward is done and comes back before
  // its backward (nn/transformer.h): device activations of about one block.
  bool offload_activations = false;
  // The blocks' linear layers on per-tensor-scaled fp8 (E4M3 activations and
  // weights, E5M2 gradients; nn/parallel_linear.h). CPU only so far: the
  // numerics of fp8 training, not its speed.
  bool fp8 = false;
  bool deterministic = true;          // the same bits every run (false, on a GPU: attention's dq by atomics, tuned matmuls; core/determinism.h)
  int64_t eval_every = 0;             // steps between evaluations (0: never)
  int64_t eval_batches = 4;           // validation micro-batches per evaluation
  bool eval_each_dataset = false;     // a blend: also each dataset's validation loss, alone
  int64_t sample_every = 0;           // steps between text samples (0: only at the end)
  int64_t log_every = 1;              // steps between console lines
  std::string run_dir = "runs/run";   // where config, metrics.jsonl and checkpoints go
  int64_t max_bad_steps = 1;          // consecutive non-finite steps before stopping (1: stop at the first)
  std::string loss_scale = "auto";    // auto (dynamic for fp16, else off) | dynamic | off
  double loss_scale_init = 65536.0;   // first dynamic loss scale (a power of two)
  int64_t loss_scale_window = 2000;   // steps without overflow before the scale doubles
};

struct OptimSettings {
  double lr = 6e-4;
  double min_lr = 6e-5;
  std::string schedule = "cosine";    // cosine | wsd | constant
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;            // wsd: length of the final decay
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  bool decay_embeddings = false;
  bool stochastic_rounding = false;   // bf16 weights rounded from the f32 master stochastically
  // Master weights and moments in host memory, the update on the host's
  // cores (optim/adamw.h): the device keeps no optimizer state.
  bool offload = false;
  double grad_clip = 1.0;             // max global grad norm (0: off)
};

struct SampleSettings {
  std::string prompt = "";            // empty: start from the end-of-text token
  int64_t tokens = 64;                // tokens to generate per sample
  double temperature = 1.0;           // 0: the most likely token (greedy)
  int64_t top_k = 40;                 // 0: no top-k filtering
  double top_p = 1.0;                 // nucleus: the most likely tokens whose probability reaches it (1: all)
  int64_t count = 2;                  // samples per sampling point
};

struct MetricsSettings {
  double peak_gflops = 0;             // device peak for MFU; 0 = measure sgemm at startup (CPU)
  int64_t pipeline_trace_step = 0;    // pp > 1: write RUN_DIR/pipeline_trace.json of this step (0: none)
  int64_t trace_step = 0;             // write RUN_DIR/trace.json: this step's timeline on every rank (0: none)
  int64_t profiler_capture_step = 0;  // a profiler started with capture off records this step's kernels (0: none)
  bool op_profile = false;            // time every op: per-op totals per step and for the run (ops/op_profile.h)
};

struct ParallelSettings {
  int64_t dp = 0;                     // data-parallel size; 0: world / (tp x pp x cp)
  int64_t tp = 1, pp = 1, cp = 1, ep = 1;
  bool sequence_parallel = false;     // tp > 1: norms and residuals sharded along the tokens
  std::string pp_schedule = "1f1b";   // pp > 1: afab | 1f1b | interleaved | zb
  int64_t virtual_stages = 1;         // model chunks per pipeline rank (interleaved)
  std::string pp_layers = "";         // blocks per stage, e.g. "4,4,3,3" (empty: balanced by cost)
  int64_t zero_stage = 0;             // 0: replicate; 1: shard optimizer state; 2: + gradients; 3: + parameters
  int64_t shard_group = 0;            // HSDP: ZeRO shards over groups of this many dp ranks (0: all)
  double bucket_mb = 25;              // gradient reduction bucket size (MiB)
  std::string comm_backend = "auto";  // auto | mpi | solo | nccl (GPU tensors; auto picks it for several GPU processes)
  double comm_timeout = 600;          // seconds before a stuck collective ends the job
};

struct CheckpointSettings {
  int64_t every = 0;                  // steps between saves (0: none); the last step is saved too
  int64_t keep_last = 3;              // newest checkpoints kept (0: all)
  int64_t keep_every = 0;             // steps that are multiples of this are kept for good (0: none)
  bool async = false;                 // copy to host at the step boundary, write in the background
  std::string dir = "";               // empty: RUN_DIR/checkpoints
};

struct Config {
  std::string model_preset;           // the preset the model section started from
  nn::ModelConfig model;
  DataSettings data;
  TrainSettings train;
  OptimSettings optim;
  SampleSettings sample;
  MetricsSettings metrics;
  ParallelSettings parallel;
  CheckpointSettings checkpoint;

  // Cross-field checks (batch divisibility, seq_len vs context, ...);
  // throws zt::Error with the fix.
  void validate() const;
  // What a layout (the mesh's resolved sizes) needs of the config beyond
  // validate(): the global batch split over dp in whole micro-batches, the
  // pipeline schedule's micro-batches. Pure (the same verdict on every rank, before
  // any collective); the trainer and the planner's search both ask it.
  // Throws zt::Error with the fix.
  void check_layout(const parallel::MeshShape& mesh) const;
  // Micro-batches per step on each of dp data-parallel ranks.
  int64_t grad_accum_steps(int64_t dp = 1) const { return train.global_batch / (train.micro_batch * dp); }
  DType compute_dtype() const;
  nn::Recompute recompute() const;
  optim::LrSchedule lr_schedule() const;
  optim::AdamWConfig adamw() const;
  // Dynamic loss scaling: its settings, or nullopt when off.
  std::optional<optim::LossScaleConfig> loss_scaling() const;
  std::string checkpoint_dir() const;
  // The datasets to train on: data.dir with weight 1, or data.blend's
  // entries in order. Throws zt::Error naming a malformed entry.
  std::vector<data::BlendPart> data_parts() const;
  // The device this process trains on: train.device, where a bare `cuda`
  // under a multi-process launch means the local rank's GPU (local rank
  // modulo the GPU count when parallel.comm_backend = mpi lets processes
  // share a GPU; else an error names the fix when there are too few).
  Device device(bool multi_process) const;
  // True for a bare `cuda`: a multi-process run's GPU follows the local rank.
  // False for `cuda:N`, which the user placed (a launcher that gives each
  // process its own GPU), and for the CPU.
  bool gpu_by_local_rank() const { return train.device == "cuda"; }
};

// The GPU of local rank `local_rank` of the `local_size` processes on a node
// with `gpus` GPUs visible to each: cuda:local_rank, or local_rank modulo
// gpus when comm_backend = "mpi" lets processes share a GPU (staged through
// host memory). With too few GPUs for NCCL, throws naming the fixes -
// including train.device = "cuda:N" where a launcher gives each process its
// own GPU (srun --gpus-per-task=1: every process sees one GPU, cuda:0),
// which Config::device takes as placed, as is.
Device local_gpu(int local_rank, int local_size, int gpus, const std::string& comm_backend);
// A device setting with "auto" resolved: "cuda" when this machine has a
// usable GPU, else "cpu"; any other setting as it is.
std::string resolve_auto_device(const std::string& device);

// Reads a TOML file and applies `overrides` ("section.key=value", value in
// TOML syntax or a bare string). Throws zt::Error naming the file and key.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Parses TOML text (`origin` names it in errors).
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});
// A configuration saved with a checkpoint: parsed like parse_config, but
// only the model section is validated (data paths and run settings belong to
// the run that wrote it).
Config parse_saved_config(const std::string& toml_text, const std::string& origin);
// The resolved configuration as TOML (every key, with the values in force).
std::string to_toml(const Config& c);
// The settings whose values differ from `before` to `after`, each as
// "section.key: before -> after" (TOML values), in the config's order.
std::vector<std::string> changed_settings(const Config& before, const Config& after);
// All valid "section.key" names (for help and suggestions).
std::vector<std::string> config_keys();

}  // namespace zt::train
