// `zettatron plan CONFIG`: the config's layout and the fastest layouts of its
// model on a cluster, predicted (plan/).
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "plan/calibrate.h"
#include "plan/cluster.h"
#include "plan/search.h"
#include "train/config.h"

namespace zt::cli {

namespace {

// The model, its FLOPs and the batch: what every layout shares.
void print_job(const train::Config& cfg) {
  const nn::ModelConfig& m = cfg.model;
  std::printf("model: %s, %lld layers x %lld wide, %.1fM parameters", nn::arch_name(m.arch).data(),
              (long long)m.n_layer, (long long)m.d_model, double(m.total_params()) / 1e6);
  if (m.moe()) std::printf(" (%.1fM active)", double(m.active_params()) / 1e6);
  std::printf("; %.2f GFLOP per token at seq_len %lld; global batch %lld x %lld tokens, %s\n",
              m.train_flops_per_token(cfg.train.seq_len) / 1e9, (long long)cfg.train.seq_len,
              (long long)cfg.train.global_batch, (long long)cfg.train.seq_len, cfg.train.dtype.c_str());
  // The step model prices every product at the compute dtype's GEMM rate:
  // fp8's has not been measured here, so its speed-up is left out, not guessed.
  if (cfg.train.fp8)
    std::printf("train.fp8: the blocks' products are predicted at the %s GEMM rate (fp8's own is not measured "
                "yet): the steps below leave its speed-up and its quantisation passes out\n",
                cfg.train.dtype.c_str());
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  struct Opts {
    std::string config, cluster = "cpu", calibrate;
    std::vector<std::string> overrides;
    int64_t nodes = 1, devices_per_node = 0, devices = 0;
    size_t top = 10;
    bool layout_only = false, json = false;
    double peak_tflops = 0, gemm_tflops = 0, step_efficiency = 0, memory_gib = 0, intra_gbps = 0, inter_gbps = 0;
    double host_gib = 0, host_link_gbps = 0, host_memory_gbps = 0;
  };
  auto opts = std::make_shared<Opts>();
  Command c;
  c.app = app.add_subcommand("plan", "Predict a config's step time and memory on a cluster and search the fastest "
                                     "layout (dp, tp, pp, cp, ep, ZeRO stage, micro-batch, recompute)");
  c.app->add_option("config", opts->config, "TOML config")->required()->check(CLI::ExistingFile);
  c.app->add_option("--set", opts->overrides, "Override a config value: section.key=value");
  c.app->add_option("--cluster", opts->cluster, "Cluster preset: h100-sxm, h200-sxm or cpu (this machine, measured)")
      ->capture_default_str();
  c.app->add_option("--nodes", opts->nodes, "Nodes")->check(CLI::PositiveNumber)->capture_default_str();
  c.app->add_option("--devices-per-node", opts->devices_per_node,
                    "Devices (GPUs, or processes on a CPU) per node (default: the preset's; cpu: 1)")
      ->check(CLI::PositiveNumber);
  c.app->add_option("--devices", opts->devices, "Devices the search uses (default: every one)")
      ->check(CLI::PositiveNumber);
  c.app->add_option("--top", opts->top, "Layouts listed")->capture_default_str();
  c.app->add_flag("--layout-only", opts->layout_only,
                  "Keep the config's ZeRO stage, micro-batch, recompute policy and pipeline schedule; vary only "
                  "the mesh");
  c.app->add_flag("--json", opts->json,
                  "Print only the config's own layout's prediction, as JSON (step, its parts, bytes per dimension)");
  c.app->add_option("--calibrate", opts->calibrate,
                    "A run directory of `zettatron train` on this cluster's machines: the step efficiency that "
                    "predicts its measured tokens/s (median after two steps) is used for every layout")
      ->check(CLI::ExistingDirectory);
  c.app->add_option("--peak-tflops", opts->peak_tflops, "Override: dense peak per device (MFU's denominator)");
  c.app->add_option("--gemm-tflops", opts->gemm_tflops, "Override: a large GEMM's measured rate per device");
  c.app->add_option("--step-efficiency", opts->step_efficiency,
                    "Override: the share of the GEMM rate a training step reaches (0..1)");
  c.app->add_option("--memory-gib", opts->memory_gib, "Override: memory per device for training");
  c.app->add_option("--intra-gbps", opts->intra_gbps, "Override: ring bus bandwidth per device in a node (GB/s)");
  c.app->add_option("--inter-gbps", opts->inter_gbps, "Override: ring bus bandwidth per device between nodes (GB/s)");
  c.app->add_option("--host-gib", opts->host_gib, "Override: host memory per device, for offloaded state");
  c.app->add_option("--host-link-gbps", opts->host_link_gbps, "Override: a device's link to the host, each way (GB/s)");
  c.app->add_option("--host-memory-gbps", opts->host_memory_gbps,
                    "Override: host memory bandwidth of a device's share of the cores (the offloaded optimizer, GB/s)");
  c.run = [opts] {
    const train::Config cfg = train::load_config(opts->config, opts->overrides);
    plan::Cluster cluster = plan::cluster_preset(opts->cluster, opts->nodes, opts->devices_per_node);
    if (opts->peak_tflops > 0) cluster.peak_flops = opts->peak_tflops * 1e12;
    if (opts->gemm_tflops > 0) cluster.matmul_flops = opts->gemm_tflops * 1e12;
    if (opts->step_efficiency > 0) cluster.step_efficiency = opts->step_efficiency;
    if (opts->memory_gib > 0) cluster.memory_bytes = int64_t(opts->memory_gib * double(int64_t(1) << 30));
    if (opts->intra_gbps > 0) cluster.intra_node_bandwidth = opts->intra_gbps * 1e9;
    if (opts->inter_gbps > 0) cluster.inter_node_bandwidth = opts->inter_gbps * 1e9;
    if (opts->host_gib > 0) cluster.host_memory_bytes = int64_t(opts->host_gib * double(int64_t(1) << 30));
    if (opts->host_link_gbps > 0) cluster.host_link_bandwidth = opts->host_link_gbps * 1e9;
    if (opts->host_memory_gbps > 0) cluster.host_memory_bandwidth = opts->host_memory_gbps * 1e9;
    if (!opts->calibrate.empty()) cluster = plan::calibrate(cluster, plan::read_measured_run(opts->calibrate));
    const int64_t world = opts->devices > 0 ? opts->devices : cluster.devices();
    if (opts->json) {
      const plan::Candidate own = plan::evaluate_layout(cfg, cluster, world);
      const plan::StepEstimate& e = own.step;
      const auto comm = [](const plan::CommTime& t, double bytes) {
        return nlohmann::json{{"s", t.seconds}, {"exposed_s", t.exposed_seconds}, {"bytes", bytes}};
      };
      const nlohmann::json j = {
          {"cluster", cluster.name},
          {"mesh", {{"dp", e.mesh.dp}, {"tp", e.mesh.tp}, {"pp", e.mesh.pp}, {"cp", e.mesh.cp}, {"ep", e.mesh.ep}}},
          {"memory_bytes", own.memory.total()},
          {"fits", own.fits},
          {"step_s", e.step_seconds},
          {"tokens_per_s", e.tokens_per_second},
          {"mfu", e.mfu},
          {"compute_s", e.compute_seconds},
          {"bubble_s", e.bubble_seconds},
          {"optimizer_s", e.optimizer_seconds},
          {"offload", {{"host_bytes", own.memory.offload}, {"activation_bytes", e.offload_bytes}, {"s", e.offload_seconds}}},
          {"dp", comm(e.dp, e.volumes.dp_bytes)},
          {"tp", comm(e.tp, e.volumes.tp_bytes)},
          {"cp", comm(e.cp, e.volumes.cp_bytes)},
          {"ep", comm(e.ep, e.volumes.ep_bytes)},
          {"pp", comm(e.pp, e.volumes.pp_bytes)}};
      std::cout << j.dump() << "\n";
      return 0;
    }
    std::cout << "cluster " << plan::describe_cluster(cluster) << "\n  (" << cluster.source << ")\n";
    print_job(cfg);
    // The config's own layout (parallel.dp = 0: the rest of the devices).
    try {
      const plan::Candidate own = plan::evaluate_layout(cfg, cluster, world);
      std::cout << "\nthe config's layout (" << own.mesh.str() << ")" << (own.fits ? "" : ": does not fit") << "\n"
                << plan::format_candidates({own}, 1);
    } catch (const Error& e) {
      std::cout << "\nthe config's layout cannot run on " << world << " devices: " << e.what() << "\n";
    }
    plan::SearchOptions so;
    so.world = world;
    so.vary_zero = so.vary_micro_batch = so.vary_recompute = so.vary_schedule = so.vary_offload = !opts->layout_only;
    const std::vector<plan::Candidate> found = plan::search_layouts(cfg, cluster, so);
    if (found.empty()) {
      std::cout << "\nno layout of " << world << " devices runs this config within "
                << double(cluster.memory_bytes) / double(int64_t(1) << 30)
                << " GiB per device: add devices, shorten train.seq_len or shrink the model\n";
      return 1;
    }
    const std::vector<plan::Candidate> meshes = plan::best_per_mesh(found);
    std::cout << "\n" << found.size() << " layouts of " << world << " devices run and fit, over " << meshes.size()
              << " meshes; the fastest setting of each of the fastest " << std::min(opts->top, meshes.size())
              << ":\n"
              << plan::format_candidates(meshes, opts->top);
    std::cout << "\nPredicted (plan/step_model.h): the model's FLOPs at the cluster's step efficiency, the pipeline's "
                 "bubble from its schedule, each dimension's bytes over the links its group spans less what overlaps "
                 "compute. A run's metrics.jsonl gives the measured tokens_per_s and comm_* to compare.\n";
    return 0;
  };
  return c;
}

}  // namespace zt::cli
