// Whether ops must give the same bits on every run: process-wide, on by
// default, set by the trainer from `train.deterministic`.
//
// On, every op sums in an order fixed by its shapes, so a run repeats bit for
// bit (exact resume, and the tests that compare recompute policies or layouts
// bitwise). Off, an op may take a faster path whose floating-point sums run
// in an order that varies between runs; today one does: on a GPU, cuDNN's
// attention backward adds each key tile's share of dq into an f32
// accumulator with atomics, instead of keeping every head's (T, T) score
// gradients in its workspace and reading them back for dq (the deterministic
// engine: B x Hq x T^2 bf16 written and read per layer). The CPU backend is
// deterministic either way.
#pragma once

namespace zt::ops {

void set_deterministic(bool on);
bool deterministic();

}  // namespace zt::ops
