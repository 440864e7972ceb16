// CUDA embedding: gather forward; backward without atomics (positions grouped
// by token id, each group summed in position order by one block, f32 sums
// added to the gradient with one rounding). The launches; the kernels and the
// grouping are in embedding_kernels.cuh.
#include "backend/cuda/embedding.h"

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/embedding_kernels.cuh"
#include "backend/cuda/runtime.h"

namespace zt::cuda {

namespace {

using namespace embedding_kernels;

template <typename T>
const T* cptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset, int64_t vocab_start) {
  const int64_t T_ = tokens.size(1), N = tokens.numel(), C = wte.size(1);
  if (N * C == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(wte.dtype(), "embedding_forward", [&] {
    T* op = static_cast<T*>(out.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(C, op, cptr<T>(wte), cptr<T>(wpe)), [&](auto v) {
      constexpr int V = decltype(v)::value;
      embed_fwd_kernel<T, V><<<grid_for(N * C / V, kThreads, out.device()), kThreads, 0, stream_of(out)>>>(
          op, tokens.data<int32_t>(), cptr<T>(wte), cptr<T>(wpe), N, T_, C, pos_offset, vocab_start, wte.size(0));
    });
  });
  ZT_CUDA_CHECK_LAUNCH("embed_fwd_kernel");
}

void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& host_tokens,
                        int64_t pos_offset, int64_t vocab_start) {
  const int64_t B = dout.size(0), T_ = dout.size(1), C = dout.size(2), N = B * T_;
  if (N * C == 0) return;
  cudaStream_t s = stream_of(dout);
  if (dwte.defined()) {
    // Positions grouped by token id on the host (stable counting sort: position order within a group).
    const TokenGroups grouped = group_by_token(host_tokens.data<int32_t>(), N, dwte.size(0), vocab_start);
    const int64_t groups = int64_t(grouped.token.size()), M = int64_t(grouped.order.size());
    if (groups > 0) {
      // One device buffer: order | begin | token.
      Tensor meta = Tensor::empty(Shape{M + 2 * groups + 1}, DType::i32, dout.device(), MemCategory::workspace);
      int32_t* d = meta.data<int32_t>();
      copy_bytes(d, dout.device(), grouped.order.data(), Device::cpu(), size_t(M) * 4);
      copy_bytes(d + M, dout.device(), grouped.begin.data(), Device::cpu(), size_t(groups + 1) * 4);
      copy_bytes(d + M + groups + 1, dout.device(), grouped.token.data(), Device::cpu(), size_t(groups) * 4);
      const dim3 grid(unsigned(groups), unsigned((C + kThreads - 1) / kThreads));
      ZT_CUDA_DISPATCH_FLOAT(dout.dtype(), "embedding_backward", [&] {
        using TD = T;
        ZT_CUDA_DISPATCH_FLOAT(dwte.dtype(), "embedding_backward", [&] {
          embed_bwd_wte_kernel<TD, T><<<grid, kThreads, 0, s>>>(static_cast<T*>(dwte.data_ptr()),
                                                               static_cast<const TD*>(dout.data_ptr()), d, d + M,
                                                               d + M + groups + 1, C);
        });
      });
      ZT_CUDA_CHECK_LAUNCH("embed_bwd_wte_kernel");
    }
  }
  if (dwpe.defined()) {
    ZT_CUDA_DISPATCH_FLOAT(dout.dtype(), "embedding_backward", [&] {
      using TD = T;
      ZT_CUDA_DISPATCH_FLOAT(dwpe.dtype(), "embedding_backward", [&] {
        embed_bwd_wpe_kernel<TD, T><<<grid_for(T_ * C, kThreads, dout.device()), kThreads, 0, s>>>(
            static_cast<T*>(dwpe.data_ptr()), static_cast<const TD*>(dout.data_ptr()), B, T_, C, pos_offset);
      });
    });
    ZT_CUDA_CHECK_LAUNCH("embed_bwd_wpe_kernel");
  }
}

}  // namespace zt::cuda
