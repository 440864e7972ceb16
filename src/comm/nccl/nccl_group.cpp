// The NCCL ProcessGroup (comm/nccl/nccl_group.h). Compiled in every build;
// without NCCL (ZT_WITH_NCCL unset) only nccl_available() = false and an
// error from make_nccl_group remain.
#include "comm/nccl/nccl_group.h"

#include "core/error.h"

#if ZT_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda/runtime.h"
#include "comm/checks.h"
#include "comm/staged_group.h"
#include "comm/watchdog.h"
#endif

namespace zt::comm {

#if !ZT_WITH_NCCL

bool nccl_available() { return false; }

int nccl_communicators(const ProcessGroup&) { return 0; }

std::unique_ptr<ProcessGroup> make_nccl_group(std::unique_ptr<ProcessGroup>, Device, const std::string&) {
  ZT_FAIL("comm: this build has no NCCL backend (NCCL was not found when it was built: install NCCL or point "
          "NCCL_ROOT at it and rebuild), so GPU tensors cannot go over NCCL; set parallel.comm_backend = mpi to "
          "stage them through host memory and MPI (slow), or train.device = cpu");
}

#else

namespace {

void nccl_check(ncclResult_t r, const char* call, const std::string& where) {
  if (r != ncclSuccess) [[unlikely]]
    ZT_FAIL(where, call, " failed: ", ncclGetErrorString(r), " (", int(r), ")");
}
void cuda_check(cudaError_t e, const char* call, const std::string& where) {
  if (e != cudaSuccess) [[unlikely]]
    ZT_FAIL(where, call, " failed: ", cudaGetErrorString(e));
}
#define ZT_NCCL(call, where) nccl_check((call), #call, (where))
#define ZT_CUDART(call, where) cuda_check((call), #call, (where))

// The sends and receives issued while it lives form one NCCL group
// (ncclGroupStart now, ncclGroupEnd at end()). A call that throws in between
// still ends the group, in the destructor: else this thread's later NCCL
// calls would join it and never launch.
class NcclGroupScope {
 public:
  explicit NcclGroupScope(const std::string& where) : where_(where) { ZT_NCCL(ncclGroupStart(), where_); }
  ~NcclGroupScope() {
    if (!ended_) (void)ncclGroupEnd();
  }
  NcclGroupScope(const NcclGroupScope&) = delete;
  NcclGroupScope& operator=(const NcclGroupScope&) = delete;
  void end() {
    ended_ = true;
    ZT_NCCL(ncclGroupEnd(), where_);
  }

 private:
  std::string where_;
  bool ended_ = false;
};

// Reductions: NCCL's types for the dtypes comm reduces (bf16 and f16 rounded
// to their type at each step, as the MPI backend's user ops do).
ncclDataType_t reduce_type(DType d) {
  switch (d) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    default: ZT_FAIL("internal: no NCCL reduction type for ", dtype_name(d));
  }
}

ncclRedOp_t reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

// A CUDA event shared by the Work handed to the caller and the group's list
// of operations in flight (destroyed with the last owner; CUDA releases it
// once it has completed).
using SharedEvent = std::shared_ptr<CUevent_st>;

SharedEvent record_timed_event(cudaStream_t stream, const std::string& at) {
  cudaEvent_t e = nullptr;
  ZT_CUDART(cudaEventCreate(&e), at);  // with timing: busy time is done - start
  SharedEvent shared(e, [](cudaEvent_t ev) { (void)cudaEventDestroy(ev); });
  ZT_CUDART(cudaEventRecord(e, stream), at);
  return shared;
}

// An operation on the communication stream: complete when its event is.
// It holds its tensors until it is dropped; one dropped before wait() first
// makes the compute stream wait for the operation, so their memory, freed
// then and reused in compute-stream order, is not overwritten while NCCL
// still reads or writes it.
class NcclWork : public Work {
 public:
  NcclWork(SharedEvent done, cudaStream_t compute, std::string where, std::vector<Tensor> keep)
      : done_(std::move(done)), compute_(compute), where_(std::move(where)), keep_(std::move(keep)) {}
  ~NcclWork() override {
    if (!waited_) (void)cudaStreamWaitEvent(compute_, done_.get(), 0);
  }
  bool test() override { return cuda::event_completed(done_.get(), where_.c_str()); }
  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (waited_) return;
    ZT_CUDART(cudaStreamWaitEvent(compute_, done_.get(), 0), where_);
    waited_ = true;
  }

