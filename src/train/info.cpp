#include "train/info.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/peak_rate.h"
#include "core/allocator.h"
#include "core/error.h"
#include "nn/transformer.h"
#include "ops/device.h"

namespace zt::train {

namespace {

// One training step of a random micro-batch per policy on `device`: the
// allocator's peak of activations over each.
void measure_activations(const Config& cfg, Device device, InfoReport& r) {
  const nn::ModelConfig& m = cfg.model;
  nn::Transformer model(m, cfg.compute_dtype(), device);
  model.head_chunk_elems = nn::default_head_chunk_elems(device);  // as the run will chunk
  model.init_weights(uint64_t(cfg.train.seed));
  const int64_t B = cfg.train.micro_batch, T = cfg.train.seq_len;
  Tensor tokens = Tensor::empty(Shape{B, T}, DType::i32), targets = Tensor::empty(Shape{B, T}, DType::i32);
  std::mt19937 gen(1);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens.data<int32_t>()[i] = int32_t(gen() % uint32_t(m.vocab_size));
    targets.data<int32_t>()[i] = int32_t(gen() % uint32_t(m.vocab_size));
  }
  Allocator& alloc = allocator_for(device);
  for (PolicyMemory& pm : r.activations) {
    model.recompute = pm.policy;
    const int64_t before = alloc.stats().current(MemCategory::activations);
    alloc.reset_peak();
    nn::ForwardContext ctx;
    model.forward(ctx, tokens, targets, true, 1.0f / float(B * T));
    model.backward(ctx);
    pm.measured_activation_bytes = alloc.stats().peak(MemCategory::activations) - before;
  }
}

}  // namespace

int64_t measured_step_bytes(const InfoReport& r) {
  int64_t act = 0;
  for (const PolicyMemory& pm : r.activations) act = std::max(act, pm.estimated_activation_bytes);
  return r.param_bytes + r.grad_bytes + act + std::max<int64_t>(r.workspace_bytes, 0);
}

double measured_step_flops(const Config& cfg) {
  const double step = cfg.model.train_flops_per_token(cfg.train.seq_len) * double(cfg.train.micro_batch) *
                      double(cfg.train.seq_len);
  return step * (1.0 + 1.0 + 4.0 / 3.0);  // none, selective, full (its blocks' forward twice)
}

std::string measure_cost_verdict(Device device, int64_t need_bytes, int64_t available_bytes, double flops,
                                 double gflops) {
  if (available_bytes > 0 && need_bytes > available_bytes)
    return zt::detail::concat("it needs about ", format_gib(double(need_bytes)), " on ", device.str(), ", ",
                              format_gib(double(available_bytes)), " are free");
  if (device.is_cpu() && gflops > 0) {
    const double seconds = flops / (gflops * 1e9);
    if (seconds > kMeasureBudgetSeconds) {
      char b[160];
      std::snprintf(b, sizeof b, "it is %.0f TFLOP, about %.0f %s on the CPU (sgemm %.0f GFLOP/s)", flops / 1e12,
                    seconds < 600 ? seconds : seconds / 60.0, seconds < 600 ? "seconds" : "minutes", gflops);
      return b;
    }
  }
  return "";
}

