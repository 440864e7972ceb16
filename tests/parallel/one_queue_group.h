// A CPU stand-in for NCCL's ordering: a ProcessGroup over a host group that
// runs every operation of every group split from it on one shared thread,
// in issue order, as NCCL runs all of a GPU's communicators on its one
// communication stream (shares_one_queue() is true). A rank that issues
// operations across groups in another order than its peers then waits on
// them in a cycle here as it would on GPUs, and the log of what each rank
// issued ("<group>:<op>", in issue order) shows the orders without relying
// on that timing. Point-to-point is posted at once, as the NCCL group's
// (staged through the host) is.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "comm/work_queue.h"

namespace zt::test {

// The thread that runs the operations of a root and of every group split
// from it, and their issue log.
struct OneQueue {
  comm::CommThread thread{nullptr};
  std::mutex mu;
  std::vector<std::string> issued;
};

class OneQueueGroup : public comm::ProcessGroup {
 public:
  // Over `inner` (owned when `owned` holds it), queueing on `queue`.
  OneQueueGroup(comm::ProcessGroup& inner, std::unique_ptr<comm::ProcessGroup> owned, std::shared_ptr<OneQueue> queue)
      : inner_(inner), owned_(std::move(owned)), queue_(std::move(queue)) {
    rank_ = inner_.rank();
    size_ = inner_.size();
    name_ = inner_.name();
    world_ranks_ = inner_.world_ranks();
  }
  // A root over `inner` with a queue of its own.
  explicit OneQueueGroup(comm::ProcessGroup& inner) : OneQueueGroup(inner, nullptr, std::make_shared<OneQueue>()) {}
  // What is queued reads inner_: it runs before inner_ goes.
  ~OneQueueGroup() override { enqueue("drain", [] {})->wait(); }

  bool shares_one_queue() const override { return true; }
  std::vector<std::string> issued() const {
    std::lock_guard<std::mutex> lock(queue_->mu);
    return queue_->issued;
  }
  // The log as one string, a line an operation: what ranks compare.
  std::string issued_lines() const {
    std::string lines;
    for (const std::string& op : issued()) lines += op + "\n";
    return lines;
  }

  comm::WorkHandle all_reduce(const Tensor& t, comm::ReduceOp op) override {
    return queued("all_reduce", [this, t, op] { inner_.all_reduce(t, op)->wait(); });
  }
  comm::WorkHandle reduce_scatter(const Tensor& out, const Tensor& in, comm::ReduceOp op) override {
    return queued("reduce_scatter", [this, out, in, op] { inner_.reduce_scatter(out, in, op)->wait(); });
  }
  comm::WorkHandle all_gather(const Tensor& out, const Tensor& in) override {
    return queued("all_gather", [this, out, in] { inner_.all_gather(out, in)->wait(); });
  }
  comm::WorkHandle broadcast(const Tensor& t, int root) override {
    return queued("broadcast", [this, t, root] { inner_.broadcast(t, root)->wait(); });
  }
  comm::WorkHandle send(const Tensor& t, int dst, int tag) override { return inner_.send(t, dst, tag); }
  comm::WorkHandle recv(const Tensor& t, int src, int tag) override { return inner_.recv(t, src, tag); }
  comm::WorkHandle all_to_all(const Tensor& out, const Tensor& in) override {
    return queued("all_to_all", [this, out, in] { inner_.all_to_all(out, in)->wait(); });
  }
  comm::WorkHandle all_to_allv(const Tensor& out, std::span<const int64_t> out_counts, const Tensor& in,
                               std::span<const int64_t> in_counts) override {
    std::vector<int64_t> oc(out_counts.begin(), out_counts.end()), ic(in_counts.begin(), in_counts.end());
    return queued("all_to_allv", [this, out, in, oc = std::move(oc), ic = std::move(ic)] {
      inner_.all_to_allv(out, oc, in, ic)->wait();
    });
  }
  comm::WorkHandle barrier() override {
    return queued("barrier", [this] { inner_.barrier()->wait(); });
  }
  std::unique_ptr<comm::ProcessGroup> split(int color, int key, const std::string& name) override {
    std::unique_ptr<comm::ProcessGroup> child;
    queued("split", [&] { child = inner_.split(color, key, name); })->wait();
    comm::ProcessGroup& c = *child;
    return std::make_unique<OneQueueGroup>(c, std::move(child), queue_);
  }
  comm::CommStats stats() const override { return inner_.stats(); }

 private:
  comm::WorkHandle enqueue(const char* op, std::function<void()> fn) {
    auto w = std::make_shared<comm::QueuedWork>(op, std::move(fn), nullptr);
    queue_->thread.enqueue(w);
    return w;
  }
  // Logged and queued under one lock: the log's order is the queue's.
  comm::WorkHandle queued(const char* op, std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(queue_->mu);
    queue_->issued.push_back(name_ + ":" + op);
    return enqueue(op, std::move(fn));
  }

  comm::ProcessGroup& inner_;
  std::unique_ptr<comm::ProcessGroup> owned_;
  std::shared_ptr<OneQueue> queue_;
};

}  // namespace zt::test
