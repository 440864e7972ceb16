#include "backend/cpu/scratch.h"

#include <array>
#include <cstdint>

#include "core/error.h"
#include "core/tensor.h"

namespace zt::cpu {

float* thread_scratch(size_t floats, int slot) {
  ZT_ASSERT(slot >= 0 && slot < kScratchSlots, "scratch slot ", slot);
  thread_local std::array<Tensor, kScratchSlots> buffers;
  Tensor& buf = buffers[size_t(slot)];
  if (!buf.defined() || size_t(buf.numel()) < floats) {
    buf = Tensor();  // release the old block before taking a larger one
    buf = Tensor::empty(Shape{int64_t(floats)}, DType::f32, Device::cpu(), MemCategory::workspace);
  }
  return buf.data<float>();
}

}  // namespace zt::cpu