InfoReport make_info(const Config& cfg, Measure measure) {
  const nn::ModelConfig& m = cfg.model;
  InfoReport r;
  const int64_t C = m.d_model;
  r.components.push_back({"token embedding (wte)", m.vocab_size * C});
  if (m.learned_positions()) r.components.push_back({"position embedding (wpe)", m.max_seq_len * C});
  const int64_t attn = m.qkv_width() * C + C * C + (m.has_bias() ? m.qkv_width() + C : 0);
  const int64_t mlp = m.mlp_params() + (m.has_bias() ? m.mlp_in_width() + C : 0);
  const int64_t norms = (m.has_bias() ? 4 : 2) * C;
  r.components.push_back({"attention (all layers)", attn * m.n_layer});
  r.components.push_back({m.moe() ? "experts + routers (all layers)" : "mlp (all layers)", mlp * m.n_layer});
  r.components.push_back({"norms (all layers + final)", norms * m.n_layer + (m.has_bias() ? 2 : 1) * C});
  if (!m.tied_embeddings) r.components.push_back({"lm head", m.vocab_size * C});
  r.total_params = m.total_params();
  r.non_embedding_params = m.non_embedding_params();
  r.flops_per_token = m.train_flops_per_token(cfg.train.seq_len);
  const MemoryPlan plan = plan_memory(cfg);
  r.param_bytes = plan.weights;
  r.grad_bytes = plan.gradients;
  r.optimizer_bytes = plan.optimizer;
  r.workspace_bytes = plan.workspace;
  r.offload_bytes = plan.offload;

  for (nn::Recompute policy : {nn::Recompute::none, nn::Recompute::selective, nn::Recompute::full})
    r.activations.push_back({policy, estimate_activation_bytes(cfg, policy), -1});
  if (measure == Measure::off) return r;
  // On the config's device; the CPU when this machine lacks it (the
  // allocator's accounting, and so the activation bytes, are the same).
  Device device = parse_device(cfg.train.device);
  std::string fallback;  // why not the config's device
  if (device.is_cuda() && device.index >= ops::gpu_count()) {
    fallback = "the config's " + device.str() + " is not on this machine";
    device = Device::cpu();
  }
  if (measure == Measure::when_affordable) {
    const double gflops = device.is_cpu() ? cpu::measure_sgemm_gflops(0.2) : 0.0;
    // What is free now: the host's available memory, a GPU's free memory
    // beside its CUDA context and libraries (training_memory).
    const int64_t available =
        device.is_cpu() ? host_meminfo_bytes("MemAvailable") : training_memory(device, 1).usable;
    r.measure_skipped =
        measure_cost_verdict(device, measured_step_bytes(r), available, measured_step_flops(cfg), gflops);
    if (!r.measure_skipped.empty()) {
      if (!fallback.empty()) r.measure_skipped = fallback + " and " + r.measure_skipped;
      return r;
    }
  }
  ops::init_device(device);
  try {
    measure_activations(cfg, device, r);
  } catch (const Error& e) {  // out of device memory: the estimates still stand
    for (PolicyMemory& pm : r.activations) pm.measured_activation_bytes = -1;
    r.measure_skipped = e.what();
    return r;
  }
  r.measured_on = fallback.empty() ? device.str() : device.str() + " (" + fallback + ")";
  return r;
}

