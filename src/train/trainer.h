// The training loop on one process: micro-batches with gradient accumulation,
// clipping, AdamW with a schedule, evaluation, sampling, metrics and hooks.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nn/transformer.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "train/config.h"
#include "train/memory_plan.h"
#include "train/metrics.h"

namespace zt::train {

// Where batches come from: fills inputs and targets, both (rows, T) i32. The
// trainer asks for micro-batches in order; k calls of B/k rows must give the
// same rows as one call of B rows (gradient accumulation equivalence).
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual void next(const Tensor& inputs, const Tensor& targets) = 0;
  // Back to the first batch (validation is read from the start at every evaluation).
  virtual void reset() = 0;
  // The position in the stream, for checkpoints; restore() continues from it
  // with identical batches. Sources that cannot do this throw zt::Error.
  virtual nlohmann::json state() const;
  virtual void restore(const nlohmann::json& state);
};

// A validation source with a name (a blended dataset's folder).
struct NamedBatchSource {
  std::string name;
  std::unique_ptr<BatchSource> source;
};

// How far training has come: what a checkpoint needs besides tensors.
struct TrainProgress {
  int64_t steps_done = 0;       // optimizer steps completed (including skipped ones)
  int64_t tokens_seen = 0;
  int64_t bad_steps = 0;        // consecutive non-finite steps so far
  double last_good_loss = 0;
  int64_t last_good_step = -1;  // 0-based
  // Dynamic loss scaling (optim/loss_scale.h): the scale for the next step
  // (0: scaling off) and steps since it last changed; steps skipped for a
  // gradient overflow.
  optim::LossScaleState loss_scale;
  int64_t overflow_steps = 0;
  // Aux-loss-free balancing: every block's routing bias per expert,
  // (n_layer, E) f32 row-major, the same on every rank (empty: none).
  std::vector<float> router_bias;
};

// Text <-> tokens for samples (from data::Tokenizer; optional).
struct TextCodec {
  std::function<std::vector<uint32_t>(std::string_view)> encode;
  std::function<std::string(std::span<const uint32_t>)> decode;
  uint32_t eot_token = 0;
};

struct TrainResult {
  int64_t steps = 0;
  double final_loss = 0;
  double final_val_loss = -1;  // -1: never evaluated
  std::vector<double> losses;  // per step
};

class Trainer {
 public:
  // val may be null (no evaluation); codec may be null (no samples). mesh:
  // the process's place in a multi-process job (null: one process); the
  // data sources must then give this rank's rows (open_training_data does).
  Trainer(const Config& cfg, std::unique_ptr<BatchSource> train, std::unique_ptr<BatchSource> val,
          std::unique_ptr<TextCodec> codec, std::shared_ptr<parallel::Mesh> mesh = nullptr);
  ~Trainer();

  // Runs steps progress().steps_done .. cfg.train.steps - 1 (all of them
  // unless a checkpoint was restored), logging to the console,
  // run_dir/train.log and run_dir/metrics.jsonl, saving checkpoints as
  // [checkpoint] says. Stops early after step `stop_after` (1-based; 0: no),
  // saving a checkpoint there when checkpoints are on. Throws zt::Error when
  // training must stop.
  TrainResult run(int64_t stop_after = 0);

  // One optimizer step (0-based step index): gradients of the global batch,
  // clipping, update. Public so tests can drive training step by step.
  StepMetrics train_step(int64_t step);
  // Mean validation loss over train.eval_batches micro-batches (of `source`:
  // the trainer's validation data by default). Collective over the model's
  // ranks, like a step.
  double evaluate(int64_t* tokens_out = nullptr);
  double evaluate(BatchSource& source, int64_t* tokens_out = nullptr);
  // Each evaluation in run() also takes each of these sources' loss alone
  // (train.eval_each_dataset: a blend's datasets), logged by name
  // (metrics.jsonl: val_loss_by_dataset). Every rank must set the same.
  void set_dataset_validation(std::vector<NamedBatchSource> sources) { val_each_ = std::move(sources); }
  // `count` samples of text (prompt + continuation), sample i drawn with
  // seed + i.
  std::vector<std::string> samples(uint64_t seed, int64_t count);

