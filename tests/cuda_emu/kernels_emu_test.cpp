// The CUDA embedding (embedding_kernels.cuh), AdamW (adamw_kernels.cuh),
// GeLU / SwiGLU (activation_kernels.cuh), RoPE (rope_kernels.cuh),
// add / scale / axpy (elementwise_kernels.cuh) and bias-gradient column sum
// (colsum_kernels.cuh) kernels, run by the warp
// emulator on the CPU with the launches of embedding.cu, adamw.cu,
// activation.cu, rope.cu and elementwise.cu and their host-side helpers (the token
// grouping, the bias corrections, the cos/sin table), against the CPU backend
// (itself checked against float64 references in tests/ops): the gather with
// and without wpe and a position offset, of a whole table and of a
// tensor-parallel vocabulary slice, the grouped dwte and the dwpe
// backward accumulating into nonzero gradients (tokens repeated, so groups
// have several positions), the AdamW step with every model-copy dtype, the
// activations forward and backward (an element or a 16-byte pack per load),
// the rotation and its inverse (in place), the residual add, scale and
// axpy, and db += column sums of dy against a float64 reference. f32 and bf16; sizes that
// leave partial blocks; the grid-stride kernels on a few blocks, so the
// stride loop runs; outputs poisoned first.
#include "cuda_emu/warp_emulator.h"  // first: it defines what the kernel headers emulate

#include "backend/cuda/activation_kernels.cuh"
#include "backend/cuda/adamw_kernels.cuh"
#include "backend/cuda/colsum_kernels.cuh"
#include "backend/cuda/elementwise_kernels.cuh"
#include "backend/cuda/embedding_kernels.cuh"
#include "backend/cuda/rope_kernels.cuh"

#include <gtest/gtest.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "backend/cpu/adamw.h"
#include "core/rng.h"
#include "ops/activation.h"
#include "ops/adamw.h"
#include "ops/device.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/rope.h"
#include "cuda_emu/colsum_emu.h"
#include "cuda_emu/emu_test_util.h"
#include "test_util.h"

