// CUDA AdamW: one grid-stride pass updating the f32 master, m and v and
// writing the rounded model copy, weight decay off in the caller's spans (one
// launch per 16 of them: launch_parts), 4 elements a thread where every
// stream's pack is aligned; the bias corrections are computed once in f64 on
// the host, exactly as the CPU does. The launch; the kernel and its
// constants (adamw_consts) are in adamw_kernels.cuh.
#include "backend/cuda/adamw.h"

#include "backend/cuda/adamw_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

namespace {

using namespace adamw_kernels;

constexpr int kPack = 4;  // elements a thread: 16 bytes of each f32 stream

}  // namespace

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const cpu::AdamWHyper& h) {
  const int64_t n = master.numel();
  if (n == 0) return;
  cudaStream_t s = stream_of(master);
  const DType copy_dtype = model_copy.defined() ? model_copy.dtype() : DType::f32;
  for (const LaunchPart& part : launch_parts(n, h.no_decay)) {
    cpu::AdamWHyper hp = h;
    hp.rounding_offset = h.rounding_offset + part.lo;
    const Consts k = adamw_consts(hp);
    const int64_t lo = part.lo, len = part.hi - part.lo;
    ZT_CUDA_DISPATCH_FLOAT(grad.dtype(), "adamw_step", [&] {
      using G = T;
      ZT_CUDA_DISPATCH_FLOAT(copy_dtype, "adamw_step", [&] {
        float *pp = master.data<float>() + lo, *mp = m.data<float>() + lo, *vp = v.data<float>() + lo;
        const G* gp = static_cast<const G*>(grad.data_ptr()) + lo;
        T* cp = model_copy.defined() ? static_cast<T*>(model_copy.data_ptr()) + lo : nullptr;
        if (adamw_packs_fit<kPack>(pp, gp, mp, vp, cp)) {
          adamw_kernel<G, T, kPack><<<grid_for(len / kPack + 1, kThreads, master.device()), kThreads, 0, s>>>(
              pp, gp, mp, vp, cp, len, k, part.nd);
        } else {
          adamw_kernel<G, T, 1><<<grid_for(len, kThreads, master.device()), kThreads, 0, s>>>(pp, gp, mp, vp, cp,
                                                                                             len, k, part.nd);
        }
      });
    });
    ZT_CUDA_CHECK_LAUNCH("adamw_kernel");
  }
}

}  // namespace zt::cuda
