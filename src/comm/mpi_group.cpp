#include "comm/mpi_group.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "comm/checks.h"
#include "comm/watchdog.h"
#include "core/dtype.h"
#include "core/error.h"

namespace zt::comm {

namespace {

std::atomic<int64_t> g_max_elems{INT_MAX};

int64_t max_elems() { return g_max_elems.load(); }

void mpi_check(int rc, const std::string& where_text) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  ZT_FAIL(where_text, "MPI error: ", std::string(msg, size_t(len)));
}

int as_int(int64_t n, const char* op, const ProcessGroup& g) {
  ZT_CHECK(n <= INT_MAX, where(op, g), n, " elements in one block is more than MPI's int counts allow (", INT_MAX,
           "); split the tensor");
  return int(n);
}

// bf16 and f16 reductions: MPI has neither, so user ops over 16-bit words
// that compute in f32 and round back (nearest even) at each step.
template <typename H, typename F>
void half_apply(void* in, void* inout, int* len, F f) {
  const H* a = static_cast<const H*>(in);
  H* b = static_cast<H*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = from_float<H>(f(to_float(a[i]), to_float(b[i])));
}
template <typename H>
void half_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  half_apply<H>(in, inout, len, [](float x, float y) { return x + y; });
}
template <typename H>
void half_max(void* in, void* inout, int* len, MPI_Datatype*) {
  half_apply<H>(in, inout, len, [](float x, float y) { return std::max(x, y); });
}
template <typename H>
void half_min(void* in, void* inout, int* len, MPI_Datatype*) {
  half_apply<H>(in, inout, len, [](float x, float y) { return std::min(x, y); });
}

MPI_Datatype reduce_type(DType d) {
  switch (d) {
    case DType::f32: return MPI_FLOAT;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::bf16:
    case DType::f16: return MPI_UINT16_T;
    default: ZT_ASSERT(false, "not reducible: ", dtype_name(d));
  }
  return MPI_DATATYPE_NULL;
}

// The user ops of a 16-bit float type, created once: sum, max, min.
template <typename H>
MPI_Op half_op(ReduceOp op) {
  static MPI_Op ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_Op_create(&half_sum<H>, 1, &ops[0]);
    MPI_Op_create(&half_max<H>, 1, &ops[1]);
    MPI_Op_create(&half_min<H>, 1, &ops[2]);
  });
  return ops[int(op)];
}

MPI_Op reduce_op(ReduceOp op, DType d) {
  if (d == DType::bf16) return half_op<bf16>(op);
  if (d == DType::f16) return half_op<f16>(op);
  switch (op) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

const char* op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : op == ReduceOp::max ? "max" : "min"; }

}  // namespace

void set_max_message_elements(int64_t n) { g_max_elems = n > 0 ? std::min<int64_t>(n, INT_MAX) : INT_MAX; }

void init_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  ZT_CHECK(provided >= MPI_THREAD_MULTIPLE, "this MPI library provides thread level ", provided,
           ", but Zettatron's comm threads need MPI_THREAD_MULTIPLE (", MPI_THREAD_MULTIPLE,
           "); use an MPI built with thread support (Debian's OpenMPI has it)");
}

MpiGroup::MpiGroup(MPI_Comm comm, std::string name, double timeout_seconds) : comm_(comm), timeout_(timeout_seconds) {
  name_ = std::move(name);
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  int world_rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  world_ranks_.resize(size_t(size_));
  // No comm thread yet: this collective cannot race with queued ones.
  mpi_check(MPI_Allgather(&world_rank, 1, MPI_INT, world_ranks_.data(), 1, MPI_INT, comm_),
            where("create", *this));
  thread_ = std::make_unique<CommThread>(on_busy());
  watch({thread_.get(), [t = thread_.get()] { return t->in_flight(); }, name_, world_ranks_, world_rank, timeout_});
}

MpiGroup::~MpiGroup() {
  unwatch(thread_.get());
  thread_.reset();  // runs what is queued, then joins
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Comm_free(&comm_);
}

WorkHandle MpiGroup::submit(const char* op, int64_t bytes_sent, std::function<void()> fn) {
  count_op(bytes_sent);
  auto w = std::make_shared<QueuedWork>(op, std::move(fn), [this](double s) { add_wait(s); });
  thread_->enqueue(w);
  return w;
}

WorkHandle MpiGroup::all_reduce(const Tensor& t, ReduceOp op) {
  check_host("all_reduce", *this, t);
  check_reducible("all_reduce", *this, t);
  const int64_t p = size_, n = int64_t(t.nbytes());
  return submit("all_reduce", 2 * n * (p - 1) / p, [this, t, op] {
    const MPI_Datatype type = reduce_type(t.dtype());
    const MPI_Op mop = reduce_op(op, t.dtype());
    const size_t elem = dtype_size(t.dtype());
    char* base = static_cast<char*>(t.data_ptr());
    for (int64_t off = 0; off < t.numel(); off += max_elems()) {
      const int count = int(std::min(max_elems(), t.numel() - off));
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, base + size_t(off) * elem, count, type, mop, comm_),
                where("all_reduce", *this) + op_name(op) + ": ");
    }
  });
}

