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

std::string ranks_of(const WatchedGroup& g) {
  std::string ranks;
  for (size_t i = 0; i < g.world_ranks.size() && i < 16; ++i) {
    if (i) ranks += ',';
    ranks += std::to_string(g.world_ranks[i]);
  }
  if (g.world_ranks.size() > 16) ranks += ",...";
  return ranks;
}

[[noreturn]] void abort_job() {
  std::fflush(stderr);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 3);
  std::_Exit(3);
}

[[noreturn]] void fire_timeout(const WatchedGroup& g, const std::string& op, double seconds) {
  std::fprintf(stderr,
               "error: comm watchdog: %s on group '%s' (world ranks %s; this is world rank %d) did not complete in "
               "%.0f s at step %lld - a rank may have died or diverged; aborting the job (parallel.comm_timeout "
               "sets the limit)\n",
               op.c_str(), g.name.c_str(), ranks_of(g).c_str(), g.world_rank, seconds, (long long)current_step());
  abort_job();
}

[[noreturn]] void fire_fault(const WatchedGroup& g, const std::string& what) {
  std::fprintf(stderr,
               "error: comm watchdog: group '%s' (world ranks %s; this is world rank %d) failed at step %lld: %s; "
               "aborting the job\n",
               g.name.c_str(), ranks_of(g).c_str(), g.world_rank, (long long)current_step(), what.c_str());
  abort_job();
}

void monitor() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    const auto now = Clock::now();
    for (const WatchedGroup& g : r.groups) {
      if (g.fault)
        if (const std::string what = g.fault(); !what.empty()) fire_fault(g, what);
      const CommThread::InFlight f = g.in_flight();
      if (f.op.empty()) continue;
      const double age = std::chrono::duration<double>(now - f.since).count();
      if (age > g.timeout_seconds) fire_timeout(g, f.op, age);
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
