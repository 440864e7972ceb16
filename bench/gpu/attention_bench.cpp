// GPU attention timing (bench/gpu/run.sh attention): causal GQA attention
// forward and forward + backward, bf16, at the two training benchmark shapes,
// for each CUDA implementation (cuDNN's fused attention - its deterministic
// backward, and as "cudnn-atomic" the one that sums dq with atomics, which
// train.deterministic = false selects -, our fused mma and flash kernels, the
// tensor-core gemm path and the simple kernel). "cudnn-packed": cuDNN on q,
// k, v as the heads of one fused qkv product's output and dq, dk, dv written
// into one (attention_forward_packed: strided operands, GPT-2's training
// form), beside the dense "cudnn" row.
// Median of 10 timed runs after 3 warm-ups, CUDA events on the compute
// stream (gpu/median_time.h). Prints one JSON line per (shape, kernel);
// bench/gpu/attention_peer.py times PyTorch's flash SDPA on the same shapes
// for the ratio.
//
// FLOPs (causal, as FlashAttention counts them): forward 4 B Hq D T^2 / 2,
// forward + backward 3.5x that. With ZT_CUDNN_FORWARD_CONFIG or
// ZT_CUDNN_BACKWARD_CONFIG set (cuDNN's n-th engine configuration instead
// of its first choice), the cuDNN rows are named "cudnn f<n>" / "b<n>".
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "backend/cuda/attention.h"
#include "backend/cuda/runtime.h"
#include "core/rng.h"
#include "gpu/median_time.h"
#include "ops/device.h"
#include "ops/elementwise.h"

namespace {

using namespace zt;

struct Case {
  const char* name;
  int64_t B, T, Hq, Hkv, D;
};

}  // namespace

int main(int argc, char** argv) {
  // Optional: one kernel by name (cudnn, cudnn-packed, cudnn-atomic, mma, flash, tensor-core, simple), so a
  // kernel that faults spoils only its row.
  const std::string only = argc > 1 ? argv[1] : "";
  if (cuda::device_count() == 0) {
    std::fprintf(stderr, "no GPU: nothing to time\n");
    return 1;
  }
  const Device dev = Device::cuda(0);
  ops::init_device(dev);
  Generator gen(11);
  for (const Case c : {Case{"gpt2-124m", 16, 1024, 12, 12, 64}, Case{"llama3-1b", 8, 1024, 32, 8, 64}}) {
    auto tensor = [&](int64_t H) {
      Tensor t = Tensor::empty(Shape{c.B, c.T, H, c.D}, DType::bf16, dev);
      ops::fill_uniform(t, gen, -1.0f, 1.0f);
      return t;
    };
    const Tensor q = tensor(c.Hq), k = tensor(c.Hkv), v = tensor(c.Hkv), dout = tensor(c.Hq);
    Tensor out = Tensor::empty(q.shape(), DType::bf16, dev), lse = Tensor::empty(Shape{c.B, c.Hq, c.T}, DType::f32, dev);
    Tensor dq = Tensor::empty(q.shape(), DType::bf16, dev), dk = Tensor::empty(k.shape(), DType::bf16, dev),
           dv = Tensor::empty(v.shape(), DType::bf16, dev);
    const Tensor qkv = tensor(c.Hq + 2 * c.Hkv);  // the same values' layout as a fused product writes them
    Tensor dqkv = Tensor::empty(qkv.shape(), DType::bf16, dev);
    const float scale = float(1.0 / std::sqrt(double(c.D)));
    const double fwd_flops = 4.0 * double(c.B * c.Hq * c.D) * double(c.T) * double(c.T) / 2.0;
    struct Row {
      const char* name;
      cuda::AttentionKernel kernel;
      bool deterministic;
      bool packed = false;  // q, k, v (dq, dk, dv) the heads of one tensor
    };
    for (const Row row : {Row{"cudnn", cuda::AttentionKernel::cudnn, true},
                          Row{"cudnn-packed", cuda::AttentionKernel::cudnn, true, true},
                          Row{"cudnn-atomic", cuda::AttentionKernel::cudnn, false},
                          Row{"mma", cuda::AttentionKernel::mma, true}, Row{"flash", cuda::AttentionKernel::flash, true},
                          Row{"tensor-core", cuda::AttentionKernel::gemm, true},
                          Row{"simple", cuda::AttentionKernel::simple, true}}) {
      const cuda::AttentionKernel kernel = row.kernel;
      if (!only.empty() && only != row.name) continue;
      std::string label = row.name;
      for (const auto& [env, tag] : {std::pair{"ZT_CUDNN_FORWARD_CONFIG", " f"}, {"ZT_CUDNN_BACKWARD_CONFIG", " b"}}) {
        const char* n = std::getenv(env);
        if (kernel == cuda::AttentionKernel::cudnn && n && *n) label += tag + std::string(n);
      }
      const char* kname = label.c_str();
      if (kernel == cuda::AttentionKernel::cudnn) {
        const cuda::AttentionShape shape =
            row.packed ? cuda::packed_attention_shape(qkv, c.Hq, c.Hkv) : cuda::attention_shape(q, k);
        const std::string why =
            cuda::cudnn_attention_unsupported(shape, scale, cuda::AttentionPass{}) + " " +
            cuda::cudnn_attention_unsupported(shape, scale, cuda::AttentionPass{true, row.deterministic});
        if (why != " ") {  // no row: the reason goes to stderr (run.sh shows it)
          std::fprintf(stderr, "cuDNN cannot take %s: %s\n", c.name, why.c_str());
          continue;
        }
      }
      auto forward = [&] {
        if (row.packed)
          cuda::attention_forward_packed(out, lse, qkv, c.Hq, c.Hkv, scale, kernel);
        else
          cuda::attention_forward(out, lse, q, k, v, scale, kernel);
      };
      const double fwd = 1e3 * bench::median_seconds(dev, forward);
      const double both = 1e3 * bench::median_seconds(dev, [&] {
        forward();
        if (row.packed)
          cuda::attention_backward_packed(dqkv, dout, qkv, out, lse, c.Hq, c.Hkv, scale, kernel, row.deterministic);
        else
          cuda::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, kernel, row.deterministic);
      });
      std::printf(
          "{\"shape\": \"%s\", \"kernel\": \"%s\", \"forward_ms\": %.4f, \"forward_backward_ms\": %.4f, "
          "\"forward_tflops\": %.1f, \"forward_backward_tflops\": %.1f}\n",
          c.name, kname, fwd, both, fwd_flops / (fwd * 1e9), 3.5 * fwd_flops / (both * 1e9));
      std::fflush(stdout);
    }
  }
  return 0;
}
