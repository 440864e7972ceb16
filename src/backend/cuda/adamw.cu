// CUDA AdamW: one grid-stride pass updating the f32 master, m and v and
// writing the rounded model copy; the bias corrections are computed once in
// f64 on the host, exactly as the CPU does.
#include "backend/cuda/adamw.h"

#include <cmath>

#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

namespace {

constexpr int kThreads = 256;

struct Consts {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, grad_scale, inv_bc1, inv_sqrt_bc2, eps, lr, weight_decay;
};

template <typename G, typename C>
__global__ void adamw_kernel(float* p, const G* g, float* m, float* v, C* copy, int64_t n, Consts k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float gi = to_f32(g[i]) * k.grad_scale;
    const float mi = k.beta1 * m[i] + k.one_minus_beta1 * gi;
    const float vi = k.beta2 * v[i] + k.one_minus_beta2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const float update = (mi * k.inv_bc1) / (sqrtf(vi) * k.inv_sqrt_bc2 + k.eps);
    const float pi = p[i] - k.lr * (update + k.weight_decay * p[i]);
    p[i] = pi;
    if (copy != nullptr) copy[i] = from_f32<C>(pi);
  }
}

}  // namespace

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const cpu::AdamWHyper& h) {
  const int64_t n = master.numel();
  if (n == 0) return;
  const double bc1 = 1.0 - std::pow(double(h.beta1), double(h.step));
  const double bc2 = 1.0 - std::pow(double(h.beta2), double(h.step));
  const Consts k{h.beta1, 1.0f - h.beta1, h.beta2, 1.0f - h.beta2, h.grad_scale, float(1.0 / bc1),
                 float(1.0 / std::sqrt(bc2)), h.eps, h.lr, h.weight_decay};
  const unsigned grid = grid_for(n, kThreads, master.device());
  cudaStream_t s = stream_of(master);
  const DType copy_dtype = model_copy.defined() ? model_copy.dtype() : DType::f32;
  ZT_CUDA_DISPATCH_FLOAT(grad.dtype(), "adamw_step", [&] {
    using G = T;
    ZT_CUDA_DISPATCH_FLOAT(copy_dtype, "adamw_step", [&] {
      adamw_kernel<G, T><<<grid, kThreads, 0, s>>>(
          master.data<float>(), static_cast<const G*>(grad.data_ptr()), m.data<float>(), v.data<float>(),
          model_copy.defined() ? static_cast<T*>(model_copy.data_ptr()) : nullptr, n, k);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("adamw_kernel");
}

}  // namespace zt::cuda
