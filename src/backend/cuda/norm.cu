// CUDA LayerNorm / RMSNorm forward and backward: the launches (16-byte packs
// where they fit the rows); the kernels are in norm_kernels.cuh. The backward
// where a row fits its lanes' registers: one pass (dx and per-block dw / db
// partials, then their column sums) or two on the same blocks (the partials
// in the same order, then dx), the same bits, which training races per
// shape (kernel_race.h); elsewhere two passes over row chunks. The partials
// are summed deterministically either way.
#include "backend/cuda/norm.h"

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "backend/cuda/colsum.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernel_race.h"
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

NormBackwardKernel pinned_norm_backward() {
  static const NormBackwardKernel pinned = [] {
    const char* env = std::getenv("ZT_CUDA_NORM_BACKWARD");
    const std::string_view v = env ? env : "";
    if (v.empty() || v == "auto") return NormBackwardKernel::automatic;
    if (v == "one_pass" || v == "fused") return NormBackwardKernel::one_pass;
    if (v == "two_pass") return NormBackwardKernel::two_pass;
    ZT_FAIL("ZT_CUDA_NORM_BACKWARD = '", v,
            "' is not one of one_pass, two_pass, auto; unset it to let training race the two");
  }();
  return pinned;
}

namespace {

// Where the one-pass kernel can run a call - weights of the activations'
// dtype, 16-byte packs, at most 8 packs a lane (backward_packs_per_lane: C
// up to 2048 in bf16, 1024 in f32), its shared memory within what a block
// may have -: its packs a lane and its grid (the blocks the GPU holds at
// once), which the two passes that race it take too. Nothing otherwise.
struct OnePass {
  int packs_per_lane;
  int64_t blocks;
};

template <typename T, int Q, bool kDb>
int64_t one_pass_blocks(int64_t N, Device device) {
  constexpr int V = kPack16<T>;
  const auto kernel = norm_backward_fused_kernel<T, V, Q, kDb>;
  const int per_sm = resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kBackwardWarps * 32,
                                            backward_shared_bytes(Q, V, kDb), device);
  return backward_blocks(N, int64_t(per_sm) * num_sms(device));
}

std::optional<OnePass> one_pass_fit(const Tensor& dx, const Tensor& db, const Tensor& dy, const Tensor& x,
                                    const Tensor& w, const Tensor& dx_add) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  if (w.dtype() != x.dtype()) return std::nullopt;
  std::optional<OnePass> fit;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "norm_backward", [&] {
    constexpr int V = kPack16<T>;
    const int Q = backward_packs_per_lane(C / V);
    if (Q == 0 || !row_packs_fit<T>(C, static_cast<const T*>(w.data_ptr()), static_cast<const T*>(nullptr),
                                    static_cast<const T*>(dx.data_ptr()), static_cast<const T*>(dy.data_ptr()),
                                    static_cast<const T*>(x.data_ptr()), ptr_or_null<T>(dx_add)))
      return;
    const bool with_db = db.defined();
    // A block's sums must fit the SM (up to 128 KiB: LayerNorm's 2048 with a
    // bias gradient; more than a 99 KiB consumer GPU gives a block).
    if (backward_shared_bytes(Q, V, with_db) > size_t(max_shared_optin(x.device()))) return;
    with_backward_packs(Q, [&](auto q_tag) {
      constexpr int kQ = decltype(q_tag)::value;
      const int64_t blocks =
          with_db ? one_pass_blocks<T, kQ, true>(N, x.device()) : one_pass_blocks<T, kQ, false>(N, x.device());
      fit = OnePass{Q, blocks};
    });
  });
  return fit;
}

// f32 partial sums of dw (and db), a row per run of rows: (rows, C).
struct Partials {
  Tensor dw, db;
  Partials(int64_t rows, int64_t C, bool with_db, Device device)
      : dw(Tensor::empty(Shape{rows, C}, DType::f32, device, MemCategory::workspace)),
        db(with_db ? Tensor::empty(Shape{rows, C}, DType::f32, device, MemCategory::workspace) : Tensor()) {}
  float* dw_data() const { return dw.data<float>(); }
  float* db_data() const { return db.defined() ? db.data<float>() : nullptr; }
  // dw (db) += (or, overwrite, =) the partials' column sums (colsum.h).
  void sum_into(const Tensor& dw_out, const Tensor& db_out, bool overwrite) const {
    colsum_accumulate(dw_out, dw, dw.size(0), dw.size(1), overwrite);
    if (db.defined()) colsum_accumulate(db_out, db, db.size(0), db.size(1), overwrite);
  }
};

