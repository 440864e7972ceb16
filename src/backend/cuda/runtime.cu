// CUDA device runtime: per-device state (allocator, streams, cuBLASLt handle),
// copies, and error reporting. See runtime.h.
#include "backend/cuda/runtime.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include <cuda_profiler_api.h>

#include "backend/cuda/cuda_common.cuh"
#include "core/allocator.h"
#include "core/env.h"
#include "core/hash.h"

namespace zt::cuda {

namespace detail {

void fail_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  throw InternalError(zt::detail::concat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ", expr,
                             " at ", file, ":", line));
}

void fail_cublas(cublasStatus_t st, const char* expr, const char* file, int line) {
  throw InternalError(zt::detail::concat("cuBLAS error ", int(st), " in ", expr, " at ", file, ":", line));
}

void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) [[unlikely]]
    throw InternalError(zt::detail::concat("CUDA kernel ", kernel, " failed to launch: ", cudaGetErrorName(err), " (",
                               cudaGetErrorString(err), ") at ", file, ":", line));
}

}  // namespace detail

namespace {

constexpr int kMaxDevices = 64;

// Blocks from cudaMalloc (256-byte aligned); cached by the base class, so the
// training loop never calls cudaMalloc once warm. All kernels of a device run
// on its compute stream, so reusing a block freed by the host is ordered after
// the kernels that used it (stream order).
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : Allocator(Device::cuda(index), 256), index_(index) {}
  ~CudaAllocator() override { release_all(); }

 protected:
  void* raw_alloc(size_t bytes) override {
    ZT_CUDA_CHECK(cudaSetDevice(index_));
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear it: the base class reports out-of-memory with the stats
      return nullptr;
    }
    ZT_CUDA_CHECK(err);
    return p;
  }
  void raw_free(void* ptr, size_t) override {
    // At process exit the runtime may already be gone; nothing to report then.
    if (cudaSetDevice(index_) == cudaSuccess) (void)cudaFree(ptr);
  }

 private:
  int index_;
};

struct DeviceState {
  cudaStream_t compute = nullptr;
  cudaStream_t comm = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  int sms = 0;
  int shared_optin = 0;  // bytes of shared memory a block may opt in to
  int l2_bytes = 0;
};

std::mutex g_mu;
std::array<std::unique_ptr<DeviceState>, kMaxDevices> g_state;

DeviceState& state(Device device) {
  ZT_CHECK(device.is_cuda(), "internal: CUDA runtime asked about ", device.str());
  const int i = device.index;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (i >= 0 && i < kMaxDevices && g_state[size_t(i)]) {
      ZT_CUDA_CHECK(cudaSetDevice(i));
      return *g_state[size_t(i)];
    }
  }
  const int n = device_count();
  ZT_CHECK(n > 0, "device ", device.str(), " requested, but no usable GPU was found (",
           n == 0 ? "no CUDA device or driver" : "error", "); use device = \"cpu\"");
  ZT_CHECK(i >= 0 && i < n, "device ", device.str(), " requested, but this machine has ", n, " GPU(s): use cuda:0",
           n > 1 ? zt::detail::concat(" .. cuda:", n - 1) : std::string());
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_state[size_t(i)]) {
    ZT_CUDA_CHECK(cudaSetDevice(i));
    auto s = std::make_unique<DeviceState>();
    ZT_CUDA_CHECK(cudaStreamCreateWithFlags(&s->compute, cudaStreamNonBlocking));
    ZT_CUDA_CHECK(cudaStreamCreateWithFlags(&s->comm, cudaStreamNonBlocking));
    ZT_CUBLAS_CHECK(cublasLtCreate(&s->lt));
    ZT_CUDA_CHECK(cudaDeviceGetAttribute(&s->sms, cudaDevAttrMultiProcessorCount, i));
    ZT_CUDA_CHECK(cudaDeviceGetAttribute(&s->shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, i));
    ZT_CUDA_CHECK(cudaDeviceGetAttribute(&s->l2_bytes, cudaDevAttrL2CacheSize, i));
    register_allocator(device, std::make_unique<CudaAllocator>(i));
    s->workspace = allocator_for(device).allocate(cublaslt_workspace_bytes(), MemCategory::workspace);
    g_state[size_t(i)] = std::move(s);
  }
  ZT_CUDA_CHECK(cudaSetDevice(i));
  return *g_state[size_t(i)];
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

void ensure_initialized(Device device) { (void)state(device); }

cudaStream_t compute_stream(Device device) { return state(device).compute; }
cudaStream_t comm_stream(Device device) { return state(device).comm; }
void* compute_stream_handle(Device device) { return compute_stream(device); }
void* comm_stream_handle(Device device) { return comm_stream(device); }
int num_sms(Device device) { return state(device).sms; }
int max_shared_optin(Device device) { return state(device).shared_optin; }
int64_t l2_cache_bytes(Device device) { return state(device).l2_bytes; }
cublasLtHandle_t cublaslt_handle(Device device) { return state(device).lt; }
void* cublaslt_workspace(Device device) { return state(device).workspace; }

// 32 MiB (Hopper wants at least that for some algorithms), or
// ZT_CUDA_CUBLAS_WORKSPACE_MIB's (an A/B of split-K algorithms whose f32
// partials need more; the kernel bench's sweep with MatmulWorkspaceScope says
// where). Read once; the memory plan counts it.
size_t cublaslt_workspace_bytes() {
  static const size_t bytes =
      size_t(env_whole_number("ZT_CUDA_CUBLAS_WORKSPACE_MIB", 1,
                              "the MiB of cuBLASLt workspace each GPU holds (32 by default)")
                 .value_or(32))
      << 20;
  return bytes;
}

int resident_blocks_per_sm(const void* kernel, int threads, size_t shared_bytes, Device device) {
  struct Key {
    const void* kernel;
    int threads;
    size_t shared_bytes;
    int device;
    bool operator<(const Key& o) const {
      return std::tie(kernel, threads, shared_bytes, device) < std::tie(o.kernel, o.threads, o.shared_bytes, o.device);
    }
  };
  static std::mutex mu;
  static auto* cache = new std::map<Key, int>();  // never freed, like the device states
  const Key key{kernel, threads, shared_bytes, device.index};
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  state(device);  // initialised and current
  // The kernel's dynamic shared memory limit, only ever raised: a launch with
  // less than an earlier one (the classifier's staged rows of another
  // vocabulary) must not lower it under a size already cached.
  cudaFuncAttributes attributes{};
  ZT_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  if (shared_bytes > size_t(attributes.maxDynamicSharedSizeBytes))
    ZT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(shared_bytes)));
  int blocks = 0;
  ZT_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared_bytes));
  ZT_CHECK(blocks > 0, "internal: a kernel of ", threads, " threads and ", shared_bytes,
           " bytes of shared memory fits no multiprocessor of ", device.str());
  cache->emplace(key, blocks);
  return blocks;
}

void synchronize(Device device) {
  DeviceState& s = state(device);
  ZT_CUDA_CHECK(cudaStreamSynchronize(s.compute));
  ZT_CUDA_CHECK(cudaStreamSynchronize(s.comm));
}

namespace {

// Host-to-device copies go through pinned staging buffers: the bytes are
// copied into one on the host, then DMA'd on the compute stream, so the
// call returns without waiting for the GPU and the caller's buffer is free at
// once. A buffer is reused when the copy that used it has completed (its
// event). Larger copies take the direct path, which waits.
constexpr size_t kMaxStagedBytes = size_t(64) << 20;
constexpr size_t kMinStagingBytes = size_t(64) << 10;

struct StagingBuffer {
  void* host = nullptr;  // pinned
  size_t bytes = 0;
  int device = 0;        // its event's device
  cudaEvent_t done = nullptr;
};
std::mutex g_staging_mu;
std::vector<StagingBuffer> g_staging;  // free or in flight; never freed (reused)

// Stages a host-to-device copy; false when it is too large to stage.
bool staged_upload(void* dst, Device dst_device, const void* src, size_t bytes) {
  if (bytes > kMaxStagedBytes) return false;
  cudaStream_t stream = compute_stream(dst_device);
  std::lock_guard<std::mutex> lock(g_staging_mu);
  StagingBuffer* buf = nullptr;
  for (StagingBuffer& b : g_staging)  // the smallest free one that fits
    if (b.device == dst_device.index && b.bytes >= bytes && (!buf || b.bytes < buf->bytes)) {
      if (event_completed(b.done, "staged upload: a staging buffer's event")) buf = &b;
    }
  if (!buf) {
    StagingBuffer b;
    b.bytes = std::max(kMinStagingBytes, std::bit_ceil(bytes));
    b.device = dst_device.index;
    ZT_CUDA_CHECK(cudaHostAlloc(&b.host, b.bytes, cudaHostAllocPortable));
    ZT_CUDA_CHECK(cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming));
    g_staging.push_back(b);
    buf = &g_staging.back();
  }
  std::memcpy(buf->host, src, bytes);
  ZT_CUDA_CHECK(cudaMemcpyAsync(dst, buf->host, bytes, cudaMemcpyHostToDevice, stream));
  ZT_CUDA_CHECK(cudaEventRecord(buf->done, stream));
  return true;
}

}  // namespace

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  if (src_device.is_cpu() && dst_device.is_cuda() && staged_upload(dst, dst_device, src, bytes)) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // Order the copy after the kernels that produced src (or last used dst).
  const Device on = dst_device.is_cuda() ? dst_device : src_device;
  cudaStream_t s = compute_stream(on);
  if (dst_device.is_cuda() && src_device.is_cuda() && dst_device.index != src_device.index) {
    synchronize(src_device);  // src's producers run on src's stream
    ZT_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, bytes, s));
  } else {
    ZT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
  }
  // A host source may be reused or freed as soon as we return; a host
  // destination must hold the bytes when we return.
  if (dst_device.is_cpu() || src_device.is_cpu()) ZT_CUDA_CHECK(cudaStreamSynchronize(s));
}

