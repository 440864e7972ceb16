// ProcessGroup: the collectives every parallel dimension is built on.
//
// A group is an ordered set of processes (ranks 0..size-1 within it). Every
// operation is asynchronous: it returns a Work handle at once and runs on the
// group's communication thread, in the order the operations were issued.
// Collectives must be issued in the same order on every member (the MPI
// rule). A blocking call is op(...)->wait().
//
// Tensors are contiguous host tensors for the MPI and solo backends; GPU
// tensors go through the NCCL backend (comm/nccl) or are staged through host
// memory (comm/staged_group.h). Reductions
// take f32, i32 or i64 (and bf16 and f16, reduced in f32 and rounded at each
// step); data movement
// (gather, broadcast, send/recv, all-to-all) takes any dtype. The caller
// keeps the tensors alive and untouched until the Work completes.
//
// Watchdog: an operation in flight for longer than the group's timeout is a
// fatal error on that rank: it prints which operation, group, step and how
// long, then ends the process with a non-zero status (a collective stuck in
// MPI cannot be cancelled), so the launcher tears the job down instead of
// hanging.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace zt::comm {

enum class ReduceOp { sum, max, min };

// A pending operation.
class Work {
 public:
  virtual ~Work() = default;
  // True once the operation has completed (never blocks); rethrows its error.
  virtual bool test() = 0;
  // Blocks until the operation completes; rethrows its error.
  virtual void wait() = 0;
};
using WorkHandle = std::shared_ptr<Work>;

// Counters for metrics (per group, cumulative; reset by the caller).
struct CommStats {
  int64_t ops = 0;
  int64_t bytes_sent = 0;       // payload bytes this rank sent (algorithm-independent estimate, see below)
  double busy_seconds = 0;      // time operations were in flight on the comm thread
  double wait_seconds = 0;      // time callers spent blocked in wait(): the communication not hidden
};
// bytes_sent per operation (n = payload bytes, p = group size), the
// bandwidth-optimal (ring) volumes: all_reduce 2 n (p-1)/p, reduce_scatter
// and all_gather n (p-1)/p of the full buffer, broadcast n (root) / 0,
// send n, all_to_all n (p-1)/p.

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }   // "world", "dp", "tp", ...
  // World ranks of the members, in group order (for messages and the mesh).
  const std::vector<int>& world_ranks() const { return world_ranks_; }

  // t <- op over all members' t (in place).
  virtual WorkHandle all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum) = 0;
  // in: size() equal blocks of out.numel(); rank r's out <- op over members of block r.
  virtual WorkHandle reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op = ReduceOp::sum) = 0;
  // out: size() blocks of in.numel(); block r <- rank r's in. `in` may be
  // this rank's own block of `out` (in place: nothing is copied).
  virtual WorkHandle all_gather(const Tensor& out, const Tensor& in) = 0;
  virtual WorkHandle broadcast(const Tensor& t, int root) = 0;
  // Point-to-point is non-blocking: a send or receive is posted at once
  // (not queued behind the group's collectives) and completes in the
  // background, so any number may be outstanding in any order (a ring
  // exchange of large messages, receives posted early) without deadlock.
  // Messages between two ranks with one tag are matched in posting order.
  // Completion is seen by test()/wait(); wait() gives up with an error after
  // the group's timeout.
  virtual WorkHandle send(const Tensor& t, int dst, int tag = 0) = 0;
  virtual WorkHandle recv(const Tensor& t, int src, int tag = 0) = 0;
  // One step of a ring (or any pairing where dst's src is this rank):
  // `sent` to dst and `received` from src, completing when both have.
  // Collective over the group: every member calls it, and members issue
  // their exchanges in one order. The default posts send and recv (tag);
  // the NCCL group runs a GPU pair as one grouped ncclSend / ncclRecv on its
  // communication stream, ordered like its collectives - device to device,
  // no host wait, where send and recv of GPU tensors are staged through host
  // memory. sent and received: tensors of one device.
  virtual WorkHandle send_recv(const Tensor& sent, int dst, const Tensor& received, int src, int tag = 0);
  // in and out: size() equal blocks; out block r <- rank r's in block (this rank).
  virtual WorkHandle all_to_all(const Tensor& out, const Tensor& in) = 0;
  // Element counts per peer (size() entries each); blocks are packed in rank order.
  virtual WorkHandle all_to_allv(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                                 std::span<const int64_t> in_counts) = 0;
  virtual WorkHandle barrier() = 0;

  // Collective over this group (MPI_Comm_split semantics): members with the
  // same color form a new group, ordered by key (then by rank).
  virtual std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) = 0;

  // True when this group runs its operations (on its device's tensors) on
  // one queue with every other such group of the process - NCCL: the GPU's
  // one communication stream -, so an operation starts only once everything
  // issued before it on any of them has finished. Ranks must then issue
  // operations in one order across all those groups, not only within each
  // (else two ranks can each wait for the other's next operation: a
  // cycle), and a caller may queue an operation behind another one whose
  // result it reads without waiting for it. False: each group runs its own
  // operations (MPI: a thread per group), in any order with other groups'.
  virtual bool shares_one_queue() const { return false; }

  // A snapshot of the counters (they are updated by the comm thread). A
  // group that forwards its operations to another reports that one's.
  virtual CommStats stats() const;

 protected:
  // Called by stats() first: a backend whose operations finish on a device
  // counts the ones that have finished since.
  virtual void update_stats() const {}
  void count_op(int64_t bytes_sent);
  // An operation `op` in flight from start to end: its time, and a span on
  // the track "comm NAME" while a trace is on (core/trace.h).
  void add_busy(const std::string& op, std::chrono::steady_clock::time_point start,
                std::chrono::steady_clock::time_point end);
  // Time in flight measured elsewhere (NCCL: on the device; not in a trace).
  void add_busy_seconds(double seconds);
  void add_wait(double seconds);
  int rank_ = 0, size_ = 1;
  std::string name_;
  std::vector<int> world_ranks_;
  mutable std::mutex stats_mu_;
  CommStats stats_;
};