 private:
  SharedEvent done_;
  cudaStream_t compute_;
  std::string where_;
  std::vector<Tensor> keep_;
  std::mutex mu_;
  bool waited_ = false;
};

// A communicator and the lock its callers take (NCCL's calls on one
// communicator must not overlap); destroyed with its last group.
struct SharedComm {
  explicit SharedComm(ncclComm_t c) : comm(c) {}
  ~SharedComm() { (void)ncclCommDestroy(comm); }
  ncclComm_t comm;
  std::mutex mu;
};

// The communicators of one group and every group split from it, by their
// members (world ranks in group rank order: the same list on every member).
// A split whose members already have one shares it instead of making
// another - the mesh's dp, dp_cp and ep_dp groups are the world, or each
// other, whenever the other dimensions are 1, and every NCCL communicator
// holds its own buffers on the GPU (hundreds of MB with NVLS), outside the
// memory plan. Owned by the groups of that family (no global state).
class CommRegistry {
 public:
  std::shared_ptr<SharedComm> find(const std::vector<int>& members) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = comms_.find(members);
    if (it == comms_.end()) return nullptr;
    std::shared_ptr<SharedComm> c = it->second.lock();
    if (!c) comms_.erase(it);
    return c;
  }
  std::shared_ptr<SharedComm> add(const std::vector<int>& members, ncclComm_t comm) {
    auto c = std::make_shared<SharedComm>(comm);
    std::lock_guard<std::mutex> lock(mu_);
    comms_[members] = c;
    return c;
  }
  int live() {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& [members, c] : comms_) n += c.expired() ? 0 : 1;
    return n;
  }

 private:
  std::mutex mu_;
  std::map<std::vector<int>, std::weak_ptr<SharedComm>> comms_;
};

