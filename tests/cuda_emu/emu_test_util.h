// Helpers the emulated kernel tests share: host tensors for kernels launched
// by the warp emulator (raw pointers, poisoned outputs, fresh copies) and the
// comparison against the CPU backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "ops/device.h"
#include "test_util.h"

namespace zt::test::emu_util {

// The DType of a kernel's element type.
template <typename T>
DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) {
    return DType::f32;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return DType::bf16;
  } else {
    return DType::f16;
  }
}

// Blocks for a grid-stride launch over n elements of 256-thread blocks, in
// place of grid_for (which asks the device): at most 3, so that n > 768 runs
// the stride loop and its last sweep is partial.
inline unsigned stride_grid(int64_t n) { return unsigned(std::clamp<int64_t>((n + 255) / 256, 1, 3)); }

inline double tol(DType dt) { return dt == DType::f32 ? 1e-5 : 2e-2; }

inline ::testing::AssertionResult close(const Tensor& got, const Tensor& ref, double limit, const char* what) {
  return rel_error_within(got, to_f64(ref), limit, what);
}

inline Tensor poisoned(const Shape& shape, DType dt) {
  Tensor t = Tensor::empty(shape, dt);
  poison(t);
  return t;
}

inline Tensor copy_of(const Tensor& t) { return ops::to_device(t, Device::cpu()); }  // a fresh host copy

// The tensor's memory as the kernel's element type (null when undefined).
template <typename T>
T* p(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

}  // namespace zt::test::emu_util
