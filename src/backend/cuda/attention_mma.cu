// CUDA causal GQA attention, FlashAttention-2 on mma.sync: the host side
// (shapes taken, launches). The kernels and their design are in
// attention_mma_kernels.cuh.
#include <algorithm>
#include <cstdint>
#include <string>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_launch.cuh"
#include "backend/cuda/attention_mma_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

namespace {

using attn::Dims;
using namespace mma_attention;

size_t shared_bytes_needed(DType dt, int64_t D) {
  size_t most = 0;
  attn::dispatch(dt, D, [&]<typename T, int kD>() {
    most = std::max({forward_bytes<kD>(sizeof(T)), dkdv_bytes<kD>(sizeof(T)), dq_bytes<kD>(sizeof(T))});
  });
  return most;
}

}  // namespace

std::string mma_attention_unsupported(const Tensor& q, const Tensor&) {
  if (std::string shape = attn::shape_blocker(q); !shape.empty()) return shape;
  const size_t need = shared_bytes_needed(q.dtype(), q.size(3));
  const int have = max_shared_optin(q.device());
  if (need > size_t(have))
    return ::zt::detail::concat("needs ", need, " bytes of shared memory per block, the GPU allows ", have);
  return {};
}

void mma_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                           float scale) {
  if (q.numel() == 0) return;
  const Dims d = attn::dims_of(q, k);
  attn::dispatch(q.dtype(), q.size(3), [&]<typename T, int kD>() {
    attn::launch(mma_forward_kernel<T, kD>, "mma_forward_kernel",
                 dim3(unsigned(d.tiles(kRows)), unsigned(d.Hq), unsigned(d.B)), forward_bytes<kD>(sizeof(T)),
                 stream_of(out), static_cast<T*>(out.data_ptr()), lse.data<float>(),
                 static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k.data_ptr()),
                 static_cast<const T*>(v.data_ptr()), d, scale);
  });
}

void mma_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
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
    attn::launch(mma_dkdv_kernel<T, kD>, "mma_dkdv_kernel", dim3(unsigned(d.tiles(kRows)), unsigned(d.Hkv), unsigned(d.B)),
                 dkdv_bytes<kD>(sizeof(T)), stream, static_cast<T*>(dk.data_ptr()), static_cast<T*>(dv.data_ptr()),
                 dop, qp, kp, vp, lse.data<float>(), delta.data<float>(), d, scale);
    attn::launch(mma_dq_kernel<T, kD>, "mma_dq_kernel", dim3(unsigned(d.tiles(kRows)), unsigned(d.Hq), unsigned(d.B)),
                 dq_bytes<kD>(sizeof(T)), stream, static_cast<T*>(dq.data_ptr()), dop, qp, kp, vp,
                 lse.data<float>(), delta.data<float>(), d, scale);
  });
}

}  // namespace zt::cuda
