// Where the compute goes, op by op. When enabled, every public op (ops/*.h)
// adds its time to a total per op name: CPU ops by the wall clock, GPU ops
// by events on the device's compute stream, read only when the totals are
// taken (so profiling adds no host synchronisation inside a step). An op
// called inside another (linear_forward's matmul) counts once, in the outer
// one: the totals never overlap, and their sum is at most the time spent.
// Each op also records the most workspace memory (MemCategory::workspace:
// its temporaries - cuDNN's, partial sums) that one call held above what was
// live when it began, from the device allocator's window peak (the memory
// plan counts the largest: ops/workspace.h), and how many of its allocations
// the allocator's cache could not serve: on a GPU each is a cudaMalloc, which
// waits for the device, so a miss in a steady-state step is time the op
// table charges to that op. The window and the counter are the allocator's,
// so the figures are exact while ops run on one thread, as the trainer runs
// them (the communication and loader threads move bytes, not ops). Ops that
// do arithmetic worth a rate say how much (add_flops: a matrix product
// 2 M N K, attention its causal products), so the table gives each its
// achieved TFLOP/s beside the device's own GEMM rate.
// Off by default; a scope then costs two relaxed atomic loads.
//
// While a trace is on (core/trace.h), every op is also a span on the "ops"
// track: a CPU op by the host clock, a GPU op by events resolved in
// end_op_trace, placed from a mark made at begin_op_trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/trace.h"
#include "ops/device.h"

namespace zt::ops {

struct OpTotal {
  std::string name;     // the op's name, as its errors give it ("linear_forward")
  int64_t calls = 0;
  double seconds = 0;
  int64_t workspace_peak_bytes = 0;  // the most workspace one call held above its start (max over calls)
  int64_t cache_misses = 0;          // its allocations the allocator's cache could not serve (sum over calls)
  double flops = 0;                  // the arithmetic its calls reported (add_flops; 0: none reported)
};

void enable_op_profile(bool on);
bool op_profile_enabled();
// The totals since the last take (waiting for the GPU timings still in
// flight), largest time first; clears them.
std::vector<OpTotal> take_op_profile();

// The trace's GPU ops (core/trace.h must be on first): begin_op_trace marks
// `device`'s stream at the trace's start; end_op_trace waits for the ops
// timed since and adds their spans, each placed at the mark's host time
// plus its device time since the mark.
void begin_op_trace(Device device);
void end_op_trace();
// A span of `track` between two marks of the trace's device, placed the
// same way (waits for the marks' work). Nothing while no trace is on.
void trace_device_span(const std::string& track, const std::string& name, const DeviceMark& start,
                       const DeviceMark& end);

// Times one op from construction to destruction (see above), on the device
// of `on` (the op's output; the host if undefined: validation reports it).
// `name` must outlive the profile (a string literal).
class OpScope {
 public:
  OpScope(const char* name, const Tensor& on);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
  // The op's useful floating-point operations (multiply and add counted
  // apart). A nested op's scope ignores it: its outer op reports its own.
  void add_flops(double flops) { flops_ += flops; }

 private:
  const char* name_ = nullptr;  // null: not timing (profile and trace off, or nested in another op)
  bool profiled_ = false;       // the totals (else only the trace)
  Device device_;
  DeviceMark start_;
  TraceClock::time_point host_start_;
  int64_t workspace_at_start_ = 0;  // bytes live in the device's workspace category
  int64_t misses_at_start_ = 0;     // the allocator's cache misses so far
  double flops_ = 0;
};

}  // namespace zt::ops
