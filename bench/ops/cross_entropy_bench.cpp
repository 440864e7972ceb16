// Fused softmax + cross-entropy at GPT-2 shapes: N = 2048 rows (B*T tokens),
// V = 50257 (padded to 50304 columns), forward + backward in place. Bytes =
// logits read once + dlogits written once (+ targets and losses); the peer is
// memcpy of a buffer of the logits' size.
#include <benchmark/benchmark.h>
#include <cstdint>

#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/peers.h"

namespace {

using namespace zt;

constexpr int64_t kN = 2048, kV = 50257, kVp = 50304;

void BM_cross_entropy(benchmark::State& state, DType dt, bool backward) {
  Tensor logits = Tensor::empty(Shape{kN, kVp}, dt);
  Tensor targets = Tensor::empty(Shape{kN}, DType::i32), losses = Tensor::empty(Shape{kN}, DType::f32);
  for (int64_t n = 0; n < kN; ++n) targets.data<int32_t>()[n] = int32_t((n * 7919) % kV);
  Generator gen(42);
  ops::fill_normal(logits, gen, 0.0f, 2.0f);
  for (auto _ : state) {
    // In place: the gradient overwrites the logits (each iteration then sees
    // the previous gradient as logits, which costs the same).
    ops::softmax_cross_entropy(losses, backward ? logits : Tensor(), logits, targets, kV, 1.0f / kN);
    benchmark::DoNotOptimize(losses.data_ptr());
  }
  const double row_bytes = double(kVp) * double(dtype_size(dt));
  const double bytes = double(kN) * (row_bytes * (backward ? 2 : 1) + 8);
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(kN * row_bytes)));
}
BENCHMARK_CAPTURE(BM_cross_entropy, f32_fwd_bwd_inplace, DType::f32, true)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cross_entropy, bf16_fwd_bwd_inplace, DType::bf16, true)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_cross_entropy, f32_fwd_only, DType::f32, false)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace
