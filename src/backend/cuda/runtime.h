// The CUDA device runtime, callable from host code that includes no CUDA
// headers (ops/, nn/, train/, cli/).
//
// Per GPU: a caching allocator registered for cuda:N (same per-category
// accounting as the CPU one: the memory profiler works unchanged), a compute
// stream and a communication stream (non-blocking, so nothing serialises on
// the legacy default stream), and a cuBLASLt handle with its workspace. Every
// kernel of this backend is launched on the compute stream of its device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/device.h"

namespace zt::cuda {

// Number of GPUs the process can use (0 without a driver or GPU; never throws).
int device_count();
// Makes `device` current on this thread and creates its allocator, streams
// and handles on first use. Throws zt::Error naming the device when it does
// not exist ("cuda:3, but this machine has 1 GPU").
void ensure_initialized(Device device);
// Waits until every stream of the device is idle.
void synchronize(Device device);
// The cuBLASLt workspace every device holds from its initialisation (bytes,
// MemCategory::workspace; 32 MiB, or ZT_CUDA_CUBLAS_WORKSPACE_MIB's).
size_t cublaslt_workspace_bytes();

// The device's compute and communication streams as cudaStream_t, for code
// outside this backend that must order work on them (the NCCL group).
void* compute_stream_handle(Device device);
void* comm_stream_handle(Device device);

// Copies `bytes` between any two devices (host<->GPU, GPU<->GPU, host<->host).
// Returns when src may be reused and dst read from the host's point of view:
// a copy to the host waits for the compute stream; a copy from the host is
// staged through a pinned buffer (up to 64 MiB; larger ones wait) and ordered
// on the compute stream without waiting; a GPU-to-GPU copy is ordered on the
// destination's compute stream.
void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes);
// Copies `rows` runs of `width` bytes within one GPU's memory, each `pitch`
// bytes after the last on its side, ordered on the compute stream.
void copy_bytes_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                   Device device);
// Sets `bytes` bytes at ptr to `value` on the device's compute stream.
void memset_bytes(void* ptr, Device device, int value, size_t bytes);

// Polls `event` (a cudaEvent_t). cudaEventQuery's "not ready" also becomes the
// calling thread's last CUDA error, which the next kernel launch check would
// report as a failure: both functions clear it. event_state never throws (the
// watchdog's thread uses it); event_completed throws zt::Error naming `where`
// on a failed event.
enum class EventState { complete, pending, failed };
EventState event_state(void* event);
bool event_completed(void* event, const char* where);

// The device's free and total memory now (cudaMemGetInfo, bytes): free is
// what no process holds - this one's allocator, CUDA context and libraries'
// own buffers (cuBLAS, cuDNN, NCCL's communicators) and other processes'.
struct DeviceMemory {
  int64_t free = 0, total = 0;
};
DeviceMemory device_memory(Device device);

// Device facts for metrics and the planner.
struct DeviceInfo {
  std::string name;           // "NVIDIA H100 80GB HBM3"
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;    // bytes
  double peak_bf16_tflops = 0;  // dense tensor-core peak from the datasheet, 0 if unknown
  std::string uuid;             // "GPU-8c3f...-...", as nvidia-smi -L names it: unique across machines
};
DeviceInfo device_info(int index);

// Starts (on) or stops (off) a profiler's capture (cudaProfilerStart/Stop):
// a profiler told not to capture from the start (ncu --profile-from-start
// off) profiles only the kernels launched in between. No effect otherwise.
void profiler_capture(bool on);

// Timing marks (ops::DeviceMark, EventTimer): record_mark puts an
// event on the device's compute stream (events come from a pool, so a mark
// costs one cudaEventRecord); elapsed_ms waits for `end` and returns the time
// between two marks of one device; release_mark returns a mark to the pool.
using TimingMark = void*;
TimingMark record_mark(Device device);
float elapsed_ms(TimingMark start, TimingMark end);
void release_mark(TimingMark mark);

// Times device work with timing marks on the compute stream: start() records,
// stop_ms() records and returns the milliseconds since start (it waits for
// the stop mark; it may be called again after the same start).
class EventTimer {
 public:
  explicit EventTimer(Device device);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start();
  float stop_ms();

 private:
  Device device_;
  TimingMark start_ = nullptr;
};

}  // namespace zt::cuda
