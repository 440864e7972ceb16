#include "plan/calibrate.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "plan/step_model.h"

namespace zt::plan {

MeasuredRun read_measured_run(const std::string& run_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(run_dir), config = dir / "config.toml", metrics = dir / "metrics.jsonl";
  ZT_CHECK(fs::exists(config) && fs::exists(metrics), "--calibrate ", run_dir,
           ": not a run directory (it needs config.toml and metrics.jsonl, as `zettatron train` writes them)");
  MeasuredRun r;
  r.dir = run_dir;
  r.cfg = train::load_config(config.string(), {});
  std::ifstream in(metrics);
  std::vector<double> rates;
  int64_t world = 0;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.contains("tokens_per_s")) continue;  // evaluation records, a torn last line
    rates.push_back(j["tokens_per_s"].get<double>());
    if (j.contains("world")) world = j["world"].get<int64_t>();
  }
  ZT_CHECK(rates.size() >= 3, "--calibrate ", run_dir, ": ", metrics.string(), " has ", rates.size(),
           " training steps; the calibration takes the median after the first two: run 3 or more");
  ZT_CHECK(world > 0, "--calibrate ", run_dir, ": ", metrics.string(),
           " does not say how many processes ran it (\"world\"): rerun it with this version");
  rates.erase(rates.begin(), rates.begin() + 2);
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  r.tokens_per_second = rates[rates.size() / 2];
  r.steps = int64_t(rates.size());
  const train::ParallelSettings& p = r.cfg.parallel;
  r.mesh = parallel::resolve_mesh_shape({p.dp, p.tp, p.pp, p.cp, p.ep}, world);
  return r;
}

Cluster calibrate(const Cluster& c, const MeasuredRun& run) {
  // A CPU "cluster" is one host whose rate its processes share
  // (cluster.h): the run saw it shared by its own processes.
  const Cluster as_run = c.gpu ? c : with_devices_per_node(c, run.mesh.world());
  const StepEstimate e = estimate_step(run.cfg, run.mesh, as_run);
  const double measured_step = double(run.cfg.train.global_batch * run.cfg.train.seq_len) / run.tokens_per_second;
  const double others = e.step_seconds - e.compute_seconds - e.bubble_seconds;
  const double bubble = e.compute_seconds > 0 ? e.bubble_seconds / e.compute_seconds : 0.0;
  const double compute = (measured_step - others) / (1.0 + bubble);
  ZT_CHECK(compute > 0, "--calibrate ", run.dir, ": the run's step (", measured_step * 1e3,
           " ms) is shorter than the model's communication and optimizer alone (", others * 1e3,
           " ms) on cluster ", c.name, ": was it run on these machines?");
  Cluster out = c;
  out.step_efficiency = c.step_efficiency * e.compute_seconds / compute;
  char buf[160];
  std::snprintf(buf, sizeof buf, "; step efficiency %.3f from %s (%.0f tokens/s, median of %lld steps)",
                out.step_efficiency, run.dir.c_str(), run.tokens_per_second, (long long)run.steps);
  out.source += buf;
  return out;
}

}  // namespace zt::plan
