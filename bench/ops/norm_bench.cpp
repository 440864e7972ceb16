// LayerNorm / RMSNorm benchmarks at GPT-2-small-like sizes (N = 2048 tokens,
// C in {384, 768, 1024}), f32 and bf16 activations (bf16 runs use bf16 weights
// and f32 weight gradients, as in mixed-precision training), against memcpy of
// a comparable buffer. bytes = every byte read + written by the op:
//   forward            x, y (N C), w, b (C), mean, rstd (N)
//   residual forward   r_in, x, r_out, y (N C), w, b (C), mean, rstd (N)
//   backward           dy, x, dx_add, dx (N C), w (C), dw, db (C, read + written),
//                      mean, rstd (N)
#include <benchmark/benchmark.h>
#include <cstdint>


#include "ops/norm.h"
#include "ops/inputs.h"
#include "ops/peers.h"

namespace {

using namespace zt;

constexpr int64_t kRows = 2048;

DType dtype_arg(const benchmark::State& state) { return state.range(1) == 0 ? DType::f32 : DType::bf16; }
ops::NormKind kind_arg(const benchmark::State& state) {
  return state.range(2) == 0 ? ops::NormKind::layernorm : ops::NormKind::rmsnorm;
}

struct Setup {
  ops::NormKind kind;
  DType dt;
  int64_t N, C;
  Tensor x, y, w, b, mean, rstd;
  double act_bytes;  // one (N, C) activation
  double param_bytes;  // w and b
  double stat_bytes;   // mean and rstd
  explicit Setup(const benchmark::State& state)
      : kind(kind_arg(state)), dt(dtype_arg(state)), N(kRows), C(state.range(0)) {
    const bool ln = kind == ops::NormKind::layernorm;
    x = bench::uniform_tensor(Shape{N, C}, dt, 1);
    y = Tensor::empty(Shape{N, C}, dt);
    w = bench::uniform_tensor(Shape{C}, dt, 2);
    b = ln ? bench::uniform_tensor(Shape{C}, dt, 3) : Tensor();
    mean = ln ? Tensor::empty(Shape{N}, DType::f32) : Tensor();
    rstd = Tensor::empty(Shape{N}, DType::f32);
    act_bytes = double(x.nbytes());
    param_bytes = double(w.nbytes()) * (ln ? 2 : 1);
    stat_bytes = double(N) * 4 * (ln ? 2 : 1);
  }
};

void BM_norm_forward(benchmark::State& state) {
  Setup s(state);
  for (auto _ : state) {
    ops::norm_forward(s.kind, s.y, s.mean, s.rstd, s.x, s.w, s.b, 1e-5f);
    benchmark::DoNotOptimize(s.y.data_ptr());
  }
  const double bytes = 2 * s.act_bytes + s.param_bytes + s.stat_bytes;
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}

void BM_residual_norm_forward(benchmark::State& state) {
  Setup s(state);
  const Tensor r_in = bench::uniform_tensor(Shape{s.N, s.C}, s.dt, 4), r_out = Tensor::empty(Shape{s.N, s.C}, s.dt);
  for (auto _ : state) {
    ops::residual_norm_forward(s.kind, r_out, s.y, s.mean, s.rstd, r_in, s.x, s.w, s.b, 1e-5f);
    benchmark::DoNotOptimize(s.y.data_ptr());
  }
  const double bytes = 4 * s.act_bytes + s.param_bytes + s.stat_bytes;
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}

void BM_norm_backward(benchmark::State& state) {
  Setup s(state);
  const bool ln = s.kind == ops::NormKind::layernorm;
  ops::norm_forward(s.kind, s.y, s.mean, s.rstd, s.x, s.w, s.b, 1e-5f);
  const Tensor dy = bench::uniform_tensor(Shape{s.N, s.C}, s.dt, 5), dx_add = bench::uniform_tensor(Shape{s.N, s.C}, s.dt, 6);
  const Tensor dx = Tensor::empty(Shape{s.N, s.C}, s.dt);
  const Tensor dw = bench::uniform_tensor(Shape{s.C}, DType::f32, 7), db = ln ? bench::uniform_tensor(Shape{s.C}, DType::f32, 8) : Tensor();
  for (auto _ : state) {
    ops::norm_backward(s.kind, dx, dw, db, dy, s.x, s.w, s.mean, s.rstd, dx_add);
    benchmark::DoNotOptimize(dx.data_ptr());
  }
  const double grad_bytes = 2.0 * double(dw.nbytes()) * (ln ? 2 : 1);
  const double bytes = 4 * s.act_bytes + double(s.w.nbytes()) + grad_bytes + s.stat_bytes;
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}

// Args: C, dtype (0 f32, 1 bf16), kind (0 layernorm, 1 rmsnorm).
void norm_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"C", "bf16", "rms"})->ArgsProduct({{384, 768, 1024}, {0, 1}, {0, 1}})->UseRealTime();
}

BENCHMARK(BM_norm_forward)->Apply(norm_args);
BENCHMARK(BM_norm_backward)->Apply(norm_args);
BENCHMARK(BM_residual_norm_forward)
    ->ArgNames({"C", "bf16", "rms"})
    ->ArgsProduct({{384, 768, 1024}, {0, 1}, {0}})
    ->UseRealTime();

}  // namespace
