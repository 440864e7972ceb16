// Elementwise benchmarks: casts, add, axpy and sum_squares over 16M elements,
// against memcpy of a comparable buffer (bytes = bytes read + bytes written).
#include <benchmark/benchmark.h>
#include <cstdint>

#include "ops/elementwise.h"
#include "ops/peers.h"

namespace {

using namespace zt;

constexpr int64_t kN = int64_t(1) << 24;  // 16M elements

void BM_cast(benchmark::State& state, DType from, DType to) {
  Tensor in = Tensor::empty(Shape{kN}, from), out = Tensor::empty(Shape{kN}, to);
  Generator gen(1);
  if (dtype_is_float(from))
    ops::fill_uniform(in, gen, -2.0f, 2.0f);
  else
    ops::fill(in, 7.0);
  for (auto _ : state) {
    ops::cast(out, in);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  const double bytes = double(in.nbytes() + out.nbytes());
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}
BENCHMARK_CAPTURE(BM_cast, f32_to_bf16, DType::f32, DType::bf16)->UseRealTime();
BENCHMARK_CAPTURE(BM_cast, bf16_to_f32, DType::bf16, DType::f32)->UseRealTime();
BENCHMARK_CAPTURE(BM_cast, f32_to_f16, DType::f32, DType::f16)->UseRealTime();
BENCHMARK_CAPTURE(BM_cast, f16_to_f32, DType::f16, DType::f32)->UseRealTime();
BENCHMARK_CAPTURE(BM_cast, f32_to_i32, DType::f32, DType::i32)->UseRealTime();
BENCHMARK_CAPTURE(BM_cast, f32_to_f8e4m3, DType::f32, DType::f8e4m3)->UseRealTime();

void BM_add(benchmark::State& state, DType dt) {
  Tensor a = Tensor::empty(Shape{kN}, dt), b = Tensor::empty(Shape{kN}, dt), out = Tensor::empty(Shape{kN}, dt);
  Generator gen(2);
  ops::fill_uniform(a, gen, -1, 1);
  ops::fill_uniform(b, gen, -1, 1);
  for (auto _ : state) {
    ops::add(out, a, b);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  const double bytes = 3.0 * double(a.nbytes());
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}
BENCHMARK_CAPTURE(BM_add, f32, DType::f32)->UseRealTime();
BENCHMARK_CAPTURE(BM_add, bf16, DType::bf16)->UseRealTime();

void BM_axpy_f32_bf16(benchmark::State& state) {
  Tensor y = Tensor::empty(Shape{kN}, DType::f32), x = Tensor::empty(Shape{kN}, DType::bf16);
  ops::fill(y, 0.0);
  Generator gen(3);
  ops::fill_uniform(x, gen, -1, 1);
  for (auto _ : state) {
    ops::axpy(y, 0.5f, x);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  const double bytes = double(2 * y.nbytes() + x.nbytes());
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}
BENCHMARK(BM_axpy_f32_bf16)->UseRealTime();

void BM_sum_squares_f32(benchmark::State& state) {
  Tensor x = Tensor::empty(Shape{kN}, DType::f32);
  Generator gen(4);
  ops::fill_normal(x, gen, 0, 1);
  for (auto _ : state) benchmark::DoNotOptimize(ops::sum_squares(x));
  // Read-only: compare against memcpy moving the same number of bytes.
  const double bytes = double(x.nbytes());
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}
BENCHMARK(BM_sum_squares_f32)->UseRealTime();

void BM_fill_normal(benchmark::State& state, DType dt) {
  Tensor x = Tensor::empty(Shape{kN}, dt);
  Generator gen(5);
  for (auto _ : state) {
    ops::fill_normal(x, gen, 0, 0.02f);
    benchmark::DoNotOptimize(x.data_ptr());
  }
  const double bytes = double(x.nbytes());
  bench::report(state, 0, bytes, bench::memcpy_gbps(size_t(bytes / 2)));
}
BENCHMARK_CAPTURE(BM_fill_normal, f32, DType::f32)->UseRealTime();
BENCHMARK_CAPTURE(BM_fill_normal, bf16, DType::bf16)->UseRealTime();

}  // namespace
