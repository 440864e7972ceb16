// `zettatron devices`: the compute devices this build can use.
#include <iostream>

#include "cli/commands.h"
#include "ops/device.h"
#ifdef ZT_WITH_CUDA
#include "backend/cuda/device_probe.h"
#endif

namespace zt::cli {

Command add_devices_command(CLI::App& app) {
  Command c;
  c.app = app.add_subcommand("devices", "List the compute devices this build can use");
  c.run = [] {
    std::cout << "cpu: available; BLAS: " << ops::describe_cpu() << "\n";
#ifdef ZT_WITH_CUDA
    std::cout << zt::cuda::describe_devices() << "\n";
#else
    std::cout << "CUDA: not built (no nvcc at configure time)\n";
#endif
    std::cout << "train.device = \"auto\" trains on: " << (ops::gpu_count() > 0 ? "cuda" : "cpu") << "\n";
    return 0;
  };
  return c;
}

}  // namespace zt::cli
