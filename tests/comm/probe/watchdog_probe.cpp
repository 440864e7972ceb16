// Jobs that fail on purpose, for the watchdog test.
//   watchdog_probe        every rank but rank 1 enters an all-reduce; rank 1
//                         sleeps far past the timeout. The watchdog on the
//                         waiting ranks must end the job.
//   watchdog_probe fault  rank 1's group reports a failure of its own (as
//                         NCCL's asynchronous errors do) while rank 0 waits
//                         in an all-reduce; the watchdog on rank 1 must end
//                         the job at once, long before the timeout.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "comm/process_group.h"
#include "comm/watchdog.h"
#include "core/tensor.h"

int main(int argc, char** argv) {
  const bool fault = argc > 1 && std::string(argv[1]) == "fault";
  zt::comm::ProcessGroup& w = zt::comm::world({"mpi", 600});
  zt::comm::set_current_step(17);
  zt::Tensor t = zt::Tensor::empty(zt::Shape{4}, zt::DType::f32);
  w.all_reduce(t)->wait();  // everyone arrives: the group works
  const int marker = 0;  // the probe group's owner, for the watchdog
  if (fault && w.rank() == 1) {
    const auto failed_at = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    zt::comm::watch({&marker, [] { return zt::comm::CommThread::InFlight{}; }, "probe-link", {0, 1}, 1, 600,
                     [failed_at]() -> std::string {
                       return std::chrono::steady_clock::now() >= failed_at ? "the probe's link went down" : "";
                     }});
  }
  if (w.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
  w.all_reduce(t)->wait();
  std::printf("rank %d: not reached in time\n", w.rank());
  return 0;
}
