// The comm watchdog: one monitor thread per process watching every group's
// oldest operation in flight (an MPI group's comm thread, an NCCL group's
// operations on its GPU stream). One in flight longer than the timeout is fatal: one
// line on stderr naming the operation, the group, its ranks and the step,
// then MPI_Abort (the launcher tears the whole job down; a collective stuck
// in MPI cannot be cancelled, and waiting forever is the worst outcome). So
// is a failure the group's library reports by itself (NCCL's asynchronous
// errors: a peer or a link gone), at once instead of after the timeout.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/work_queue.h"

namespace zt::comm {

struct WatchedGroup {
  const void* owner;  // what unwatch names
  // The oldest operation not yet complete and since when (empty op when
  // idle); called from the monitor thread every 200 ms.
  std::function<CommThread::InFlight()> in_flight;
  std::string name;
  std::vector<int> world_ranks;
  int world_rank;
  double timeout_seconds;
  // A failure the group's library reported by itself, as one line (empty:
  // none); optional, called from the monitor thread every 200 ms.
  std::function<std::string()> fault = {};
};

// Registration (the group's lifetime brackets it).
void watch(const WatchedGroup& g);
void unwatch(const void* owner);

}  // namespace zt::comm
