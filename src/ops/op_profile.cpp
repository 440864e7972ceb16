// The op profiler's totals (ops/op_profile.h).
#include "ops/op_profile.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>

#include "core/allocator.h"

namespace zt::ops {

namespace {

// A GPU op's marks, read once its work is done (shared by the totals and the trace).
using SharedMark = std::shared_ptr<const DeviceMark>;

struct PendingGpuOp {  // timed on the GPU, not yet read
  const char* name;
  SharedMark start, end;
  int64_t workspace_bytes, cache_misses;
  double flops;
};

struct PendingTraceOp {  // a GPU op of the trace, not yet read
  const char* name;
  SharedMark start, end;
};

struct Profile {
  std::mutex mu;
  std::map<std::string, OpTotal> totals;
  std::vector<PendingGpuOp> pending;
  // The trace's GPU ops and the mark they are placed from (its host time
  // since the trace's origin, microseconds).
  std::vector<PendingTraceOp> trace_pending;
  DeviceMark trace_mark;
  double trace_mark_us = 0;
};

std::atomic<bool> g_enabled{false};
thread_local int t_depth = 0;  // ops open on this thread

Profile& profile() {
  static Profile p;
  return p;
}

void add(Profile& p, const char* name, double seconds, int64_t workspace_bytes, int64_t cache_misses,
         double flops) {  // p.mu held
  OpTotal& t = p.totals[name];
  t.name = name;
  ++t.calls;
  t.seconds += seconds;
  t.workspace_peak_bytes = std::max(t.workspace_peak_bytes, workspace_bytes);
  t.cache_misses += cache_misses;
  t.flops += flops;
}

}  // namespace

void enable_op_profile(bool on) { g_enabled.store(on, std::memory_order_relaxed); }
bool op_profile_enabled() { return g_enabled.load(std::memory_order_relaxed); }

std::vector<OpTotal> take_op_profile() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  for (const PendingGpuOp& op : p.pending)
    add(p, op.name, op.end->seconds_since(*op.start), op.workspace_bytes, op.cache_misses, op.flops);
  p.pending.clear();
  std::vector<OpTotal> out;
  for (auto& [name, t] : p.totals) out.push_back(t);
  p.totals.clear();
  std::sort(out.begin(), out.end(), [](const OpTotal& a, const OpTotal& b) {
    return a.seconds != b.seconds ? a.seconds > b.seconds : a.name < b.name;
  });
  return out;
}

void begin_op_trace(Device device) {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  p.trace_pending.clear();
  p.trace_mark = DeviceMark(device);
  p.trace_mark_us = std::chrono::duration<double, std::micro>(TraceClock::now() - trace_origin()).count();
}

void end_op_trace() {
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  for (const PendingTraceOp& op : p.trace_pending)
    trace_span_us("ops", op.name, p.trace_mark_us + 1e6 * op.start->seconds_since(p.trace_mark),
                  1e6 * op.end->seconds_since(*op.start));
  p.trace_pending.clear();
  p.trace_mark = DeviceMark();
}

void trace_device_span(const std::string& track, const std::string& name, const DeviceMark& start,
                       const DeviceMark& end) {
  if (!trace_on()) return;
  Profile& p = profile();
  std::lock_guard<std::mutex> lock(p.mu);
  trace_span_us(track, name, p.trace_mark_us + 1e6 * start.seconds_since(p.trace_mark),
                1e6 * end.seconds_since(start));
}

OpScope::OpScope(const char* name, const Tensor& on) {
  const bool profiled = g_enabled.load(std::memory_order_relaxed);
  if (!profiled && !trace_on()) return;
  if (t_depth++ > 0) {
    --t_depth;  // nested: the outer op holds the time
    return;
  }
  try {
    device_ = on.defined() ? on.device() : Device::cpu();
    Allocator& allocator = allocator_for(device_);
    allocator.reset_window_peak();
    const MemStats stats = allocator.stats();
    workspace_at_start_ = stats.current(MemCategory::workspace);
    misses_at_start_ = stats.num_system_allocs;
    start_ = DeviceMark(device_);
    host_start_ = TraceClock::now();
    profiled_ = profiled;
    name_ = name;
  } catch (...) {  // a device that cannot be timed: the op reports the problem itself
    --t_depth;
  }
}

OpScope::~OpScope() {
  if (!name_) return;
  --t_depth;
  Profile& p = profile();
  try {
    // Allocations are accounted on the host as the op enqueues its work.
    const MemStats stats = allocator_for(device_).stats();
    const int64_t workspace = stats.window_peak(MemCategory::workspace) - workspace_at_start_;
    const int64_t misses = stats.num_system_allocs - misses_at_start_;
    DeviceMark end(device_);
    if (end.on_gpu()) {
      const SharedMark s = std::make_shared<const DeviceMark>(std::move(start_)),
                       e = std::make_shared<const DeviceMark>(std::move(end));
      std::lock_guard<std::mutex> lock(p.mu);
      if (trace_on() && p.trace_mark.on_gpu()) p.trace_pending.push_back({name_, s, e});
      if (profiled_) p.pending.push_back({name_, s, e, workspace, misses, flops_});
      return;
    }
    if (trace_on()) trace_span("ops", name_, host_start_, TraceClock::now());
    if (!profiled_) return;
    const double seconds = end.seconds_since(start_);
    std::lock_guard<std::mutex> lock(p.mu);
    add(p, name_, seconds, workspace, misses, flops_);
  } catch (...) {  // a failing device: the op's own error is the one to report
  }
}

}  // namespace zt::ops
