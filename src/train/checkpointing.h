// A Trainer's whole state in a checkpoint (ckpt/), and back.
//
// Tensors, by global name (one file per rank: shard-00000.safetensors with
// one process):
//   model.<param>             f32 master weights (a bf16 model's weights are
//                             their rounding, so restoring the master restores both)
//   optim.exp_avg.<param>     AdamW first moment, f32
//   optim.exp_avg_sq.<param>  AdamW second moment, f32
// Manifest state: {"progress": TrainProgress, "optimizer": {"steps_taken"},
// "data": the train loader's position, "rng": {"seed"} (every random draw is
// counter-based on the seed and the step, so that is the whole RNG state),
// "lr_schedule": the schedule in force (informational: the LR is a function
// of the step)}; the manifest's config is the run's resolved TOML.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "ckpt/checkpoint_writer.h"
#include "train/config.h"
#include "train/trainer.h"

namespace zt::train {

class TrainCheckpointer {
 public:
  explicit TrainCheckpointer(const Config& cfg);
  ~TrainCheckpointer();  // waits for a background write

  // Saves the trainer's state after progress().steps_done steps and applies
  // the retention policy. With checkpoint.async, the state is copied to host
  // buffers now and written by a background thread (returns before the
  // write; the next save or wait() waits for it). Returns the directory the
  // checkpoint is (or will be) committed to.
  std::string save(Trainer& t);  // a collective under ZeRO (every rank calls it)
  // Waits for a background write; rethrows its error.
  void wait();

 private:
  Config cfg_;
  ckpt::BackgroundWriter background_;
};

// Restores everything a checkpoint holds into a freshly built trainer (same
// model shapes): weights, optimizer state, progress, data position. The
// checkpoint's batch geometry may differ in micro_batch (the global batch
// semantics are kept). Errors list every tensor whose shape differs. The
// settings that differ from the checkpoint's run (changed_settings: a
// change of dtype, batch or schedule is allowed) become a start note of the
// trainer (Trainer::start_notes), said with the run's header.
// Returns the checkpoint's directory.
std::string restore_checkpoint(Trainer& t, const std::string& path);

// Loads only the model weights (fine-tuning from a checkpoint or an imported
// Hugging Face model); optimizer, progress and data start fresh.
std::string init_weights_from_checkpoint(Trainer& t, const std::string& path);

// Where a run resumes from: an explicit path, or (empty) the run's
// checkpoint directory's `latest`. Error when there is none.
std::string resume_path(const Config& cfg, const std::string& explicit_path);

// Checkpoint steps a run of `cfg` would save that already exist: a run must
// not plan to write over them (checked before training starts).
void check_no_future_checkpoints(const Config& cfg, int64_t first_step);

// Weights-only checkpoints (conversions): model.<name> f32 tensors, the
// config (only its model section matters) and `state` (e.g. the Hugging Face
// layout an import came from). Written straight to `dir`, which must not exist.
void write_model_checkpoint(const std::string& dir, const Config& cfg,
                            const std::vector<std::pair<std::string, Tensor>>& tensors, const nlohmann::json& state);

struct ModelCheckpoint {
  std::string dir;
  Config config;        // as saved (only the model section is validated)
  std::vector<std::pair<std::string, Tensor>> tensors;  // parameter names, f32 host tensors
  nlohmann::json state; // the manifest's state
};
// The model weights of any checkpoint (a training checkpoint or a weights-only one).
ModelCheckpoint read_model_checkpoint(const std::string& path);
// A checkpoint's routing biases (its state.progress.router_bias: n_layer x E
// f32, nn/model_config.h's router_bias_update_rate; empty: none).
std::vector<float> saved_router_bias(const nlohmann::json& state);

}  // namespace zt::train
