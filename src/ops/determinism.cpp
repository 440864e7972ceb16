// The process-wide determinism switch (contract: ops/determinism.h).
#include "ops/determinism.h"

#include <atomic>

#if ZT_WITH_CUDA
#include "backend/cuda/matmul.h"
#endif

namespace zt::ops {
namespace {
std::atomic<bool> g_deterministic{true};
}  // namespace

void set_deterministic(bool on) {
  g_deterministic.store(on, std::memory_order_relaxed);
#if ZT_WITH_CUDA
  cuda::set_matmul_tuning(!on);  // the clock's choice of algorithm is not repeatable
#endif
}
bool deterministic() { return g_deterministic.load(std::memory_order_relaxed); }

}  // namespace zt::ops
