// CUDA RoPE: one thread per channel pair, in place allowed (each pair is read
// before it is written by the same thread). The launches; the kernel and the
// host-built table are in rope_kernels.cuh.
#include "backend/cuda/rope.h"

#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/rope_kernels.cuh"
#include "backend/cuda/runtime.h"

namespace zt::cuda {

namespace {

using namespace rope_kernels;

}  // namespace

void rope_table(const Tensor& table, const double* freqs) {
  const int64_t T_max = table.size(0), half = table.size(1);
  std::vector<float> host(size_t(T_max * half * 2));
  rope_table_host(host.data(), T_max, half, freqs);
  copy_bytes(table.data_ptr(), table.device(), host.data(), Device::cpu(), host.size() * sizeof(float));
}

void rope_rotate(const Tensor& y, const Tensor& x, const Tensor& table, int64_t pos_offset, bool inverse) {
  const int64_t T_ = x.size(1), H = x.size(2), half = x.size(3) / 2, pairs = x.numel() / 2;
  if (pairs == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "rope", [&] {
    rope_kernel<T><<<grid_for(pairs, kThreads, x.device()), kThreads, 0, stream_of(y)>>>(
        static_cast<T*>(y.data_ptr()), static_cast<const T*>(x.data_ptr()), table.data<float>(), pairs, T_, H, half,
        pos_offset, inverse ? -1.0f : 1.0f);
  });
  ZT_CUDA_CHECK_LAUNCH("rope_kernel");
}

}  // namespace zt::cuda
