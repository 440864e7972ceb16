// The final weights of a run: RUN_DIR/model.safetensors next to
// RUN_DIR/config.toml (written by the trainer). Enough to generate text from
// a finished run; resumable checkpoints (optimizer, data position, RNG) are
// the checkpoint layer's job.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/process_group.h"
#include "nn/transformer.h"
#include "train/config.h"

namespace zt::train {

// Writes the model's parameters (global names, compute dtype) into
// cfg.train.run_dir/model.safetensors; returns the path. Under tensor
// parallelism every rank of the group calls it (the tensors are assembled
// from their slices) and only the one with write = true writes.
std::string save_model_file(const nn::Transformer& model, const Config& cfg, bool write = true);
// The same for a model split over pipeline ranks: every rank of pp passes
// its chunks; the tensors travel to pipeline rank 0, which writes when
// write = true. A collective over pp (and tp).
// router_bias: the routing biases of every block (TrainProgress::router_bias),
// saved as the tensor "router_bias" (n_layer, E) f32 when not empty. The
// file's metadata holds the run's config (TOML) and, for step >= 0, the
// steps done: the file describes itself whatever later runs write beside it.
std::string save_model_file(const std::vector<const nn::Transformer*>& chunks, comm::ProcessGroup* pp,
                            const Config& cfg, bool write, const std::vector<float>& router_bias = {},
                            int64_t step = -1);

struct LoadedModel {
  Config config;
  std::unique_ptr<nn::Transformer> model;
  std::string source;  // what the weights were read from, for the user
};
// Reads DIR/model.safetensors with the config in its metadata (files
// written before 2026-12-07: DIR/config.toml); errors name the missing file
// or the tensors whose shapes do not match the config (another dtype is
// cast). Where DIR also has a checkpoint of a later step than the file's (a
// resumed run that stopped early), that checkpoint is read instead. Without
// model.safetensors, DIR may be a checkpoint (or a run with checkpoints):
// the weights (f32 masters) and config come from it. The routing biases
// too, where the run kept them. The model is for inference: it holds no
// gradient buffers. It runs on `device`, or (nullopt) on the run's own
// (train.device) where this machine has it, else on the CPU; in the run's
// compute dtype (f32 from a checkpoint's masters, and for f16 on a CPU).
LoadedModel load_model_file(const std::string& run_dir, std::optional<Device> device = Device::cpu());

}  // namespace zt::train
