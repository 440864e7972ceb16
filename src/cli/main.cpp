// zettatron: the command-line front door. Subcommands live in *_cmd.cpp.
#include <exception>
#include <iostream>
#include <vector>

#include "cli/commands.h"
#include "cli/errors.h"
#include "comm/process_group.h"

int main(int argc, char** argv) {
  CLI::App app{"Zettatron: trains transformer language models, from one CPU to thousands of GPUs"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", "zettatron 0.1.0");

  std::vector<zt::cli::Command> commands;
  commands.push_back(zt::cli::add_devices_command(app));
  commands.push_back(zt::cli::add_train_command(app));
  commands.push_back(zt::cli::add_generate_command(app));
  commands.push_back(zt::cli::add_info_command(app));
  commands.push_back(zt::cli::add_prepare_command(app));
  commands.push_back(zt::cli::add_convert_command(app));
  commands.push_back(zt::cli::add_plan_command(app));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    for (auto& c : commands)
      if (c.app->parsed()) return c.run();
    std::cout << app.help() << std::flush;
    return 0;
  } catch (...) {
    zt::cli::print_error(std::current_exception());
    zt::comm::abort_job_after_error(1);  // the other ranks must not wait for this one
    return 1;
  }
}