namespace zt::test {
namespace {

namespace actk = cuda::activation_kernels;
namespace adk = cuda::adamw_kernels;
namespace ek = cuda::embedding_kernels;
namespace elk = cuda::elementwise_kernels;
namespace rk = cuda::rope_kernels;

using namespace emu_util;

// Embedding of B x T tokens (ids in [0, V)) in C channels; wte / wpe / out
// of type T, gradients of type G.
// A tensor-parallel slice: wte holds rows [start, start + rows) of the V
// ids (rows < 0: the whole table, no slice).
template <typename T, typename G>
void embedding_case(int64_t B, int64_t T_, int64_t C, int64_t V, int64_t T_max, int64_t pos_offset, bool with_wpe,
                    std::mt19937_64& rng, int64_t start = 0, int64_t rows = -1) {
  const DType dt = dtype_of<T>(), gdt = dtype_of<G>();
  const bool sliced = rows >= 0;
  const int64_t R = sliced ? rows : V;
  SCOPED_TRACE(::testing::Message() << B << "x" << T_ << " tokens of " << V << ", C " << C << (with_wpe ? ", wpe" : "")
                                    << ", pos_offset " << pos_offset << " " << dtype_name(dt) << ", grads "
                                    << dtype_name(gdt) << ", rows [" << start << ", " << start + R << ")");
  const int64_t N = B * T_;
  ASSERT_GT(N, V) << "more positions than ids, so some id repeats";
  Tensor tokens = random_tokens(Shape{B, T_}, V, rng);
  // Two positions share an id in the table (a slice's first row), whatever
  // the draw: a slice may otherwise hold each of its ids once.
  tokens.data<int32_t>()[0] = tokens.data<int32_t>()[1] = int32_t(start);
  const Tensor wte = random_tensor(Shape{R, C}, dt, rng);
  const Tensor wpe = with_wpe ? random_tensor(Shape{T_max, C}, dt, rng) : Tensor();
  const Tensor dout = random_tensor(Shape{B, T_, C}, dt, rng);
  const Tensor dwte0 = random_tensor(Shape{R, C}, gdt, rng), dwpe0 = random_tensor(Shape{T_max, C}, gdt, rng);
  // The CPU backend.
  const ops::VocabSlice slice = sliced ? ops::VocabSlice{start, V} : ops::VocabSlice{};
  Tensor out = Tensor::empty(Shape{B, T_, C}, dt);
  ops::embedding_forward(out, tokens, wte, wpe, pos_offset, slice);
  Tensor dwte = copy_of(dwte0), dwpe = with_wpe ? copy_of(dwpe0) : Tensor();
  ops::embedding_backward(dwte, dwpe, dout, tokens, pos_offset, slice);
  // The kernels, launched as embedding.cu launches them.
  // One addition rounded once (or a copy), as on the CPU: bitwise equal, an
  // element per load and (C a multiple of a pack) 16-byte packs.
  Tensor gout = poisoned(out.shape(), dt);
  emu::launch(dim3(stride_grid(N * C)), ek::kThreads, 0, ek::embed_fwd_kernel<T, 1>, p<T>(gout),
              p<int32_t>(tokens), p<T>(wte), p<T>(wpe), N, T_, C, pos_offset, start, R);
  EXPECT_TRUE(all_close(gout, to_f64(out), 0.0, 0.0)) << "out";
  constexpr int kPack = cuda::kPack16<T>;
  if (C % kPack == 0) {
    Tensor gpacked = poisoned(out.shape(), dt);
    emu::launch(dim3(stride_grid(N * C / kPack)), ek::kThreads, 0, ek::embed_fwd_kernel<T, kPack>, p<T>(gpacked),
                p<int32_t>(tokens), p<T>(wte), p<T>(wpe), N, T_, C, pos_offset, start, R);
    EXPECT_TRUE(all_close(gpacked, to_f64(out), 0.0, 0.0)) << "out, 16-byte packs";
  }

  const ek::TokenGroups g = ek::group_by_token(p<int32_t>(tokens), N, R, start);
  const int64_t groups = int64_t(g.token.size());
  // The grouping itself: every position whose id is in the table once, rows
  // ascending, positions ascending within a group.
  int64_t in_table = 0;
  for (int64_t i = 0; i < N; ++i) in_table += p<int32_t>(tokens)[i] >= start && p<int32_t>(tokens)[i] < start + R;
  if (sliced) {
    ASSERT_GT(in_table, 0);
    ASSERT_LT(in_table, N) << "some tokens fall outside the slice";
  }
  ASSERT_EQ(int64_t(g.order.size()), in_table);
  ASSERT_EQ(int64_t(g.begin.size()), groups + 1);
  ASSERT_EQ(g.begin.back(), in_table);
  int64_t largest = 0;
  for (int64_t k = 0; k < groups; ++k) {
    largest = std::max<int64_t>(largest, g.begin[size_t(k) + 1] - g.begin[size_t(k)]);
    if (k > 0) {
      EXPECT_LT(g.token[size_t(k) - 1], g.token[size_t(k)]);
    }
    for (int32_t j = g.begin[size_t(k)]; j < g.begin[size_t(k) + 1]; ++j) {
      EXPECT_EQ(p<int32_t>(tokens)[g.order[size_t(j)]], g.token[size_t(k)] + start);
      if (j > g.begin[size_t(k)]) {
        EXPECT_LT(g.order[size_t(j) - 1], g.order[size_t(j)]);
      }
    }
  }
  EXPECT_GT(largest, 1);
  // The segments: each group's positions in order, in pieces of at most
  // kSegmentRows; the pieces of a group longer than that own consecutive
  // partial rows, in order.
  const ek::TokenSegments seg = ek::segment_groups(g);
  const int64_t S = int64_t(seg.token.size()), K = int64_t(seg.split_token.size());
  ASSERT_EQ(int64_t(seg.begin.size()), S + 1);
  ASSERT_EQ(seg.begin.front(), 0);
  ASSERT_EQ(seg.begin.back(), in_table);
  int64_t split_groups = 0, next_slot = 0;
  for (int64_t k = 0, s = 0; k < groups; ++k) {
    const int32_t size = g.begin[size_t(k) + 1] - g.begin[size_t(k)];
    const int64_t pieces = (size + ek::kSegmentRows - 1) / ek::kSegmentRows;
    for (int64_t i = 0; i < pieces; ++i, ++s) {
      ASSERT_EQ(seg.begin[size_t(s)], g.begin[size_t(k)] + i * ek::kSegmentRows);
      EXPECT_EQ(seg.token[size_t(s)], g.token[size_t(k)]);
      EXPECT_EQ(seg.slot[size_t(s)], pieces > 1 ? next_slot + i : -1);
    }
    if (pieces > 1) {
      EXPECT_EQ(seg.split_token[size_t(split_groups)], g.token[size_t(k)]);
      EXPECT_EQ(seg.split_first[size_t(split_groups)], next_slot);
      next_slot += pieces, ++split_groups;
    }
  }
  ASSERT_EQ(split_groups, K);
  ASSERT_EQ(seg.partials(), next_slot);
  EXPECT_EQ(K > 0, largest > ek::kSegmentRows);
  Tensor gdwte = copy_of(dwte0);
  Tensor partial = poisoned(Shape{std::max<int64_t>(1, seg.partials()) * C}, DType::f32);
  const unsigned channel_blocks = unsigned((C + ek::kThreads - 1) / ek::kThreads);
  emu::launch(dim3(unsigned(S), channel_blocks), ek::kThreads, 0, ek::embed_bwd_segment_kernel<T, G>, p<G>(gdwte),
              p<float>(partial), p<T>(dout), g.order.data(), seg.begin.data(), seg.slot.data(), seg.token.data(), C);
  if (K > 0)
    emu::launch(dim3(unsigned(K), channel_blocks), ek::kThreads, 0, ek::embed_bwd_partials_kernel<G>, p<G>(gdwte),
                p<float>(partial), seg.split_first.data(), seg.split_token.data(), C);
  EXPECT_TRUE(close(gdwte, dwte, tol(gdt), "dwte"));
  if (with_wpe) {
    Tensor gdwpe = copy_of(dwpe0);
    emu::launch(dim3(stride_grid(T_ * C)), ek::kThreads, 0, ek::embed_bwd_wpe_kernel<T, G>, p<G>(gdwpe), p<T>(dout),
                B, T_, C, pos_offset);
    EXPECT_TRUE(close(gdwpe, dwpe, tol(gdt), "dwpe"));
  }
}

// One AdamW step over n elements: gradient of type G, model copy of type C
// (void: none).
template <typename G, typename C>
void adamw_case(int64_t n, const ops::AdamWParams& h, std::mt19937_64& rng) {
  constexpr bool kCopy = !std::is_void_v<C>;
  using CopyT = std::conditional_t<kCopy, C, float>;
  const DType gdt = dtype_of<G>(), cdt = dtype_of<CopyT>();
  SCOPED_TRACE(::testing::Message() << n << " elements, step " << h.step << ", grad " << dtype_name(gdt) << ", copy "
                                    << (kCopy ? dtype_name(cdt) : "none"));
  const Tensor master0 = random_tensor(Shape{n}, DType::f32, rng), grad = random_tensor(Shape{n}, gdt, rng);
  const Tensor m0 = random_tensor(Shape{n}, DType::f32, rng, -0.1, 0.1);
  const Tensor v0 = random_tensor(Shape{n}, DType::f32, rng, 0.0, 0.01);  // a second moment: >= 0
  // The CPU backend.
  Tensor master = copy_of(master0), m = copy_of(m0), v = copy_of(v0);
  Tensor copy = kCopy ? Tensor::empty(Shape{n}, cdt) : Tensor();
  ops::adamw_step(master, grad, m, v, copy, h);
  // The kernel, launched as adamw.cu launches it, with its host-side
  // constants: an element a thread (V = 1), and 4 a thread where a part's
  // packs are aligned (as adamw.cu checks; the tail an element a thread).
  struct Run {
    Tensor master, m, v, copy;
    int64_t packed_parts = 0;
  };
  auto run = [&](bool packs) {
    Run r{copy_of(master0), copy_of(m0), copy_of(v0), kCopy ? poisoned(Shape{n}, cdt) : Tensor()};
    for (const adk::LaunchPart& part : adk::launch_parts(n, h.no_decay)) {
      const adk::Consts k = adk::adamw_consts(cpu::AdamWHyper{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step,
                                                              h.grad_scale, h.stochastic_rounding, h.rounding_seed,
                                                              h.rounding_offset + part.lo});
      const int64_t lo = part.lo, len = part.hi - part.lo;
      float *pp = p<float>(r.master) + lo, *mp = p<float>(r.m) + lo, *vp = p<float>(r.v) + lo;
      const G* gp = p<G>(grad) + lo;
      CopyT* cp = kCopy ? p<CopyT>(r.copy) + lo : nullptr;
      if (packs && adk::adamw_packs_fit<4>(pp, gp, mp, vp, cp)) {
        emu::launch(dim3(stride_grid(len / 4 + 1)), adk::kThreads, 0, adk::adamw_kernel<G, CopyT, 4>, pp, gp, mp, vp,
                    cp, len, k, part.nd);
        ++r.packed_parts;
      } else {
        emu::launch(dim3(stride_grid(len)), adk::kThreads, 0, adk::adamw_kernel<G, CopyT, 1>, pp, gp, mp, vp, cp, len,
                    k, part.nd);
      }
    }
    return r;
  };
  const Run one = run(false), four = run(true);
  EXPECT_GT(four.packed_parts, 0) << "no part took 4 elements a thread";
  const Tensor gmaster = one.master, gm = one.m, gv = one.v, gcopy = one.copy;
  // The same arithmetic per element at either width: the same bits.
  EXPECT_EQ(to_f64(four.master), to_f64(gmaster)) << "master, 4 a thread";
  EXPECT_EQ(to_f64(four.m), to_f64(gm)) << "m, 4 a thread";
  EXPECT_EQ(to_f64(four.v), to_f64(gv)) << "v, 4 a thread";
  if (kCopy) {
    EXPECT_EQ(to_f64(four.copy), to_f64(gcopy)) << "model copy, 4 a thread";
  }
  EXPECT_TRUE(close(gmaster, master, 1e-6, "master"));
  EXPECT_TRUE(close(gm, m, 1e-6, "m"));
  EXPECT_TRUE(close(gv, v, 1e-6, "v"));
  if (kCopy) {
    EXPECT_TRUE(close(gcopy, copy, cdt == DType::f32 ? 1e-6 : 2e-2, "model copy"));
  }
  if (h.stochastic_rounding) {
    // The kernel's own master, rounded with the random word of each element's
    // position: the same bits as the CPU draws (the masters themselves may
    // differ in the last place, which moves a rounding, hence this form).
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t r = philox_word_at(h.rounding_seed, uint64_t(h.step), uint64_t(h.rounding_offset + i));
      const uint16_t want = float_to_bf16_bits_stochastic(gmaster.data<float>()[i], r);
      bad += p<uint16_t>(gcopy)[i] != want;
    }
    EXPECT_EQ(bad, 0) << "of " << n << " stochastically rounded copy elements differ from the CPU's rule";
  }
}

// GeLU on n elements and SwiGLU on rows x (2H -> H), forward and backward,
// V elements per load and store (1, or a 16-byte pack: n and H multiples of V).
template <typename T, int V>
void activation_case(int64_t n, int64_t rows, int64_t H, std::mt19937_64& rng) {
  const DType dt = dtype_of<T>();
  SCOPED_TRACE(::testing::Message() << "gelu " << n << ", swiglu " << rows << "x" << H << " " << dtype_name(dt)
                                    << ", " << V << " per load");
  ASSERT_TRUE(n % V == 0 && H % V == 0);
  const Tensor x = random_tensor(Shape{n}, dt, rng, -5, 5), dy = random_tensor(Shape{n}, dt, rng);
  Tensor y = Tensor::empty(Shape{n}, dt), dx = Tensor::empty(Shape{n}, dt);
  ops::gelu_forward(y, x);
  ops::gelu_backward(dx, dy, x);
  Tensor gy = poisoned(Shape{n}, dt), gdx = poisoned(Shape{n}, dt);
  emu::launch(dim3(stride_grid(n / V)), actk::kThreads, 0, actk::gelu_fwd_kernel<T, V>, p<T>(gy), p<T>(x), n);
  emu::launch(dim3(stride_grid(n / V)), actk::kThreads, 0, actk::gelu_bwd_kernel<T, V>, p<T>(gdx), p<T>(dy), p<T>(x),
              n);
  EXPECT_TRUE(close(gy, y, tol(dt), "gelu y"));
  EXPECT_TRUE(close(gdx, dx, tol(dt), "gelu dx"));

  const Tensor sx = random_tensor(Shape{rows, 2 * H}, dt, rng, -5, 5), sdy = random_tensor(Shape{rows, H}, dt, rng);
  Tensor sy = Tensor::empty(Shape{rows, H}, dt), sdx = Tensor::empty(Shape{rows, 2 * H}, dt);
  ops::swiglu_forward(sy, sx);
  ops::swiglu_backward(sdx, sdy, sx);
  Tensor gsy = poisoned(sy.shape(), dt), gsdx = poisoned(sdx.shape(), dt);
  emu::launch(dim3(stride_grid(rows * H / V)), actk::kThreads, 0, actk::swiglu_fwd_kernel<T, V>, p<T>(gsy), p<T>(sx),
              rows, H);
  emu::launch(dim3(stride_grid(rows * H / V)), actk::kThreads, 0, actk::swiglu_bwd_kernel<T, V>, p<T>(gsdx),
              p<T>(sdy), p<T>(sx), rows, H);
  EXPECT_TRUE(close(gsy, sy, tol(dt), "swiglu y"));
  EXPECT_TRUE(close(gsdx, sdx, tol(dt), "swiglu dx"));
  // In place over x (the model's call): the same bits.
  Tensor in_place = copy_of(sx);
  emu::launch(dim3(stride_grid(rows * H / V)), actk::kThreads, 0, actk::swiglu_bwd_kernel<T, V>, p<T>(in_place),
              p<T>(sdy), static_cast<const T*>(p<T>(in_place)), rows, H);
  EXPECT_EQ(to_f64(in_place), to_f64(gsdx)) << "swiglu dx in place";
  // The launch shapes activation.cu races: 4 packs a thread an iteration,
  // on a grid that strides (3 blocks) and one that does not; the bits of a
  // pack a thread.
  for (const unsigned blocks : {3u, 0u}) {
    SCOPED_TRACE(::testing::Message() << "4 packs a thread, " << (blocks ? "3 blocks" : "a block per 4 x 256 packs"));
    const auto grid = [&](int64_t packs) {
      return dim3(blocks ? blocks : unsigned((packs + 4 * actk::kThreads - 1) / (4 * actk::kThreads)));
    };
    Tensor uy = poisoned(Shape{n}, dt), udx = poisoned(Shape{n}, dt);
    emu::launch(grid(n / V), actk::kThreads, 0, actk::gelu_fwd_kernel<T, V, 4>, p<T>(uy), p<T>(x), n);
    emu::launch(grid(n / V), actk::kThreads, 0, actk::gelu_bwd_kernel<T, V, 4>, p<T>(udx), p<T>(dy), p<T>(x), n);
    EXPECT_EQ(to_f64(uy), to_f64(gy)) << "gelu y";
    EXPECT_EQ(to_f64(udx), to_f64(gdx)) << "gelu dx";
    Tensor usy = poisoned(sy.shape(), dt), usdx = copy_of(sx);  // the backward in place, as the model calls it
    emu::launch(grid(rows * H / V), actk::kThreads, 0, actk::swiglu_fwd_kernel<T, V, 4>, p<T>(usy), p<T>(sx), rows,
                H);
    emu::launch(grid(rows * H / V), actk::kThreads, 0, actk::swiglu_bwd_kernel<T, V, 4>, p<T>(usdx), p<T>(sdy),
                static_cast<const T*>(p<T>(usdx)), rows, H);
    EXPECT_EQ(to_f64(usy), to_f64(gsy)) << "swiglu y";
    EXPECT_EQ(to_f64(usdx), to_f64(gsdx)) << "swiglu dx in place";
  }
}

// add and scale on n elements, V per load and store (1, or a 16-byte pack: n
// a multiple of V); axpy into f32 from T (an element per load).
template <typename T, int V>
void elementwise_case(int64_t n, std::mt19937_64& rng) {
  const DType dt = dtype_of<T>();
  SCOPED_TRACE(::testing::Message() << n << " " << dtype_name(dt) << ", " << V << " per load");
  ASSERT_EQ(n % V, 0);
  const Tensor a = random_tensor(Shape{n}, dt, rng), b = random_tensor(Shape{n}, dt, rng);
  const Tensor y0 = random_tensor(Shape{n}, DType::f32, rng);
  Tensor sum = Tensor::empty(Shape{n}, dt), scaled = Tensor::empty(Shape{n}, dt), y = copy_of(y0);
  ops::add(sum, a, b);
  ops::scale(scaled, a, -0.37f);
  ops::axpy(y, 0.5f, a);
  Tensor gsum = poisoned(Shape{n}, dt), gscaled = poisoned(Shape{n}, dt), gy = copy_of(y0);
  emu::launch(dim3(stride_grid(n / V)), elk::kThreads, 0, elk::add_kernel<T, V>, p<T>(gsum),
              static_cast<const T*>(p<T>(a)), static_cast<const T*>(p<T>(b)), n);
  emu::launch(dim3(stride_grid(n / V)), elk::kThreads, 0, elk::scale_kernel<T, V>, p<T>(gscaled),
              static_cast<const T*>(p<T>(a)), -0.37f, n);
  emu::launch(dim3(stride_grid(n)), elk::kThreads, 0, elk::axpy_kernel<float, T>, p<float>(gy),
              0.5f, static_cast<const T*>(p<T>(a)), n);
  // One rounding of the same f32 value on both sides: bitwise equal.
  EXPECT_EQ(to_f64(gsum), to_f64(sum)) << "add";
  EXPECT_EQ(to_f64(gscaled), to_f64(scaled)) << "scale";
  EXPECT_TRUE(close(gy, y, 1e-6, "axpy"));
}

template <typename T>
void colsum_case(int64_t rows, int64_t cols, std::mt19937_64& rng) {
  const DType dt = dtype_of<T>();
  SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " " << dtype_name(dt));
  const Tensor dy = random_tensor(Shape{rows, cols}, dt, rng), db0 = random_tensor(Shape{cols}, DType::f32, rng);
  const std::vector<double> y = to_f64(dy), b0 = to_f64(db0);
  std::vector<double> want(static_cast<size_t>(cols));
  for (int64_t c = 0; c < cols; ++c) {
    double s = b0[size_t(c)];
    for (int64_t r = 0; r < rows; ++r) s += y[size_t(r * cols + c)];
    want[size_t(c)] = s;
  }
  const Tensor one = colsum_on_emulator<T, 1>(dy, db0);
  EXPECT_TRUE(rel_error_within(one, want, 1e-5, "db, a column per lane"));
  constexpr int kPack = cuda::kPack16<T>;
  if (cols % kPack == 0) {
    // The same summation order per column at any pack width: the same bits.
    EXPECT_EQ(to_f64(colsum_on_emulator<T, kPack>(dy, db0)), to_f64(one)) << "db, 16-byte packs per lane";
  }
  // Written over db (a step's first write: db not read, here NaN) gives the
  // bits of the sums added into zeros.
  Tensor zeros = Tensor::empty(Shape{cols}, DType::f32);
  ops::fill(zeros, 0.0);
  EXPECT_EQ(to_f64(colsum_on_emulator<T, 1>(dy, poisoned(Shape{cols}, DType::f32), true)),
            to_f64(colsum_on_emulator<T, 1>(dy, zeros)))
      << "db written over";
}

