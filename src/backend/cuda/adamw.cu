// CUDA AdamW: one grid-stride pass updating the f32 master, m and v and
// writing the rounded model copy; the bias corrections are computed once in
// f64 on the host, exactly as the CPU does. The launch; the kernel and its
// constants (adamw_consts) are in adamw_kernels.cuh.
#include "backend/cuda/adamw.h"

#include "backend/cuda/adamw_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

namespace {

using namespace adamw_kernels;

}  // namespace

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const cpu::AdamWHyper& h) {
  const int64_t n = master.numel();
  if (n == 0) return;
  const Consts k = adamw_consts(h);
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