void copy_bytes_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t rows,
                   Device device) {
  if (width == 0 || rows == 0) return;
  ZT_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                                  compute_stream(device)));
}

void memset_bytes(void* ptr, Device device, int value, size_t bytes) {
  if (bytes == 0) return;
  ZT_CUDA_CHECK(cudaMemsetAsync(ptr, value, bytes, compute_stream(device)));
}

DeviceMemory device_memory(Device device) {
  state(device);  // current on this thread, with its context
  size_t free = 0, total = 0;
  ZT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return {int64_t(free), int64_t(total)};
}

DeviceInfo device_info(int index) {
  cudaDeviceProp p{};
  ZT_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  DeviceInfo d;
  d.name = p.name;
  d.sm_major = p.major;
  d.sm_minor = p.minor;
  d.multiprocessors = p.multiProcessorCount;
  d.total_memory = p.totalGlobalMem;
  // 16 bytes as hex, grouped 4-2-2-2-6 (nvidia-smi's form).
  const std::string h = hex_bytes(p.uuid.bytes, sizeof p.uuid.bytes);
  d.uuid = "GPU-" + h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) + "-" +
           h.substr(20, 12);
  // Dense bf16 tensor-core peaks from NVIDIA's datasheets (TFLOP/s): the MFU
  // denominator. Unknown parts report 0 and the trainer measures a GEMM.
  const std::string n = d.name;
  auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("H100") && has("PCIe")) d.peak_bf16_tflops = 756.0;
  else if (has("H100") || has("H200") || has("H800") || has("GH200")) d.peak_bf16_tflops = 989.4;
  else if (has("B200")) d.peak_bf16_tflops = 2250.0;
  else if (has("A100") || has("A800")) d.peak_bf16_tflops = 312.0;
  else if (has("L40S")) d.peak_bf16_tflops = 362.0;
  else if (has("A10G")) d.peak_bf16_tflops = 70.0;
  return d;
}

EventTimer::EventTimer(Device device) : device_(device) { ensure_initialized(device); }

EventTimer::~EventTimer() {
  if (start_) release_mark(start_);
}

void EventTimer::start() {
  if (start_) release_mark(start_);
  start_ = record_mark(device_);
}

float EventTimer::stop_ms() {
  ZT_CHECK(start_ != nullptr, "internal: EventTimer::stop_ms before start");
  const TimingMark stop = record_mark(device_);
  const float ms = elapsed_ms(start_, stop);
  release_mark(stop);
  return ms;
}

namespace {
// An event belongs to the device current when it was made, and records only
// on that device's streams: the free marks are kept per device.
std::mutex g_mark_mu;
std::map<int, std::vector<cudaEvent_t>> g_free_marks;  // by device index
std::map<cudaEvent_t, int> g_mark_device;             // every mark made, its device index
}  // namespace

TimingMark record_mark(Device device) {
  cudaStream_t stream = compute_stream(device);
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mark_mu);
    std::vector<cudaEvent_t>& free = g_free_marks[device.index];
    if (!free.empty()) {
      e = free.back();
      free.pop_back();
    }
  }
  if (!e) {
    int current = 0;
    ZT_CUDA_CHECK(cudaGetDevice(&current));
    if (current != device.index) ZT_CUDA_CHECK(cudaSetDevice(device.index));
    const cudaError_t made = cudaEventCreate(&e);
    if (current != device.index) ZT_CUDA_CHECK(cudaSetDevice(current));
    ZT_CUDA_CHECK(made);
    std::lock_guard<std::mutex> lock(g_mark_mu);
    g_mark_device[e] = device.index;
  }
  ZT_CUDA_CHECK(cudaEventRecord(e, stream));
  return e;
}

namespace {

cudaError_t query_event(void* event) {
  const cudaError_t q = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (q == cudaErrorNotReady) (void)cudaGetLastError();  // not an error: do not let a launch check see it
  return q;
}

}  // namespace

EventState event_state(void* event) {
  const cudaError_t q = query_event(event);
  return q == cudaSuccess ? EventState::complete : q == cudaErrorNotReady ? EventState::pending : EventState::failed;
}

bool event_completed(void* event, const char* where) {
  const cudaError_t q = query_event(event);
  if (q == cudaErrorNotReady) return false;
  if (q != cudaSuccess) ZT_FAIL(where, ": ", cudaGetErrorString(q));
  return true;
}

void profiler_capture(bool on) { ZT_CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop()); }

float elapsed_ms(TimingMark start, TimingMark end) {
  ZT_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end)));
  float ms = 0;
  ZT_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
  return ms;
}

void release_mark(TimingMark mark) {
  const auto e = static_cast<cudaEvent_t>(mark);
  std::lock_guard<std::mutex> lock(g_mark_mu);
  const auto it = g_mark_device.find(e);
  ZT_CHECK(it != g_mark_device.end(), "internal: release_mark of an event record_mark did not make");
  g_free_marks[it->second].push_back(e);
}

}  // namespace zt::cuda
