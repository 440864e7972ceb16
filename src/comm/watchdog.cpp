#include "comm/watchdog.h"

#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace zt::comm {

namespace {

using Clock = std::chrono::steady_clock;

struct Registry {
  std::mutex mu;
  std::vector<WatchedGroup> groups;
  bool started = false;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: the monitor may run until exit
  return *r;
}

[[noreturn]] void fire(const WatchedGroup& g, const std::string& op, double seconds) {
  std::string ranks;
  for (size_t i = 0; i < g.world_ranks.size() && i < 16; ++i) {
    if (i) ranks += ',';
    ranks += std::to_string(g.world_ranks[i]);
  }
  if (g.world_ranks.size() > 16) ranks += ",...";
  std::fprintf(stderr,
               "error: comm watchdog: %s on group '%s' (world ranks %s; this is world rank %d) did not complete in "
               "%.0f s at step %lld - a rank may have died or diverged; aborting the job (parallel.comm_timeout "
               "sets the limit)\n",
               op.c_str(), g.name.c_str(), ranks.c_str(), g.world_rank, seconds, (long long)current_step());
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

void monitor() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    const auto now = Clock::now();
    for (const WatchedGroup& g : r.groups) {
      const CommThread::InFlight f = g.in_flight();
      if (f.op.empty()) continue;
      const double age = std::chrono::duration<double>(now - f.since).count();
      if (age > g.timeout_seconds) fire(g, f.op, age);
    }
  }
}

}  // namespace

void watch(const WatchedGroup& g) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.groups.push_back(g);
  if (!r.started) {
    r.started = true;
    std::thread(monitor).detach();
  }
}

void unwatch(const void* owner) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (size_t i = 0; i < r.groups.size(); ++i)
    if (r.groups[i].owner == owner) {
      r.groups.erase(r.groups.begin() + long(i));
      return;
    }
}

}  // namespace zt::comm