  // The whole model, or under pipeline parallelism this rank's first chunk
  // (chunks() has all of them).
  nn::Transformer& model() { return *chunks_.front(); }
  const nn::Transformer& model() const { return *chunks_.front(); }
  const std::vector<std::unique_ptr<nn::Transformer>>& chunks() const { return chunks_; }
  // Every parameter set of this rank's chunks, in order (what the optimizer
  // and data parallelism see).
  std::vector<nn::ParamSet*> param_sets();
  std::vector<const nn::ParamSet*> param_sets() const;
  // The pipeline group (null without pipeline parallelism).
  comm::ProcessGroup* pp_group() const { return pipeline_ ? &mesh_->pp() : nullptr; }
  BatchSource& train_data() { return *train_; }
  const TrainProgress& progress() const { return progress_; }
  // For restoring a checkpoint (train/checkpointing.h).
  void set_progress(const TrainProgress& p);
  // The routing biases of every block (TrainProgress::router_bias; empty:
  // none, or zeros under model.router_bias_update_rate), checked against
  // the model's layers and experts: a checkpoint's, for initial weights.
  void set_router_bias(const std::vector<float>& bias);
  // Under model.router_bias_update_rate: the last step's routed slots per
  // block and expert, (n_layer, E) summed over every rank (each tp rank
  // counts its group's tokens again) - what moved the biases. Else empty.
  const std::vector<int64_t>& step_expert_load() const { return step_expert_load_; }
  optim::AdamW& optimizer() { return *optimizer_; }
  parallel::DataParallel& data_parallel() { return *dp_; }
  // The data-parallel ranks again, for checkpoint writes (a group of its own,
  // so a background save's collectives never interleave with training's).
  comm::ProcessGroup& checkpoint_group() { return *ckpt_group_; }
  // Rank 0 of the job logs, writes metrics and checkpoint manifests.
  bool is_main_rank() const { return main_rank_; }
  // This process's rank in the job (0 for a single process).
  int64_t world_rank() const { return mesh_ ? mesh_->world_rank() : 0; }
  // The tensor-parallel group (null without tensor parallelism).
  comm::ProcessGroup* tp_group() const { return model().tensor_parallel().group; }
  // The context-parallel group (null without context parallelism).
  comm::ProcessGroup* cp_group() const { return model().context_parallel; }
  // The expert-parallel group (null without expert parallelism).
  comm::ProcessGroup* ep_group() const { return model().tensor_parallel().experts; }
  // Data-parallel ranks: replicas that read different batches (the mesh's
  // dp; gradients reduce over dp x cp, data_parallel().size()).
  int64_t data_ranks() const { return data_ranks_; }
  const Config& config() const { return cfg_; }
  double peak_gflops() const { return peak_gflops_; }

  // Called after every step.
  std::vector<std::function<void(const StepMetrics&)>> step_hooks;
  // Called with the 0-based step when its gradients are complete (reduced
  // over every group, still multiplied by the loss scale), before the norm
  // and the update: gradient inspection (tests inject an overflow here).
  std::function<void(int64_t step)> before_update;
  // Console output (default: stdout and run_dir/train.log).
  std::function<void(const std::string&)> log;
  // Lines run() says with its header (console and train.log): what the
  // caller set up, e.g. the settings a resumed run changed.
  std::vector<std::string> start_notes;

 private:
  // Aux-loss-free balancing after an optimizer step: the step's routed slots
  // per block and expert summed over every rank, each bias moved by the rate
  // towards the mean (progress_.router_bias, then every chunk's); the loads
  // are dropped after a skipped step (apply = false). The same on every rank.
  void update_router_bias(bool apply);
  Config cfg_;
  std::vector<std::unique_ptr<nn::Transformer>> chunks_;  // one, or this rank's pipeline chunks
  std::unique_ptr<optim::AdamW> optimizer_;
  std::shared_ptr<parallel::Mesh> mesh_;
  std::unique_ptr<comm::ProcessGroup> solo_dp_;  // the dp group of a single process
  std::unique_ptr<parallel::DataParallel> dp_;
  std::unique_ptr<comm::ProcessGroup> ckpt_group_;
  // Every rank of the job, for the step's expert loads under
  // model.router_bias_update_rate (null: one process or no balancing bias).
  std::unique_ptr<comm::ProcessGroup> balance_group_;
  std::vector<int64_t> step_expert_load_;  // step_expert_load()
  std::unique_ptr<parallel::PipelineRunner> pipeline_;
  bool main_rank_ = true;
  std::unique_ptr<BatchSource> train_, val_;
  std::vector<NamedBatchSource> val_each_;
  std::unique_ptr<TextCodec> codec_;
  optim::LrSchedule schedule_;
  std::optional<optim::LossScaler> scaler_;  // dynamic loss scaling, when on (state in progress_)
  double peak_gflops_ = 0;
  std::string memory_plan_;  // this rank's estimated memory, for the log
  MemoryPlan rank_plan_;     // the same, by category: compared with the run's peaks at the end
  int64_t outside_at_plan_ = -1;  // a GPU's bytes outside the allocator at the pre-flight check (-1: host)
  std::string peak_source_;  // where peak_gflops_ came from, for the log
  TrainProgress progress_;
  Tensor inputs_, targets_;  // (micro_batch, T) i32
  int64_t data_ranks_ = 1;
  // A batch's rows for the model: this rank's zigzag rows under context
  // parallelism (micro_batch, T / cp), else the batch itself.
  Tensor model_rows(const Tensor& batch) const;
};

}  // namespace zt::train