// The one pass (norm_backward_fused_kernel, its per-block partials summed by
// colsum.h) on `fit`.
void one_pass(const OnePass& fit, bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
              const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add,
              bool overwrite) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  const bool with_db = db.defined();
  const Partials partials(fit.blocks, C, with_db, x.device());
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "norm_backward", [&] {
    constexpr int V = kPack16<T>;
    with_backward_packs(fit.packs_per_lane, [&](auto q_tag) {
      constexpr int kQ = decltype(q_tag)::value;
      auto launch = [&](auto kernel) {
        kernel<<<unsigned(fit.blocks), kBackwardWarps * 32, backward_shared_bytes(kQ, V, with_db), stream_of(dx)>>>(
            rms, static_cast<T*>(dx.data_ptr()), partials.dw_data(), partials.db_data(),
            static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(x.data_ptr()),
            static_cast<const T*>(w.data_ptr()), f32_or_null(mean), rstd.data<float>(), ptr_or_null<T>(dx_add), N, C);
      };
      if (with_db) launch(norm_backward_fused_kernel<T, V, kQ, true>);
      else launch(norm_backward_fused_kernel<T, V, kQ, false>);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("norm_backward_fused_kernel");
  partials.sum_into(dw, db, overwrite);
}

// Two passes: the dw / db partials (norm_dwdb_partial_kernel) over `runs`
// runs of rows - chunks of per_chunk rows, or (per_chunk = 0) the one
// pass's blocks -, summed by colsum.h, then dx a warp per row. Partials
// first: dx may overwrite dy in place.
void two_pass(int64_t runs, int64_t per_chunk, bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db,
              const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
              const Tensor& dx_add, bool overwrite) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  const Partials partials(runs, C, db.defined(), x.device());
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "norm_backward", [&] {
    const T *dyp = static_cast<const T*>(dy.data_ptr()), *xp = static_cast<const T*>(x.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(C, dyp, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      const dim3 grid(unsigned((C / V + kSumCols - 1) / kSumCols), unsigned(runs));
      norm_dwdb_partial_kernel<T, V><<<grid, dim3(kSumCols, kSumLanes), 0, stream_of(dx)>>>(
          rms, partials.dw_data(), partials.db_data(), dyp, xp, f32_or_null(mean), rstd.data<float>(), N, C,
          per_chunk);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("norm_dwdb_partial_kernel");
  partials.sum_into(dw, db, overwrite);
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "norm_backward", [&] {
    using TX = T;
    TX* dxp = static_cast<TX*>(dx.data_ptr());
    const TX *dyp = static_cast<const TX*>(dy.data_ptr()), *xp = static_cast<const TX*>(x.data_ptr());
    const TX* addp = ptr_or_null<TX>(dx_add);
    ZT_CUDA_DISPATCH_FLOAT(w.dtype(), "norm_backward", [&] {
      const T* wp = static_cast<const T*>(w.data_ptr());
      with_pack_width<TX>(row_packs_fit<TX>(C, wp, static_cast<const T*>(nullptr), dxp, dyp, xp, addp), [&](auto v) {
        constexpr int V = decltype(v)::value;
        norm_dx_kernel<TX, T, V><<<row_blocks(N), kRowWarps * 32, 0, stream_of(dx)>>>(
            rms, dxp, dyp, xp, wp, f32_or_null(mean), rstd.data<float>(), addp, N, C);
      });
    });
  });
  ZT_CUDA_CHECK_LAUNCH("norm_dx_kernel");
}

// Two passes on the one pass's blocks (`fit`): its bits.
void two_pass_on_blocks(const OnePass& fit, bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db,
                        const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dx_add, bool overwrite) {
  two_pass(fit.blocks, 0, rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite);
}

// Two passes on colsum_kernels::chunk_rows chunks, for any call.
void two_pass_on_chunks(bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                        const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                        const Tensor& dx_add, bool overwrite) {
  const int64_t N = x.numel() / x.size(-1), per_chunk = chunk_rows(N);
  const int64_t chunks = (N + per_chunk - 1) / per_chunk;
  two_pass(chunks, per_chunk, rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite);
}

// The race of the one pass and the two on its grid, per shape of call.
struct RaceKey {
  int device;
  DType dtype;
  int64_t rows, cols;
  bool rms, db, add, overwrite;
  int form;  // dx: 0 a tensor of its own, 1 over dy, 2 over dx_add
  bool operator==(const RaceKey&) const = default;
};

RaceBook<RaceKey>& races() {
  static auto* book = new RaceBook<RaceKey>(
      "norm backward", {"one_pass", "two_pass"}, [](const RaceKey& k) {
        static const char* const forms[] = {"", ", dx over dy", ", dx over dx_add"};
        return std::string(k.rms ? "rmsnorm " : "layernorm ") + std::to_string(k.rows) + " x " +
               std::to_string(k.cols) + " " + std::string(dtype_name(k.dtype)) + (k.db ? "" : ", no db") +
               (k.add ? ", dx_add" : "") + forms[k.form] + (k.overwrite ? ", overwrite" : "") + ", " +
               Device::cuda(k.device).str();
      });  // never freed (kernel_race_lines reads it)
  return *book;
}

}  // namespace

void norm_backward(bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add,
                   bool overwrite, NormBackwardKernel kernel) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  if (N == 0) return;  // the ops layer has zeroed dw and db for an overwrite
  const std::optional<OnePass> fit = one_pass_fit(dx, db, dy, x, w, dx_add);
  if (!fit) return two_pass_on_chunks(rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite);
  if (kernel == NormBackwardKernel::automatic) kernel = pinned_norm_backward();
  if (kernel == NormBackwardKernel::one_pass)
    return one_pass(*fit, rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite);
  if (kernel == NormBackwardKernel::two_pass)
    return two_pass_on_blocks(*fit, rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite);
  const RaceKey key{.device = x.device().index,
                    .dtype = x.dtype(),
                    .rows = N,
                    .cols = C,
                    .rms = rms,
                    .db = db.defined(),
                    .add = dx_add.defined(),
                    .overwrite = overwrite,
                    .form = dx.data_ptr() == dy.data_ptr()                          ? 1
                            : dx_add.defined() && dx.data_ptr() == dx_add.data_ptr() ? 2
                                                                                     : 0};
  races().run(key, x.device(), [&](int c) {
    if (c == 0) one_pass(*fit, rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite);
    else two_pass_on_blocks(*fit, rms, dx, dw, db, dy, x, w, mean, rstd, dx_add, overwrite);
    return true;
  });
}

}  // namespace zt::cuda