// The CPU's cos/sin table of head dim D, and rope.cu's host code on the
// frequencies the ops layer passes it (checked bitwise equal); theta 10000.
struct RopeTables {
  Tensor cpu, gpu;
};

RopeTables rope_tables(int64_t D, int64_t T_max, const ops::RopeScaling& scaling) {
  const double theta = 10000.0;
  const int64_t half_dim = D / 2;
  RopeTables t{Tensor::empty(Shape{T_max, half_dim, 2}, DType::f32), poisoned(Shape{T_max, half_dim, 2}, DType::f32)};
  ops::rope_table(t.cpu, D, theta, scaling);
  std::vector<double> freqs(static_cast<size_t>(half_dim));
  for (int64_t i = 0; i < half_dim; ++i) freqs[size_t(i)] = ops::rope_frequency(i, D, theta, scaling);
  rk::rope_table_host(p<float>(t.gpu), T_max, half_dim, freqs.data());
  EXPECT_TRUE(all_close(t.gpu, to_f64(t.cpu), 0.0, 0.0)) << "the cos/sin tables are bitwise equal";
  return t;
}

// RoPE on (B, T, H, D) at positions pos_offset.. of a T_max table: forward,
// then the inverse in place (as the backward may run). V elements per thread:
// one pair (2), or a 16-byte pack (D a multiple of V).
template <typename T, int V>
void rope_case(int64_t B, int64_t T_, int64_t H, int64_t D, int64_t T_max, int64_t pos_offset,
               const ops::RopeScaling& scaling, std::mt19937_64& rng) {
  const DType dt = dtype_of<T>();
  SCOPED_TRACE(::testing::Message() << B << "x" << T_ << "x" << H << "x" << D << ", pos_offset " << pos_offset
                                    << (scaling.enabled ? ", Llama 3 scaling " : " ") << dtype_name(dt) << ", " << V
                                    << " per thread");
  const int64_t half_dim = D / 2, units = B * T_ * H * D / V;
  const RopeTables tables = rope_tables(D, T_max, scaling);
  const Tensor x = random_tensor(Shape{B, T_, H, D}, dt, rng), dy = random_tensor(Shape{B, T_, H, D}, dt, rng);
  Tensor y = Tensor::empty(x.shape(), dt), dx = Tensor::empty(x.shape(), dt);
  ops::rope_forward(y, x, tables.cpu, pos_offset);
  ops::rope_backward(dx, dy, tables.cpu, pos_offset);
  Tensor gy = poisoned(x.shape(), dt), gdx = copy_of(dy);
  emu::launch(dim3(stride_grid(units)), rk::kThreads, 0, rk::rope_kernel<T, V>,
              rk::HeadLayout<T>{p<T>(x), p<T>(gy), nullptr, nullptr, H, 0}, p<float>(tables.gpu), units, T_,
              half_dim, pos_offset, 1.0f, false);
  emu::launch(dim3(stride_grid(units)), rk::kThreads, 0, rk::rope_kernel<T, V>,
              rk::HeadLayout<T>{p<T>(gdx), p<T>(gdx), nullptr, nullptr, H, 0}, p<float>(tables.gpu), units, T_,
              half_dim, pos_offset, -1.0f, false);
  EXPECT_TRUE(close(gy, y, tol(dt), "y"));
  EXPECT_TRUE(close(gdx, dx, tol(dt), "dx (in place)"));
}

