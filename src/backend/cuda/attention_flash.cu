// CUDA causal GQA attention, the FlashAttention-2 schedule through WMMA: the
// host side (shapes taken, launches). The kernels and their design are in
// attention_flash_kernels.cuh.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_flash_kernels.cuh"
#include "backend/cuda/attention_launch.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

namespace {

using attn::Dims;
using namespace wmma_attention;

size_t shared_bytes_needed(DType dt, int64_t D) {
  size_t most = 0;
  attn::dispatch(dt, D, [&]<typename T, int kD>() {
    using G = Geometry<T, kD>;
    most = std::max({G::forward_bytes, G::dkdv_bytes, G::dq_bytes});
  });
  return most;
}

}  // namespace

std::string flash_attention_unsupported(const Tensor& q, const Tensor&) {
  if (std::string shape = attn::shape_blocker(q); !shape.empty()) return shape;
  const size_t need = shared_bytes_needed(q.dtype(), q.size(3));
  const int have = max_shared_optin(q.device());
  if (need > size_t(have))
    return ::zt::detail::concat("needs ", need, " bytes of shared memory per block, the GPU allows ", have);
  return {};
}

void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             float scale) {
  if (q.numel() == 0) return;
  const Dims d = attn::dims_of(q, k);
  attn::dispatch(q.dtype(), q.size(3), [&]<typename T, int kD>() {
    attn::launch(flash_forward_kernel<T, kD>, "flash_forward_kernel", dim3(unsigned(d.tiles(kTile)), unsigned(d.Hq), unsigned(d.B)),
           Geometry<T, kD>::forward_bytes, stream_of(out), static_cast<T*>(out.data_ptr()), lse.data<float>(),
           static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
           static_cast<const T*>(v.data_ptr()), d, scale);
  });
}

void flash_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              float scale) {
  if (q.numel() == 0) return;
  const Dims d = attn::dims_of(q, k);
  Tensor delta = Tensor::empty(lse.shape(), DType::f32, q.device(), MemCategory::workspace);
  attention_delta(delta, dout, out);
  cudaStream_t stream = stream_of(dq);
  attn::dispatch(q.dtype(), q.size(3), [&]<typename T, int kD>() {
    const T* dop = static_cast<const T*>(dout.data_ptr());
    const T* qp = static_cast<const T*>(q.data_ptr());
    const T* kp = static_cast<const T*>(k.data_ptr());
    const T* vp = static_cast<const T*>(v.data_ptr());
    attn::launch(flash_dkdv_kernel<T, kD>, "flash_dkdv_kernel", dim3(unsigned(d.tiles(kTile)), unsigned(d.Hkv), unsigned(d.B)),
           Geometry<T, kD>::dkdv_bytes, stream, static_cast<T*>(dk.data_ptr()), static_cast<T*>(dv.data_ptr()), dop,
           qp, kp, vp, lse.data<float>(), delta.data<float>(), d, scale);
    attn::launch(flash_dq_kernel<T, kD>, "flash_dq_kernel", dim3(unsigned(d.tiles(kTile)), unsigned(d.Hq), unsigned(d.B)),
           Geometry<T, kD>::dq_bytes, stream, static_cast<T*>(dq.data_ptr()), dop, qp, kp, vp, lse.data<float>(),
           delta.data<float>(), d, scale);
  });
}

}  // namespace zt::cuda
