// The training loop on one process: micro-batches with gradient accumulation,
// clipping, AdamW with a schedule, evaluation, sampling, metrics and hooks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "nn/transformer.h"
#include "optim/adamw.h"
#include "train/config.h"
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
  // val may be null (no evaluation); codec may be null (no samples).
  Trainer(const Config& cfg, std::unique_ptr<BatchSource> train, std::unique_ptr<BatchSource> val,
          std::unique_ptr<TextCodec> codec);

  // Runs cfg.train.steps steps, logging to the console, run_dir/train.log and
  // run_dir/metrics.jsonl. Throws zt::Error when training must stop.
  TrainResult run();

  // One optimizer step (0-based step index): gradients of the global batch,
  // clipping, update. Public so tests can drive training step by step.
  StepMetrics train_step(int64_t step);
  // Mean validation loss over train.eval_batches micro-batches.
  double evaluate(int64_t* tokens_out = nullptr);
  // A sample of text (prompt + continuation).
  std::string sample(uint64_t seed);

  nn::Transformer& model() { return *model_; }
  optim::AdamW& optimizer() { return *optimizer_; }
  const Config& config() const { return cfg_; }
  double peak_gflops() const { return peak_gflops_; }

  // Called after every step (the checkpoint issue hooks saving in here).
  std::vector<std::function<void(const StepMetrics&)>> step_hooks;
  // Console output (default: stdout and run_dir/train.log).
  std::function<void(const std::string&)> log;

 private:
  Config cfg_;
  std::unique_ptr<nn::Transformer> model_;
  std::unique_ptr<optim::AdamW> optimizer_;
  std::unique_ptr<BatchSource> train_, val_;
  std::unique_ptr<TextCodec> codec_;
  optim::LrSchedule schedule_;
  double peak_gflops_ = 0;
  std::string peak_source_;  // where peak_gflops_ came from, for the log
  int64_t tokens_seen_ = 0;
  int64_t bad_steps_ = 0;
  double last_good_loss_ = 0;
  int64_t last_good_step_ = -1;
  Tensor inputs_, targets_;  // (micro_batch, T) i32
};

}  // namespace zt::train
