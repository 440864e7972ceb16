// The ops of a training step, timed one by one at the two GPU benchmark
// shapes (bench/gpu/run.sh kernels): each memory-bound op against the
// device's own copy rate, each product against its dense bf16 GEMM rate (an
// 8192^3 product), both measured in the same run, and (bench/gpu/kernels_peer.py)
// every row against PyTorch's kernels for the same work; each product also
// with every algorithm cuBLASLt's heuristic ranks for it (sweep_candidates).
// Together with the op profile of a training run this says which kernel to
// work on next.
//
// Shapes are those of configs/bench-gpu-{gpt2,llama}.toml's models at T = 1024
// (GPT-2 124M at micro-batch 16, Llama 3 1B at 8), bf16 activations, f32
// gradients of the weights and optimizer state; the logits rows are the LM
// head's chunk (nn::head_chunk_rows). bytes = the least memory traffic of the
// op: every tensor it must read read once, every tensor it writes written
// once (per-row statistics left out). GB/s = bytes / median time.
//
//   usage: zt_bench_gpu_kernels [cuda|cpu] [row divisor]
// cpu with a divisor (e.g. 64) runs the same code on small shapes: a check of
// the harness on a machine without a GPU. Prints one JSON line per op.
// ZT_KERNELS_ONLY=REGEX times only the rows whose "model/op" it matches
// (ECMAScript, anywhere in the name; e.g. "llama3-1b/swiglu_backward"); with
// ZT_BENCH_PROFILE=1 (median_time.h) each runs once under a profiler's
// capture, and products skip their candidate sweeps (bench/gpu/run.sh ncu).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <regex>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "gpu/median_time.h"
#ifdef ZT_WITH_CUDA
#include "backend/cuda/cross_entropy.h"
#include "backend/cuda/kernel_race.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/norm.h"
#endif
#include "nn/transformer.h"
#include "ops/activation.h"
#include "ops/adamw.h"
#include "ops/cross_entropy.h"
#include "ops/device.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/fp8.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace {

using namespace zt;
using bench::median_seconds;

// Whether the row "model/op" is timed: ZT_KERNELS_ONLY's regex matches it
// (all rows when it is unset).
bool selected(const char* model, const std::string& op) {
  static const std::optional<std::regex> only = []() -> std::optional<std::regex> {
    const char* pattern = std::getenv("ZT_KERNELS_ONLY");
    if (pattern == nullptr || *pattern == '\0') return std::nullopt;
    try {
      return std::regex(pattern);
    } catch (const std::regex_error& e) {
      ZT_FAIL("ZT_KERNELS_ONLY = \"", pattern, "\" is not a regular expression (", e.what(),
              "); give one over \"model/op\" names such as llama3-1b/swiglu_backward, or unset it");
    }
  }();
  // (a row's name without the "*" that marks the kernel training takes, so
  // an anchored pattern selects it whichever kernel wins)
  const std::string name = op.ends_with('*') ? op.substr(0, op.size() - 1) : op;
  return !only || std::regex_search(std::string(model) + "/" + name, *only);
}

// A row that throws (a launch or cuBLAS failure, a switch's bad value) is
// reported on stderr and the bench goes on to the next row, so that one
// failure does not lose every row after it; main then exits 1.
int failed_rows = 0;
void guarded(const char* model, const std::string& op, const std::function<void()>& row) {
  try {
    row();
  } catch (const std::exception& e) {
    ++failed_rows;
    std::fprintf(stderr, "%s/%s failed: %s\n", model, op.c_str(), e.what());
  }
}

struct Model {
  const char* name;
  bool llama;
  int64_t B, T, C, F, Vp, V, Hq, Hkv, D, params;
};

// `vocab` (ids in [0, vocab); 0: none) lets the peer build the same inputs.
void print_row(const char* model, const char* op, const std::string& shape, int64_t vocab, double seconds,
               double bytes, double copy_gbps) {
  const double gbps = bytes / seconds / 1e9;
  std::printf("{\"model\": \"%s\", \"op\": \"%s\", \"shape\": \"%s\", \"vocab\": %lld, \"ms\": %.4f, "
              "\"bytes\": %.0f, \"gbps\": %.1f, \"of_copy\": %.3f}\n",
              model, op, shape.c_str(), static_cast<long long>(vocab), seconds * 1e3, bytes, gbps, gbps / copy_gbps);
  std::fflush(stdout);
}

// A product: 2 M N K flops over the median time, against the device's
// measured dense bf16 GEMM rate (gemm_tflops; 0: not measured, on the CPU).
void print_product(const char* model, const std::string& op, int64_t M, int64_t K, int64_t N, bool bias,
                   double seconds, double gemm_tflops) {
  const double tflops = 2.0 * double(M) * double(N) * double(K) / seconds / 1e12;
  char peak[32] = "null";
  if (gemm_tflops > 0) std::snprintf(peak, sizeof peak, "%.3f", tflops / gemm_tflops);
  std::printf("{\"model\": \"%s\", \"op\": \"%s\", \"shape\": \"%lldx%lldx%lld\", \"bias\": %s, \"ms\": %.4f, "
              "\"tflops\": %.1f, \"of_gemm\": %s}\n",
              model, op.c_str(), static_cast<long long>(M), static_cast<long long>(K), static_cast<long long>(N),
              bias ? "true" : "false", seconds * 1e3, tflops, peak);
  std::fflush(stdout);
}

