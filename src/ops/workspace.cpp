// The backend's workspace over a step, for the memory plan (contract: ops/workspace.h).
#include "ops/workspace.h"

#include <algorithm>

#include "ops/attention.h"
#include "ops/device.h"
#if ZT_WITH_CUDA
#include "backend/cuda/attention.h"
#include "backend/cuda/runtime.h"
#endif

namespace zt::ops {

int64_t step_workspace_bytes(Device device, const AttentionDims& a) {
  if (!device.is_cuda() || device.index >= gpu_count()) return -1;
#if ZT_WITH_CUDA
  init_device(device);
  const cuda::AttentionShape shape{a.B, a.T, a.Hq, a.Hkv, a.D, a.dtype, device};
  const float scale = default_attention_scale(a.D);  // as the model calls attention
  const int64_t attention = std::max(cuda::attention_workspace_bytes(shape, scale, false),
                                     cuda::attention_workspace_bytes(shape, scale, true));
  return int64_t(cuda::cublaslt_workspace_bytes()) + attention;
#else
  return -1;
#endif
}

}  // namespace zt::ops
