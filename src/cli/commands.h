// Each subcommand lives in its own file and registers itself on the app:
//   `add_<name>_command(app)` adds the CLI11 subcommand and returns a runner
//   that main() calls when that subcommand was chosen.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace zt::cli {

struct Command {
  CLI::App* app = nullptr;       // the CLI11 subcommand
  std::function<int()> run;      // exit code
};

Command add_devices_command(CLI::App& app);
Command add_info_command(CLI::App& app);
Command add_train_command(CLI::App& app);
Command add_generate_command(CLI::App& app);
Command add_prepare_command(CLI::App& app);
Command add_convert_command(CLI::App& app);
Command add_plan_command(CLI::App& app);

}  // namespace zt::cli
