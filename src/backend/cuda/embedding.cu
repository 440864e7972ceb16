// CUDA embedding: gather forward; backward without atomics (positions grouped
// by token id and cut into segments of at most kSegmentRows, each summed in
// position order by one block; a group's f32 sum added to the gradient with
// one rounding). The launches; the kernels and the
// grouping are in embedding_kernels.cuh.
#include "backend/cuda/embedding.h"

#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/embedding_kernels.cuh"
#include "backend/cuda/runtime.h"

namespace zt::cuda {

namespace {

using namespace embedding_kernels;

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset, int64_t vocab_start) {
  const int64_t T_ = tokens.size(1), N = tokens.numel(), C = wte.size(1);
  if (N * C == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(wte.dtype(), "embedding_forward", [&] {
    T* op = elements<T>(out);
    const T *table = elements<const T>(wte), *positions = elements<const T>(wpe);
    with_pack_width<T>(packs_of_16_fit<T>(C, op, table, positions), [&](auto v) {
      constexpr int V = decltype(v)::value;
      embed_fwd_kernel<T, V><<<grid_for(N * C / V, kThreads, out.device()), kThreads, 0, stream_of(out)>>>(
          op, tokens.data<int32_t>(), table, positions, N, T_, C, pos_offset, vocab_start, wte.size(0));
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
    // Positions grouped by token id on the host (stable counting sort:
    // position order within a group), the groups cut into segments.
    const TokenGroups grouped = group_by_token(host_tokens.data<int32_t>(), N, dwte.size(0), vocab_start);
    const TokenSegments seg = segment_groups(grouped);
    const int64_t M = int64_t(grouped.order.size()), S = int64_t(seg.token.size()), K = int64_t(seg.split_token.size());
    if (S > 0) {
      // One upload: order | segment begin | slot | token | split first | split token.
      std::vector<int32_t> meta;
      meta.reserve(size_t(M + 3 * S + 2 * K + 2));
      for (const std::vector<int32_t>* part : {&grouped.order, &seg.begin, &seg.slot, &seg.token, &seg.split_first,
                                               &seg.split_token})
        meta.insert(meta.end(), part->begin(), part->end());
      Tensor dmeta = Tensor::empty(Shape{int64_t(meta.size())}, DType::i32, dout.device(), MemCategory::workspace);
      int32_t* d = dmeta.data<int32_t>();
      copy_bytes(d, dout.device(), meta.data(), Device::cpu(), meta.size() * 4);
      const int32_t *order = d, *seg_begin = order + M, *seg_slot = seg_begin + S + 1, *seg_token = seg_slot + S;
      const int32_t *split_first = seg_token + S, *split_token = split_first + K + 1;
      Tensor partial;
      if (seg.partials() > 0)
        partial = Tensor::empty(Shape{int64_t(seg.partials()) * C}, DType::f32, dout.device(), MemCategory::workspace);
      float* pp = partial.defined() ? partial.data<float>() : nullptr;
      const unsigned channel_blocks = unsigned((C + kThreads - 1) / kThreads);
      ZT_CUDA_DISPATCH_FLOAT(dout.dtype(), "embedding_backward", [&] {
        using TD = T;
        ZT_CUDA_DISPATCH_FLOAT(dwte.dtype(), "embedding_backward", [&] {
          embed_bwd_segment_kernel<TD, T><<<dim3(unsigned(S), channel_blocks), kThreads, 0, s>>>(
              static_cast<T*>(dwte.data_ptr()), pp, static_cast<const TD*>(dout.data_ptr()), order, seg_begin,
              seg_slot, seg_token, C);
        });
      });
      ZT_CUDA_CHECK_LAUNCH("embed_bwd_segment_kernel");
      if (K > 0) {
        ZT_CUDA_DISPATCH_FLOAT(dwte.dtype(), "embedding_backward", [&] {
          embed_bwd_partials_kernel<T><<<dim3(unsigned(K), channel_blocks), kThreads, 0, s>>>(
              static_cast<T*>(dwte.data_ptr()), pp, split_first, split_token, C);
        });
        ZT_CUDA_CHECK_LAUNCH("embed_bwd_partials_kernel");
      }
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
