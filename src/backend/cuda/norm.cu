// CUDA LayerNorm / RMSNorm forward and backward: the launches (16-byte packs
// where they fit the rows); the kernels are in norm_kernels.cuh.
#include "backend/cuda/norm.h"

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/norm_kernels.cuh"

namespace zt::cuda {

namespace {

using namespace norm_kernels;

const float* f32_or_null(const Tensor& t) { return t.defined() ? t.data<float>() : nullptr; }

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

void launch_forward(bool rms, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                    const Tensor& r_in, const Tensor& r_out, const Tensor& w, const Tensor& b, float eps) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  if (N == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "norm_forward", [&] {
    using TX = T;
    TX* yp = static_cast<TX*>(y.data_ptr());
    const TX *xp = static_cast<const TX*>(x.data_ptr()), *rip = ptr_or_null<TX>(r_in);
    TX* rop = r_out.defined() ? static_cast<TX*>(r_out.data_ptr()) : nullptr;
    ZT_CUDA_DISPATCH_FLOAT(w.dtype(), "norm_forward", [&] {
      const T *wp = static_cast<const T*>(w.data_ptr()), *bp = ptr_or_null<T>(b);
      with_pack_width<TX>(row_packs_fit<TX>(C, wp, bp, yp, xp, rip, rop), [&](auto v) {
        constexpr int V = decltype(v)::value;
        norm_forward_kernel<TX, T, V><<<row_blocks(N), kRowWarps * 32, 0, stream_of(y)>>>(
            rms, yp, mean.defined() ? mean.data<float>() : nullptr, rstd.data<float>(), xp, rip, rop, wp, bp, N, C,
            eps);
      });
    });
  });
  ZT_CUDA_CHECK_LAUNCH("norm_forward_kernel");
}

void add_partials(const Tensor& out, const Tensor& partials, int64_t chunks, int64_t C) {
  const unsigned grid = unsigned((C + kThreads - 1) / kThreads);
  ZT_CUDA_DISPATCH_FLOAT(out.dtype(), "norm_backward", [&] {
    add_partials_kernel<T><<<grid, kThreads, 0, stream_of(out)>>>(static_cast<T*>(out.data_ptr()),
                                                                  partials.data<float>(), chunks, C);
  });
  ZT_CUDA_CHECK_LAUNCH("add_partials_kernel");
}

}  // namespace

void norm_forward(bool rms, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                  const Tensor& w, const Tensor& b, float eps) {
  launch_forward(rms, y, mean, rstd, x, Tensor(), Tensor(), w, b, eps);
}

void residual_norm_forward(bool rms, const Tensor& r_out, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                           const Tensor& r_in, const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  launch_forward(rms, y, mean, rstd, x, r_in, r_out, w, b, eps);
}

void norm_backward(bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  if (N == 0) return;
  cudaStream_t s = stream_of(dx);
  // Weight/bias partials first: dx may overwrite dy in place.
  const int64_t per_chunk = chunk_rows(N), chunks = (N + per_chunk - 1) / per_chunk;
  Tensor pdw = Tensor::empty(Shape{chunks, C}, DType::f32, x.device(), MemCategory::workspace);
  Tensor pdb = db.defined() ? Tensor::empty(Shape{chunks, C}, DType::f32, x.device(), MemCategory::workspace)
                            : Tensor();
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "norm_backward", [&] {
    const T *dyp = static_cast<const T*>(dy.data_ptr()), *xp = static_cast<const T*>(x.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(C, dyp, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      const dim3 grid(unsigned((C / V + kSumCols - 1) / kSumCols), unsigned(chunks));
      norm_dwdb_partial_kernel<T, V><<<grid, dim3(kSumCols, kSumLanes), 0, s>>>(
          rms, pdw.data<float>(), pdb.defined() ? pdb.data<float>() : nullptr, dyp, xp, f32_or_null(mean),
          rstd.data<float>(), N, C, per_chunk);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("norm_dwdb_partial_kernel");
  add_partials(dw, pdw, chunks, C);
  if (db.defined()) add_partials(db, pdb, chunks, C);
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "norm_backward", [&] {
    using TX = T;
    TX* dxp = static_cast<TX*>(dx.data_ptr());
    const TX *dyp = static_cast<const TX*>(dy.data_ptr()), *xp = static_cast<const TX*>(x.data_ptr());
    const TX* addp = ptr_or_null<TX>(dx_add);
    ZT_CUDA_DISPATCH_FLOAT(w.dtype(), "norm_backward", [&] {
      const T* wp = static_cast<const T*>(w.data_ptr());
      with_pack_width<TX>(row_packs_fit<TX>(C, wp, static_cast<const T*>(nullptr), dxp, dyp, xp, addp), [&](auto v) {
        constexpr int V = decltype(v)::value;
        norm_dx_kernel<TX, T, V><<<row_blocks(N), kRowWarps * 32, 0, s>>>(rms, dxp, dyp, xp, wp, f32_or_null(mean),
                                                                          rstd.data<float>(), addp, N, C);
      });
    });
  });
  ZT_CUDA_CHECK_LAUNCH("norm_dx_kernel");
}

}  // namespace zt::cuda
