// Moving tensors between devices, and bringing a device's backend up.
#pragma once

#include <string>

#include "core/tensor.h"

namespace zt::ops {

// Initialises the backend of `device` (for cuda:N: allocator, streams,
// handles) so tensors can be allocated there. A no-op for the CPU. Throws
// zt::Error when the device does not exist or this build has no backend for it.
// A GPU's tuning switches (read_device_environment) are checked first.
void init_device(Device device);
// Reads and checks the GPU backend's tuning switches in the environment
// (ZT_CUDA_*, ZT_CUDNN_*: backend/cuda/environment.h), throwing zt::Error for
// a bad value; no GPU needed, nothing without a CUDA backend.
void read_device_environment();
// Number of usable GPUs (0 in a build without CUDA).
int gpu_count();
// The UUID of GPU `index` of those this process sees ("GPU-...", as
// nvidia-smi -L prints it; unique across machines). Throws without it.
std::string gpu_uuid(int index);
// The CPU's product kernels in one phrase (which OpenBLAS kernels, and
// whether Zettatron replaced the library's pick: backend/cpu/blas_kernels.h).
std::string describe_cpu();
// dst = src, bytes copied between any two devices. Same dtype and numel
// (shapes may differ); no overlap unless exactly the same tensor. When dst or
// src is on the host, the host side is complete when this returns.
void copy(const Tensor& dst, const Tensor& src);
// A strided copy on one device: for each of `rows` rows,
//   dst[r, dst_col : dst_col + cols] = src[r, src_col : src_col + cols],
// dst and src viewed as row-major matrices of `rows` rows (dst.numel() / rows
// and src.numel() / rows elements a row). Same dtype and device, no overlap.
// Context parallelism's chunks of each sequence (B rows of T H D elements)
// and an lse's columns (B H rows of T). On a GPU one 2-D copy ordered on the
// compute stream (no host wait).
void copy_columns(const Tensor& dst, int64_t dst_col, const Tensor& src, int64_t src_col, int64_t cols, int64_t rows);
// A new tensor on `device` holding src's values (same shape and dtype).
Tensor to_device(const Tensor& src, Device device, MemCategory category = MemCategory::activations);
// src itself when it is already on `device`, else to_device.
Tensor on_device(const Tensor& src, Device device, MemCategory category = MemCategory::activations);
// Waits for every kernel queued on the device (a no-op for the CPU).
void synchronize(Device device);

// Starts (on) or stops (off) a profiler's capture of the device's kernels
// (on a GPU: ncu --profile-from-start off profiles only what is launched in
// between; bench/gpu/run.sh ncu). A no-op for the CPU.
void profiler_capture(Device device, bool on);

// A point in a device's stream of work, for timing it without blocking: the
// host clock on the CPU; on a GPU an event on the compute stream, read only
// by seconds_since. Movable, not copyable (a GPU mark holds a pooled event).
class DeviceMark {
 public:
  DeviceMark() = default;
  explicit DeviceMark(Device device);  // marks now (after the work queued so far)
  ~DeviceMark();
  DeviceMark(DeviceMark&& o) noexcept;
  DeviceMark& operator=(DeviceMark&& o) noexcept;
  DeviceMark(const DeviceMark&) = delete;
  DeviceMark& operator=(const DeviceMark&) = delete;
  bool on_gpu() const { return event_ != nullptr; }  // reading it may wait for the GPU
  // Seconds of device work from `start` to this mark (waits for this mark's
  // work on a GPU). Both marks of one device.
  double seconds_since(const DeviceMark& start) const;

 private:
  bool defined_ = false;
  double host_seconds_ = 0;  // CPU: steady clock
  void* event_ = nullptr;    // GPU: cuda::TimingMark
};

}  // namespace zt::ops
