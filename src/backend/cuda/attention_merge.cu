// CUDA launch of ops::attention_merge (the kernel: attention_merge_kernels.cuh).
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_merge_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& part, const Tensor& part_lse, int64_t row0) {
  const int64_t B = part.size(0), n = part.size(1), H = part.size(2), D = part.size(3);
  const int64_t rows = B * H * n;
  if (rows == 0 || D == 0) return;
  using merge_kernels::kWarps;
  ZT_CHECK((rows + kWarps - 1) / kWarps < (int64_t(1) << 31), "attention_merge: ", rows,
           " rows (batch x heads x block rows) exceed one grid of warps");
  ZT_CUDA_DISPATCH_FLOAT(part.dtype(), "attention_merge", [&] {
    merge_kernels::attention_merge_kernel<T><<<unsigned((rows + kWarps - 1) / kWarps), kWarps * 32, 0,
                                               stream_of(out)>>>(elements<float>(out), elements<float>(lse),
                                                                 elements<const T>(part),
                                                                 elements<const float>(part_lse), B, out.size(1), H,
                                                                 D, n, row0);
  });
  ZT_CUDA_CHECK_LAUNCH("attention_merge_kernel");
}

}  // namespace zt::cuda
