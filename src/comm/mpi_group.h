// The MPI backend: a group is an MPI communicator plus a comm thread that
// runs its operations (blocking MPI calls) one at a time in issue order, so
// communication progresses while the caller computes. MPI is initialised
// with MPI_THREAD_MULTIPLE (the comm threads of several groups, the
// watchdog's MPI_Abort and the caller may all be inside MPI at once).
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/process_group.h"
#include "comm/work_queue.h"

namespace zt::comm {

class MpiGroup : public ProcessGroup {
 public:
  // Takes ownership of comm (freed on destruction).
  MpiGroup(MPI_Comm comm, std::string name, double timeout_seconds);
  ~MpiGroup() override;

  WorkHandle all_reduce(const Tensor& t, ReduceOp op) override;
  WorkHandle reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override;
  WorkHandle all_gather(const Tensor& out, const Tensor& in) override;
  WorkHandle broadcast(const Tensor& t, int root) override;
  WorkHandle send(const Tensor& t, int dst, int tag) override;
  WorkHandle recv(const Tensor& t, int src, int tag) override;
  WorkHandle all_to_all(const Tensor& out, const Tensor& in) override;
  WorkHandle all_to_allv(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                         std::span<const int64_t> in_counts) override;
  WorkHandle barrier() override;
  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override;

 private:
  WorkHandle submit(const char* op, int64_t bytes_sent, std::function<void()> fn);
  // This group's add_busy, for its comm thread and its point-to-point transfers.
  BusyCallback on_busy() {
    return [this](const std::string& op, auto start, auto end) { add_busy(op, start, end); };
  }
  // send / recv: posted at once (MPI_Isend / MPI_Irecv), not queued.
  WorkHandle post_p2p(const char* op, const Tensor& t, int peer, int tag);
  MPI_Comm comm_;
  double timeout_;
  std::unique_ptr<CommThread> thread_;
};

// Messages larger than this many elements are split (MPI counts are int).
// Tests lower it to exercise the splitting; 0 restores the default.
void set_max_message_elements(int64_t n);

// Initialises MPI (once) with MPI_THREAD_MULTIPLE; throws zt::Error if the
// library cannot provide it.
void init_mpi();

}  // namespace zt::comm