struct CommOptions {
  std::string backend = "auto";  // auto (mpi when launched by mpirun/srun, else solo) | solo | mpi
  double timeout_seconds = 600;  // watchdog
};

struct WorldInfo {
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // on this node (device selection)
  std::string backend;                 // "solo" | "mpi"
  double timeout_seconds = 600;        // the comm watchdog's limit for every group of this process
};

// The world group (initialises MPI on first use when the backend is mpi;
// MPI is finalised at exit). Calling it again returns the same group.
ProcessGroup& world(const CommOptions& options = {});
WorldInfo world_info();
// A group of one process (no communication; every operation completes at
// once, all_reduce is the identity), e.g. for a parallel dimension of size 1.
std::unique_ptr<ProcessGroup> make_solo_group(const std::string& name);
// The sum over the group of one double per rank, the same bits on every
// rank: every rank's value is gathered exactly and added in rank order
// (blocking). A group of one returns v.
double sum_exact(ProcessGroup& g, double v);
// The largest of one double per rank, on every rank (blocking). A group of
// one returns v.
double max_over(ProcessGroup& g, double v);
// Every rank's double, in rank order, on every rank (blocking).
std::vector<double> all_gather_doubles(ProcessGroup& g, double v);
// Every rank's n doubles in one collective: rank r's at [r n, (r + 1) n).
std::vector<double> all_gather_doubles(ProcessGroup& g, std::span<const double> mine);
// Every rank's string (any bytes), in rank order, on every rank (blocking).
std::vector<std::string> all_gather_strings(ProcessGroup& g, const std::string& mine);
// The step training is at, for watchdog messages (set by the trainer).
void set_current_step(int64_t step);
int64_t current_step();
// True once the world group exists and spans several processes (never
// creates it: safe in an error path that may run before it does).
bool in_multi_process_job();
// After a fatal error on this rank of a multi-process job: ends the whole
// job at once (MPI_Abort) instead of leaving the other ranks waiting in a
// collective until the watchdog fires. Does nothing for a single process.
void abort_job_after_error(int exit_code);

}  // namespace zt::comm
