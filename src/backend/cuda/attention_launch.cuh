// Host-side pieces shared by the fused attention kernels: dims from tensors,
// dispatch over (dtype, head dim), the shapes they take, and the launch with
// the shared-memory opt-in.
#pragma once

#include <string>

#include "backend/cuda/attention_tiles.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::attn {

inline Dims dims_of(const Tensor& q, const Tensor& k) { return {q.size(0), q.size(1), q.size(2), k.size(2)}; }

// Runs fn.template operator()<T, kD>() for bf16 / f16 and head dims 16, 32,
// 64, 128 (the shapes both fused kernels take).
template <typename F>
void dispatch(DType dt, int64_t D, F&& fn) {
  auto with_dim = [&]<typename T>() {
    switch (D) {
      case 16: return fn.template operator()<T, 16>();
      case 32: return fn.template operator()<T, 32>();
      case 64: return fn.template operator()<T, 64>();
      case 128: return fn.template operator()<T, 128>();
      default: ZT_FAIL("fused attention: head dim ", D, " is not one of 16, 32, 64, 128");
    }
  };
  switch (dt) {
    case DType::bf16: return with_dim.template operator()<__nv_bfloat16>();
    case DType::f16: return with_dim.template operator()<__half>();
    default: ZT_FAIL("fused attention: dtype ", dtype_name(dt), " is not bf16 or f16");
  }
}

// Why neither fused kernel can take (q, k) before shared memory is asked
// (empty when they can): dtype, head dim, grid limits.
inline std::string shape_blocker(const Tensor& q) {
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16)
    return ::zt::detail::concat("dtype ", dtype_name(q.dtype()), " (the fused kernels take bf16 or f16)");
  const int64_t D = q.size(3);
  if (D != 16 && D != 32 && D != 64 && D != 128)
    return ::zt::detail::concat("head dim ", D, " (the fused kernels take 16, 32, 64 or 128)");
  if (q.size(0) > 65535 || q.size(2) > 65535) return "more than 65535 batch rows or heads (a grid limit)";
  return {};
}

template <typename Kernel, typename... Args>
void launch(Kernel kernel, const char* name, dim3 grid, size_t smem, cudaStream_t stream, Args... args) {
  // Above 48 KiB a kernel must opt in; setting it on every launch is cheap
  // and right for whichever device is current.
  ZT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<grid, kThreads, smem, stream>>>(args...);
  ZT_CUDA_CHECK_LAUNCH(name);
}

}  // namespace zt::cuda::attn
