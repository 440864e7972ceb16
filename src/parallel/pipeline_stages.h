// How a model's layers split into pipeline stages.
//
// p pipeline ranks with v model chunks each make S = p v model stages (chunk
// c of rank r is stage c p + r: see pipeline_schedule.h). Stage s holds the
// contiguous blocks [first, last); stage 0 also the embeddings and stage
// S-1 the final norm and LM head. Balanced by cost - each block's training
// FLOPs per token, the LM head's 6 V C (a large share for small models)
// and the embedding lookup's (about one row read and written: negligible,
// counted as 2 C) - minimising the most expensive stage; an explicit list of
// blocks per stage overrides the balance.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "nn/model_config.h"

namespace zt::parallel {

struct StageLayers {
  int64_t first = 0, last = 0;  // blocks [first, last)
  bool embedding = false;       // stage 0
  bool head = false;            // stage S-1
  double cost = 0;              // FLOPs per token of its training step (forward + backward)
};

// Throws zt::Error naming the problem and the fix (fewer blocks than stages;
// an explicit list of the wrong length, with an empty stage, or not adding
// up to n_layer). Pure: the same verdict on every rank.
std::vector<StageLayers> plan_pipeline_stages(const nn::ModelConfig& cfg, int64_t seq_len, int64_t stages,
                                              const std::vector<int64_t>& blocks_per_stage = {});

// "4,4,3,3" -> {4, 4, 3, 3}; empty -> {}. Bad text throws zt::Error naming the key.
std::vector<int64_t> parse_stage_layers(std::string_view text);

}  // namespace zt::parallel
