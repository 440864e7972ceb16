// The CUDA LayerNorm / RMSNorm kernels (norm_kernels.cuh) and the fused
// classifier (cross_entropy_kernels.cuh), run by the warp emulator on the CPU
// with the launches of norm.cu / cross_entropy.cu, against the CPU backend
// (itself checked against float64 references in tests/ops): forward with and
// without the fused residual, backward dx (with and without dx_add) and the
// two-stage dw / db, and the loss with its in-place gradient (padding
// columns, an ignored row), whole or in the three vocabulary-parallel passes.
// f32, bf16 and (the norms) f16; outputs poisoned first.
#include "cuda_emu/warp_emulator.h"  // first: it defines what the kernel headers emulate

#include "cuda_emu/colsum_emu.h"

#include "backend/cuda/cross_entropy.h"
#include "backend/cuda/cross_entropy_kernels.cuh"
#include "backend/cuda/norm_kernels.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/cross_entropy.h"
#include "ops/device.h"
#include "ops/norm.h"
#include "cuda_emu/emu_test_util.h"
#include "test_util.h"

namespace zt::test {
namespace {

namespace nk = cuda::norm_kernels;
namespace ck = cuda::ce_kernels;

using namespace emu_util;

// The one-pass backward launched as norm.cu launches it (Q packs per lane,
// kDb with a bias gradient) on `blocks` blocks, then its partials' column
// sums (colsum.h, as norm.cu calls it) into copies of dw0 / db0 (f32
// gradients; overwrite: poisoned copies, not read).
template <typename T, int V, int Q, bool kDb>
void fused_backward_on_emulator(const Tensor& dx, Tensor& dw, Tensor& db, bool rms, const Tensor& dy, const Tensor& x,
                                const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add,
                                const Tensor& dw0, const Tensor& db0, int64_t blocks, bool overwrite) {
  const int64_t N = x.size(0), C = x.size(1);
  const Tensor pdw = poisoned(Shape{blocks, C}, DType::f32);
  const Tensor pdb = kDb ? poisoned(Shape{blocks, C}, DType::f32) : Tensor();
  emu::launch(dim3(unsigned(blocks)), nk::kBackwardWarps * 32, nk::backward_shared_bytes(Q, V, kDb),
              nk::norm_backward_fused_kernel<T, V, Q, kDb>, rms, p<T>(dx), p<float>(pdw), p<float>(pdb),
              static_cast<const T*>(p<T>(dy)), static_cast<const T*>(p<T>(x)), static_cast<const T*>(p<T>(w)),
              static_cast<const float*>(p<float>(mean)), static_cast<const float*>(p<float>(rstd)),
              static_cast<const T*>(p<T>(dx_add)), N, C);
  constexpr int kF32Pack = cuda::kPack16<float>;  // C is a multiple of V, so of 4: colsum's 16-byte packs
  const auto start = [&](const Tensor& g0) { return overwrite ? poisoned(g0.shape(), DType::f32) : g0; };
  dw = colsum_on_emulator<float, kF32Pack>(pdw, start(dw0), overwrite);
  db = kDb ? colsum_on_emulator<float, kF32Pack>(pdb, start(db0), overwrite) : Tensor();
}

// The two passes on the one pass's blocks, as norm.cu's two_pass_on_blocks
// launches them: the partials in its order on `blocks` blocks, their column
// sums (colsum.h), then dx a warp per row.
template <typename T, int V>
void two_pass_on_blocks_on_emulator(const Tensor& dx, Tensor& dw, Tensor& db, bool rms, bool with_db,
                                    const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                    const Tensor& rstd, const Tensor& dx_add, const Tensor& dw0, const Tensor& db0,
                                    int64_t blocks, bool overwrite) {
  const int64_t N = x.size(0), C = x.size(1);
  const Tensor pdw = poisoned(Shape{blocks, C}, DType::f32);
  const Tensor pdb = with_db ? poisoned(Shape{blocks, C}, DType::f32) : Tensor();
  emu::launch(dim3(unsigned((C / V + nk::kSumCols - 1) / nk::kSumCols), unsigned(blocks)),
              dim3(nk::kSumCols, nk::kSumLanes), 0, nk::norm_dwdb_partial_kernel<T, V>, rms, p<float>(pdw),
              p<float>(pdb), static_cast<const T*>(p<T>(dy)), static_cast<const T*>(p<T>(x)),
              static_cast<const float*>(p<float>(mean)), static_cast<const float*>(p<float>(rstd)), N, C,
              int64_t(0));
  constexpr int kF32Pack = cuda::kPack16<float>;
  const auto start = [&](const Tensor& g0) { return overwrite ? poisoned(g0.shape(), DType::f32) : g0; };
  dw = colsum_on_emulator<float, kF32Pack>(pdw, start(dw0), overwrite);
  db = with_db ? colsum_on_emulator<float, kF32Pack>(pdb, start(db0), overwrite) : Tensor();
  emu::launch(dim3(nk::row_blocks(N)), nk::kRowWarps * 32, 0, nk::norm_dx_kernel<T, T, V>, rms, p<T>(dx),
              static_cast<const T*>(p<T>(dy)), static_cast<const T*>(p<T>(x)), static_cast<const T*>(p<T>(w)),
              static_cast<const float*>(p<float>(mean)), static_cast<const float*>(p<float>(rstd)),
              static_cast<const T*>(p<T>(dx_add)), N, C);
}

// The fused backward where norm.cu takes it (16-byte packs, a width
// backward_packs_per_lane takes): dx, dw and db against the CPU's on the
// block count norm.cu would launch on a GPU holding 3 blocks at once (600
// rows: 25 a warp) and on so many blocks that some warps get no row; dx in place over
// dx_add with the bits of dx out of place; dw and db overwritten (the
// partials' sums alone) as well as added. On every one of those, the two
// passes on the same blocks (which training races against it) give its
// bits: dx, dw and db.
template <typename T, int V>
void fused_backward_case(bool rms, const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                         const Tensor& rstd, const Tensor& dx_add, const Tensor& dw0, const Tensor& db0,
                         const Tensor& want_dx, const Tensor& want_dw, const Tensor& want_db) {
  const int64_t N = x.size(0), C = x.size(1);
  const int Q = nk::backward_packs_per_lane(C / V);
  if (Q == 0) return;
  const DType dt = x.dtype();
  // The sums alone, for the overwrite: want - dw0.
  auto minus = [](const Tensor& a, const Tensor& b) {
    std::vector<double> d = to_f64(a);
    const std::vector<double> bv = to_f64(b);
    for (size_t i = 0; i < d.size(); ++i) d[i] -= bv[i];
    return d;
  };
  const std::vector<double> sums_dw = minus(want_dw, dw0), sums_db = rms ? std::vector<double>() : minus(want_db, db0);
  // norm.cu's launch: Q packs a lane, a bias gradient for the LayerNorm.
  // (with_db false: a LayerNorm whose bias needs no gradient, as RMSNorm's none)
  const auto fused = [&](const Tensor& dx, Tensor& dw, Tensor& db, const Tensor& g, const Tensor& add, int64_t blocks,
                         bool overwrite, bool with_db) {
    nk::with_backward_packs(Q, [&](auto q_tag) {
      constexpr int kQ = decltype(q_tag)::value;
      if (!with_db) {
        fused_backward_on_emulator<T, V, kQ, false>(dx, dw, db, rms, g, x, w, mean, rstd, add, dw0, db0, blocks,
                                                    overwrite);
      } else {
        fused_backward_on_emulator<T, V, kQ, true>(dx, dw, db, rms, g, x, w, mean, rstd, add, dw0, db0, blocks,
                                                   overwrite);
      }
    });
  };
  const int64_t sparse = (N + 4) / 5;  // 5 rows a block: warps 5-7 have none
  Tensor out_of_place;
  for (const int64_t blocks : {nk::backward_blocks(N, 3), sparse})
    for (const bool in_place : {false, true}) {
      const bool overwrite = in_place;
      SCOPED_TRACE(::testing::Message() << "fused on " << blocks << " blocks" << (in_place ? ", dx over dx_add" : "")
                                        << (overwrite ? ", dw/db overwritten" : ""));
      Tensor dx = in_place ? copy_of(dx_add) : poisoned(x.shape(), dt);
      Tensor dw, db;
      fused(dx, dw, db, dy, in_place ? dx : dx_add, blocks, overwrite, !rms);
      {  // the two passes on these blocks: the same bits
        Tensor tdx = in_place ? copy_of(dx_add) : poisoned(x.shape(), dt);
        Tensor tdw, tdb;
        two_pass_on_blocks_on_emulator<T, V>(tdx, tdw, tdb, rms, !rms, dy, x, w, mean, rstd, in_place ? tdx : dx_add,
                                             dw0, db0, blocks, overwrite);
        EXPECT_EQ(to_f64(tdx), to_f64(dx)) << "two passes on the blocks: dx";
        EXPECT_EQ(to_f64(tdw), to_f64(dw)) << "two passes on the blocks: dw";
        if (!rms) {
          EXPECT_EQ(to_f64(tdb), to_f64(db)) << "two passes on the blocks: db";
        }
      }
      EXPECT_TRUE(close(dx, want_dx, tol(dt), "dx"));
      if (out_of_place.defined()) {
        EXPECT_EQ(to_f64(dx), to_f64(out_of_place)) << "dx the same on any grid, in place or not";
      } else {
        out_of_place = dx;
      }
      EXPECT_TRUE(rel_error_within(dw, overwrite ? sums_dw : to_f64(want_dw), 1e-5, "dw"));
      if (!rms) {
        EXPECT_TRUE(rel_error_within(db, overwrite ? sums_db : to_f64(want_db), 1e-5, "db"));
      }
    }
  // Without dx_add (a block's first norm, whose input gradient has no
  // residual branch to add): dx against the CPU's without one.
  SCOPED_TRACE("fused, no dx_add");
  const auto kind = rms ? ops::NormKind::rmsnorm : ops::NormKind::layernorm;
  Tensor want_plain = Tensor::empty(x.shape(), dt), cdw = copy_of(dw0), cdb = rms ? Tensor() : copy_of(db0);
  ops::norm_backward(kind, want_plain, cdw, cdb, dy, x, w, mean, rstd, Tensor());
  Tensor dx = poisoned(x.shape(), dt), dw, db;
  fused(dx, dw, db, dy, Tensor(), nk::backward_blocks(N, 3), false, !rms);
  EXPECT_TRUE(close(dx, want_plain, tol(dt), "dx"));
  EXPECT_TRUE(rel_error_within(dw, to_f64(want_dw), 1e-5, "dw"));
  if (!rms) {
    EXPECT_TRUE(rel_error_within(db, to_f64(want_db), 1e-5, "db"));
  }
  // dx written over dy (the race's third form), and a LayerNorm whose bias
  // needs no gradient (no db partials): the one pass against the CPU, and
  // the two passes on its blocks with its bits.
  for (const bool with_db : rms ? std::vector<bool>{false} : std::vector<bool>{true, false}) {
    SCOPED_TRACE(with_db ? "fused, dx over dy" : "fused, dx over dy, no bias gradient");
    const int64_t blocks = nk::backward_blocks(N, 3);
    Tensor over = copy_of(dy), fdw, fdb;
    fused(over, fdw, fdb, over, dx_add, blocks, false, with_db);
    Tensor tover = copy_of(dy), tdw, tdb;
    two_pass_on_blocks_on_emulator<T, V>(tover, tdw, tdb, rms, with_db, tover, x, w, mean, rstd, dx_add, dw0, db0,
                                         blocks, false);
    EXPECT_EQ(to_f64(tover), to_f64(over)) << "two passes on the blocks: dx";
    EXPECT_EQ(to_f64(tdw), to_f64(fdw)) << "two passes on the blocks: dw";
    EXPECT_TRUE(close(over, want_dx, tol(dt), "dx"));
    EXPECT_TRUE(rel_error_within(fdw, to_f64(want_dw), 1e-5, "dw"));
    if (with_db) {
      EXPECT_EQ(to_f64(tdb), to_f64(fdb)) << "two passes on the blocks: db";
      EXPECT_TRUE(rel_error_within(fdb, to_f64(want_db), 1e-5, "db"));
    } else {
      EXPECT_FALSE(fdb.defined() || tdb.defined()) << "no bias gradient asked, none written";
    }
  }
}

// V elements per load (1, or a 16-byte pack: C a multiple of V), as norm.cu
// chooses from the row length and the pointers.
template <typename T, int V>
void norm_case(ops::NormKind kind, int64_t N, int64_t C, bool residual, DType dt, std::mt19937_64& rng) {
  SCOPED_TRACE(::testing::Message() << (kind == ops::NormKind::rmsnorm ? "rmsnorm" : "layernorm") << " " << N << "x"
                                    << C << (residual ? " residual" : "") << " " << dtype_name(dt) << ", " << V
                                    << " per load");
  const bool rms = kind == ops::NormKind::rmsnorm;
  const Tensor x = random_tensor(Shape{N, C}, dt, rng), r_in = random_tensor(Shape{N, C}, dt, rng);
  const Tensor w = random_tensor(Shape{C}, dt, rng, 0.5, 1.5), b = rms ? Tensor() : random_tensor(Shape{C}, dt, rng);
  const Tensor dy = random_tensor(Shape{N, C}, dt, rng), dx_add = random_tensor(Shape{N, C}, dt, rng);
  const Tensor dw0 = random_tensor(Shape{C}, DType::f32, rng), db0 = random_tensor(Shape{C}, DType::f32, rng);
  // The CPU backend.
  Tensor y = Tensor::empty(Shape{N, C}, dt), mean = rms ? Tensor() : Tensor::empty(Shape{N}, DType::f32);
  Tensor rstd = Tensor::empty(Shape{N}, DType::f32), r_out = Tensor::empty(Shape{N, C}, dt);
  if (residual)
    ops::residual_norm_forward(kind, r_out, y, mean, rstd, r_in, x, w, b, 1e-5f);
  else
    ops::norm_forward(kind, y, mean, rstd, x, w, b, 1e-5f);
  const Tensor normed = residual ? r_out : x;
  Tensor dx = Tensor::empty(Shape{N, C}, dt), dw = copy_of(dw0), db = rms ? Tensor() : copy_of(db0);
  ops::norm_backward(kind, dx, dw, db, dy, normed, w, mean, rstd, dx_add);
  // The forward kernels, launched as norm.cu launches them: re-reading the
  // row (P = 0) and, for packed rows, with the lane's packs held in
  // registers (P = forward_packs_per_lane). The same sums in the same order,
  // but the host compiler may contract d * d into FMAs differently in the
  // two kernels: each is checked against the CPU; the residual sum exactly.
  auto check_forward = [&](auto held) {
    constexpr int kP = decltype(held)::value;
    SCOPED_TRACE(::testing::Message() << kP << " packs a lane in registers");
    Tensor gy = poisoned(y.shape(), dt), grstd = poisoned(rstd.shape(), DType::f32);
    Tensor gmean = rms ? Tensor() : poisoned(Shape{N}, DType::f32), gr_out = poisoned(Shape{N, C}, dt);
    emu::launch(dim3(nk::row_blocks(N)), nk::kRowWarps * 32, 0, nk::norm_forward_kernel<T, T, V, kP>, rms, p<T>(gy),
                p<float>(gmean), p<float>(grstd), static_cast<const T*>(p<T>(x)),
                residual ? static_cast<const T*>(p<T>(r_in)) : nullptr, residual ? p<T>(gr_out) : nullptr,
                static_cast<const T*>(p<T>(w)), static_cast<const T*>(p<T>(b)), N, C, 1e-5f);
    EXPECT_TRUE(close(gy, y, tol(dt), "y"));
    EXPECT_TRUE(close(grstd, rstd, 1e-5, "rstd"));
    if (!rms) {
      EXPECT_TRUE(close(gmean, mean, 1e-5, "mean"));
    }
    if (residual) {
      EXPECT_EQ(to_f64(gr_out), to_f64(r_out)) << "the rounded residual sum";
    }
  };
  check_forward(std::integral_constant<int, 0>{});
  if constexpr (V > 1) nk::with_forward_packs(nk::forward_packs_per_lane(C / V), check_forward);
  const int64_t per_chunk = nk::chunk_rows(N), chunks = (N + per_chunk - 1) / per_chunk;
  Tensor pdw = poisoned(Shape{chunks, C}, DType::f32), pdb = rms ? Tensor() : poisoned(Shape{chunks, C}, DType::f32);
  emu::launch(dim3(unsigned((C / V + nk::kSumCols - 1) / nk::kSumCols), unsigned(chunks)),
              dim3(nk::kSumCols, nk::kSumLanes), 0, nk::norm_dwdb_partial_kernel<T, V>, rms, p<float>(pdw),
              p<float>(pdb), static_cast<const T*>(p<T>(dy)), static_cast<const T*>(p<T>(normed)),
              static_cast<const float*>(p<float>(mean)), static_cast<const float*>(p<float>(rstd)), N, C, per_chunk);
  Tensor gdw = copy_of(dw0), gdb = rms ? Tensor() : copy_of(db0);
  add_chunk_partials_on_emulator(gdw, pdw, chunks, C);
  if (!rms) add_chunk_partials_on_emulator(gdb, pdb, chunks, C);
  Tensor gdx = poisoned(Shape{N, C}, dt);
  emu::launch(dim3(nk::row_blocks(N)), nk::kRowWarps * 32, 0, nk::norm_dx_kernel<T, T, V>, rms, p<T>(gdx),
              static_cast<const T*>(p<T>(dy)), static_cast<const T*>(p<T>(normed)), static_cast<const T*>(p<T>(w)),
              static_cast<const float*>(p<float>(mean)), static_cast<const float*>(p<float>(rstd)),
              static_cast<const T*>(p<T>(dx_add)), N, C);
  EXPECT_TRUE(close(gdx, dx, tol(dt), "dx"));
  // In place, as the model calls it (dx = dx_add = the residual gradient).
  Tensor gdx_in_place = copy_of(dx_add);
  emu::launch(dim3(nk::row_blocks(N)), nk::kRowWarps * 32, 0, nk::norm_dx_kernel<T, T, V>, rms, p<T>(gdx_in_place),
              static_cast<const T*>(p<T>(dy)), static_cast<const T*>(p<T>(normed)), static_cast<const T*>(p<T>(w)),
              static_cast<const float*>(p<float>(mean)), static_cast<const float*>(p<float>(rstd)),
              static_cast<const T*>(p<T>(gdx_in_place)), N, C);
  EXPECT_EQ(to_f64(gdx_in_place), to_f64(gdx)) << "dx written over dx_add";
  EXPECT_TRUE(close(gdw, dw, 1e-5, "dw"));
  if (!rms) {
    EXPECT_TRUE(close(gdb, db, 1e-5, "db"));
  }
  if constexpr (V == cuda::kPack16<T>)
    fused_backward_case<T, V>(rms, dy, normed, w, mean, rstd, dx_add, dw0, db0, dx, dw, db);
}

template <typename T, int P>  // P elements per load (1, or a 16-byte pack: Vp a multiple of P)
void ce_case(int64_t N, int64_t Vp, int64_t V, DType dt, std::mt19937_64& rng) {
  SCOPED_TRACE(::testing::Message() << N << " rows, Vp " << Vp << ", V " << V << " " << dtype_name(dt) << ", " << P
                                    << " per load");
  const Tensor logits = random_tensor(Shape{N, Vp}, dt, rng, -8, 8);
  Tensor targets = random_tokens(Shape{N}, V, rng);
  targets.data<int32_t>()[0] = -1;  // an ignored row
  Tensor losses = Tensor::empty(Shape{N}, DType::f32), d = Tensor::empty(Shape{N, Vp}, dt);
  ops::softmax_cross_entropy(losses, d, logits, targets, V, 0.25f);
  Tensor gl = copy_of(logits), glosses = poisoned(Shape{N}, DType::f32);
  constexpr int kRows = cuda::kClassifierCandidates[0].rows_per_sm;  // the race's first (its choice on a tie)
  emu::launch(dim3(unsigned(N)), ck::kThreads, 0, ck::ce_kernel<T, P, kRows>, p<float>(glosses), p<T>(gl),
              static_cast<const T*>(p<T>(gl)), static_cast<const int32_t*>(p<int32_t>(targets)), N, Vp, V, 0.25f);
  EXPECT_TRUE(close(glosses, losses, dt == DType::f32 ? 1e-5 : 1e-3, "losses"));
  EXPECT_TRUE(close(gl, d, tol(dt), "dlogits (in place)"));
  // Every rows-per-SM choice (its packs ahead per thread), on fewer blocks
  // than rows (as ce_grid launches it: each block strides over rows): the
  // same bits, a row being one block's work in one order.
  const auto same_bits = [&](auto kernel, const char* what) {
    Tensor sl = copy_of(logits), slosses = poisoned(Shape{N}, DType::f32);
    emu::launch(dim3(2), ck::kThreads, 0, kernel, p<float>(slosses), p<T>(sl), static_cast<const T*>(p<T>(sl)),
                static_cast<const int32_t*>(p<int32_t>(targets)), N, Vp, V, 0.25f);
    EXPECT_EQ(to_f64(slosses), to_f64(glosses)) << "losses, 2 blocks striding over the rows, " << what;
    EXPECT_EQ(to_f64(sl), to_f64(gl)) << "dlogits, 2 blocks striding over the rows, " << what;
  };
  same_bits(ck::ce_kernel<T, P, 1>, "1 row per SM (4 packs ahead)");
  same_bits(ck::ce_kernel<T, P, 2>, "2 rows per SM (2 packs ahead)");
  same_bits(ck::ce_kernel<T, P, 4>, "4 rows per SM (1 pack ahead)");
  // The staged kernel (16-byte packs only): the whole row in shared memory,
  // and fewer packs with a tail read from memory in both passes, on 2 blocks
  // striding over the rows (each refilling its slots with its next row):
  // ce_kernel's bits.
  if constexpr (P == cuda::kPack16<T>) {
    const int64_t packs = Vp / P;
    // 0: every pack from memory (more than one round of loads ahead); then
    // the most whole sweeps below the row, a tail of 1 to 512 packs.
    std::vector<int64_t> staged_counts{packs, 0};
    if (packs > ck::kThreads) staged_counts.push_back((packs - 1) / ck::kThreads * ck::kThreads);
    for (const int64_t staged : staged_counts) {
      SCOPED_TRACE(::testing::Message() << "staged kernel, " << staged << " of " << packs << " packs staged");
      Tensor sl = copy_of(logits), slosses = poisoned(Shape{N}, DType::f32);
      emu::launch(dim3(2), ck::kThreads, size_t(staged) * 16, ck::ce_staged_kernel<T>, p<float>(slosses), p<T>(sl),
                  static_cast<const T*>(p<T>(sl)), static_cast<const int32_t*>(p<int32_t>(targets)), N, Vp, V, 0.25f,
                  staged);
      EXPECT_EQ(to_f64(slosses), to_f64(glosses)) << "losses";
      EXPECT_EQ(to_f64(sl), to_f64(gl)) << "dlogits (in place)";
      if (staged != packs) continue;  // the losses alone once, every pack staged
      Tensor llosses = poisoned(Shape{N}, DType::f32);  // the losses alone (no dlogits)
      emu::launch(dim3(2), ck::kThreads, size_t(staged) * 16, ck::ce_staged_kernel<T>, p<float>(llosses),
                  static_cast<T*>(nullptr), static_cast<const T*>(p<T>(logits)),
                  static_cast<const int32_t*>(p<int32_t>(targets)), N, Vp, V, 0.25f, staged);
      EXPECT_EQ(to_f64(llosses), to_f64(glosses)) << "losses without dlogits";
    }
  }
}

// The vocabulary-parallel passes for `ranks` ranks of Vl columns each over N
// rows of V ids (the last ranks' columns past V are padding; a rank may hold
// none): each pass on the kernels against the CPU backend's pass, both fed the
// same statistics reduced over the ranks (as the all-reduces would).
template <typename T, int P>  // P elements per load (1, or a 16-byte pack: Vl a multiple of P)
void vp_ce_case(int64_t N, int64_t V, int64_t ranks, int64_t Vl, DType dt, std::mt19937_64& rng) {
  SCOPED_TRACE(::testing::Message() << N << " rows, V " << V << " over " << ranks << " ranks of " << Vl << " columns "
                                    << dtype_name(dt) << ", " << P << " per load");
  const int64_t es = int64_t(dtype_size(dt));
  const Tensor logits = random_tensor(Shape{N, ranks * Vl}, dt, rng, -8, 8);
  Tensor targets = random_tokens(Shape{N}, V, rng);
  targets.data<int32_t>()[1] = -1;  // an ignored row
  std::vector<Tensor> slice(static_cast<size_t>(ranks));
  for (int64_t r = 0; r < ranks; ++r) {
    slice[size_t(r)] = Tensor::empty(Shape{N, Vl}, dt);
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(static_cast<char*>(slice[size_t(r)].data_ptr()) + n * Vl * es,
                  static_cast<const char*>(logits.data_ptr()) + (n * ranks * Vl + r * Vl) * es, size_t(Vl * es));
  }
  auto real_of = [&](int64_t r) { return std::clamp<int64_t>(V - r * Vl, 0, Vl); };
  // Pass 1, and the max over the ranks.
  std::vector<float> row_max(static_cast<size_t>(N), -INFINITY);
  for (int64_t r = 0; r < ranks; ++r) {
    Tensor m = Tensor::empty(Shape{N}, DType::f32), gm = poisoned(Shape{N}, DType::f32);
    ops::vocab_parallel_ce_max(m, slice[size_t(r)], r * Vl, V);
    emu::launch(dim3(unsigned(N)), ck::kThreads, 0, ck::vp_max_kernel<T, P>, p<float>(gm),
                static_cast<const T*>(p<T>(slice[size_t(r)])), Vl, real_of(r));
    for (int64_t n = 0; n < N; ++n)  // exact; -inf where the rank holds no real column
      EXPECT_EQ(gm.data<float>()[n], m.data<float>()[n]) << "row max of rank " << r << ", row " << n;
    for (int64_t n = 0; n < N; ++n) row_max[size_t(n)] = std::max(row_max[size_t(n)], m.data<float>()[n]);
  }
  Tensor rm = Tensor::empty(Shape{N}, DType::f32);
  std::copy(row_max.begin(), row_max.end(), rm.data<float>());
  // Pass 2, and the sums over the ranks.
  Tensor sum_exp = Tensor::empty(Shape{N}, DType::f32), target_logit = Tensor::empty(Shape{N}, DType::f32);
  for (int64_t n = 0; n < N; ++n) sum_exp.data<float>()[n] = target_logit.data<float>()[n] = 0.0f;
  for (int64_t r = 0; r < ranks; ++r) {
    Tensor se = Tensor::empty(Shape{N}, DType::f32), tl = Tensor::empty(Shape{N}, DType::f32);
    Tensor gse = poisoned(Shape{N}, DType::f32), gtl = poisoned(Shape{N}, DType::f32);
    ops::vocab_parallel_ce_sums(se, tl, slice[size_t(r)], rm, targets, r * Vl, V);
    emu::launch(dim3(unsigned(N)), ck::kThreads, 0, ck::vp_sums_kernel<T, P>, p<float>(gse), p<float>(gtl),
                static_cast<const T*>(p<T>(slice[size_t(r)])), static_cast<const float*>(p<float>(rm)),
                static_cast<const int32_t*>(p<int32_t>(targets)), Vl, r * Vl, real_of(r));
    EXPECT_TRUE(close(gse, se, 1e-5, "exp sums")) << "rank " << r;
    EXPECT_TRUE(all_close(gtl, to_f64(tl), 0.0, 0.0)) << "target logits of rank " << r;
    for (int64_t n = 0; n < N; ++n) {
      sum_exp.data<float>()[n] += se.data<float>()[n];
      target_logit.data<float>()[n] += tl.data<float>()[n];
    }
  }
  // Pass 3: every rank's losses (the same on each) and its dlogits, in place.
  for (int64_t r = 0; r < ranks; ++r) {
    Tensor losses = Tensor::empty(Shape{N}, DType::f32), d = copy_of(slice[size_t(r)]);
    ops::vocab_parallel_ce_finish(losses, d, d, rm, sum_exp, target_logit, targets, r * Vl, V, 0.25f);
    Tensor glosses = poisoned(Shape{N}, DType::f32), gd = copy_of(slice[size_t(r)]);
    emu::launch(dim3(unsigned(N)), ck::kThreads, 0, ck::vp_finish_kernel<T, P>, p<float>(glosses), p<T>(gd),
                static_cast<const T*>(p<T>(gd)), static_cast<const float*>(p<float>(rm)),
                static_cast<const float*>(p<float>(sum_exp)), static_cast<const float*>(p<float>(target_logit)),
                static_cast<const int32_t*>(p<int32_t>(targets)), Vl, r * Vl, real_of(r), 0.25f);
    EXPECT_TRUE(close(glosses, losses, 1e-5, "losses")) << "rank " << r;
    EXPECT_TRUE(close(gd, d, tol(dt), "dlogits (in place)")) << "rank " << r;
  }
}

TEST(CudaKernelsEmulated, NormForwardBackwardMatchTheCpu) {
  auto rng = make_rng(41);
  constexpr int kF32Pack = cuda::kPack16<float>, kBf16Pack = cuda::kPack16<__nv_bfloat16>;
  // 70 rows: 9 blocks of 8 row warps, the last partial (one block runs at a
  // time, so the rest stay small). C = 300: 75 packs of 4 floats, more than
  // the 32 lanes of a warp.
  norm_case<float, 1>(ops::NormKind::layernorm, 70, 300, false, DType::f32, rng);
  norm_case<float, kF32Pack>(ops::NormKind::layernorm, 70, 300, false, DType::f32, rng);
  // dw / db partials over several chunks (colsum_kernels::chunk_rows): 600
  // rows are chunks of 256, 256 and 88 rows; the fused backward's 264
  // columns are 33 packs, 2 per lane (lanes 1-31 hold one).
  norm_case<__nv_bfloat16, kBf16Pack>(ops::NormKind::layernorm, 600, 264, true, DType::bf16, rng);
  // RMSNorm over 256 packs: the fused backward's 8 packs per lane (and the
  // forward's 8 held in registers); over 512, the forward re-reads them and
  // the backward takes two passes.
  norm_case<__nv_bfloat16, kBf16Pack>(ops::NormKind::rmsnorm, 16, 2048, true, DType::bf16, rng);
  norm_case<__nv_bfloat16, kBf16Pack>(ops::NormKind::rmsnorm, 3, 4096, true, DType::bf16, rng);
  for (const auto kind : {ops::NormKind::layernorm, ops::NormKind::rmsnorm})
    for (const bool residual : {false, true}) {
      norm_case<float, 1>(kind, 4, 301, residual, DType::f32, rng);
      norm_case<float, kF32Pack>(kind, 4, 300, residual, DType::f32, rng);
      norm_case<__nv_bfloat16, 1>(kind, 3, 70, residual, DType::bf16, rng);
      // 8 packs: lanes 8-31 hold none; 97 packs: a fourth, partial sweep.
      norm_case<__nv_bfloat16, kBf16Pack>(kind, 3, 64, residual, DType::bf16, rng);
      norm_case<__nv_bfloat16, kBf16Pack>(kind, 9, 776, residual, DType::bf16, rng);
    }
  // The fused backward's other packs per lane (backward_packs_per_lane): 3
  // in bf16 (GPT-2's 768), 6 (1536, 1416: lanes past the row's 177 packs
  // hold 5), 8 with the LayerNorm's bias gradient (the most shared memory);
  // f32 at 8, 6 and 1.
  norm_case<__nv_bfloat16, kBf16Pack>(ops::NormKind::layernorm, 40, 768, false, DType::bf16, rng);
  norm_case<__nv_bfloat16, kBf16Pack>(ops::NormKind::layernorm, 20, 1536, true, DType::bf16, rng);
  norm_case<__nv_bfloat16, kBf16Pack>(ops::NormKind::rmsnorm, 20, 1416, true, DType::bf16, rng);
  norm_case<__nv_bfloat16, kBf16Pack>(ops::NormKind::layernorm, 17, 2048, false, DType::bf16, rng);
  norm_case<float, kF32Pack>(ops::NormKind::layernorm, 12, 1024, false, DType::f32, rng);
  norm_case<float, kF32Pack>(ops::NormKind::rmsnorm, 12, 700, false, DType::f32, rng);
  norm_case<float, kF32Pack>(ops::NormKind::layernorm, 70, 64, false, DType::f32, rng);
}

// f16 (fp16 training's norms; the CPU has no f16 kernels to check against,
// and the GPU tests run f32 and bf16): the one pass and the two passes on
// its blocks, which training races, write the same dx, dw and db bits -
// LayerNorm with and without its bias gradient, RMSNorm, dx apart and over
// dx_add. 1000 columns: 125 packs, 4 a lane.
TEST(CudaKernelsEmulated, NormBackwardInF16TheTwoPassesHaveTheOnePassBits) {
  auto rng = make_rng(43);
  using T = __half;
  constexpr int V = cuda::kPack16<T>;
  const int64_t N = 40, C = 1000;
  const Tensor x = random_tensor(Shape{N, C}, DType::f16, rng), dy = random_tensor(Shape{N, C}, DType::f16, rng);
  const Tensor w = random_tensor(Shape{C}, DType::f16, rng, 0.5, 1.5);
  const Tensor dx_add = random_tensor(Shape{N, C}, DType::f16, rng);
  const Tensor mean = random_tensor(Shape{N}, DType::f32, rng, -0.1, 0.1);
  const Tensor rstd = random_tensor(Shape{N}, DType::f32, rng, 0.5, 2.0);
  const Tensor dw0 = random_tensor(Shape{C}, DType::f32, rng), db0 = random_tensor(Shape{C}, DType::f32, rng);
  const int Q = nk::backward_packs_per_lane(C / V);
  ASSERT_EQ(Q, 4);
  const int64_t blocks = nk::backward_blocks(N, 3);
  for (const bool rms : {false, true})
    for (const bool with_db : rms ? std::vector<bool>{false} : std::vector<bool>{true, false})
      for (const bool in_place : {false, true}) {
        SCOPED_TRACE(::testing::Message() << (rms ? "rmsnorm" : "layernorm") << (with_db ? " with db" : "")
                                          << (in_place ? ", dx over dx_add" : ""));
        Tensor dx = in_place ? copy_of(dx_add) : poisoned(x.shape(), DType::f16), dw, db;
        const Tensor& m = rms ? Tensor() : mean;
        if (with_db)
          fused_backward_on_emulator<T, V, 4, true>(dx, dw, db, rms, dy, x, w, m, rstd, in_place ? dx : dx_add, dw0,
                                                    db0, blocks, false);
        else
          fused_backward_on_emulator<T, V, 4, false>(dx, dw, db, rms, dy, x, w, m, rstd, in_place ? dx : dx_add, dw0,
                                                     db0, blocks, false);
        Tensor tdx = in_place ? copy_of(dx_add) : poisoned(x.shape(), DType::f16), tdw, tdb;
        two_pass_on_blocks_on_emulator<T, V>(tdx, tdw, tdb, rms, with_db, dy, x, w, m, rstd, in_place ? tdx : dx_add,
                                             dw0, db0, blocks, false);
        const std::vector<double> got = to_f64(dx);
        EXPECT_TRUE(std::ranges::all_of(got, [](double v) { return std::isfinite(v); })) << "dx written everywhere";
        EXPECT_EQ(to_f64(tdx), got) << "dx";
        EXPECT_EQ(to_f64(tdw), to_f64(dw)) << "dw";
        if (with_db) {
          EXPECT_EQ(to_f64(tdb), to_f64(db)) << "db";
        }
      }
}

// The classifier's grid: R blocks per SM (H100: 132 SMs), never more blocks
// than rows.
TEST(CudaKernelsLaunch, ClassifierGridHoldsItsRowsPerSm) {
  constexpr int kSms = 132;
  EXPECT_EQ(ck::ce_grid(4096, kSms, 1), 132u);
  EXPECT_EQ(ck::ce_grid(4096, kSms, 2), 264u);
  EXPECT_EQ(ck::ce_grid(4096, kSms, 4), 528u);
  EXPECT_EQ(ck::ce_grid(300, kSms, 4), 300u) << "never more blocks than rows";
  EXPECT_EQ(ck::ce_grid(1, kSms, 1), 1u);
  EXPECT_EQ(ck::packs_ahead(1), 4);
  EXPECT_EQ(ck::packs_ahead(2), 2);
  EXPECT_EQ(ck::packs_ahead(4), 1);
}

// The staged kernel's share of a row: all of it where it fits, else whole
// sweeps of the block's threads (16-byte packs; 227 KiB less the scratch).
TEST(CudaKernelsLaunch, ClassifierStagesWholeSweepsOfPacks) {
  constexpr int64_t kShared = 227 * 1024 - 128;
  EXPECT_EQ(ck::staged_packs(50304 / 8, kShared), 6288) << "GPT-2's row, 98 KiB, whole";
  EXPECT_EQ(ck::staged_packs(128256 / 8, kShared), 14336) << "Llama's: 28 sweeps of 512 packs of 16032";
  EXPECT_EQ(ck::staged_packs(14520, kShared), 14520) << "exactly full";
  EXPECT_EQ(ck::staged_packs(14521, kShared), 14336);
  EXPECT_EQ(ck::staged_packs(1000, 16 * 511), 0) << "not one sweep fits";
}

TEST(CudaKernelsEmulated, CrossEntropyLossAndInPlaceGradientMatchTheCpu) {
  auto rng = make_rng(42);
  constexpr int kF32Pack = cuda::kPack16<float>, kBf16Pack = cuda::kPack16<__nv_bfloat16>;
  // The last real column mid-pack (997 = 249 x 4 + 1, 515 = 64 x 8 + 3); 513
  // packs of 4 floats: a second, partial sweep of the 512 threads.
  ce_case<float, 1>(5, 1000, 997, DType::f32, rng);
  ce_case<float, kF32Pack>(5, 1000, 997, DType::f32, rng);
  ce_case<float, kF32Pack>(2, 2052, 2050, DType::f32, rng);
  ce_case<__nv_bfloat16, 1>(3, 520, 515, DType::bf16, rng);
  ce_case<__nv_bfloat16, kBf16Pack>(3, 520, 515, DType::bf16, rng);
  // 2513 packs of 8: past one round of kUnroll packs per thread (4 x 512), the
  // second round partial.
  ce_case<__nv_bfloat16, kBf16Pack>(3, 20104, 20100, DType::bf16, rng);
  // Whole packs of padding (GPT-2's 50257 of 50304): 520 packs, 513 real;
  // 1032 packs, 500 real (the staged sweep of 512 past the real ones); one
  // row of 2 packs.
  ce_case<__nv_bfloat16, kBf16Pack>(5, 4160, 4100, DType::bf16, rng);
  ce_case<float, kF32Pack>(4, 2080, 2050, DType::f32, rng);
  ce_case<__nv_bfloat16, kBf16Pack>(3, 8256, 4000, DType::bf16, rng);
  ce_case<__nv_bfloat16, kBf16Pack>(1, 16, 3, DType::bf16, rng);
}

TEST(CudaKernelsEmulated, VocabParallelCrossEntropyMatchesTheCpu) {
  auto rng = make_rng(44);
  // 9 ids over 4 ranks of 3 columns: the last rank holds only padding.
  vp_ce_case<float, 1>(5, 9, 4, 3, DType::f32, rng);
  // 1000 ids over 2 ranks of 520 (> the 512 threads of a row; 40 padding columns).
  vp_ce_case<float, 1>(4, 1000, 2, 520, DType::f32, rng);
  vp_ce_case<float, cuda::kPack16<float>>(4, 1000, 2, 520, DType::f32, rng);
  vp_ce_case<__nv_bfloat16, 1>(3, 1000, 2, 520, DType::bf16, rng);
  // 1003 ids: rank 1's last real column mid-pack (483 = 60 x 8 + 3).
  vp_ce_case<__nv_bfloat16, cuda::kPack16<__nv_bfloat16>>(3, 1003, 2, 520, DType::bf16, rng);
}

}  // namespace
}  // namespace zt::test
