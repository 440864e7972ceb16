// A job that hangs on purpose, for the watchdog test: every rank but rank 1
// enters an all-reduce; rank 1 sleeps far past the timeout. The watchdog on
// the waiting ranks must end the job.
#include <chrono>
#include <cstdio>
#include <thread>

#include "comm/process_group.h"
#include "core/tensor.h"

int main() {
  zt::comm::ProcessGroup& w = zt::comm::world({"mpi", 600});
  zt::comm::set_current_step(17);
  zt::Tensor t = zt::Tensor::empty(zt::Shape{4}, zt::DType::f32);
  w.all_reduce(t)->wait();  // everyone arrives: the group works
  if (w.rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
  w.all_reduce(t)->wait();
  std::printf("rank %d: not reached in time\n", w.rank());
  return 0;
}