std::string dims(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t x : d) {
    if (!s.empty()) s += 'x';
    s += std::to_string(x);
  }
  return s;
}

class Bench {
 public:
  Bench(Device dev, const Model& m, double copy_gbps, double gemm_tflops)
      : dev_(dev), m_(m), copy_gbps_(copy_gbps), gemm_tflops_(gemm_tflops), gen_(7) {}

  // The step's products, one layer of each shape. q, k and v run as one
  // product, attn.qkv (nn::qkv_form), timed beside their ZT_FUSED_QKV=0
  // form: attn.q and attn.k (GPT-2's k and v have q's shape, Llama's v has
  // k's):
  // forward y (M, N) = x (M, K) W (N, K)^T + b (forward_residual: + the
  // residual stream, attn.proj and mlp.out); dgrad dx = dy W (GPT-2's
  // mlp.out with the GeLU backward in its epilogue; dgrad_add dx += dy W, as
  // the second and third of three q, k, v products run); wgrad dW += dy^T x (f32),
  // db += column sums of dy. M = the micro-batch's tokens, or a head chunk.
  void run_products() {
    struct Product {
      const char* name;
      int64_t M, K, N;
      bool bias, gelu_dgrad;
      bool dgrad_add = false;  // also timed adding into its output: k's and v's beside q's
    };
    const int64_t N = m_.B * m_.T, C = m_.C, q = m_.Hq * m_.D, kv = m_.Hkv * m_.D;
    const int64_t head_rows = head_chunk_rows(N);
    std::vector<Product> products;
    if (m_.llama) {
      products = {{"attn.q", N, C, q, false, false},        {"attn.k", N, C, kv, false, false, true},
                  {"attn.qkv", N, C, q + 2 * kv, false, false},
                  {"attn.proj", N, q, C, false, false},     {"mlp.in", N, C, 2 * m_.F, false, false},
                  {"mlp.out", N, m_.F, C, false, false},    {"head", head_rows, C, m_.Vp, false, false}};
    } else {
      products = {{"attn.q", N, C, q, true, false, true},   {"attn.qkv", N, C, 3 * q, true, false},
                  {"attn.proj", N, q, C, true, false},
                  {"mlp.in", N, C, m_.F, true, false},      {"mlp.out", N, m_.F, C, true, true},
                  {"head", head_rows, C, m_.Vp, false, false}};
    }
    const DType bf = DType::bf16;
    for (const Product& p : products) {
      const Tensor x = rand({p.M, p.K}, bf), w = rand({p.N, p.K}, bf, -0.05f, 0.05f), dy = rand({p.M, p.N}, bf);
      const Tensor b = p.bias ? rand({p.N}, bf) : Tensor();
      Tensor y = empty({p.M, p.N}, bf), dx = empty({p.M, p.K}, bf), dw = zeros({p.N, p.K});
      Tensor db = p.bias ? zeros({p.N}) : Tensor();
      auto row = [&](const char* kind, const std::function<void()>& run) {
        const std::string op = std::string(p.name) + "." + kind;
        if (!selected(m_.name, op)) return;
        guarded(m_.name, op, [&] {
          print_product(m_.name, op, p.M, p.K, p.N, p.bias, median_seconds(dev_, run), gemm_tflops_);
          if (!bench::profiling_run()) sweep_candidates(op, p.M, p.K, p.N, run);
        });
      };
      row("forward", [&] { ops::linear_forward(y, x, w, b); });
      // The block's output layers add the residual stream inside the product
      // (its C apart from D): against forward plus the add row, what that saves.
      if (std::string(p.name) == "attn.proj" || std::string(p.name) == "mlp.out") {
        const Tensor residual = rand({p.M, p.N}, bf);
        row("forward_residual", [&] { ops::linear_forward(y, x, w, b, residual); });
      }
#ifdef ZT_WITH_CUDA
      // GPT-2's mlp.in with its GeLU in the product (the GELU_AUX_BIAS
      // epilogue, ZT_CUDA_GELU_EPILOGUE): against forward plus the
      // gelu_forward row, what that saves. No row where no algorithm takes it.
      if (!m_.llama && std::string(p.name) == "mlp.in" && dev_.is_cuda()) {
        Tensor act = empty({p.M, p.N}, bf);
        if (cuda::linear_gelu_forward(act, y, x, w, b))
          row("forward_gelu", [&] { cuda::linear_gelu_forward(act, y, x, w, b); });
      }
#endif
      if (p.gelu_dgrad) {
        const Tensor pre = rand({p.M, p.K}, bf, -4, 4);
        row("dgrad_gelu", [&] { ops::matmul_gelu_backward(dx, dy, w, pre); });
      } else {
        row("dgrad", [&] { ops::matmul(dx, dy, w); });
        if (p.dgrad_add) {
          Tensor sum = rand({p.M, p.K}, bf);
          row("dgrad_add", [&] { ops::matmul(sum, dy, w, false, false, 1.0f, 1.0f); });
        }
      }
      row("wgrad", [&] { ops::linear_backward(Tensor(), dw, db, dy, x, w); });
#ifdef ZT_WITH_CUDA
      // The same dW and db from one product (the BGRADB epilogue,
      // ZT_CUDA_BGRAD_EPILOGUE): no column-sum pass over dy. No row where no
      // algorithm takes it.
      const std::string bgrad_op = std::string(p.name) + ".wgrad_bgrad";
      if (p.bias && dev_.is_cuda() && selected(m_.name, bgrad_op))
        guarded(m_.name, bgrad_op, [&] {
          // Accumulating, as the wgrad row; where the library refuses that
          // (beta = 1), overwriting (op <layer>.wgrad_bgrad_overwrite), as a
          // step's first micro-batch runs it.
          for (const bool overwrite : {false, true}) {
            if (!cuda::weight_gradient_with_bias(dw, db, dy, x, overwrite)) continue;
            print_product(m_.name, bgrad_op + (overwrite ? "_overwrite" : ""), p.M, p.K, p.N, true,
                          median_seconds(dev_, [&] { cuda::weight_gradient_with_bias(dw, db, dy, x, overwrite); }),
                          gemm_tflops_);
            break;
          }
        });
#endif
      if (p.name != std::string("head")) fp8_rows(p.name, p.M, p.K, p.N, p.bias, x, w, b, dy);
    }
    // The LM head's weight gradient accumulates into its f32 dW once per
    // chunk: at the chunk's rows (above) and at 4x them (fewer, longer
    // products: a quarter of the dW traffic), to say whether larger head
    // chunks would pay.
    const int64_t long_rows = std::min(N, 4 * head_rows);
    if (long_rows > head_rows && selected(m_.name, "head.wgrad")) {
      const Tensor x = rand({long_rows, C}, bf), dy = rand({long_rows, m_.Vp}, bf);
      const Tensor w = rand({m_.Vp, C}, bf, -0.05f, 0.05f);
      Tensor dw = zeros({m_.Vp, C});
      guarded(m_.name, "head.wgrad", [&] {
        print_product(m_.name, "head.wgrad", long_rows, C, m_.Vp, false,
                      median_seconds(dev_, [&] { ops::linear_backward(Tensor(), dw, Tensor(), dy, x, w); }),
                      gemm_tflops_);
      });
    }
  }

