// zettatron: the command-line front door.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>

#include "core/error.h"
#ifdef ZT_WITH_CUDA
#include "backend/cuda/device_probe.h"
#endif

int main(int argc, char** argv) {
  CLI::App app{"Zettatron: trains transformer language models, from one CPU to thousands of GPUs"};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", "zettatron 0.1.0");

  auto* devices = app.add_subcommand("devices", "List the compute devices this build can use");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (*devices) {
      std::cout << "cpu: available\n";
#ifdef ZT_WITH_CUDA
      std::cout << zt::cuda::describe_devices() << "\n";
#else
      std::cout << "CUDA: not built (no nvcc at configure time)\n";
#endif
      return 0;
    }
    std::cout << app.help() << std::flush;
    return 0;
  } catch (const zt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
