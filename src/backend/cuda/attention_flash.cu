// CUDA causal GQA attention, the FlashAttention-2 schedule through WMMA: the
// entry points (attention.h). The kernels and their design are in
// attention_flash_kernels.cuh; the host side they share with the other fused
// kernel in attention_launch.cuh.
#include <string>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_launch.cuh"
#include "backend/cuda/attention_flash_kernels.cuh"

namespace zt::cuda {

std::string flash_attention_unsupported(const AttentionShape& s) {
  return attn::fused_unsupported<wmma_attention::Kernels>(s);
}

void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             float scale) {
  attn::fused_forward<wmma_attention::Kernels>("flash (WMMA) attention forward", out, lse, q, k, v, scale);
}

void flash_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              float scale) {
  attn::fused_backward<wmma_attention::Kernels>("flash (WMMA) attention backward", dq, dk, dv, dout, q, k, v, out, lse, scale);
}

}  // namespace zt::cuda