  // The block's products on fp8 (train.fp8; the LM head stays in the
  // compute dtype): <layer>.forward_fp8, .dgrad_fp8 and .wgrad_fp8 on codes
  // quantised beforehand (on a GPU the fp8 tensor cores, the transposes of
  // the K-major operands inside the backward rows), and
  // .forward_fp8_quantizing with the quantisation of x and W the model runs
  // before each forward. of_gemm is against the bf16 GEMM rate.
  void fp8_rows(const char* name, int64_t M, int64_t K, int64_t N, bool bias, const Tensor& x, const Tensor& w,
                const Tensor& b, const Tensor& dy) {
    struct Codes {
      Tensor q, scale_inv;
    };
    auto codes = [&](const Tensor& t, DType format) {
      Codes c{Tensor::empty(t.shape(), format, dev_), empty({1}, DType::f32)};
      ops::quantize_fp8(c.q, c.scale_inv, t);
      return c;
    };
    const Codes xq = codes(x, DType::f8e4m3), wq = codes(w, DType::f8e4m3), dyq = codes(dy, DType::f8e5m2);
    Tensor y = empty({M, N}, DType::bf16), dx = empty({M, K}, DType::bf16), dw = zeros({N, K});
    auto fp8_row = [&](const char* kind, const std::function<void()>& run) {
      const std::string op = std::string(name) + "." + kind;
      if (!selected(m_.name, op)) return;
      guarded(m_.name, op,
              [&] { print_product(m_.name, op, M, K, N, bias, median_seconds(dev_, run), gemm_tflops_); });
    };
    fp8_row("forward_fp8", [&] { ops::fp8_linear_forward(y, xq.q, xq.scale_inv, wq.q, wq.scale_inv, b); });
    fp8_row("forward_fp8_quantizing", [&] {
      ops::quantize_fp8(xq.q, xq.scale_inv, x);
      ops::quantize_fp8(wq.q, wq.scale_inv, w);
      ops::fp8_linear_forward(y, xq.q, xq.scale_inv, wq.q, wq.scale_inv, b);
    });
    fp8_row("dgrad_fp8", [&] {
      ops::fp8_linear_backward(dx, Tensor(), dyq.q, dyq.scale_inv, {}, {}, wq.q, wq.scale_inv);
    });
    fp8_row("wgrad_fp8", [&] {
      ops::fp8_linear_backward(Tensor(), dw, dyq.q, dyq.scale_inv, xq.q, xq.scale_inv, {}, {});
    });
  }

