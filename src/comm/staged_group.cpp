// The host-staged ProcessGroup (comm/staged_group.h).
#include "comm/staged_group.h"

#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace zt::comm {

namespace {

bool on_host(const Tensor& t) { return !t.defined() || t.device().is_cpu(); }  // undefined: the host group says so

// The host side of one operation: device tensors it reads are copied to host
// buffers at once; host buffers it writes go back to their device tensors in
// finish(). Host tensors are used as they are.
class Staging {
 public:
  explicit Staging(const DeviceCopy& copy) : copy_(copy) {}

  // A tensor the operation only reads.
  Tensor in(const Tensor& t) {
    if (on_host(t)) return t;
    Tensor h = host_like(t);
    copy_(h, t);
    kept_.push_back(h);  // a send reads it until it completes
    return h;
  }
  // A tensor the operation only writes.
  Tensor out(const Tensor& t) {
    if (on_host(t)) return t;
    Tensor h = host_like(t);
    back_.push_back({t, h});
    return h;
  }
  // A tensor the operation reads and writes.
  Tensor in_out(const Tensor& t) {
    if (on_host(t)) return t;
    Tensor h = in(t);
    back_.push_back({t, h});
    return h;
  }
  bool staged() const { return !kept_.empty() || !back_.empty(); }

  // The copies back to the device, once the host operation is complete.
  void finish() {
    for (const auto& [device, host] : back_) copy_(device, host);
    back_.clear();
    kept_.clear();
  }

 private:
  static Tensor host_like(const Tensor& t) {
    return Tensor::empty(t.shape(), t.dtype(), Device::cpu(), MemCategory::comm);
  }
  DeviceCopy copy_;
  std::vector<Tensor> kept_;
  std::vector<std::pair<Tensor, Tensor>> back_;  // (device tensor, host buffer)
};

// Complete when the host operation is, after the copies back.
class StagedWork : public Work {
 public:
  StagedWork(WorkHandle host_work, Staging staging) : host_work_(std::move(host_work)), staging_(std::move(staging)) {}
  bool test() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return true;
    if (!host_work_->test()) return false;
    finish();
    return true;
  }
  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    host_work_->wait();
    finish();
  }

 private:
  void finish() {
    staging_.finish();
    finished_ = true;
  }
  WorkHandle host_work_;
  Staging staging_;
  std::mutex mu_;
  bool finished_ = false;
};

class StagedGroup : public ProcessGroup {
 public:
  StagedGroup(std::unique_ptr<ProcessGroup> host, DeviceCopy copy) : host_(std::move(host)), copy_(std::move(copy)) {
    ZT_ASSERT(host_ && copy_, "a staged group needs a host group and a copy function");
    rank_ = host_->rank();
    size_ = host_->size();
    name_ = host_->name();
    world_ranks_ = host_->world_ranks();
  }

  WorkHandle all_reduce(const Tensor& t, ReduceOp op) override {
    Staging s(copy_);
    const Tensor h = s.in_out(t);
    return done_after(host_->all_reduce(h, op), std::move(s));
  }
  WorkHandle reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    Staging s(copy_);
    const Tensor hin = s.in(in), hout = s.out(out);
    return done_after(host_->reduce_scatter(hout, hin, op), std::move(s));
  }
  WorkHandle all_gather(const Tensor& out, const Tensor& in) override {
    // `in` may be this rank's block of `out`: its host copy is taken first,
    // and the whole of `out` comes back (its own block unchanged).
    Staging s(copy_);
    const Tensor hin = s.in(in), hout = s.out(out);
    return done_after(host_->all_gather(hout, hin), std::move(s));
  }
  WorkHandle broadcast(const Tensor& t, int root) override {
    Staging s(copy_);
    const Tensor h = rank_ == root ? s.in(t) : s.in_out(t);  // the root's values do not change
    return done_after(host_->broadcast(h, root), std::move(s));
  }
  WorkHandle send(const Tensor& t, int dst, int tag) override {
    Staging s(copy_);
    const Tensor h = s.in(t);
    return done_after(host_->send(h, dst, tag), std::move(s));
  }
  WorkHandle recv(const Tensor& t, int src, int tag) override {
    Staging s(copy_);
    const Tensor h = s.out(t);
    return done_after(host_->recv(h, src, tag), std::move(s));
  }
  WorkHandle all_to_all(const Tensor& out, const Tensor& in) override {
    Staging s(copy_);
    const Tensor hin = s.in(in), hout = s.out(out);
    return done_after(host_->all_to_all(hout, hin), std::move(s));
  }
  WorkHandle all_to_allv(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                         std::span<const int64_t> in_counts) override {
    Staging s(copy_);
    const Tensor hin = s.in(in), hout = s.out(out);
    return done_after(host_->all_to_allv(hout, out_counts, hin, in_counts), std::move(s));
  }
  WorkHandle barrier() override { return host_->barrier(); }

  std::unique_ptr<ProcessGroup> split(int color, int key, const std::string& name) override {
    return std::make_unique<StagedGroup>(host_->split(color, key, name), copy_);
  }

  CommStats stats() const override { return host_->stats(); }

 private:
  static WorkHandle done_after(WorkHandle host_work, Staging staging) {
    if (!staging.staged()) return host_work;  // host tensors only: nothing to copy back
    return std::make_shared<StagedWork>(std::move(host_work), std::move(staging));
  }

  std::unique_ptr<ProcessGroup> host_;
  DeviceCopy copy_;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_host_staged_group(std::unique_ptr<ProcessGroup> host, DeviceCopy copy) {
  return std::make_unique<StagedGroup>(std::move(host), std::move(copy));
}

}  // namespace zt::comm
