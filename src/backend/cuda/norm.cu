// CUDA LayerNorm / RMSNorm forward and backward: the launches (16-byte packs
// where they fit the rows); the kernels are in norm_kernels.cuh. The backward
// is one pass where a row fits its lanes' registers (dx and per-block dw / db
// partials, then their column sums), else two (dw / db partials, then dx); the
// partials are summed deterministically either way.
#include "backend/cuda/norm.h"

#include <cstdlib>
#include <string_view>

#include "backend/cuda/colsum.h"
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
        auto launch = [&](auto held) {
          constexpr int P = decltype(held)::value;
          norm_forward_kernel<TX, T, V, P><<<row_blocks(N), kRowWarps * 32, 0, stream_of(y)>>>(
              rms, yp, mean.defined() ? mean.data<float>() : nullptr, rstd.data<float>(), xp, rip, rop, wp, bp, N,
              C, eps);
        };
        // Rows of 16-byte packs stay in registers up to 256 packs a row.
        if constexpr (V == 1) launch(std::integral_constant<int, 0>{});
        else with_forward_packs(forward_packs_per_lane(C / V), launch);
      });
    });
  });
  ZT_CUDA_CHECK_LAUNCH("norm_forward_kernel");
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

namespace {

// ZT_CUDA_NORM_BACKWARD = two_pass keeps the backward in two passes where the
// fused one could run: the A/B of the kernel bench (unset or "auto": fused).
bool fused_allowed() {
  static const bool allowed = [] {
    const char* env = std::getenv("ZT_CUDA_NORM_BACKWARD");
    const std::string_view v = env ? env : "";
    if (v.empty() || v == "auto" || v == "fused") return true;
    if (v == "two_pass") return false;
    ZT_FAIL("ZT_CUDA_NORM_BACKWARD = '", v, "' is not one of fused, two_pass; unset it to let Zettatron choose");
  }();
  return allowed;
}

// The one-pass backward (norm_backward_fused_kernel, its per-block partials
// summed by colsum.h) where a row fits its lanes' registers: weights of the
// activations' dtype, 16-byte packs, and at most 8 packs a lane
// (backward_packs_per_lane: C up to 2048 in bf16, 1024 in f32), its shared
// memory within what a block may have. Returns false, having done nothing,
// otherwise.
bool fused_backward(bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                    const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add, bool overwrite) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  if (w.dtype() != x.dtype() || !fused_allowed()) return false;
  bool done = false;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "norm_backward", [&] {
    constexpr int V = kPack16<T>;
    T* dxp = static_cast<T*>(dx.data_ptr());
    const T *dyp = static_cast<const T*>(dy.data_ptr()), *xp = static_cast<const T*>(x.data_ptr());
    const T *wp = static_cast<const T*>(w.data_ptr()), *addp = ptr_or_null<T>(dx_add);
    const int Q = backward_packs_per_lane(C / V);
    if (Q == 0 || !row_packs_fit<T>(C, wp, static_cast<const T*>(nullptr), dxp, dyp, xp, addp)) return;
    const bool with_db = db.defined();
    // A block's sums must fit the SM (up to 128 KiB: LayerNorm's 2048 with a
    // bias gradient; more than a 99 KiB consumer GPU gives a block).
    if (backward_shared_bytes(Q, V, with_db) > size_t(max_shared_optin(x.device()))) return;
    cudaStream_t s = stream_of(dx);
    Tensor pdw, pdb;
    int64_t blocks = 0;
    with_backward_packs(Q, [&](auto q_tag) {
      constexpr int kQ = decltype(q_tag)::value;
      auto launch = [&](auto kernel) {
        const size_t smem = backward_shared_bytes(kQ, V, with_db);
        constexpr int kThreads = kBackwardWarps * 32;
        const int per_sm = resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, smem, x.device());
        blocks = backward_blocks(N, int64_t(per_sm) * num_sms(x.device()));
        pdw = Tensor::empty(Shape{blocks, C}, DType::f32, x.device(), MemCategory::workspace);
        if (with_db) pdb = Tensor::empty(Shape{blocks, C}, DType::f32, x.device(), MemCategory::workspace);
        float* const pdb_p = with_db ? pdb.data<float>() : nullptr;
        kernel<<<unsigned(blocks), kThreads, smem, s>>>(rms, dxp, pdw.data<float>(), pdb_p, dyp, xp, wp, f32_or_null(mean),
                                                        rstd.data<float>(), addp, N, C);
      };
      if (with_db) launch(norm_backward_fused_kernel<T, V, kQ, true>);
      else launch(norm_backward_fused_kernel<T, V, kQ, false>);
    });
    ZT_CUDA_CHECK_LAUNCH("norm_backward_fused_kernel");
    colsum_accumulate(dw, pdw, blocks, C, overwrite);
    if (with_db) colsum_accumulate(db, pdb, blocks, C, overwrite);
    done = true;
  });
  return done;
}

}  // namespace

void norm_backward(bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add,
                   bool overwrite, NormBackwardKernel kernel) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  if (N == 0) return;  // the ops layer has zeroed dw and db for an overwrite
  const bool one_pass_allowed = kernel == NormBackwardKernel::automatic;
  if (one_pass_allowed && fused_backward(rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite)) return;
  // Two passes: the dw / db partials, then dx.
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
  add_chunk_partials(dw, pdw, chunks, C, overwrite);
  if (db.defined()) add_chunk_partials(db, pdb, chunks, C, overwrite);
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