  // Every algorithm cuBLASLt's heuristic ranks for a product (at most
  // kMatmulCandidates, matmul.h: MatmulCandidateScope), each timed like the
  // product's row, then cuBLAS's own GEMM (kCublasCandidate) where it applies:
  // whether choosing algorithms by measurement would beat the heuristic's
  // first. One line per product: op "<product>.candidates", candidate_ms in
  // the heuristic's order (candidate 0 is the row above, timed again unless a
  // switch changed that row's choice), candidate_algos their configurations
  // (last_matmul_algorithm), cublas_ms (null: no epilogue-free product). A
  // candidate that fails is reported and ends the sweep.
  void sweep_candidates([[maybe_unused]] const std::string& op, [[maybe_unused]] int64_t M,
                        [[maybe_unused]] int64_t K, [[maybe_unused]] int64_t N,
                        [[maybe_unused]] const std::function<void()>& run) {
#ifdef ZT_WITH_CUDA
    if (!dev_.is_cuda()) return;
    // The JSON fields of one sweep: candidate_ms, candidate_algos, cublas_ms.
    auto ms_of = [&](int n) -> std::optional<double> {  // nullopt: no candidate n
      try {
        const cuda::MatmulCandidateScope scope(n);
        return median_seconds(dev_, run) * 1e3;
      } catch (const std::exception& e) {  // the list's end (zt::Error), or a candidate that failed
        if (std::string(e.what()).find("so there is no candidate") == std::string::npos)
          std::fprintf(stderr, "%s %s: candidate %d failed: %s\n", m_.name, op.c_str(), n, e.what());
        return std::nullopt;
      }
    };
    auto sweep = [&] {
      std::string ms, algos;
      char one[32];
      for (int n = 0; n < cuda::kMatmulCandidates; ++n) {
        const std::optional<double> t = ms_of(n);
        if (!t) break;
        std::snprintf(one, sizeof one, "%s%.4f", ms.empty() ? "" : ", ", *t);
        ms += one;
        algos += (algos.empty() ? "\"" : ", \"") + cuda::last_matmul_algorithm() + "\"";
      }
      const std::optional<double> cublas = ms_of(cuda::kCublasCandidate);
      std::snprintf(one, sizeof one, "%.4f", cublas.value_or(0.0));
      return "\"candidate_ms\": [" + ms + "], \"candidate_algos\": [" + algos +
             "], \"cublas_ms\": " + (cublas ? one : "null");
    };
    const std::string fields = sweep();
    std::printf("{\"model\": \"%s\", \"op\": \"%s.candidates\", \"shape\": \"%s\", %s}\n", m_.name, op.c_str(),
                dims({M, K, N}).c_str(), fields.c_str());
    // Again with kLargeWorkspaceMiB of cuBLASLt workspace (MatmulWorkspaceScope):
    // whether split-K algorithms held back by the device's 32 MiB would pay.
    if (!large_workspace_.defined())
      large_workspace_ = Tensor::empty(Shape{kLargeWorkspaceMiB << 18}, DType::u32, dev_, MemCategory::workspace);
    std::string large;
    {
      const cuda::MatmulWorkspaceScope scope(large_workspace_);
      large = sweep();
    }
    std::printf("{\"model\": \"%s\", \"op\": \"%s.candidates_large_workspace\", \"shape\": \"%s\", "
                "\"workspace_mib\": %lld, %s}\n",
                m_.name, op.c_str(), dims({M, K, N}).c_str(), static_cast<long long>(kLargeWorkspaceMiB), large.c_str());
    std::fflush(stdout);
#endif
  }

  // The weight gradients with few output tiles (matmul.h, wgrad_row_chunks)
  // at `rows` (16384, and a training run's: GPT-2 at micro-batch 128, Llama
  // at 32), over the row-chunk counts: the data to check its occupancy
  // model against. Op "<layer>.wgrad_chunks<n>", "*" after the count the
  // rule picks; the peer times the same dW in one product.
  void run_wgrad_chunks([[maybe_unused]] int64_t rows) {
#ifdef ZT_WITH_CUDA
    if (!dev_.is_cuda()) return;
    const int64_t C = m_.C, OC = m_.llama ? m_.Hkv * m_.D : m_.Hq * m_.D;
    const char* layer = m_.llama ? "attn.k" : "attn.q";
    const DType bf = DType::bf16;
    const Tensor x = rand({rows, C}, bf), dy = rand({rows, OC}, bf);
    Tensor dw = zeros({OC, C});
    const int64_t chosen = cuda::wgrad_row_chunks(OC, C, rows, dev_);
    for (const int64_t chunks : {1, 2, 4, 8, 16, 32, 64}) {
      if (!cuda::wgrad_chunks_usable(chunks, rows)) continue;
      const std::string op = std::string(layer) + ".wgrad_chunks" + std::to_string(chunks) + (chunks == chosen ? "*" : "");
      if (!selected(m_.name, op)) continue;
      guarded(m_.name, op, [&] {
        print_product(m_.name, op, rows, C, OC, false,
                      median_seconds(dev_, [&] { cuda::weight_gradient(dw, dy, x, chunks); }), gemm_tflops_);
      });
    }
#endif
  }