WorkHandle MpiGroup::reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) {
  check_host("reduce_scatter", *this, out);
  check_host("reduce_scatter", *this, in);
  check_reducible("reduce_scatter", *this, in);
  check_same_dtype("reduce_scatter", *this, out, in);
  check_numel("reduce_scatter", *this, "the input", in.numel(), out.numel() * size_);
  const int count = as_int(out.numel(), "reduce_scatter", *this);
  const int64_t p = size_;
  return submit("reduce_scatter", int64_t(in.nbytes()) * (p - 1) / p, [this, out, in, op, count] {
    mpi_check(MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), count, reduce_type(in.dtype()),
                                       reduce_op(op, in.dtype()), comm_),
              where("reduce_scatter", *this));
  });
}

WorkHandle MpiGroup::all_gather(const Tensor& out, const Tensor& in) {
  check_host("all_gather", *this, out);
  check_host("all_gather", *this, in);
  check_same_dtype("all_gather", *this, out, in);
  check_numel("all_gather", *this, "the output", out.numel(), in.numel() * size_);
  const int bytes = as_int(int64_t(in.nbytes()), "all_gather", *this);
  const int64_t p = size_;
  const bool in_place = in.data_ptr() == static_cast<char*>(out.data_ptr()) + size_t(rank_) * in.nbytes();
  return submit("all_gather", int64_t(out.nbytes()) * (p - 1) / p, [this, out, in, bytes, in_place] {
    mpi_check(MPI_Allgather(in_place ? MPI_IN_PLACE : in.data_ptr(), bytes, MPI_BYTE, out.data_ptr(), bytes,
                            MPI_BYTE, comm_),
              where("all_gather", *this));
  });
}

WorkHandle MpiGroup::broadcast(const Tensor& t, int root) {
  check_host("broadcast", *this, t);
  check_peer("broadcast", *this, root, true);
  return submit("broadcast", root == rank_ ? int64_t(t.nbytes()) : 0, [this, t, root] {
    char* base = static_cast<char*>(t.data_ptr());
    const int64_t n = int64_t(t.nbytes());
    for (int64_t off = 0; off < n; off += max_elems())
      mpi_check(MPI_Bcast(base + off, int(std::min(max_elems(), n - off)), MPI_BYTE, root, comm_),
                where("broadcast", *this));
  });
}

namespace {

// Point-to-point in flight: MPI requests (one per chunk of the message),
// completed by MPI in the background. test() polls them; wait() polls until
// they are done, with short sleeps, and gives up with an error naming the
// transfer after the group's timeout (a peer that never posts the matching
// call: a schedule bug or a dead rank).
class P2pWork : public Work {
 public:
  P2pWork(std::string what, std::vector<MPI_Request> reqs, Tensor keep, double timeout,
          BusyCallback on_busy, std::function<void(double)> on_wait)
      : what_(std::move(what)), reqs_(std::move(reqs)), keep_(std::move(keep)), timeout_(timeout),
        on_busy_(std::move(on_busy)), on_wait_(std::move(on_wait)), posted_(Clock::now()) {}
  ~P2pWork() override {
    // Dropped before completion: the buffer must outlive the transfer.
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
  }
  bool test() override {
    std::lock_guard<std::mutex> lock(mu_);
    return poll();
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (poll()) return;
    const auto t0 = Clock::now();
    while (!poll()) {
      const double waited = std::chrono::duration<double>(Clock::now() - posted_).count();
      ZT_CHECK(waited < timeout_, what_, " has not completed after ", int(waited), " s (step ", current_step(),
               "): the peer never posted the matching call - a schedule that does not pair its transfers, or "
               "a rank that died; raise parallel.comm_timeout if it is only slow");
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      lock.lock();
    }
    if (on_wait_) on_wait_(std::chrono::duration<double>(Clock::now() - t0).count());
  }

