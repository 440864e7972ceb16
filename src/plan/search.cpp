#include "plan/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <tuple>

#include "core/error.h"

namespace zt::plan {

namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// What the trainer checks of a layout before it allocates (the config, the
// mesh, Config::check_layout on the cluster's kind of device), then the
// memory plan of its largest rank and, when it fits or `always_step`, the
// predicted step.
Candidate evaluate(const train::Config& cfg, const Cluster& cluster, const parallel::MeshShape& shape,
                   bool always_step) {
  cfg.validate();
  const parallel::MeshShape mesh = parallel::resolve_mesh_shape(shape, shape.world());
  cfg.check_layout(mesh);
  Candidate c;
  c.cfg = cfg;
  c.mesh = mesh;
  const train::PlanView view = train::context_parallel_view(cfg, {mesh.dp, mesh.tp, mesh.pp, 0, 0});
  c.memory = train::largest_rank_plan(view.cfg, view.layout);
  // Offloaded bytes are the devices' own on a CPU cluster, else the host's.
  c.memory.offload_on_device = !cluster.gpu;
  c.fits = train::plan_fits(c.memory.total(), cluster.memory_bytes) &&
           (c.memory.offload_on_device || train::plan_fits(c.memory.offload, cluster.host_memory_bytes));
  if (c.fits || always_step) c.step = estimate_step(cfg, mesh, cluster);
  return c;
}

}  // namespace

Candidate evaluate_layout(const train::Config& cfg, const Cluster& cluster, int64_t world) {
  const parallel::MeshShape mesh = parallel::resolve_mesh_shape(
      {cfg.parallel.dp, cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.cp, cfg.parallel.ep}, world);
  return evaluate(cfg, cluster, mesh, /*always_step=*/true);
}

std::vector<Candidate> search_layouts(const train::Config& cfg, const Cluster& cluster, const SearchOptions& options) {
  const int64_t world = options.world > 0 ? options.world : cluster.devices();
  ZT_CHECK(world <= cluster.devices(), "the search is over ", world, " devices; the cluster has ", cluster.devices());
  const nn::ModelConfig& m = cfg.model;
  std::vector<int64_t> zeros{cfg.parallel.zero_stage};
  if (options.vary_zero) zeros = {0, 1, 2, 3};
  std::vector<std::string> policies{cfg.train.recompute};
  if (options.vary_recompute) policies = {"none", "selective", "full"};
  std::vector<Candidate> out;
  // A layout that fits, or else (vary_offload, unless the config offloads
  // already) its offloaded variants that fit: offloading costs host-link
  // time every step, so it is tried only where nothing fits without it.
  const auto consider = [&](const train::Config& c, const parallel::MeshShape& shape) {
    Candidate cand = evaluate(c, cluster, shape, /*always_step=*/false);
    if (cand.fits) {
      out.push_back(std::move(cand));
      return;
    }
    if (!options.vary_offload || cfg.optim.offload || cfg.train.offload_activations) return;
    for (const auto& [optimizer, activations] : {std::pair{true, false}, {false, true}, {true, true}}) {
      train::Config o = c;
      o.optim.offload = optimizer;
      o.train.offload_activations = activations;
      Candidate off = evaluate(o, cluster, shape, /*always_step=*/false);
      if (off.fits) out.push_back(std::move(off));
    }
  };
  for (int64_t tp : divisors(world)) {
    if (tp > cluster.devices_per_node) continue;  // tensor parallelism needs a node's links
    for (int64_t cp : divisors(world / tp))
      for (int64_t pp : divisors(world / tp / cp)) {
        const int64_t dp = world / tp / cp / pp;
        std::vector<int64_t> eps{1};
        if (m.moe()) eps = divisors(std::gcd(m.n_expert, dp * cp));
        std::vector<int64_t> micro{cfg.train.micro_batch};
        if (options.vary_micro_batch && cfg.train.global_batch % dp == 0) micro = divisors(cfg.train.global_batch / dp);
        // (schedule, chunks per rank): one pass without a pipeline.
        std::vector<std::pair<std::string, int64_t>> schedules{{cfg.parallel.pp_schedule, cfg.parallel.virtual_stages}};
        if (pp == 1) schedules = {{cfg.parallel.pp_schedule, 1}};
        else if (options.vary_schedule) schedules = {{"1f1b", 1}, {"zb", 1}, {"interleaved", 2}};
        for (int64_t ep : eps)
          for (int64_t zero : zeros)
            for (int64_t mb : micro)
              for (const std::string& policy : policies)
                for (const auto& [schedule, chunks] : schedules) {
                  train::Config c = cfg;
                  c.parallel.dp = dp, c.parallel.tp = tp, c.parallel.pp = pp, c.parallel.cp = cp, c.parallel.ep = ep;
                  c.parallel.zero_stage = zero;
                  c.train.micro_batch = mb;
                  c.train.recompute = policy;
                  c.parallel.pp_schedule = schedule;
                  c.parallel.virtual_stages = chunks;
                  // The config's own blocks per stage where its stages are these; else the planner's balance.
                  if (pp != cfg.parallel.pp || chunks != cfg.parallel.virtual_stages) c.parallel.pp_layers = "";
                  try {
                    consider(c, {dp, tp, pp, cp, ep});
                  } catch (const Error&) {  // a layout the trainer would refuse
                  }
                }
      }
  }
  // Fastest first, where "as fast" is within 1% (finer than the model
  // predicts): then the lower ZeRO stage and the less recomputation (the
  // less communication and work left to overlap), the more rows a
  // micro-batch gives each product (micro_batch x seq_len / cp: its GEMMs
  // run nearer the rate on GPUs, which the model does not count), the
  // smaller context-parallel group (a ring the model counts as hidden), the
  // less memory.
  const auto key = [](const Candidate& c) {
    const int64_t rows = c.cfg.train.micro_batch * c.cfg.train.seq_len / c.cfg.parallel.cp;
    return std::make_tuple(-int64_t(std::floor(std::log(c.step.tokens_per_second) / std::log(1.01))),
                           c.cfg.parallel.zero_stage, int(c.cfg.recompute()),
                           int(c.cfg.optim.offload) + int(c.cfg.train.offload_activations), -rows, c.cfg.parallel.cp,
                           c.memory.total());
  };
  std::stable_sort(out.begin(), out.end(), [&](const Candidate& a, const Candidate& b) { return key(a) < key(b); });
  return out;
}

