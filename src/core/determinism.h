// Whether ops must give the same bits on every run: process-wide, on by
// default; a trainer's step runs under its config's `train.deterministic`
// (DeterminismScope), so trainers with different settings can share a
// process. In core so that the ops and the backends read the one switch.
//
// On, every op sums in an order fixed by its shapes, so a run repeats bit for
// bit (exact resume, and the tests that compare recompute policies or layouts
// bitwise). Off, an op may take a faster path whose floating-point sums run
// in an order that varies between runs; today two do, on a GPU: cuDNN's
// attention backward adds each key tile's share of dq into an f32
// accumulator with atomics, instead of keeping every head's (T, T) score
// gradients in its workspace and reading them back for dq (the deterministic
// engine: B x Hq x T^2 bf16 written and read per layer); and each new matmul
// shape keeps the fastest of cuBLASLt's ranked algorithms and cuBLAS's own
// GEMM, timed on its first call (backend/cuda/matmul.h), where the clock's
// choice may differ between processes. The CPU backend is deterministic
// either way.
#pragma once

namespace zt {

void set_deterministic(bool on);
bool deterministic();

// Sets the switch for a scope (one training step) and restores the value it
// found when the scope ends.
class DeterminismScope {
 public:
  explicit DeterminismScope(bool on) : previous_(deterministic()) { set_deterministic(on); }
  ~DeterminismScope() { set_deterministic(previous_); }
  DeterminismScope(const DeterminismScope&) = delete;
  DeterminismScope& operator=(const DeterminismScope&) = delete;

 private:
  bool previous_;
};

}  // namespace zt