// The fused qkv product (B, T, Hq + 2 Hkv, D) against the CPU's: its split
// into rotated q and k and copied v, and its gradient's join; then its query
// and key heads rotated in place, forward and inverse (a thread per unit of
// the Hq + Hkv visited heads of each token, the value heads skipped: their
// bits must stay).
template <typename T, int V>
void rope_fused_qkv_case(int64_t B, int64_t T_, int64_t Hq, int64_t Hkv, int64_t D, int64_t pos_offset,
                         const ops::RopeScaling& scaling, std::mt19937_64& rng) {
  const DType dt = dtype_of<T>();
  SCOPED_TRACE(::testing::Message() << "fused qkv " << B << "x" << T_ << "x(" << Hq << "+2x" << Hkv << ")x" << D
                                    << ", pos_offset " << pos_offset << " " << dtype_name(dt) << ", " << V
                                    << " per thread");
  const int64_t H = Hq + 2 * Hkv, units = B * T_ * H * D / V;
  const RopeTables tables = rope_tables(D, pos_offset + T_, scaling);
  const Shape qs{B, T_, Hq, D}, kvs{B, T_, Hkv, D}, packed{B, T_, H, D};
  const Tensor qkv = random_tensor(packed, dt, rng);
  const Tensor dq = random_tensor(qs, dt, rng), dk = random_tensor(kvs, dt, rng), dv = random_tensor(kvs, dt, rng);
  Tensor q = Tensor::empty(qs, dt), k = Tensor::empty(kvs, dt), v = Tensor::empty(kvs, dt);
  Tensor dqkv = Tensor::empty(packed, dt);
  ops::rope_split_qkv_forward(q, k, v, qkv, tables.cpu, pos_offset);
  ops::rope_split_qkv_backward(dqkv, dq, dk, dv, tables.cpu, pos_offset);
  Tensor gq = poisoned(qs, dt), gk = poisoned(kvs, dt), gv = poisoned(kvs, dt), gdqkv = poisoned(packed, dt);
  emu::launch(dim3(stride_grid(units)), rk::kThreads, 0, rk::rope_kernel<T, V>,
              rk::HeadLayout<T>{p<T>(qkv), p<T>(gq), p<T>(gk), p<T>(gv), Hq, Hkv}, p<float>(tables.gpu), units, T_,
              D / 2, pos_offset, 1.0f, false);
  emu::launch(dim3(stride_grid(units)), rk::kThreads, 0, rk::rope_kernel<T, V>,
              rk::HeadLayout<T>{p<T>(gdqkv), p<T>(dq), p<T>(dk), p<T>(dv), Hq, Hkv}, p<float>(tables.gpu), units, T_,
              D / 2, pos_offset, -1.0f, true);
  EXPECT_TRUE(close(gq, q, tol(dt), "q"));
  EXPECT_TRUE(close(gk, k, tol(dt), "k"));
  EXPECT_TRUE(all_close(gv, to_f64(v), 0.0, 0.0)) << "v is copied";
  EXPECT_TRUE(close(gdqkv, dqkv, tol(dt), "dqkv"));
  const int64_t visited = B * T_ * (Hq + Hkv) * D / V;
  for (const bool inverse : {false, true}) {
    SCOPED_TRACE(inverse ? "in place, inverse" : "in place, forward");
    Tensor want = copy_of(qkv), got = copy_of(qkv);
    if (inverse) ops::rope_packed_qkv_backward(want, Hq, Hkv, tables.cpu, pos_offset);
    else ops::rope_packed_qkv_forward(want, Hq, Hkv, tables.cpu, pos_offset);
    emu::launch(dim3(stride_grid(visited)), rk::kThreads, 0, rk::rope_kernel<T, V>,
                rk::HeadLayout<T>{p<T>(got), p<T>(got), nullptr, nullptr, Hq + Hkv, 0, Hkv}, p<float>(tables.gpu),
                visited, T_, D / 2, pos_offset, inverse ? -1.0f : 1.0f, false);
    EXPECT_TRUE(close(got, want, tol(dt), "q and k heads"));
    EXPECT_TRUE(all_close(test::heads_of(got, Hq + Hkv, Hkv), to_f64(test::heads_of(qkv, Hq + Hkv, Hkv)), 0.0, 0.0))
        << "v heads untouched";
    EXPECT_FALSE(all_close(test::heads_of(got, 0, Hq), to_f64(test::heads_of(qkv, 0, Hq)), 0.0, 0.0))
        << "q heads rotated";
  }
}

