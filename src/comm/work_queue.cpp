#include "comm/work_queue.h"

namespace zt::comm {

using Clock = std::chrono::steady_clock;

bool QueuedWork::test() {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_ && error_) std::rethrow_exception(error_);
  return done_;
}

void QueuedWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!done_) {
    const auto t0 = Clock::now();
    cv_.wait(lock, [&] { return done_; });
    if (on_wait_) on_wait_(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  if (error_) std::rethrow_exception(error_);
}

void QueuedWork::run(const BusyCallback& on_busy) {
  std::exception_ptr err;
  const auto t0 = Clock::now();
  try {
    fn_();
  } catch (...) {
    err = std::current_exception();
  }
  if (on_busy) on_busy(op_, t0, Clock::now());
  fn_ = nullptr;  // drop the tensors it holds as soon as it is done
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = err;
  }
  cv_.notify_all();
}

CommThread::CommThread(BusyCallback on_busy) : on_busy_(std::move(on_busy)) {
  thread_ = std::thread([this] { loop(); });
}

CommThread::~CommThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CommThread::enqueue(std::shared_ptr<QueuedWork> w) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(w));
  }
  cv_.notify_all();
}

CommThread::InFlight CommThread::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

void CommThread::loop() {
  for (;;) {
    std::shared_ptr<QueuedWork> w;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      w = std::move(queue_.front());
      queue_.pop_front();
      current_ = {w->op(), Clock::now()};
    }
    w->run(on_busy_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = {};
    }
  }
}

}  // namespace zt::comm