class NcclGroup : public ProcessGroup {
 public:
  NcclGroup(std::unique_ptr<ProcessGroup> host, Device device, std::shared_ptr<CommRegistry> family,
            std::shared_ptr<SharedComm> comm, std::string name)
      : host_(std::move(host)),
        device_(device),
        family_(std::move(family)),
        shared_(std::move(comm)) {
    rank_ = host_->rank();
    size_ = host_->size();
    world_ranks_ = host_->world_ranks();
    name_ = std::move(name);
    compute_ = static_cast<cudaStream_t>(cuda::compute_stream_handle(device_));
    stream_ = static_cast<cudaStream_t>(cuda::comm_stream_handle(device_));
    // The watchdog sees the oldest GPU operation not yet complete: a hang on
    // the device ends the job with a message instead of blocking the next
    // host synchronisation forever.
    auto from_monitor = [this] {
      (void)cudaSetDevice(device_.index);  // the monitor thread's current device, for the event queries
      return settle();
    };
    // NCCL's own asynchronous errors (a peer's process or a link gone, a
    // remote failure) end the job when NCCL sees them, not at the timeout.
    auto fault = [this]() -> std::string {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(nccl(), &state) != ncclSuccess) return {};
      if (state == ncclSuccess || state == ncclInProgress) return {};
      std::string what = std::string("NCCL reported ") + ncclGetErrorString(state);
      if (const char* last = ncclGetLastError(nccl()); last && *last) what += std::string(" (") + last + ")";
      return what + " - a peer may have died or a link failed";
    };
    watch({this, from_monitor, name_ + " (NCCL)", world_ranks_, world_ranks_[size_t(rank_)],
           world_info().timeout_seconds, fault});
  }
  ~NcclGroup() override {
    unwatch(this);
    (void)cudaStreamSynchronize(stream_);  // nothing of ours in flight when the communicator goes
    // (shared_ destroys it after the last group that holds it)
  }

  int communicators() const { return family_->live(); }

  // Every communicator of the device runs on its one comm stream.
  bool shares_one_queue() const override { return true; }

  WorkHandle all_reduce(const Tensor& t, ReduceOp op) override {
    if (on_host(t)) return host_->all_reduce(t, op);
    const char* name = "all_reduce";
    check_device(name, t);
    check_reducible(name, *this, t);
    return launch(name, 2 * int64_t(t.nbytes()) * (size_ - 1) / size_, {t}, [&](cudaStream_t s) {
      ZT_NCCL(ncclAllReduce(t.data_ptr(), t.data_ptr(), size_t(t.numel()), reduce_type(t.dtype()), reduce_op(op),
                            nccl(), s),
              where(name, *this));
    });
  }

  WorkHandle reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    if (on_host(out) && on_host(in)) return host_->reduce_scatter(out, in, op);
    const char* name = "reduce_scatter";
    check_device(name, out);
    check_device(name, in);
    check_reducible(name, *this, in);
    check_same_dtype(name, *this, out, in);
    check_numel(name, *this, "in", in.numel(), out.numel() * size_);
    return launch(name, int64_t(in.nbytes()) * (size_ - 1) / size_, {out, in}, [&](cudaStream_t s) {
      ZT_NCCL(ncclReduceScatter(in.data_ptr(), out.data_ptr(), size_t(out.numel()), reduce_type(in.dtype()),
                                reduce_op(op), nccl(), s),
              where(name, *this));
    });
  }

  WorkHandle all_gather(const Tensor& out, const Tensor& in) override {
    if (on_host(out) && on_host(in)) return host_->all_gather(out, in);
    const char* name = "all_gather";
    check_device(name, out);
    check_device(name, in);
    check_same_dtype(name, *this, out, in);
    check_numel(name, *this, "out", out.numel(), in.numel() * size_);
    // In place when `in` is this rank's block of `out` (NCCL's own rule).
    return launch(name, int64_t(out.nbytes()) * (size_ - 1) / size_, {out, in}, [&](cudaStream_t s) {
      ZT_NCCL(ncclAllGather(in.data_ptr(), out.data_ptr(), in.nbytes(), ncclUint8, nccl(), s), where(name, *this));
    });
  }

  WorkHandle broadcast(const Tensor& t, int root) override {
    if (on_host(t)) return host_->broadcast(t, root);
    const char* name = "broadcast";
    check_device(name, t);
    check_peer(name, *this, root, true);
    return launch(name, rank_ == root ? int64_t(t.nbytes()) : 0, {t}, [&](cudaStream_t s) {
      ZT_NCCL(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.nbytes(), ncclUint8, root, nccl(), s), where(name, *this));
    });
  }

  // GPU tensors through host memory (host_ stages them): NCCL's transfers
  // carry no tag, and a receive posted early on the comm stream would hold
  // up every later operation until its sender got there.
  WorkHandle send(const Tensor& t, int dst, int tag) override {
    if (!on_host(t)) {
      check_device("send", t);
      count_op(int64_t(t.nbytes()));
    }
    return host_->send(t, dst, tag);
  }
  WorkHandle recv(const Tensor& t, int src, int tag) override {
    if (!on_host(t)) {
      check_device("recv", t);
      count_op(0);
    }
    return host_->recv(t, src, tag);
  }

  // A ring step of GPU tensors: one grouped send and receive on the comm
  // stream, after the compute stream's work queued so far (sent's producer,
  // received's last readers), like a collective.
  WorkHandle send_recv(const Tensor& sent, int dst, const Tensor& received, int src, int tag) override {
    if (on_host(sent) && on_host(received)) return host_->send_recv(sent, dst, received, src, tag);
    const char* name = "send_recv";
    check_device(name, sent);
    check_device(name, received);
    check_peer(name, *this, dst, false);
    check_peer(name, *this, src, false);
    return launch(name, int64_t(sent.nbytes()), {sent, received}, [&](cudaStream_t s) {
      const std::string at = where(name, *this);
      NcclGroupScope group(at);
      ZT_NCCL(ncclSend(sent.data_ptr(), sent.nbytes(), ncclUint8, dst, nccl(), s), at);
      ZT_NCCL(ncclRecv(received.data_ptr(), received.nbytes(), ncclUint8, src, nccl(), s), at);
      group.end();
    });
  }

  WorkHandle all_to_all(const Tensor& out, const Tensor& in) override {
    if (on_host(out) && on_host(in)) return host_->all_to_all(out, in);
    const char* name = "all_to_all";
    check_device(name, out);
    check_device(name, in);
    check_same_dtype(name, *this, out, in);
    check_numel(name, *this, "out", out.numel(), in.numel());
    ZT_CHECK(in.numel() % size_ == 0, where(name, *this), in.numel(), " elements do not split into ", size_,
             " equal blocks");
    const std::vector<int64_t> counts(size_t(size_), in.numel() / size_);
    return exchange(name, out, counts, in, counts);
  }

  WorkHandle all_to_allv(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                         std::span<const int64_t> in_counts) override {
    if (on_host(out) && on_host(in)) return host_->all_to_allv(out, out_counts, in, in_counts);
    const char* name = "all_to_allv";
    check_device(name, out);
    check_device(name, in);
    check_same_dtype(name, *this, out, in);
    check_counts(name, *this, "out_counts", out_counts, out.numel());
    check_counts(name, *this, "in_counts", in_counts, in.numel());
    return exchange(name, out, out_counts, in, in_counts);
  }

  WorkHandle barrier() override { return host_->barrier(); }

  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override {
    std::unique_ptr<ProcessGroup> host = host_->split(color, key, name);
    // Every member of this group passes NCCL_SPLIT_NOCOLOR when their
    // communicator exists already (each made it with the others), so the
    // split, collective over this group, is still called by every rank.
    std::shared_ptr<SharedComm> same = family_->find(host->world_ranks());
    ncclComm_t comm = nullptr;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      cuda::ensure_initialized(device_);  // NCCL works on the current device
      ZT_NCCL(ncclCommSplit(nccl(), same ? NCCL_SPLIT_NOCOLOR : color, key, &comm, nullptr), where("split", *this));
    }
    if (same) {
      ZT_ASSERT(comm == nullptr, where("split", *this), "NCCL made a communicator for a rank that passed no color");
      return std::make_unique<NcclGroup>(std::move(host), device_, family_, std::move(same), name);
    }
    // Block offsets and peers are host ranks: NCCL's split must order the
    // members as the host's does (by key, then parent rank).
    int nccl_rank = -1, nccl_size = -1;
    ZT_NCCL(ncclCommUserRank(comm, &nccl_rank), where("split", *this));
    ZT_NCCL(ncclCommCount(comm, &nccl_size), where("split", *this));
    ZT_ASSERT(nccl_rank == host->rank() && nccl_size == host->size(), where("split", *this), "NCCL made rank ",
              nccl_rank, " of ", nccl_size, " where the host group made rank ", host->rank(), " of ", host->size());
    std::shared_ptr<SharedComm> made = family_->add(host->world_ranks(), comm);
    return std::make_unique<NcclGroup>(std::move(host), device_, family_, std::move(made), name);
  }

 private:
  ncclComm_t nccl() const { return shared_->comm; }
  bool on_host(const Tensor& t) const { return t.defined() && t.device().is_cpu(); }

  void check_device(const char* op, const Tensor& t) const {
    ZT_CHECK(t.defined(), where(op, *this), "undefined tensor");
    ZT_CHECK(t.device() == device_, where(op, *this), "the tensor is on ", t.device().str(), " but this group's GPU is ",
             device_.str(), " (pass tensors of this process's GPU, or host tensors)");
  }

  // Operations that finished since the last call leave the front of the
  // list (they finish in stream order), adding their GPU time to busy_seconds;
  // returns the oldest one still in flight and when it was issued.
  // Called from the watchdog's thread too.
  CommThread::InFlight settle() {
    std::lock_guard<std::mutex> lock(pending_mu_);
    while (!pending_.empty()) {
      const Pending& p = pending_.front();
      // Not ready, or failed (the failure surfaces in the caller's next CUDA call).
      if (cuda::event_state(p.done.get()) != cuda::EventState::complete) return {p.op, p.issued};
      float ms = 0.0f;
      if (cudaEventElapsedTime(&ms, p.start.get(), p.done.get()) == cudaSuccess)
        add_busy_seconds(double(ms) * 1e-3);
      else
        (void)cudaGetLastError();  // no time, and no error left for the next launch check
      pending_.pop_front();
    }
    return {};
  }
  // stats() is const; settling moves only the counters and this list.
  void update_stats() const override { const_cast<NcclGroup*>(this)->settle(); }

  // Runs body(stream) on the communication stream after the compute stream's
  // queued work; the Work completes with it and holds `keep` (the operation's
  // tensors) until dropped. Timed on the device (start and done events) and
  // listed for the watchdog until it completes.
  WorkHandle launch(const char* op, int64_t bytes_sent, std::vector<Tensor> keep,
                    const std::function<void(cudaStream_t)>& body) {
    const std::string at = where(op, *this);
    std::lock_guard<std::mutex> lock(shared_->mu);  // one thread at a time in a communicator
    cuda::ensure_initialized(device_);
    settle();
    cudaEvent_t ready = nullptr;
    ZT_CUDART(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), at);
    ZT_CUDART(cudaEventRecord(ready, compute_), at);
    ZT_CUDART(cudaStreamWaitEvent(stream_, ready, 0), at);
    ZT_CUDART(cudaEventDestroy(ready), at);
    const auto issued = std::chrono::steady_clock::now();
    SharedEvent start = record_timed_event(stream_, at);
    body(stream_);
    SharedEvent done = record_timed_event(stream_, at);
    count_op(bytes_sent);
    {
      std::lock_guard<std::mutex> plock(pending_mu_);
      pending_.push_back({start, done, op, issued});
    }
    return std::make_shared<NcclWork>(std::move(done), compute_, at, std::move(keep));
  }

  // Block r of `in` (in_counts[r] elements) to rank r; block r of `out`
  // (out_counts[r]) from rank r; blocks packed in rank order.
  WorkHandle exchange(const char* op, const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                      std::span<const int64_t> in_counts) {
    const int64_t es = int64_t(dtype_size(in.dtype()));
    int64_t sent = 0;
    for (int r = 0; r < size_; ++r)
      if (r != rank_) sent += in_counts[size_t(r)] * es;
    const std::vector<int64_t> oc(out_counts.begin(), out_counts.end()), ic(in_counts.begin(), in_counts.end());
    return launch(op, sent, {out, in}, [&](cudaStream_t s) {
      const std::string at = where(op, *this);
      char* o = static_cast<char*>(out.data_ptr());
      const char* i = static_cast<const char*>(in.data_ptr());
      NcclGroupScope group(at);
      for (int r = 0; r < size_; ++r) {
        ZT_NCCL(ncclSend(i, size_t(ic[size_t(r)] * es), ncclUint8, r, nccl(), s), at);
        ZT_NCCL(ncclRecv(o, size_t(oc[size_t(r)] * es), ncclUint8, r, nccl(), s), at);
        i += ic[size_t(r)] * es;
        o += oc[size_t(r)] * es;
      }
      group.end();
    });
  }

  struct Pending {
    SharedEvent start, done;
    std::string op;
    std::chrono::steady_clock::time_point issued;
  };

  std::unique_ptr<ProcessGroup> host_;
  Device device_;
  std::shared_ptr<CommRegistry> family_;  // of the group this one was split from, and its splits
  std::shared_ptr<SharedComm> shared_;  // with every group of the same members
  cudaStream_t compute_ = nullptr, stream_ = nullptr;
  std::mutex pending_mu_;               // after shared_->mu when both are held
  std::deque<Pending> pending_;  // issued, not yet seen complete, in stream order
};

}  // namespace

