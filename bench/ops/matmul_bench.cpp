// Benchmarks for ops::matmul, ops::linear_forward and ops::linear_backward at
// the shapes of a GPT-2-like model at B*T = 2048 tokens (C = 384 / 768 / 1024,
// vocab 50257), f32 and bf16, each against this machine's OpenBLAS sgemm rate
// on the same (M, N, K) measured in the same run ("ratio" = ours / sgemm).
//   matmul:           2*M*N*K flops per call (per batch entry, times the batch)
//   linear_forward:   2*N*OC*C flops (+ bias), peer sgemm(N, OC, C)
//   linear_backward:  4*N*OC*C flops (dx and dw; db rides along), peer sgemm(N, OC, C)
//   linear_decodeR:   R = 1 or 4 rows (a decoding step of R sequences), 2*R*OC*C flops, peer sgemm(R, OC, C)
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ops/inputs.h"
#include "ops/matmul.h"
#include "ops/peers.h"

namespace zt {
namespace {

constexpr int64_t kTokens = 2048;

const char* tname(bool ta, bool tb) { return ta ? (tb ? "TT" : "TN") : (tb ? "NT" : "NN"); }

void bm_matmul(benchmark::State& state, int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb, DType in,
               DType out_dt) {
  std::vector<int64_t> lead;
  if (batch > 1) lead.push_back(batch);
  auto shape = [&](int64_t r, int64_t c) {
    Shape s(lead.begin(), lead.end());
    s.push_back(r);
    s.push_back(c);
    return s;
  };
  const Tensor a = bench::uniform_tensor(ta ? shape(K, M) : shape(M, K), in, 1);
  const Tensor b = bench::uniform_tensor(tb ? shape(N, K) : shape(K, N), in, 2);
  const Tensor out = Tensor::empty(shape(M, N), out_dt);
  const double peer = bench::sgemm_gflops(M, N, K);
  for (auto _ : state) {
    ops::matmul(out, a, b, ta, tb);
    benchmark::DoNotOptimize(out.data_ptr());
  }
  bench::report(state, 2.0 * double(batch) * double(M) * double(N) * double(K), 0, peer);
}

void bm_linear_forward(benchmark::State& state, int64_t C, int64_t OC, bool bias, DType in) {
  const Tensor x = bench::uniform_tensor(Shape{kTokens, C}, in, 3);
  const Tensor w = bench::uniform_tensor(Shape{OC, C}, in, 4);
  const Tensor b = bias ? bench::uniform_tensor(Shape{OC}, DType::f32, 5) : Tensor();
  const Tensor y = Tensor::empty(Shape{kTokens, OC}, in);
  const double peer = bench::sgemm_gflops(kTokens, OC, C);
  for (auto _ : state) {
    ops::linear_forward(y, x, w, b);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  bench::report(state, 2.0 * double(kTokens) * double(OC) * double(C), 0, peer);
}

// A decoding step's product: a row a sequence through the layer (y = x W^T
// + b, x (rows, C)), against OpenBLAS's sgemm on the same (rows, OC, C); GB/s
// counts the weight bytes read.
void bm_linear_decode(benchmark::State& state, int64_t rows, int64_t C, int64_t OC, bool bias, DType in) {
  const Tensor x = bench::uniform_tensor(Shape{rows, C}, in, 3);
  const Tensor w = bench::uniform_tensor(Shape{OC, C}, in, 4);
  const Tensor b = bias ? bench::uniform_tensor(Shape{OC}, DType::f32, 5) : Tensor();
  const Tensor y = Tensor::empty(Shape{rows, OC}, in);
  const double peer = bench::sgemm_gflops(rows, OC, C);
  for (auto _ : state) {
    ops::linear_forward(y, x, w, b);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  bench::report(state, 2.0 * double(rows) * double(OC) * double(C), double(w.nbytes()), peer);
}

// Gradients as a bf16 model with fp32 master grads would hold them: dx in the
// activation dtype, dw and db in f32.
void bm_linear_backward(benchmark::State& state, int64_t C, int64_t OC, bool bias, DType in) {
  const Tensor x = bench::uniform_tensor(Shape{kTokens, C}, in, 6);
  const Tensor w = bench::uniform_tensor(Shape{OC, C}, in, 7);
  const Tensor dy = bench::uniform_tensor(Shape{kTokens, OC}, in, 8);
  const Tensor dx = Tensor::empty(Shape{kTokens, C}, in);
  const Tensor dw = bench::uniform_tensor(Shape{OC, C}, DType::f32, 9);
  const Tensor db = bias ? bench::uniform_tensor(Shape{OC}, DType::f32, 10) : Tensor();
  const double peer = bench::sgemm_gflops(kTokens, OC, C);
  for (auto _ : state) {
    ops::linear_backward(dx, dw, db, dy, x, w);
    benchmark::DoNotOptimize(dw.data_ptr());
  }
  bench::report(state, 4.0 * double(kTokens) * double(OC) * double(C), 0, peer);
}

struct Layer {
  const char* name;
  int64_t C, OC;
  bool bias;
};
// qkv, attention out proj, MLP up/down at C = 384 / 768 / 1024; the LM head.
const Layer kLayers[] = {
    {"qkv384", 384, 1152, true},     {"fc384", 384, 1536, true},     {"fcproj384", 1536, 384, true},
    {"qkv768", 768, 2304, true},     {"attproj768", 768, 768, true}, {"fc768", 768, 3072, true},
    {"fcproj768", 3072, 768, true},  {"fc1024", 1024, 4096, true},   {"fcproj1024", 4096, 1024, true},
    {"lmhead768", 768, 50257, false},
};

std::string dt(DType d) { return std::string(dtype_name(d)); }

int register_all() {
  const DType ins[] = {DType::f32, DType::bf16};
  for (DType in : ins) {
    for (const Layer& l : kLayers) {
      // The three products of a linear layer as plain matmuls:
      //   forward (N, C) x (C, OC) NN and in PyTorch layout NT, dx NN, dw TN.
      struct P {
        const char* what;
        int64_t M, N, K;
        bool ta, tb;
      };
      const P ps[] = {{"fwd", kTokens, l.OC, l.C, false, false},
                      {"fwd", kTokens, l.OC, l.C, false, true},
                      {"dx", kTokens, l.C, l.OC, false, false},
                      {"dw", l.OC, l.C, kTokens, true, false}};
      for (const P& p : ps) {
        const std::string name = "matmul/" + dt(in) + "/" + l.name + "_" + p.what + "/" + tname(p.ta, p.tb) + "/" +
                                 std::to_string(p.M) + "x" + std::to_string(p.N) + "x" + std::to_string(p.K);
        benchmark::RegisterBenchmark(name.c_str(), bm_matmul, 1, p.M, p.N, p.K, p.ta, p.tb, in, in)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
      benchmark::RegisterBenchmark(("linear_forward/" + dt(in) + "/" + l.name).c_str(), bm_linear_forward, l.C,
                                   l.OC, l.bias, in)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("linear_backward/" + dt(in) + "/" + l.name).c_str(), bm_linear_backward, l.C,
                                   l.OC, l.bias, in)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
      for (int64_t rows : {1, 4})
        benchmark::RegisterBenchmark(("linear_decode" + std::to_string(rows) + "/" + dt(in) + "/" + l.name).c_str(),
                                     bm_linear_decode, rows, l.C, l.OC, l.bias, in)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
    }
    // bf16 inputs with an f32 out (fp32 gradient accumulation).
    if (in == DType::bf16) {
      benchmark::RegisterBenchmark("matmul/bf16->f32/qkv768_dw/TN/2304x768x2048", bm_matmul, 1, 2304, 768, kTokens,
                                   true, false, in, DType::f32)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
    // Batched attention-like products (B*H = 12 heads of 64, T = 1024 or 256)
    // and many tiny ones: peer is one threaded sgemm of the same (M, N, K).
    struct Bt {
      const char* what;
      int64_t batch, M, N, K;
      bool ta, tb;
    };
    const Bt bts[] = {{"scores", 12, 1024, 1024, 64, false, true},
                      {"pv", 12, 1024, 64, 1024, false, false},
                      {"scores", 48, 256, 256, 64, false, true},
                      {"tiny", 512, 32, 32, 32, false, false}};
    for (const Bt& b : bts) {
      const std::string name = "matmul_batched/" + dt(in) + "/" + b.what + "/" + tname(b.ta, b.tb) + "/" +
                               std::to_string(b.batch) + "x" + std::to_string(b.M) + "x" + std::to_string(b.N) + "x" +
                               std::to_string(b.K);
      benchmark::RegisterBenchmark(name.c_str(), bm_matmul, b.batch, b.M, b.N, b.K, b.ta, b.tb, in, in)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  return 0;
}

const int registered = register_all();

}  // namespace
}  // namespace zt
