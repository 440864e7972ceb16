// The backend's workspace over a step, for the memory plan (contract: ops/workspace.h).
#include "ops/workspace.h"

#include <algorithm>

#include "ops/attention.h"
#include "ops/device.h"
#if ZT_WITH_CUDA
#include "backend/cuda/attention.h"
#include "backend/cuda/fp8.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/runtime.h"
#endif

namespace zt::ops {

int64_t step_workspace_bytes(Device device, const std::vector<AttentionDims>& attention, int64_t rows,
                             const std::vector<LinearDims>& linears, bool fp8, DType compute) {
  if (!device.is_cuda() || device.index >= gpu_count()) return -1;
#if ZT_WITH_CUDA
  init_device(device);
  int64_t largest = 0;  // of one call
  for (const AttentionDims& a : attention) {
    if (a.B * a.T * a.Hq * a.D == 0) continue;
    const cuda::AttentionShape shape{a.B,    a.T,    a.Hq, a.Hkv, a.D, a.dtype, device,
                                     a.packed ? (a.Hq + 2 * a.Hkv) * a.D : 0,
                                     a.causal, a.causal ? 0 : a.keys()};
    const float scale = default_attention_scale(a.D);  // as the model calls attention
    largest = std::max({largest, cuda::attention_workspace_bytes(shape, scale, cuda::AttentionPass{}),
                        cuda::attention_workspace_bytes(shape, scale, cuda::AttentionPass{true, a.deterministic})});
  }
  for (const LinearDims& l : linears)
    largest = std::max(largest, fp8 ? cuda::fp8_linear_workspace_bytes(l.out, l.in, rows, l.bias, compute,
                                                                       l.fp8_dx_scratch, l.fp8_held_width,
                                                                       l.fp8_held_codes)
                                    : cuda::linear_backward_workspace_bytes(l.out, l.in, rows, l.bias, device));
  return int64_t(cuda::cublaslt_workspace_bytes()) + largest;
#else
  return -1;
#endif
}

}  // namespace zt::ops
