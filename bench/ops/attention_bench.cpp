// Causal attention forward and forward+backward at B*T = 2048 tokens, D = 64,
// Hq = Hkv in {6, 12} (GPT-2-small-like heads), f32 and bf16.
//
// FLOP count (causal, honest): a (batch, head) has T (T + 1) / 2 unmasked
// (query, key) pairs. The forward does two products over them (S = Q K^T and
// O = P V), 2 D flops per pair each:
//   forward  = 4 * B * Hq * D * T (T + 1) / 2
// The backward does five (S again, dP = dO V^T, dV, dK, dQ):
//   backward = 2.5 * forward,   forward + backward = 3.5 * forward.
// The softmax (exp, max, sums) is not counted. Peer: peak_sgemm_gflops().
#include <cstdint>

#include "ops/attention.h"
#include "ops/inputs.h"
#include "ops/peers.h"

namespace {

using zt::DType;
using zt::Shape;
using zt::Tensor;

void BM_Attention(benchmark::State& state, DType dtype, bool backward) {
  const int64_t B = state.range(0), T = state.range(1), H = state.range(2), D = 64;
  const Shape s{B, T, H, D};
  const Tensor q = zt::bench::uniform_tensor(s, dtype, 1), k = zt::bench::uniform_tensor(s, dtype, 2);
  const Tensor v = zt::bench::uniform_tensor(s, dtype, 3), dout = zt::bench::uniform_tensor(s, dtype, 4);
  Tensor out = Tensor::empty(s, dtype), lse = Tensor::empty(Shape{B, H, T}, DType::f32);
  Tensor dq = Tensor::empty(s, dtype), dk = Tensor::empty(s, dtype), dv = Tensor::empty(s, dtype);
  const double peer = zt::bench::peak_sgemm_gflops();
  zt::ops::attention_forward(out, lse, q, k, v);  // warm-up (scratch buffers)
  if (backward) zt::ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
  for (auto _ : state) {
    zt::ops::attention_forward(out, lse, q, k, v);
    if (backward) zt::ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
    benchmark::DoNotOptimize(dq.data_ptr());
    benchmark::ClobberMemory();
  }
  const double fwd_flops = 4.0 * double(B * H * D) * double(T) * double(T + 1) / 2.0;
  zt::bench::report(state, backward ? 3.5 * fwd_flops : fwd_flops, 0.0, peer);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"B", "T", "H"});
  for (int64_t h : {6, 12}) {
    b->Args({8, 256, h});
    b->Args({2, 1024, h});
  }
  b->UseRealTime();
}

BENCHMARK_CAPTURE(BM_Attention, fwd_f32, DType::f32, false)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Attention, fwd_bf16, DType::bf16, false)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Attention, fwdbwd_f32, DType::f32, true)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Attention, fwdbwd_bf16, DType::bf16, true)->Apply(shapes);

}  // namespace