std::string format_info(const Config& cfg, const InfoReport& r) {
  std::ostringstream os;
  char line[256];
  const double MiB = 1024.0 * 1024.0;
  const nn::ModelConfig& m = cfg.model;
  std::snprintf(line, sizeof line, "model: %s, %s, %lld layers, d_model %lld, %lld heads (%lld kv), d_ff %lld, vocab %lld (padded %lld)\n",
                cfg.model_preset.empty() ? "custom" : cfg.model_preset.c_str(), std::string(nn::arch_name(m.arch)).c_str(),
                (long long)m.n_layer, (long long)m.d_model, (long long)m.n_head, (long long)m.n_kv_head,
                (long long)m.d_ff, (long long)m.vocab_size, (long long)m.padded_vocab());
  os << line;
  if (m.moe()) os << nn::moe_summary(m) << "\n";
  os << "\nparameters\n";
  for (const auto& c : r.components) {
    std::snprintf(line, sizeof line, "  %-28s %14lld  (%5.1f%%)\n", c.name.c_str(), (long long)c.params,
                  100.0 * double(c.params) / double(r.total_params));
    os << line;
  }
  std::snprintf(line, sizeof line, "  %-28s %14lld\n  %-28s %14lld\n", "total", (long long)r.total_params,
                "non-embedding (N)", (long long)r.non_embedding_params);
  os << line;
  std::snprintf(line, sizeof line,
                "\ntraining FLOPs per token at T=%lld: %.4g (6N + 12 L d T, N = %lld parameters in matmuls: "
                "blocks + LM head%s)\n",
                (long long)cfg.train.seq_len, r.flops_per_token, (long long)cfg.model.matmul_params(),
                m.moe() ? "; of the experts, the k a token uses" : "");
  os << line;
  std::snprintf(line, sizeof line, "\nmemory (one process, %s)\n  %-28s %10.1f MiB\n  %-28s %10.1f MiB\n  %-28s %10.1f MiB\n",
                cfg.train.dtype.c_str(), "parameters", double(r.param_bytes) / MiB, "gradients (f32)",
                double(r.grad_bytes) / MiB, "optimizer (AdamW m, v[, master])", double(r.optimizer_bytes) / MiB);
  os << line;
  if (r.workspace_bytes >= 0) {
    std::snprintf(line, sizeof line, "  %-28s %10.1f MiB\n", "workspace (cuBLASLt, attention)",
                  double(r.workspace_bytes) / MiB);
    os << line;
  } else if (parse_device(cfg.train.device).is_cuda()) {
    os << "  workspace: asked of the GPU's backend, so planned only on a machine with the GPU ("
       << (cfg.train.deterministic
               ? "cuDNN's deterministic attention backward keeps B x Hq x T^2 x 2 bytes on an H100, in batch chunks "
                 "of at most 1 GiB"
               : "cuDNN's attention backward with atomics, train.deterministic = false, takes an f32 dq "
                 "accumulator of B x T x Hq x D x 4 bytes")
       << ", plus cuBLASLt's 32 MiB or ZT_CUDA_CUBLAS_WORKSPACE_MIB's)\n";
  }
  if (r.offload_bytes > 0) {
    // What waits in host memory: on a GPU beside the device's, on the CPU in the same memory.
    std::string what = cfg.optim.offload ? "the optimizer's master, m, v and staging" : "";
    if (cfg.train.offload_activations)
      what += std::string(what.empty() ? "" : "; ") + "the blocks' kept activations of a micro-batch";
    std::snprintf(line, sizeof line, "  %-28s %10.1f MiB (%s)\n", "offloaded to host memory", double(r.offload_bytes) / MiB,
                  what.c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "  activations per micro-batch (%lld x %lld tokens%s):\n    %-10s %14s %14s\n",
                (long long)cfg.train.micro_batch, (long long)cfg.train.seq_len,
                cfg.train.offload_activations ? "; on the device, the blocks' kept tensors offloaded" : "",
                "recompute", "estimate MiB", "measured MiB");
  os << line;
  for (const auto& a : r.activations) {
    char measured[32] = "-";
    if (a.measured_activation_bytes >= 0)
      std::snprintf(measured, sizeof measured, "%.1f", double(a.measured_activation_bytes) / MiB);
    std::snprintf(line, sizeof line, "    %-10s %14.1f %14s\n", std::string(nn::recompute_name(a.policy)).c_str(),
                  double(a.estimated_activation_bytes) / MiB, measured);
    os << line;
  }
  if (!r.measured_on.empty()) os << "  measured: one training step per policy on " << r.measured_on << "\n";
  if (!r.measure_skipped.empty()) os << "  not measured: " << r.measure_skipped << "; `--measure` runs it anyway\n";
  return os.str();
}

std::string format_layout_plan(const Config& cfg, const PlanPlace& layout, Device device, int64_t capacity_bytes,
                               bool list_splits) {
  std::ostringstream os;
  const auto verdict = [&](int64_t total) -> std::string {
    if (capacity_bytes <= 0) return "";
    return plan_fits(total, capacity_bytes) ? "fits" : "does not fit";
  };
  os << "\nmemory per rank: " << describe_layout(layout) << " (" << layout.dp * layout.tp * layout.pp
     << " processes), " << cfg.train.dtype << ", micro-batch " << cfg.train.micro_batch << ", recompute "
     << cfg.train.recompute << ", zero_stage " << cfg.parallel.zero_stage;
  if (layout.pp > 1) os << ", " << cfg.parallel.pp_schedule << " schedule";
  if (layout.tp > 1 && cfg.parallel.sequence_parallel) os << ", sequence parallel";
  os << "\n";
  MemoryPlan largest;
  PlanPlace worst;
  for (int64_t r = 0; r < layout.pp; ++r) {
    PlanPlace at;  // this stage's largest tp rank
    const MemoryPlan p = stage_plan(cfg, layout, r, &at);
    os << "  " << describe_place(at) << ": " << format_memory_plan(p, device, 0) << "\n";
    if (r == 0 || p.total() > largest.total()) largest = p, worst = at;
  }
  os << "  largest: " << describe_place(worst);
  if (capacity_bytes > 0)
    os << " (" << format_gib(double(largest.total())) << " of " << device.str() << "'s "
       << format_gib(double(capacity_bytes)) << ": " << verdict(largest.total()) << ")";
  if (!list_splits) return os.str() + "\n";
  os << "\n\nevery split of these processes with these settings (its largest rank; data parallelism first, then "
        "pipeline, then tensor):\n";
  char line[160];
  for (const LayoutPlan& lp : plan_layouts(cfg, layout.dp * layout.tp * layout.pp)) {
    std::snprintf(line, sizeof line, "  %-22s %10s  %s\n", describe_layout(lp.layout).c_str(),
                  format_gib(double(lp.plan.total())).c_str(), verdict(lp.plan.total()).c_str());
    os << line;
  }
  return os.str();
}

}  // namespace zt::train
