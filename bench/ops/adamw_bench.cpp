// Fused AdamW over 16M parameters (the 124M GPT-2 step is too large for a
// quick run on 2 cores; per-element cost is the same). Bytes = everything read
// (master, m, v, grad) + written (master, m, v, model copy); the peer is memcpy
// of a buffer of half that many bytes (memcpy_gbps counts read + write).
#include <benchmark/benchmark.h>
#include <cstdint>

#include "ops/adamw.h"
#include "ops/elementwise.h"
#include "ops/peers.h"

namespace {

using namespace zt;

constexpr int64_t kN = int64_t(1) << 24;

void BM_adamw(benchmark::State& state, DType grad_dt, bool bf16_copy, bool stochastic = false) {
  Tensor p = Tensor::empty(Shape{kN}, DType::f32), m = Tensor::empty(Shape{kN}, DType::f32);
  Tensor v = Tensor::empty(Shape{kN}, DType::f32), g = Tensor::empty(Shape{kN}, grad_dt);
  Tensor copy = bf16_copy ? Tensor::empty(Shape{kN}, DType::bf16) : Tensor();
  Generator gen(7);
  ops::fill_uniform(p, gen, -0.1f, 0.1f);
  ops::fill_uniform(g, gen, -1e-3f, 1e-3f);
  ops::fill(m, 0.0);
  ops::fill(v, 0.0);
  ops::AdamWParams hp;
  hp.weight_decay = 0.1f;
  hp.stochastic_rounding = stochastic;
  for (auto _ : state) {
    ops::adamw_step(p, g, m, v, copy, hp);
    ++hp.step;
    benchmark::DoNotOptimize(p.data_ptr());
  }
  const double bytes = double(kN) * (4.0 * 3 * 2 + double(dtype_size(grad_dt)) + (bf16_copy ? 2.0 : 0.0));
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}
BENCHMARK_CAPTURE(BM_adamw, f32_grads, DType::f32, false)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_adamw, bf16_grads_bf16_copy, DType::bf16, true)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_adamw, bf16_grads_bf16_copy_stochastic, DType::bf16, true, true)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
