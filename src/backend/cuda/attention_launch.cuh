// Host-side pieces shared by the fused attention kernels: dims from tensors,
// dispatch over (dtype, head dim), the shapes they take, and the launch with
// the shared-memory opt-in.
#pragma once

#include <algorithm>
#include <string>

#include "backend/cuda/attention.h"
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

// Why neither fused kernel can take a shape before shared memory is asked
// (empty when they can): the mask, dtype, head dim, grid limits.
inline std::string shape_blocker(const AttentionShape& s) {
  if (!s.causal) return "an unmasked key block (the fused kernels are causal only)";
  if (s.dtype != DType::bf16 && s.dtype != DType::f16)
    return ::zt::detail::concat("dtype ", dtype_name(s.dtype), " (the fused kernels take bf16 or f16)");
  if (s.D != 16 && s.D != 32 && s.D != 64 && s.D != 128)
    return ::zt::detail::concat("head dim ", s.D, " (the fused kernels take 16, 32, 64 or 128)");
  if (s.B > 65535 || s.Hq > 65535) return "more than 65535 batch rows or heads (a grid limit)";
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

// One fused implementation's host side, from its Kernels<T, kD> (the three
// kernels, their shared memory and rows per block; the kernel headers define
// them): why it cannot take a shape, forward, backward. `what` names it in
// launch errors.
template <template <typename, int> class Kernels>
std::string fused_unsupported(const AttentionShape& s) {
  if (std::string shape = shape_blocker(s); !shape.empty()) return shape;
  size_t need = 0;
  dispatch(s.dtype, s.D, [&]<typename T, int kD>() {
    using K = Kernels<T, kD>;
    need = std::max({K::forward_bytes, K::dkdv_bytes, K::dq_bytes});
  });
  const int have = max_shared_optin(s.device);
  if (need > size_t(have))
    return ::zt::detail::concat("needs ", need, " bytes of shared memory per block, the GPU allows ", have);
  return {};
}

template <template <typename, int> class Kernels>
void fused_forward(const char* what, const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                   const Tensor& v, float scale) {
  if (q.numel() == 0) return;
  const Dims d = dims_of(q, k);
  dispatch(q.dtype(), q.size(3), [&]<typename T, int kD>() {
    using K = Kernels<T, kD>;
    launch(K::forward(), what, dim3(unsigned(d.tiles(K::block_rows)), unsigned(d.Hq), unsigned(d.B)),
           K::forward_bytes, stream_of(out), static_cast<T*>(out.data_ptr()), lse.data<float>(),
           static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
           static_cast<const T*>(v.data_ptr()), d, scale);
  });
}

// delta = rowsum(dout * out) first (attention_delta), then dK, dV and dQ.
template <template <typename, int> class Kernels>
void fused_backward(const char* what, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                    const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    float scale) {
  if (q.numel() == 0) return;
  const Dims d = dims_of(q, k);
  Tensor delta = Tensor::empty(lse.shape(), DType::f32, q.device(), MemCategory::workspace);
  attention_delta(delta, dout, out);
  cudaStream_t stream = stream_of(dq);
  dispatch(q.dtype(), q.size(3), [&]<typename T, int kD>() {
    using K = Kernels<T, kD>;
    const T* dop = static_cast<const T*>(dout.data_ptr());
    const T* qp = static_cast<const T*>(q.data_ptr());
    const T* kp = static_cast<const T*>(k.data_ptr());
    const T* vp = static_cast<const T*>(v.data_ptr());
    const unsigned tiles = unsigned(d.tiles(K::block_rows));
    launch(K::dkdv(), what, dim3(tiles, unsigned(d.Hkv), unsigned(d.B)), K::dkdv_bytes, stream,
           static_cast<T*>(dk.data_ptr()), static_cast<T*>(dv.data_ptr()), dop, qp, kp, vp, lse.data<float>(),
           static_cast<const float*>(delta.data<float>()), d, scale);
    launch(K::dq(), what, dim3(tiles, unsigned(d.Hq), unsigned(d.B)), K::dq_bytes, stream,
           static_cast<T*>(dq.data_ptr()), dop, qp, kp, vp, lse.data<float>(),
           static_cast<const float*>(delta.data<float>()), d, scale);
  });
}

}  // namespace zt::cuda::attn