 private:
  using Clock = std::chrono::steady_clock;
  bool poll() {
    if (done_) return true;
    int flag = 0;
    mpi_check(MPI_Testall(int(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE), what_ + ": ");
    if (!flag) return false;
    done_ = true;
    keep_ = Tensor();
    if (on_busy_) on_busy_(what_, posted_, Clock::now());
    return true;
  }
  std::string what_;
  std::vector<MPI_Request> reqs_;
  Tensor keep_;
  double timeout_;
  BusyCallback on_busy_;
  std::function<void(double)> on_wait_;
  Clock::time_point posted_;
  std::mutex mu_;
  bool done_ = false;
};

}  // namespace

WorkHandle MpiGroup::post_p2p(const char* op, const Tensor& t, int peer, int tag) {
  const bool sending = std::string_view(op) == "send";
  count_op(sending ? int64_t(t.nbytes()) : 0);
  char* base = static_cast<char*>(t.data_ptr());
  const int64_t n = int64_t(t.nbytes());
  // One request per chunk (MPI counts are ints); an empty message is one empty request.
  std::vector<MPI_Request> reqs;
  int64_t off = 0;
  do {
    MPI_Request r;
    const int count = int(std::min(max_elems(), n - off));
    if (sending)
      mpi_check(MPI_Isend(base + off, count, MPI_BYTE, peer, tag, comm_, &r), where(op, *this));
    else
      mpi_check(MPI_Irecv(base + off, count, MPI_BYTE, peer, tag, comm_, &r), where(op, *this));
    reqs.push_back(r);
    off += count;
  } while (off < n);
  const std::string what = std::string(op) + (sending ? " to rank " : " from rank ") + std::to_string(peer) +
                           " (world rank " + std::to_string(world_ranks_[size_t(peer)]) + ", tag " +
                           std::to_string(tag) + ", " + std::to_string(n) + " bytes) on group '" + name_ + "'";
  return std::make_shared<P2pWork>(what, std::move(reqs), t, timeout_, on_busy(), [this](double s) { add_wait(s); });
}

WorkHandle MpiGroup::send(const Tensor& t, int dst, int tag) {
  check_host("send", *this, t);
  check_peer("send", *this, dst, false);
  return post_p2p("send", t, dst, tag);
}

WorkHandle MpiGroup::recv(const Tensor& t, int src, int tag) {
  check_host("recv", *this, t);
  check_peer("recv", *this, src, false);
  return post_p2p("recv", t, src, tag);
}

WorkHandle MpiGroup::all_to_all(const Tensor& out, const Tensor& in) {
  check_host("all_to_all", *this, out);
  check_host("all_to_all", *this, in);
  check_same_dtype("all_to_all", *this, out, in);
  check_numel("all_to_all", *this, "the output", out.numel(), in.numel());
  ZT_CHECK(in.numel() % size_ == 0, where("all_to_all", *this), in.numel(), " elements do not split into ", size_,
           " equal blocks");
  const int block = as_int(int64_t(in.nbytes()) / size_, "all_to_all", *this);
  const int64_t p = size_;
  return submit("all_to_all", int64_t(in.nbytes()) * (p - 1) / p, [this, out, in, block] {
    mpi_check(MPI_Alltoall(in.data_ptr(), block, MPI_BYTE, out.data_ptr(), block, MPI_BYTE, comm_),
              where("all_to_all", *this));
  });
}

WorkHandle MpiGroup::all_to_allv(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                                 std::span<const int64_t> in_counts) {
  check_all_to_allv(*this, out, out_counts, in, in_counts);
  const int64_t elem = int64_t(dtype_size(in.dtype()));
  const size_t np = size_t(size_);
  std::vector<int> sc(np), sd(np), rc(np), rd(np);
  int64_t so = 0, ro = 0, sent = 0;
  for (int r = 0; r < size_; ++r) {
    sc[size_t(r)] = as_int(in_counts[size_t(r)] * elem, "all_to_allv", *this);
    rc[size_t(r)] = as_int(out_counts[size_t(r)] * elem, "all_to_allv", *this);
    sd[size_t(r)] = as_int(so, "all_to_allv", *this);
    rd[size_t(r)] = as_int(ro, "all_to_allv", *this);
    so += sc[size_t(r)];
    ro += rc[size_t(r)];
    if (r != rank_) sent += sc[size_t(r)];
  }
  return submit("all_to_allv", sent, [this, out, in, sc, sd, rc, rd] {
    mpi_check(MPI_Alltoallv(in.data_ptr(), sc.data(), sd.data(), MPI_BYTE, out.data_ptr(), rc.data(), rd.data(),
                            MPI_BYTE, comm_),
              where("all_to_allv", *this));
  });
}

WorkHandle MpiGroup::barrier() {
  return submit("barrier", 0, [this] { mpi_check(MPI_Barrier(comm_), where("barrier", *this)); });
}

std::unique_ptr<ProcessGroup> MpiGroup::split(int color, int key, const std::string& name) {
  ZT_CHECK(color >= 0, where("split", *this), "color must be >= 0, got ", color);
  MPI_Comm out = MPI_COMM_NULL;
  // On the comm thread, in order with the group's other collectives.
  submit("split", 0, [this, color, key, &out] {
    mpi_check(MPI_Comm_split(comm_, color, key, &out), where("split", *this));
  })->wait();
  return std::make_unique<MpiGroup>(out, name, timeout_);
}

}  // namespace zt::comm
