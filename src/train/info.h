// `zettatron info`: what a configuration costs before training it.
//   parameters by component, training FLOPs per token, and memory: an
//   analytic estimate next to the allocator's measurement of one real
//   forward/backward step for each recompute policy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

namespace zt::train {

struct ComponentParams {
  std::string name;
  int64_t params;
};

struct PolicyMemory {
  nn::Recompute policy;
  int64_t estimated_activation_bytes;  // analytic, per micro-batch
  int64_t measured_activation_bytes;   // allocator peak of activations over one step (-1: not measured)
};

struct InfoReport {
  std::vector<ComponentParams> components;
  int64_t total_params = 0;
  int64_t non_embedding_params = 0;
  double flops_per_token = 0;
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  std::vector<PolicyMemory> activations;
};

// measure = true runs one training step of a random micro-batch per policy.
InfoReport make_info(const Config& cfg, bool measure);
// Analytic activation bytes kept for backward by one micro-batch under a policy.
int64_t estimate_activation_bytes(const Config& cfg, nn::Recompute policy);
std::string format_info(const Config& cfg, const InfoReport& r);

}  // namespace zt::train
