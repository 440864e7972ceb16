// CUDA AdamW: one grid-stride pass updating the f32 master, m and v and
// writing the rounded model copy, weight decay off in the caller's spans (one
// launch per 16 of them); the bias corrections are computed once in
// f64 on the host, exactly as the CPU does. The launch; the kernel and its
// constants (adamw_consts) are in adamw_kernels.cuh.
#include "backend/cuda/adamw.h"

#include <algorithm>

#include "backend/cuda/adamw_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

namespace {

using namespace adamw_kernels;

}  // namespace

void adamw_step(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                const Tensor& model_copy, const cpu::AdamWHyper& h,
                std::span<const std::pair<int64_t, int64_t>> no_decay) {
  const int64_t n = master.numel();
  if (n == 0) return;
  cudaStream_t s = stream_of(master);
  const DType copy_dtype = model_copy.defined() ? model_copy.dtype() : DType::f32;
  // Elements [lo, hi) with the spans no_decay[first, last) in one launch.
  auto launch = [&](int64_t lo, int64_t hi, size_t first, size_t last) {
    NoDecay nd;
    for (size_t i = first; i < last; ++i, ++nd.count) {
      nd.begin[nd.count] = no_decay[i].first - lo;
      nd.end[nd.count] = no_decay[i].second - lo;
    }
    cpu::AdamWHyper hl = h;
    hl.rounding_offset = h.rounding_offset + lo;
    const Consts k = adamw_consts(hl);
    const unsigned grid = grid_for(hi - lo, kThreads, master.device());
    ZT_CUDA_DISPATCH_FLOAT(grad.dtype(), "adamw_step", [&] {
      using G = T;
      ZT_CUDA_DISPATCH_FLOAT(copy_dtype, "adamw_step", [&] {
        adamw_kernel<G, T><<<grid, kThreads, 0, s>>>(
            master.data<float>() + lo, static_cast<const G*>(grad.data_ptr()) + lo, m.data<float>() + lo,
            v.data<float>() + lo, model_copy.defined() ? static_cast<T*>(model_copy.data_ptr()) + lo : nullptr,
            hi - lo, k, nd);
      });
    });
    ZT_CUDA_CHECK_LAUNCH("adamw_kernel");
  };
  // Groups of kMaxNoDecaySpans spans; group j covers the elements from its
  // first span's begin (0 for the first group) to the next group's.
  const size_t spans = no_decay.size();
  for (size_t first = 0; first == 0 || first < spans; first += kMaxNoDecaySpans) {
    const size_t last = std::min(spans, first + kMaxNoDecaySpans);
    const int64_t lo = first == 0 ? 0 : no_decay[first].first;
    const int64_t hi = last < spans ? no_decay[last].first : n;
    launch(lo, hi, first, last);
  }
}

}  // namespace zt::cuda