TEST(CudaKernelsEmulated, EmbeddingForwardBackwardMatchTheCpu) {
  auto rng = make_rng(43);
  // C = 300: two 256-channel column blocks of dwte, the second partial; 15
  // positions over 9 ids, so ids repeat.
  embedding_case<float, float>(3, 5, 300, 9, 12, 4, true, rng);
  embedding_case<float, float>(3, 5, 300, 9, 5, 0, false, rng);
  embedding_case<__nv_bfloat16, __nv_bfloat16>(2, 7, 100, 6, 10, 3, true, rng);
  embedding_case<__nv_bfloat16, float>(2, 7, 100, 6, 9, 2, true, rng);
  embedding_case<__nv_bfloat16, float>(2, 7, 96, 6, 9, 2, true, rng);  // 12 packs of 8 a row
  // Groups longer than a segment (about 53 and 75 positions a token).
  embedding_case<float, float>(4, 40, 70, 3, 40, 0, false, rng);
  embedding_case<__nv_bfloat16, float>(3, 50, 300, 2, 51, 1, true, rng);
  // Tensor-parallel slices (rank 1 of 3 over 12 ids; the last rank's
  // padded slice past the vocabulary): other ids add nothing and get no gradient.
  embedding_case<float, float>(4, 6, 300, 12, 8, 1, true, rng, 4, 4);
  embedding_case<__nv_bfloat16, float>(4, 6, 100, 12, 6, 0, false, rng, 8, 5);
}

