// `zettatron info CONFIG`: parameters, FLOPs per token, memory estimate vs measured.
#include <algorithm>
#include <iostream>

#include "cli/commands.h"
#include "core/device.h"
#include "ops/device.h"
#include "train/info.h"

namespace zt::cli {

Command add_info_command(CLI::App& app) {
  struct Opts {
    std::string config;
    std::vector<std::string> overrides;
    bool no_measure = false;
    bool measure = false;
    int64_t ranks = 0;
    double device_gib = 0;
  };
  auto opts = std::make_shared<Opts>();
  Command c;
  c.app = app.add_subcommand("info", "Parameter count, FLOPs per token and memory (estimated and measured)");
  c.app->add_option("config", opts->config, "TOML config")->required()->check(CLI::ExistingFile);
  c.app->add_option("--set", opts->overrides, "Override a config value: section.key=value");
  auto* off = c.app->add_flag("--no-measure", opts->no_measure, "Skip the measured step (estimates only)");
  c.app->add_flag("--measure", opts->measure,
                  "Run the measured step even when it looks too large or slow for this machine")
      ->excludes(off);
  c.app->add_option("--ranks", opts->ranks,
                    "Processes the run will have: adds the memory of each rank of the config's parallel layout "
                    "(parallel.dp = 0 takes the rest; default: dp x tp x pp with dp = 0 counted as 1)")
      ->check(CLI::PositiveNumber);
  c.app->add_option("--device-gib", opts->device_gib,
                    "Memory of each process's device in GiB for --ranks (default: the config's device on this "
                    "machine, when it has one)")
      ->check(CLI::PositiveNumber);
  c.run = [opts] {
    const train::Config cfg = train::load_config(opts->config, opts->overrides);
    const train::Measure measure = opts->no_measure ? train::Measure::off
                                   : opts->measure  ? train::Measure::always
                                                    : train::Measure::when_affordable;
    std::cout << train::format_info(cfg, train::make_info(cfg, measure));
    const int64_t ranks = opts->ranks > 0 ? opts->ranks
                                          : std::max<int64_t>(1, cfg.parallel.dp) * cfg.parallel.tp * cfg.parallel.pp;
    if (ranks > 1) {
      const Device device = parse_device(cfg.train.device);
      int64_t capacity = int64_t(opts->device_gib * double(int64_t(1) << 30));
      if (capacity == 0 && (device.is_cpu() || device.index < ops::gpu_count()))
        capacity = train::device_capacity_bytes(device);
      // Context parallelism as the plan counts it (memory_plan.h).
      const train::PlanView view = train::context_parallel_view(cfg, train::plan_layout(cfg, ranks));
      if (cfg.parallel.cp > 1)
        std::cout << "\ncontext parallel: cp = " << cfg.parallel.cp << " planned as dp x cp = " << view.layout.dp
                  << " replicas of seq_len / cp = " << view.cfg.train.seq_len << " tokens, with the ring "
                  << "attention's buffers";
      // The other splits of the processes are splits without cp: listed for a config without it.
      std::cout << train::format_layout_plan(view.cfg, view.layout, device, capacity, cfg.parallel.cp == 1);
    }
    return 0;
  };
  return c;
}

}  // namespace zt::cli
