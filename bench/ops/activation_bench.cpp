// GeLU / SwiGLU benchmarks on the MLP activations of a GPT-2-small-like model
// at 2048 tokens: (2048, 4C) for C in {384, 768, 1024}, f32 and bf16, against
// memcpy of a comparable buffer. bytes = every byte read + written:
//   gelu forward   x, y (2048, 4C)          backward  dy, x, dx (2048, 4C)
//   swiglu forward x (2048, 2 * 4C), y (2048, 4C)
//   swiglu backward x, dx (2048, 2 * 4C), dy (2048, 4C)
#include <benchmark/benchmark.h>
#include <cstdint>


#include "ops/activation.h"
#include "ops/inputs.h"
#include "ops/peers.h"

namespace {

using namespace zt;

constexpr int64_t kRows = 2048;

DType dtype_arg(const benchmark::State& state) { return state.range(1) == 0 ? DType::f32 : DType::bf16; }

void BM_gelu_forward(benchmark::State& state) {
  const DType dt = dtype_arg(state);
  const Shape s{kRows, 4 * state.range(0)};
  const Tensor x = bench::uniform_tensor(s, dt, 1, -4, 4), y = Tensor::empty(s, dt);
  for (auto _ : state) {
    ops::gelu_forward(y, x);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  const double bytes = 2.0 * double(x.nbytes());
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}

void BM_gelu_backward(benchmark::State& state) {
  const DType dt = dtype_arg(state);
  const Shape s{kRows, 4 * state.range(0)};
  const Tensor x = bench::uniform_tensor(s, dt, 1, -4, 4), dy = bench::uniform_tensor(s, dt, 2, -1, 1), dx = Tensor::empty(s, dt);
  for (auto _ : state) {
    ops::gelu_backward(dx, dy, x);
    benchmark::DoNotOptimize(dx.data_ptr());
  }
  const double bytes = 3.0 * double(x.nbytes());
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}

void BM_swiglu_forward(benchmark::State& state) {
  const DType dt = dtype_arg(state);
  const int64_t H = 4 * state.range(0);
  const Tensor x = bench::uniform_tensor(Shape{kRows, 2 * H}, dt, 1, -4, 4), y = Tensor::empty(Shape{kRows, H}, dt);
  for (auto _ : state) {
    ops::swiglu_forward(y, x);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  const double bytes = double(x.nbytes() + y.nbytes());
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}

void BM_swiglu_backward(benchmark::State& state) {
  const DType dt = dtype_arg(state);
  const int64_t H = 4 * state.range(0);
  const Tensor x = bench::uniform_tensor(Shape{kRows, 2 * H}, dt, 1, -4, 4), dy = bench::uniform_tensor(Shape{kRows, H}, dt, 2, -1, 1);
  const Tensor dx = Tensor::empty(Shape{kRows, 2 * H}, dt);
  for (auto _ : state) {
    ops::swiglu_backward(dx, dy, x);
    benchmark::DoNotOptimize(dx.data_ptr());
  }
  const double bytes = double(x.nbytes() + dy.nbytes() + dx.nbytes());
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}

// Args: C (the tensors are (2048, 4C)), dtype (0 f32, 1 bf16).
void act_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"C", "bf16"})->ArgsProduct({{384, 768, 1024}, {0, 1}})->UseRealTime();
}

BENCHMARK(BM_gelu_forward)->Apply(act_args);
BENCHMARK(BM_gelu_backward)->Apply(act_args);
BENCHMARK(BM_swiglu_forward)->Apply(act_args);
BENCHMARK(BM_swiglu_backward)->Apply(act_args);

}  // namespace