  void run_all() {
    const int64_t N = m_.B * m_.T, C = m_.C;
    const DType bf = DType::bf16;
    const double es = 2.0;  // bytes per bf16 element
    const ops::NormKind kind = m_.llama ? ops::NormKind::rmsnorm : ops::NormKind::layernorm;
    const char* norm = m_.llama ? "rmsnorm" : "layernorm";
    {  // norms: forward, the fused residual forward, backward with the residual gradient added
      const Tensor x = rand({N, C}, bf), r_in = rand({N, C}, bf), w = rand({C}, bf, 0.5f, 1.5f);
      const Tensor b = m_.llama ? Tensor() : rand({C}, bf);
      Tensor y = empty({N, C}, bf), r_out = empty({N, C}, bf), rstd = empty({N}, DType::f32);
      Tensor mean = m_.llama ? Tensor() : empty({N}, DType::f32);
      time(std::string(norm) + "_forward", dims({N, C}), 2 * N * C * es,
           [&] { ops::norm_forward(kind, y, mean, rstd, x, w, b, 1e-5f); });
      time("residual_" + std::string(norm) + "_forward", dims({N, C}), 4 * N * C * es,
           [&] { ops::residual_norm_forward(kind, r_out, y, mean, rstd, r_in, x, w, b, 1e-5f); });
      time("add", dims({N, C}), 3 * N * C * es, [&] { ops::add(y, x, r_in); });
    }
    // The backward with the residual gradient added, at the bench's rows and
    // at a training run's (micro-batch 128 / 64 on an H200: 8x), where its
    // time per row is what the step sees.
    for (const int64_t rows : {N, 8 * N}) {
      if (!dev_.is_cuda() && rows > N) break;
      const Tensor x = rand({rows, C}, bf), w = rand({C}, bf, 0.5f, 1.5f), b = m_.llama ? Tensor() : rand({C}, bf);
      Tensor y = empty({rows, C}, bf), rstd = empty({rows}, DType::f32);
      Tensor mean = m_.llama ? Tensor() : empty({rows}, DType::f32);
      ops::norm_forward(kind, y, mean, rstd, x, w, b, 1e-5f);  // the statistics the backward reads
      const Tensor dy = rand({rows, C}, bf), dres = rand({rows, C}, bf);
      Tensor dx = empty({rows, C}, bf), dw = zeros({C}), db = m_.llama ? Tensor() : zeros({C});
      // dy, x and the residual gradient read, dx written (dw, db: C each).
      time(std::string(norm) + "_backward", dims({rows, C}), 4 * rows * C * es,
           [&] { ops::norm_backward(kind, dx, dw, db, dy, x, w, mean, rstd, dres); });
#ifdef ZT_WITH_CUDA
      // Each of the kernels the row above races (the same bits): one pass,
      // and two on its blocks.
      if (dev_.is_cuda())
        for (const auto& [name, kernel] : {std::pair{"_backward_one_pass", cuda::NormBackwardKernel::one_pass},
                                           std::pair{"_backward_two_pass", cuda::NormBackwardKernel::two_pass}})
          time(std::string(norm) + name, dims({rows, C}), 4 * rows * C * es, [&, kernel = kernel] {
            cuda::norm_backward(m_.llama, dx, dw, db, dy, x, w, mean, rstd, dres, false, kernel);
          });
#endif
    }
    if (m_.llama) {  // SwiGLU over [gate | up] rows; RoPE on the queries in place, and the qkv split
      const int64_t F = m_.F;
      // At the bench's rows and up to a training run's (micro-batch 64 on an
      // H200: 8x). The backward ran at 87% of the copy rate at 1x but 58% at
      // 4x, and 50% in training at 8x, while the forward held 92-95%
      // (bench/results/gpu-2026-11-27.md): the sweep says where it falls off.
      // A guess to test: dx and x have one layout, and at 4x their buffers
      // lie a large power of two apart, so each write may land in the DRAM
      // bank its neighbours read. Hence two more backward rows: in place
      // over x (the model's call since this change), and dx at an odd
      // offset (3 MiB + 5.75 KiB into its buffer).
      for (const int64_t rows : {N, 2 * N, 4 * N, 8 * N}) {
        const Tensor x = rand({rows, 2 * F}, bf, -4, 4), dy = rand({rows, F}, bf);
        Tensor y = empty({rows, F}, bf), dx = empty({rows, 2 * F}, bf);
        time("swiglu_forward", dims({rows, 2 * F}), 3 * rows * F * es, [&] { ops::swiglu_forward(y, x); });
        time("swiglu_backward", dims({rows, 2 * F}), 5 * rows * F * es, [&] { ops::swiglu_backward(dx, dy, x); });
        dx = Tensor();
        {
          Tensor in_place = empty({rows, 2 * F}, bf);
          ops::copy(in_place, x);
          // Each run reads the last one's gradients as its input: finite,
          // the same work.
          time("swiglu_backward_in_place", dims({rows, 2 * F}), 5 * rows * F * es,
               [&] { ops::swiglu_backward(in_place, dy, in_place); });
        }
        {
          const int64_t pad = ((3 << 20) + 5 * 1024 + 768) / 2;  // bf16 elements, 16-byte aligned
          const Tensor padded = empty({pad + rows * 2 * F}, bf);
          const Tensor shifted = padded.flat_view(pad, Shape{rows, 2 * F});
          time("swiglu_backward_dx_offset", dims({rows, 2 * F}), 5 * rows * F * es,
               [&] { ops::swiglu_backward(shifted, dy, x); });
        }
      }
      Tensor table = Tensor::empty(Shape{m_.T, m_.D / 2, 2}, DType::f32, dev_);
      ops::rope_table(table, m_.D, 500000.0, ops::RopeScaling{});
      Tensor q = rand({m_.B, m_.T, m_.Hq, m_.D}, bf);
      time("rope_forward", dims({m_.B, m_.T, m_.Hq, m_.D}), 2 * N * m_.Hq * m_.D * es,
           [&] { ops::rope_forward(q, q, table, 0); });
      // The fused qkv product's split into rotated q, k and copied v, and the
      // gradients' join (the step's RoPE pass, nn::qkv_form); shape
      // B x T x Hq x Hkv x D, every element read once and written once.
      const int64_t H = m_.Hq + 2 * m_.Hkv;
      const Tensor qkv = rand({m_.B, m_.T, H, m_.D}, bf);
      Tensor dqkv = empty({m_.B, m_.T, H, m_.D}, bf), k = empty({m_.B, m_.T, m_.Hkv, m_.D}, bf),
             v = empty({m_.B, m_.T, m_.Hkv, m_.D}, bf);
      const std::string split = dims({m_.B, m_.T, m_.Hq, m_.Hkv, m_.D});
      time("rope_split_qkv_forward", split, 2 * N * H * m_.D * es,
           [&] { ops::rope_split_qkv_forward(q, k, v, qkv, table, 0); });
      time("rope_split_qkv_backward", split, 2 * N * H * m_.D * es,
           [&] { ops::rope_split_qkv_backward(dqkv, q, k, v, table, 0); });
      // The same product's query and key heads rotated in place (the GPU's
      // form, nn::qkv_form), and its gradient's: value heads not moved.
      // Repeated runs rotate on (the same work).
      const int64_t rotated = 2 * N * (m_.Hq + m_.Hkv) * m_.D * es;
      Tensor packed = rand({m_.B, m_.T, H, m_.D}, bf);
      time("rope_packed_qkv_forward", split, rotated,
           [&] { ops::rope_packed_qkv_forward(packed, m_.Hq, m_.Hkv, table, 0); });
      time("rope_packed_qkv_backward", split, rotated,
           [&] { ops::rope_packed_qkv_backward(packed, m_.Hq, m_.Hkv, table, 0); });
    } else {  // GeLU forward (its backward is fused into a product)
      const int64_t F = m_.F;
      const Tensor x = rand({N, F}, bf, -4, 4);
      Tensor y = empty({N, F}, bf);
      time("gelu_forward", dims({N, F}), 2 * N * F * es, [&] { ops::gelu_forward(y, x); });
    }
    {  // the fused classifier over one LM-head chunk, dlogits in place over the logits
      const int64_t rows = head_chunk_rows(N);
      const Tensor logits0 = rand({rows, m_.Vp}, bf, -8, 8);
      Tensor logits = empty({rows, m_.Vp}, bf), losses = empty({rows}, DType::f32);
      const Tensor targets = random_ids(rows);  // on the host, as the model passes them
      ops::copy(logits, logits0);
      // Each run overwrites the logits with dlogits: the later runs read
      // gradients (finite, the same work), not the first logits.
      time("cross_entropy_fused", dims({rows, m_.Vp}), 2 * rows * m_.Vp * es,
           [&] { ops::softmax_cross_entropy(losses, logits, logits, targets, m_.V, 1.0f / float(N)); }, m_.V);
#ifdef ZT_WITH_CUDA
      // Each kernel (cross_entropy_kernels.cuh): the row staged in shared
      // memory, and re-read at 1, 2 or 4 rows in flight per SM; "*" after
      // the one training takes: the environment's pin, else the one its race
      // chose before the cross_entropy_fused row was timed (its line follows).
      if (dev_.is_cuda()) {
        const Tensor gpu_targets = ops::on_device(targets, dev_);
        std::optional<cuda::ClassifierKernel> trained = cuda::pinned_classifier_kernel();
        if (!trained)
          for (const cuda::ClassifierRaceStanding& race : cuda::classifier_races())
            if (race.call.starts_with(std::to_string(rows) + " x " + std::to_string(m_.Vp) + " ") &&
                race.tally.decided())
              trained = cuda::kClassifierCandidates[race.tally.winner()];
        const auto time_kernel = [&](const std::string& name, cuda::ClassifierKernel k) {
          time(name + (trained == k ? "*" : ""), dims({rows, m_.Vp}), 2 * rows * m_.Vp * es, [&] {
            cuda::softmax_cross_entropy(losses, logits, logits, gpu_targets, m_.V, 1.0f / float(N), k);
          }, m_.V);
        };
        time_kernel("cross_entropy_fused_staged", {.staged = true});
        for (const int r : {1, 2, 4}) time_kernel("cross_entropy_fused_rows" + std::to_string(r), {.rows_per_sm = r});
      }
#endif
    }
    {  // embedding: wte (+ wpe) gather; backward into f32 gradients (positions grouped on the host)
      const Tensor wte = rand({m_.Vp, m_.C}, bf), wpe = m_.llama ? Tensor() : rand({m_.T, m_.C}, bf);
      const Tensor tokens = random_ids(N).view(Shape{m_.B, m_.T});
      Tensor out = empty({m_.B, m_.T, m_.C}, bf);
      const double wpe_bytes = m_.llama ? 0.0 : double(m_.T * C) * es;
      time("embedding_forward", dims({m_.B, m_.T, C}), 2 * N * C * es + wpe_bytes,
           [&] { ops::embedding_forward(out, tokens, wte, wpe); }, m_.V);
      Tensor dwte = zeros({m_.Vp, m_.C}), dwpe = m_.llama ? Tensor() : zeros({m_.T, m_.C});
      const int32_t* t = tokens.data<int32_t>();
      const double distinct = double(std::unordered_set<int32_t>(t, t + N).size());
      // dout read; each distinct id's f32 row (and each position's) read and written.
      time("embedding_backward", dims({m_.B, m_.T, C}),
           N * C * es + 2 * distinct * double(C) * 4 + (m_.llama ? 0.0 : 2.0 * double(m_.T * C) * 4),
           [&] { ops::embedding_backward(dwte, dwpe, out, tokens); }, m_.V);
      // Ids as text repeats them: a few tokens take thousands of positions.
      const Tensor text = zipf_ids(N).view(Shape{m_.B, m_.T});
      const int32_t* z = text.data<int32_t>();
      const double text_distinct = double(std::unordered_set<int32_t>(z, z + N).size());
      time("embedding_backward_zipf", dims({m_.B, m_.T, C}),
           N * C * es + 2 * text_distinct * double(C) * 4 + (m_.llama ? 0.0 : 2.0 * double(m_.T * C) * 4),
           [&] { ops::embedding_backward(dwte, dwpe, out, text); }, m_.V);
    }
    if (!m_.llama) {  // the optimizer step and the gradient norm over every parameter (f32 state, bf16 copy)
      const int64_t P = m_.params;
      const Tensor g = rand({P}, DType::f32, -1e-3f, 1e-3f);
      Tensor p = rand({P}, DType::f32), mo = zeros({P}), v = zeros({P}), copy = empty({P}, bf);
      ops::AdamWParams hp;
      hp.lr = 1e-4f;
      hp.weight_decay = 0.1f;
      // p, g, m, v read; p, m, v and the bf16 copy written.
      time("adamw_step", dims({P}), double(P) * (16 + 12 + 2), [&] { ops::adamw_step(p, g, mo, v, copy, hp); });
      time("global_norm", dims({P}), double(P) * 4, [&] { ops::global_norm(std::span<const Tensor>(&g, 1)); });
      time("zero_grads", dims({P}), double(P) * 4, [&] { ops::fill(mo, 0.0); });
    }
  }

