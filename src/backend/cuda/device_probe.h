// Host-callable entry points of the CUDA backend (no CUDA headers here, so
// ops/ and cli/ can include it).
#pragma once

#include <string>

namespace zt::cuda {

// One line per visible GPU, or why none can be used.
std::string describe_devices();
// Launches a one-thread kernel and checks its result: the GPU smoke test.
bool run_probe_kernel();

}  // namespace zt::cuda