TEST(CudaKernelsEmulated, AdamWMatchesTheCpu) {
  auto rng = make_rng(44);
  ops::AdamWParams h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  h.step = 7;
  h.grad_scale = 0.5f;
  adamw_case<float, void>(1000, h, rng);  // 1000 > 3 x 256: a second, partial sweep of the stride loop
  adamw_case<float, float>(1000, h, rng);
  adamw_case<float, float>(1003, h, rng);  // 4 a thread: a tail of 3
  adamw_case<float, float>(4001, h, rng);  // 1000 packs: the stride loop again, and a tail of 1
  h.beta1 = 0.8f;
  h.beta2 = 0.999f;
  h.step = 1;
  h.grad_scale = 1.0f;
  adamw_case<__nv_bfloat16, __nv_bfloat16>(700, h, rng);
  adamw_case<__nv_bfloat16, __half>(700, h, rng);
  h.stochastic_rounding = true;
  h.rounding_seed = 0x1234abcd5678ull;
  h.rounding_offset = 4099;  // not a multiple of 4: words from the middle of Philox blocks
  adamw_case<__nv_bfloat16, __nv_bfloat16>(700, h, rng);
  adamw_case<float, __nv_bfloat16>(1000, h, rng);
  // Weight decay off in spans (a set's gains and biases among its weights):
  // the first elements, some in the middle, the last ones.
  h.weight_decay = 0.1f;
  h.no_decay = {{0, 30}, {300, 301}, {520, 777}, {990, 1000}};
  adamw_case<float, __nv_bfloat16>(1000, h, rng);
  h.stochastic_rounding = false;
  adamw_case<__nv_bfloat16, __nv_bfloat16>(1000, h, rng);
  // 40 spans: three launches of at most 16 (launch_parts), the last span
  // ending the buffer.
  h.no_decay.clear();
  for (int64_t s = 0; s < 40; ++s) h.no_decay.emplace_back(25 * s + 10, 25 * s + 17 + (s == 39 ? 8 : 0));
  adamw_case<float, float>(1000, h, rng);
}