 private:
  // Rows of one LM-head chunk of N tokens, as the model cuts them (nn::head_chunk_rows).
  int64_t head_chunk_rows(int64_t N) const {
    return nn::head_chunk_rows(N, m_.Vp, nn::default_head_chunk_elems(dev_));
  }
  Tensor empty(std::initializer_list<int64_t> s, DType dt) { return Tensor::empty(Shape(s), dt, dev_); }
  Tensor zeros(std::initializer_list<int64_t> s) {
    Tensor t = empty(s, DType::f32);
    ops::fill(t, 0.0);
    return t;
  }
  Tensor rand(std::initializer_list<int64_t> s, DType dt, float lo = -1.0f, float hi = 1.0f) {
    Tensor t = empty(s, dt);
    ops::fill_uniform(t, gen_, lo, hi);
    return t;
  }
  // Host i32 ids in [0, V) (the ops validate ids on the host and upload them).
  Tensor random_ids(int64_t n) {
    Tensor ids = Tensor::empty(Shape{n}, DType::i32);
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < n; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      ids.data<int32_t>()[i] = int32_t((s >> 33) % uint64_t(m_.V));
    }
    return ids;
  }
  // Host i32 ids as text repeats tokens: rank r (id r - 1) with probability
  // proportional to 1 / r (Zipf's law; the most frequent id is about 9% of
  // positions at GPT-2's vocabulary, as one token is 7% of the demo corpus).
  Tensor zipf_ids(int64_t n) {
    std::vector<double> cdf(size_t(m_.V));
    double total = 0;
    for (int64_t r = 0; r < m_.V; ++r) cdf[size_t(r)] = total += 1.0 / double(r + 1);
    Tensor ids = Tensor::empty(Shape{n}, DType::i32);
    uint64_t s = 0x2545f4914f6cdd1dull;
    for (int64_t i = 0; i < n; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const double u = double(s >> 11) * 0x1p-53 * total;
      ids.data<int32_t>()[i] = int32_t(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
    }
    return ids;
  }
  void time(const std::string& op, const std::string& shape, double bytes, const std::function<void()>& run,
            int64_t vocab = 0) {
    if (!selected(m_.name, op)) return;
    guarded(m_.name, op, [&] {
      settle_races(run);
      print_row(m_.name, op.c_str(), shape, vocab, median_seconds(dev_, run), bytes, copy_gbps_);
    });
  }
  // An op whose kernels race (kernel_race.h) reads a call's time on a later
  // call, once it has completed: queued back to back, the timed runs would
  // take the candidates in turn and the row would time their mix. Each of
  // these calls waits for the GPU, so the race has decided (the most
  // candidates an op races, each timed kRaceSamples times) before timing.
  void settle_races(const std::function<void()>& run) {
#ifdef ZT_WITH_CUDA
    if (!dev_.is_cuda()) return;  // (under a profiler too: these calls are not captured)
    constexpr int kMostCandidates = int(std::size(cuda::kClassifierCandidates));
    for (int i = 0; i < kMostCandidates * cuda::kRaceSamples; ++i) {
      run();
      ops::synchronize(dev_);
    }
#else
    (void)run;
#endif
  }

  Device dev_;
  Model m_;
  double copy_gbps_, gemm_tflops_;
  Generator gen_;
  static constexpr int64_t kLargeWorkspaceMiB = 256;  // the candidate sweep's second workspace
  Tensor large_workspace_;                           // made on the first sweep (GPU only)
};

