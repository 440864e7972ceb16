// Activation offloading: what a block keeps for its backward pass, moved to
// host memory after the block's forward and back before its backward
// (train.offload_activations; Transformer::offload_activations).
//
// The device then holds the activations of about one block per micro-batch
// in flight instead of every block's, at the price of each kept byte
// crossing the host link twice a step. It composes with recomputation: under
// full recompute only each block's input (R, C) moves. On the CPU the bytes
// only change category (activations -> offload): the path the tests take.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "nn/transformer.h"

namespace zt::nn {

// Replaces every tensor of `a` that lives on `device` by a host copy
// (MemCategory::offload), dropping the device's reference; exact aliases
// (the same view kept twice, e.g. a mixture of experts' xs and xe without
// expert parallelism) share one copy, so they stay aliases. Returns the
// bytes moved.
int64_t offload_block(BlockActivations& a, Device device);
// The inverse: every tensor of `a` in MemCategory::offload back on `device`
// (MemCategory::activations), aliases kept. Returns the bytes moved.
int64_t restore_block(BlockActivations& a, Device device);

}  // namespace zt::nn