std::vector<Candidate> best_per_mesh(const std::vector<Candidate>& candidates) {
  std::vector<Candidate> out;
  for (const Candidate& c : candidates) {
    const auto same = [&](const Candidate& o) {
      return o.mesh.dp == c.mesh.dp && o.mesh.tp == c.mesh.tp && o.mesh.pp == c.mesh.pp && o.mesh.cp == c.mesh.cp &&
             o.mesh.ep == c.mesh.ep;
    };
    if (std::none_of(out.begin(), out.end(), same)) out.push_back(c);
  }
  return out;
}

std::string format_candidates(const std::vector<Candidate>& candidates, size_t limit) {
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%4s %4s %3s %3s %3s %3s %4s %4s %-9s %-13s %-7s %9s %9s %11s %6s | %s\n", "#", "dp",
                "tp", "pp", "cp", "ep", "zero", "mb", "recompute", "schedule", "offload", "mem GiB", "step ms",
                "tokens/s", "MFU", "ms: compute bubble dp tp cp ep pp optimizer offload (exposed)");
  s += buf;
  for (size_t i = 0; i < std::min(limit, candidates.size()); ++i) {
    const Candidate& c = candidates[i];
    const StepEstimate& e = c.step;
    std::string schedule = "-";
    if (c.mesh.pp > 1) {
      schedule = c.cfg.parallel.pp_schedule;
      if (c.cfg.parallel.virtual_stages > 1) schedule += " v" + std::to_string(c.cfg.parallel.virtual_stages);
    }
    // What waits in host memory: the optimizer's state, the kept activations.
    const bool opt = c.cfg.optim.offload, act = c.cfg.train.offload_activations;
    const char* offload = opt && act ? "opt+act" : opt ? "opt" : act ? "act" : "-";
    std::snprintf(buf, sizeof buf,
                  "%4zu %4lld %3lld %3lld %3lld %3lld %4lld %4lld %-9s %-13s %-7s %9.2f %9.1f %11.0f %5.1f%% | %.1f %.1f "
                  "%.1f %.1f %.1f %.1f %.1f %.1f %.1f%s\n",
                  i + 1, (long long)c.mesh.dp, (long long)c.mesh.tp, (long long)c.mesh.pp, (long long)c.mesh.cp,
                  (long long)c.mesh.ep, (long long)c.cfg.parallel.zero_stage, (long long)c.cfg.train.micro_batch,
                  c.cfg.train.recompute.c_str(), schedule.c_str(), offload,
                  double(c.memory.total()) / double(int64_t(1) << 30),
                  e.step_seconds * 1e3, e.tokens_per_second, 100.0 * e.mfu, e.compute_seconds * 1e3,
                  e.bubble_seconds * 1e3, e.dp.exposed_seconds * 1e3, e.tp.exposed_seconds * 1e3,
                  e.cp.exposed_seconds * 1e3, e.ep.exposed_seconds * 1e3, e.pp.exposed_seconds * 1e3,
                  e.optimizer_seconds * 1e3, e.offload_seconds * 1e3, c.fits ? "" : "  (does not fit)");
    s += buf;
  }
  return s;
}

}  // namespace zt::plan
