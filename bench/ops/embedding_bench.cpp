// Token + position embedding at GPT-2-small shapes: B*T = 2048 tokens (B = 8,
// T = 256), C = 768, V = 50257. Bytes: forward reads a wte row and a wpe row
// and writes an out row per token; backward reads dout and read-modify-writes
// the touched dwte rows and the dwpe rows. Peer: memcpy of the out buffer.
#include <benchmark/benchmark.h>
#include <cstdint>

#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/peers.h"

namespace {

using namespace zt;

constexpr int64_t kB = 8, kT = 256, kC = 768, kV = 50257;

Tensor make_tokens() {
  Tensor tok = Tensor::empty(Shape{kB, kT}, DType::i32);
  uint64_t x = 12345;
  for (int64_t i = 0; i < kB * kT; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    tok.data<int32_t>()[i] = int32_t((x >> 33) % kV);
  }
  return tok;
}

void BM_embedding_forward(benchmark::State& state, DType dt) {
  Tensor tok = make_tokens();
  Tensor wte = Tensor::empty(Shape{kV, kC}, dt), wpe = Tensor::empty(Shape{1024, kC}, dt);
  Tensor out = Tensor::empty(Shape{kB, kT, kC}, dt);
  Generator gen(3);
  ops::fill_normal(wte, gen, 0, 0.02f);
  ops::fill_normal(wpe, gen, 0, 0.02f);
  for (auto _ : state) {
    ops::embedding_forward(out, tok, wte, wpe, 0);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  const double bytes = 3.0 * double(out.nbytes());
  bench::report(state, 0, bytes, bench::memcpy_gbps(out.nbytes()));
}
BENCHMARK_CAPTURE(BM_embedding_forward, f32, DType::f32)->UseRealTime();
BENCHMARK_CAPTURE(BM_embedding_forward, bf16, DType::bf16)->UseRealTime();

void BM_embedding_backward(benchmark::State& state, DType dt) {
  Tensor tok = make_tokens();
  Tensor dout = Tensor::empty(Shape{kB, kT, kC}, dt);
  Tensor dwte = Tensor::empty(Shape{kV, kC}, DType::f32), dwpe = Tensor::empty(Shape{1024, kC}, DType::f32);
  Generator gen(4);
  ops::fill_normal(dout, gen, 0, 1);
  ops::fill(dwte, 0.0);
  ops::fill(dwpe, 0.0);
  for (auto _ : state) {
    ops::embedding_backward(dwte, dwpe, dout, tok, 0);
    benchmark::DoNotOptimize(dwte.data_ptr());
  }
  // dout read twice (wte and wpe parts); each touched dwte row (<= B*T) and
  // each dwpe row (T) read and written once (f32).
  const double bytes = 2.0 * double(dout.nbytes()) + 2.0 * double((kB * kT + kT) * kC * 4);
  bench::report(state, 0, bytes, bench::memcpy_gbps(dout.nbytes()));
}
BENCHMARK_CAPTURE(BM_embedding_backward, f32, DType::f32)->UseRealTime();
BENCHMARK_CAPTURE(BM_embedding_backward, bf16_dout_f32_grads, DType::bf16)->UseRealTime();

}  // namespace
