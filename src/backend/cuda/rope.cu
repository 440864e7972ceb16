// CUDA RoPE: one thread per channel pair, in place allowed (each pair is read
// before it is written by the same thread).
#include "backend/cuda/rope.h"

#include <cmath>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/runtime.h"

namespace zt::cuda {

namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void rope_kernel(T* y, const T* x, const float* table, int64_t pairs, int64_t T_, int64_t H,
                            int64_t half, int64_t pos_offset, float sign) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < pairs; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i % half, bth = i / half;  // bth = (b*T + t)*H + h
    const int64_t t = (bth / H) % T_;
    const float c = table[((t + pos_offset) * half + p) * 2], s = sign * table[((t + pos_offset) * half + p) * 2 + 1];
    const float x0 = to_f32(x[2 * i]), x1 = to_f32(x[2 * i + 1]);
    y[2 * i] = from_f32<T>(x0 * c - x1 * s);
    y[2 * i + 1] = from_f32<T>(x0 * s + x1 * c);
  }
}

}  // namespace

void rope_table(const Tensor& table, const double* freqs) {
  const int64_t T_max = table.size(0), half = table.size(1);
  std::vector<float> host(size_t(T_max * half * 2));
  for (int64_t t = 0; t < T_max; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = double(t) * freqs[i];
      host[size_t((t * half + i) * 2)] = float(std::cos(a));
      host[size_t((t * half + i) * 2 + 1)] = float(std::sin(a));
    }
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
