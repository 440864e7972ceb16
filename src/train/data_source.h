// The trainer's view of a prepared dataset (data/): BatchSource adapters over
// data::DataLoader for the train and val splits, and the tokenizer as a
// TextCodec for samples.
#pragma once

#include <memory>
#include <string>

#include "train/config.h"
#include "train/trainer.h"

namespace zt::train {

struct TrainingData {
  std::unique_ptr<BatchSource> train;
  std::unique_ptr<BatchSource> val;   // null when the dataset has no validation split
  std::unique_ptr<TextCodec> codec;   // null when data.tokenizer is empty
  // train.eval_each_dataset: each blended dataset's validation split alone,
  // named by its folder (Trainer::set_dataset_validation).
  std::vector<NamedBatchSource> val_each;
};

// Opens cfg.data.dir (or data.blend's datasets: Config::data_parts; the
// validation split a blend of those that have one) for data-parallel rank
// dp_rank of dp_size: the train
// loader hands out this rank's rows of every global batch (validation is
// read whole by every rank). Checks that the dataset's vocabulary fits the
// model and that one global batch fits in an epoch, before any training
// step; errors name the setting to change.
TrainingData open_training_data(const Config& cfg, int dp_rank = 0, int dp_size = 1);

// gpt2, llama3 or a tokenizer file path.
std::unique_ptr<TextCodec> open_codec(const std::string& tokenizer);

}  // namespace zt::train
