// The machinery behind asynchronous operations: a Work that completes when
// a comm thread has run it, and the thread that runs a group's operations
// one at a time in issue order.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/process_group.h"

namespace zt::comm {

// Told of each operation run: its name, when it started and when it ended.
using BusyCallback = std::function<void(const std::string& op, std::chrono::steady_clock::time_point start,
                                        std::chrono::steady_clock::time_point end)>;

// An operation queued on a comm thread.
class QueuedWork : public Work {
 public:
  QueuedWork(std::string op, std::function<void()> fn, std::function<void(double)> on_wait)
      : op_(std::move(op)), fn_(std::move(fn)), on_wait_(std::move(on_wait)) {}
  bool test() override;
  void wait() override;
  const std::string& op() const { return op_; }
  // Runs the operation (on the comm thread), reports how long it ran to
  // on_busy, then marks it complete - in that order, so a caller returning
  // from wait() sees the operation in the counters.
  void run(const BusyCallback& on_busy);

 private:
  std::string op_;
  std::function<void()> fn_;
  std::function<void(double)> on_wait_;  // seconds a caller blocked
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// A work that is complete from the start (solo groups, empty operations).
class DoneWork : public Work {
 public:
  bool test() override { return true; }
  void wait() override {}
};

// One thread executing queued operations in order. The watchdog reads
// what is in flight (op name and start time) through in_flight().
class CommThread {
 public:
  explicit CommThread(BusyCallback on_busy);
  ~CommThread();  // runs what is queued, then stops
  void enqueue(std::shared_ptr<QueuedWork> w);
  // The operation running now and since when (empty op when idle).
  struct InFlight {
    std::string op;
    std::chrono::steady_clock::time_point since;
  };
  InFlight in_flight() const;

 private:
  void loop();
  BusyCallback on_busy_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<QueuedWork>> queue_;
  InFlight current_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace zt::comm
