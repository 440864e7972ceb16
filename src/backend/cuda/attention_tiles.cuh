// Shared by the fused attention kernels (attention_flash.cu: WMMA,
// attention_mma.cu: mma.sync): the block shape, the problem's dims, the
// global-to-shared tile copy, and dispatch / launch over (dtype, head dim).
#pragma once

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda::attn {

constexpr int kWarps = 4;  // per block; each owns 16 rows of the block's tile
constexpr int kThreads = 32 * kWarps;

// q, out, dq, dout (B, T, Hq, D); k, v, dk, dv (B, T, Hkv, D); lse, delta (B, Hq, T).
struct Dims {
  int64_t B, T, Hq, Hkv;
  __host__ __device__ int64_t tiles(int rows) const { return (T + rows - 1) / rows; }
  __host__ __device__ int64_t group() const { return Hq / Hkv; }
};

inline Dims dims_of(const Tensor& q, const Tensor& k) { return {q.size(0), q.size(1), q.size(2), k.size(2)}; }

// Copies rows [0, min(valid, kRows)) of a (kRows, kD) tile from global (rows
// `stride` elements apart, 16-byte aligned) into shared (rows `ld` elements
// apart), zeros below: the padding rows of the last tile stay finite and the
// callers mask them.
template <typename T, int kD, int kRows>
__device__ __forceinline__ void load_tile(T* __restrict__ dst, int ld, const T* __restrict__ src, int64_t stride,
                                          int64_t valid) {
  constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  for (int c = threadIdx.x; c < kRows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (r < valid) x = *reinterpret_cast<const uint4*>(src + r * stride + col);
    *reinterpret_cast<uint4*>(dst + r * ld + col) = x;
  }
}

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