TEST(CudaKernelsEmulated, GeluSwigluMatchTheCpu) {
  auto rng = make_rng(45);
  activation_case<float, 1>(1000, 6, 150, rng);  // 1000 and 6*150 = 900 elements: the stride loop runs twice
  activation_case<__nv_bfloat16, 1>(300, 3, 70, rng);
  // 16-byte packs (4 floats, 8 bf16): 3 blocks of 256 threads take 768 packs
  // a sweep, so GeLU's 800 and 1000 packs run a second, partial sweep; a
  // SwiGLU row is 38 or 40 packs, so rows start mid-warp.
  activation_case<float, 4>(3200, 6, 152, rng);
  activation_case<__nv_bfloat16, 8>(1000 * 8, 10, 320, rng);
}

TEST(CudaKernelsEmulated, AddScaleAxpyMatchTheCpu) {
  auto rng = make_rng(47);
  // 1000 elements, or 1000 packs: past the 768 threads of 3 blocks, a second, partial sweep.
  elementwise_case<float, 1>(1000, rng);
  elementwise_case<__nv_bfloat16, 1>(1000, rng);
  elementwise_case<float, cuda::kPack16<float>>(4000, rng);
  elementwise_case<__nv_bfloat16, cuda::kPack16<__nv_bfloat16>>(8000, rng);
}

