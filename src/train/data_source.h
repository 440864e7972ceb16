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
};

// Opens cfg.data.dir for this process (data-parallel rank 0 of 1 until the
// distributed runtime passes its own). Checks that the dataset's vocabulary
// fits the model and that one global batch fits in an epoch, before any
// training step; errors name the setting to change.
TrainingData open_training_data(const Config& cfg);

// gpt2, llama3 or a tokenizer file path.
std::unique_ptr<TextCodec> open_codec(const std::string& tokenizer);

}  // namespace zt::train
