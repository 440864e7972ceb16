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
  const int64_t T_ = x.size(1), H = x.size(2), D = x.size(3), half = D / 2;
  if (x.numel() == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "rope", [&] {
    T* yp = static_cast<T*>(y.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    // 16-byte packs where they tile a head row; else a pair per thread.
    with_pack_width<T, 2>(packs_of_16_fit<T>(D, yp, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      const int64_t units = x.numel() / V;
      rope_kernel<T, V><<<grid_for(units, kThreads, x.device()), kThreads, 0, stream_of(y)>>>(
          yp, xp, table.data<float>(), units, T_, H, half, pos_offset, inverse ? -1.0f : 1.0f);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("rope_kernel");
}

}  // namespace zt::cuda