TEST(CudaKernelsEmulated, BiasGradientColumnSumsMatchFloat64) {
  auto rng = make_rng(48);
  // 600 rows: three 256-row chunks (the last partial) and their partials; 100
  // rows: one chunk, added straight into db. 520 bf16 columns: 65 packs, past
  // a block's 32 lanes; 300 f32: 75 packs; 77 columns: an element per lane.
  colsum_case<__nv_bfloat16>(600, 520, rng);
  colsum_case<__nv_bfloat16>(100, 520, rng);
  colsum_case<float>(600, 300, rng);
  colsum_case<float>(37, 77, rng);
}

TEST(CudaKernelsEmulated, RopeMatchesTheCpu) {
  auto rng = make_rng(46);
  constexpr int kF32Pack = cuda::kPack16<float>, kBf16Pack = cuda::kPack16<__nv_bfloat16>;
  // 2*5*4*21 = 840 pairs: three blocks, then a partial second sweep.
  rope_case<float, 2>(2, 5, 4, 42, 12, 4, ops::RopeScaling{}, rng);
  // Llama 3 scaling with a short original context, so pairs fall in all three of its bands.
  ops::RopeScaling scaling;
  scaling.enabled = true;
  scaling.original_max_position = 64;
  rope_case<float, 2>(1, 9, 2, 32, 16, 7, scaling, rng);
  rope_case<float, kF32Pack>(1, 9, 2, 32, 16, 7, scaling, rng);
  rope_case<__nv_bfloat16, 2>(2, 6, 2, 32, 9, 3, scaling, rng);
  rope_case<__nv_bfloat16, kBf16Pack>(2, 6, 2, 32, 9, 3, scaling, rng);
  // Packs of 8 at D = 64 (Llama's head dim): 2560 of them, more than a sweep of 768 threads.
  rope_case<__nv_bfloat16, kBf16Pack>(2, 40, 4, 64, 48, 5, scaling, rng);
  // The fused qkv product split and rotated in place: GQA (4 query heads, 2 kv
  // heads), a pair or a pack per thread; one kv head per query head (3 + 3 +
  // 3); Llama's head dim in packs.
  rope_fused_qkv_case<float, 2>(2, 5, 4, 2, 6, 3, scaling, rng);
  rope_fused_qkv_case<float, kF32Pack>(1, 7, 4, 2, 32, 0, scaling, rng);
  rope_fused_qkv_case<__nv_bfloat16, 2>(2, 6, 3, 3, 10, 2, scaling, rng);
  rope_fused_qkv_case<__nv_bfloat16, kBf16Pack>(2, 9, 8, 2, 64, 5, scaling, rng);
}

}  // namespace
}  // namespace zt::test
