// The op profiler's totals (ops/op_profile.h).
#include "ops/op_profile.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>

#if ZT_WITH_CUDA
#include "backend/cuda/runtime.h"
#endif

namespace zt::ops {

namespace {

struct PendingGpuOp {  // timed on the GPU, not yet read
  const char* name;
  void* start;
  void* end;
};

struct Profile {
  std::mutex mu;
  std::map<std::string, OpTotal> totals;
  std::vector<PendingGpuOp> pending;
};

std::atomic<bool> g_enabled{false};
thread_local int t_depth = 0;  // ops open on this thread

Profile& profile() {
  static Profile p;
  return p;
}

void add(Profile& p, const char* name, double seconds) {  // p.mu held
  OpTotal& t = p.totals[name];
  t.name = name;
  ++t.calls;
  t.seconds += seconds;
}

}  // namespace

void enable_op_profile(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool op_profile_enabled() { return g_enabled.load(std::memory_order_relaxed); }

std::vector<OpTotal> take_op_profile() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
#if ZT_WITH_CUDA
  for (const PendingGpuOp& op : p.pending) {
    add(p, op.name, double(cuda::elapsed_ms(op.start, op.end)) / 1e3);
    cuda::release_mark(op.start);
    cuda::release_mark(op.end);
  }
#endif
  p.pending.clear();
  std::vector<OpTotal> out;
  for (auto& [name, t] : p.totals) out.push_back(t);
  p.totals.clear();
  std::sort(out.begin(), out.end(), [](const OpTotal& a, const OpTotal& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
  });
  return out;
}

OpScope::OpScope(const char* name, const Tensor& on) {
  if (!g_enabled.load(std::memory_order_relaxed)) return;
  const Device device = on.defined() ? on.device() : Device::cpu();
  device_ = device;
  if (t_depth++ > 0) {
    --t_depth;  // nested: the outer op holds the time
    return;
  }
  name_ = name;
#if ZT_WITH_CUDA
  if (device.is_cuda()) {
    start_mark_ = cuda::record_mark(device);
    return;
  }
#endif
  start_ = std::chrono::steady_clock::now();
}

OpScope::~OpScope() {
  if (!name_) return;
  --t_depth;
  Profile& p = profile();
#if ZT_WITH_CUDA
  if (start_mark_) {
    void* end = nullptr;
    try {
      end = cuda::record_mark(device_);
    } catch (...) {  // a failing device: the op's own error is the one to report
      return;
    }
    std::lock_guard<std::mutex> lock(p.mu);
    p.pending.push_back({name_, start_mark_, end});
    return;
  }
#endif
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::lock_guard<std::mutex> lock(p.mu);
  add(p, name_, seconds);
}

}  // namespace zt::ops