bool nccl_available() { return true; }

int nccl_communicators(const ProcessGroup& group) {
  const auto* g = dynamic_cast<const NcclGroup*>(&group);
  return g ? g->communicators() : 0;
}

std::unique_ptr<ProcessGroup> make_nccl_group(std::unique_ptr<ProcessGroup> host, Device device,
                                              const std::string& name) {
  ZT_CHECK(device.is_cuda(), "comm: an NCCL group needs a GPU, got ", device.str());
  const std::string at = "comm: creating NCCL group '" + name + "' (size " + std::to_string(host->size()) + "): ";
  cuda::ensure_initialized(device);  // current device for NCCL
  // Rank 0's unique id reaches every member over the host group.
  ncclUniqueId id{};
  static_assert(sizeof(ncclUniqueId) % sizeof(int64_t) == 0);
  Tensor id_words = Tensor::empty(Shape{int64_t(sizeof id / sizeof(int64_t))}, DType::i64);
  if (host->rank() == 0) {
    ZT_NCCL(ncclGetUniqueId(&id), at);
    std::memcpy(id_words.data_ptr(), &id, sizeof id);
  }
  host->broadcast(id_words, 0)->wait();
  std::memcpy(&id, id_words.data_ptr(), sizeof id);
  ncclComm_t comm = nullptr;
  ZT_NCCL(ncclCommInitRank(&comm, host->size(), id, host->rank()), at);
  auto family = std::make_shared<CommRegistry>();
  std::shared_ptr<SharedComm> shared = family->add(host->world_ranks(), comm);
  // Point-to-point transfers of GPU tensors are staged through the host group.
  auto copy = [](const Tensor& dst, const Tensor& src) {
    cuda::copy_bytes(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), src.nbytes());
  };
  return std::make_unique<NcclGroup>(make_host_staged_group(std::move(host), copy), device, std::move(family),
                                     std::move(shared), name);
}

#endif

}  // namespace zt::comm
