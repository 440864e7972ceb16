// The comm watchdog: one monitor thread per process watching every group's
// comm thread. An operation in flight longer than the timeout is fatal: one
// line on stderr naming the operation, the group, its ranks and the step,
// then MPI_Abort (the launcher tears the whole job down; a collective stuck
// in MPI cannot be cancelled, and waiting forever is the worst outcome).
#pragma once

#include <string>
#include <vector>

#include "comm/work_queue.h"

namespace zt::comm {

struct WatchedGroup {
  const CommThread* thread;
  std::string name;
  std::vector<int> world_ranks;
  int world_rank;
  double timeout_seconds;
};

// Registration (the group's lifetime brackets it).
void watch(const WatchedGroup& g);
void unwatch(const CommThread* thread);

}  // namespace zt::comm
