// The process-wide determinism switch (contract: core/determinism.h).
#include "core/determinism.h"

#include <atomic>

namespace zt {
namespace {
std::atomic<bool> g_deterministic{true};
}  // namespace

void set_deterministic(bool on) { g_deterministic.store(on, std::memory_order_relaxed); }
bool deterministic() { return g_deterministic.load(std::memory_order_relaxed); }

}  // namespace zt