// The model with its tokens (B x T), vocabulary and parameters divided by
// `divisor` (a harness check on small shapes); widths kept.
Model shrunk(Model m, int64_t divisor) {
  if (divisor == 1) return m;
  int64_t tokens = std::max<int64_t>(64, m.B * m.T / divisor);
  m.B = 1;
  m.T = std::min<int64_t>(m.T, tokens);
  m.Vp = std::max<int64_t>(128, m.Vp / divisor / 128 * 128);
  m.V = std::min(m.V, m.Vp - 3);  // a few padding columns
  m.params /= divisor;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string where = argc > 1 ? argv[1] : "cuda";
  const int64_t divisor = argc > 2 ? std::max<int64_t>(1, std::stoll(argv[2])) : 1;
  if (where != "cuda" && where != "cpu") {
    std::fprintf(stderr, "usage: zt_bench_gpu_kernels [cuda|cpu] [row divisor]\n");
    return 2;
  }
  try {  // the switches' errors before any work
    selected("", "");
    bench::profiling_run();
#ifdef ZT_WITH_CUDA
    if (where == "cuda") ops::read_device_environment();  // every ZT_CUDA_* / ZT_CUDNN_* switch
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  if (where == "cuda" && ops::gpu_count() == 0) {
    std::fprintf(stderr, "no GPU: nothing to time (zt_bench_gpu_kernels cpu 64 checks the harness)\n");
    return 1;
  }
  const Device dev = where == "cuda" ? Device::cuda(0) : Device::cpu();
  ops::init_device(dev);
  // The device's copy rate (bytes read + written) on a 1 GiB buffer (scaled with the rows).
  const int64_t n = (int64_t(1) << 28) / divisor;
  Tensor a = Tensor::empty(Shape{n}, DType::f32, dev), b = Tensor::empty(Shape{n}, DType::f32, dev);
  ops::fill(a, 1.0);
  const double copy_gbps = 2.0 * double(a.nbytes()) / median_seconds(dev, [&] { ops::copy(b, a); }) / 1e9;
  // The A/B switches set for this run, so that two runs' rows can be told apart.
  std::string switches;
  for (const char* name : {"ZT_CUDA_KERNEL_RACES", "ZT_CUDA_NORM_BACKWARD", "ZT_CUDA_CE_STAGED", "ZT_CUDA_CE_ROWS",
                           "ZT_CUDA_WGRAD_CHUNKS", "ZT_CUDA_MATMUL_TUNE", "ZT_CUDA_MATMUL_CUBLAS",
                           "ZT_CUDA_BGRAD_EPILOGUE", "ZT_CUDA_GELU_EPILOGUE", "ZT_CUDA_CUBLAS_WORKSPACE_MIB",
                           "ZT_FUSED_QKV", "ZT_HEAD_CHUNK_ELEMS"})
    if (const char* value = std::getenv(name); value && *value) {
      if (!switches.empty()) switches += ' ';
      switches.append(name).append("=").append(value);
    }
  std::printf("{\"copy_gbps\": %.1f, \"device\": \"%s\", \"environment\": \"%s\"}\n", copy_gbps, where.c_str(),
              switches.c_str());
  a = b = Tensor();
  // name, llama, B, T, C, F, Vp, V, Hq, Hkv, D, parameters (GPT-2 124M: the
  // padded vocabulary's tied embedding included).
  const Model gpt2{"gpt2-124m", false, 16, 1024, 768, 3072, 50304, 50257, 12, 12, 64, 124475904};
  const Model llama{"llama3-1b", true, 8, 1024, 2048, 8192, 128256, 128256, 32, 8, 64, 0};
  double gemm_tflops = 0;  // the products' yardstick: this GPU's dense bf16 GEMM rate
#ifdef ZT_WITH_CUDA
  if (dev.is_cuda()) gemm_tflops = cuda::measure_bf16_gemm_tflops(dev);
#endif
  std::printf("{\"gemm_tflops\": %.1f}\n", gemm_tflops);
  for (const Model& m : {shrunk(gpt2, divisor), shrunk(llama, divisor)}) {
    Bench bench(dev, m, copy_gbps, gemm_tflops);
    bench.run_all();
    bench.run_products();
    // At 16384 rows the rule chunks; from 32768 on it takes one product
    // (matmul.h): both sides of that line.
    for (const int64_t rows : {int64_t(16 * 1024), m.llama ? int64_t(32 * 1024) : int64_t(128 * 1024)})
      bench.run_wgrad_chunks(rows);
  }
#ifdef ZT_WITH_CUDA
  // The races the automatic rows ran (the classifier's, the norms'
  // backward): what training would choose for those shapes.
  if (dev.is_cuda())
    for (const std::string& line : cuda::kernel_race_lines()) std::printf("{\"race\": \"%s\"}\n", line.c_str());
#endif
  if (failed_rows > 0) std::fprintf(stderr, "%d rows failed (above); the others are timed\n", failed_rows);
  return failed_rows > 0 ? 1 : 0;
}
