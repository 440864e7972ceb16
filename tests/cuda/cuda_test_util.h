// Helpers for the GPU tests (CTest label "gpu"): skip visibly without a GPU,
// move tensors between host and device, poison device outputs.
//
// The pattern of a kernel test: draw random host inputs (test_util.h), run
// the CPU backend on them as the reference (the CPU kernels are themselves
// checked against float64 references in tests/ops), copy the inputs to the
// GPU, poison the GPU outputs (NaN bytes), run the op there, copy back and
// compare every element (all_close / max_rel_error: NaN never passes, so an
// element the kernel did not write fails).
#pragma once

#include <gtest/gtest.h>

#include "backend/cuda/runtime.h"
#include "ops/device.h"
#include "test_util.h"

namespace zt::test {

inline bool have_gpu() { return cuda::device_count() > 0; }

// Skips the test (with the reason shown) on machines without a GPU.
#define ZT_REQUIRE_GPU()                                                        \
  do {                                                                          \
    if (!::zt::test::have_gpu()) GTEST_SKIP() << "no usable GPU on this machine"; \
  } while (0)

inline Device gpu() { return Device::cuda(0); }

// A copy of a host tensor on the GPU.
inline Tensor to_gpu(const Tensor& host) { return ops::to_device(host, gpu()); }
// A copy of a device tensor on the host.
inline Tensor to_host(const Tensor& dev) { return ops::to_device(dev, Device::cpu()); }
// An uninitialised GPU tensor filled with 0xFF bytes (NaN for every float dtype).
inline Tensor gpu_poisoned(const Shape& shape, DType dtype) {
  ops::init_device(gpu());
  Tensor t = Tensor::empty(shape, dtype, gpu());
  cuda::memset_bytes(t.data_ptr(), t.device(), 0xFF, t.nbytes());
  return t;
}
// The f64 values of a (host or device) tensor.
inline std::vector<double> values_of(const Tensor& t) {
  return to_f64(t.device().is_cpu() ? t : to_host(t));
}

}  // namespace zt::test
