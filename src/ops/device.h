// Moving tensors between devices, and bringing a device's backend up.
#pragma once

#include "core/tensor.h"

namespace zt::ops {

// Initialises the backend of `device` (for cuda:N: allocator, streams,
// handles) so tensors can be allocated there. A no-op for the CPU. Throws
// zt::Error when the device does not exist or this build has no backend for it.
void init_device(Device device);
// Number of usable GPUs (0 in a build without CUDA).
int gpu_count();
// dst = src, bytes copied between any two devices. Same dtype and numel
// (shapes may differ); no overlap unless exactly the same tensor. When dst or
// src is on the host, the host side is complete when this returns.
void copy(const Tensor& dst, const Tensor& src);
// A new tensor on `device` holding src's values (same shape and dtype).
Tensor to_device(const Tensor& src, Device device, MemCategory category = MemCategory::activations);
// Waits for every kernel queued on the device (a no-op for the CPU).
void synchronize(Device device);

}  // namespace zt::ops
