// The process's timeline recorder (core/trace.h).
#include "core/trace.h"

#include <atomic>
#include <mutex>

namespace zt {

namespace {

struct Trace {
  std::mutex mu;
  TraceClock::time_point origin;
  std::vector<TraceSpan> spans;
};

std::atomic<bool> g_on{false};

Trace& the_trace() {
  static Trace t;
  return t;
}

}  // namespace

void trace_begin() {
  Trace& t = the_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  t.spans.clear();
  t.origin = TraceClock::now();
  g_on.store(true, std::memory_order_relaxed);
}

bool trace_on() { return g_on.load(std::memory_order_relaxed); }

TraceClock::time_point trace_origin() {
  Trace& t = the_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.origin;
}

void trace_span(std::string_view track, std::string_view name, TraceClock::time_point start,
                TraceClock::time_point end) {
  if (!trace_on()) return;
  Trace& t = the_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  using us = std::chrono::duration<double, std::micro>;
  t.spans.push_back({std::string(track), std::string(name), us(start - t.origin).count(), us(end - start).count()});
}

void trace_span_us(std::string_view track, std::string_view name, double start_us, double dur_us) {
  if (!trace_on()) return;
  Trace& t = the_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  t.spans.push_back({std::string(track), std::string(name), start_us, dur_us});
}

std::vector<TraceSpan> trace_end() {
  Trace& t = the_trace();
  std::lock_guard<std::mutex> lock(t.mu);
  g_on.store(false, std::memory_order_relaxed);
  std::vector<TraceSpan> out;
  out.swap(t.spans);
  return out;
}

}  // namespace zt
