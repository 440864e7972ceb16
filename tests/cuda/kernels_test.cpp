// Each CUDA op (besides matmul, which has its own file) against the CPU
// backend on fresh random inputs: same inputs on both sides, GPU outputs
// poisoned with NaN bytes first (an unwritten element fails), accumulated
// outputs start from the same random values. Tolerances are relative in the
// max norm: f32 1e-5 (summation order only), bf16 2e-2 (one bf16 rounding of
// each output on each side, plus bf16 intermediates). The CPU kernels are
// themselves checked against float64 references in tests/ops.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/cross_entropy.h"
#include "backend/cuda/kernel_race.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/norm.h"
#include "backend/cuda/runtime.h"
#include "core/determinism.h"
#include "core/rng.h"
#include "cuda/cuda_test_util.h"
#include "ops/activation.h"
#include "ops/adamw.h"
#include "ops/attention.h"
#include "ops/cross_entropy.h"
#include "ops/device.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/embedding.h"
#include "ops/moe.h"
#include "ops/norm.h"
#include "ops/rope.h"

namespace zt::test {
namespace {

double tol(DType dt) { return dt == DType::f32 ? 1e-5 : 2e-2; }

// GPU result vs CPU result.
::testing::AssertionResult matches(const Tensor& gpu_out, const Tensor& cpu_out, double limit, const char* what) {
  return rel_error_within(to_host(gpu_out), to_f64(cpu_out), limit, what);
}

Tensor gpu_copy_of(const Tensor& host) { return to_gpu(host); }

class CudaKernels : public ::testing::TestWithParam<DType> {};

TEST_P(CudaKernels, NormForwardBackwardAndResidual) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(1);
  for (auto kind : {ops::NormKind::layernorm, ops::NormKind::rmsnorm}) {
    // The one-pass backward (norm.cu) at 1-8 packs a lane: 256 (bf16: 1;
    // f32: 2), 512 (2; 4), 768 (3; 6), 1000 (4; 8), 2048 (bf16: 8, over 19
    // or more blocks); the two passes at 4099 (no packs) and 2048 f32 (16 a
    // lane), and at every shape when asked for (the kernel bench's A/B).
    for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 7}, {300, 256}, {300, 512}, {37, 768}, {300, 1000},
                        {600, 2048}, {5, 4099}}) {
      const bool ln = kind == ops::NormKind::layernorm;
      const Tensor x = random_tensor(Shape{N, C}, dt, rng), w = random_tensor(Shape{C}, dt, rng, 0.5, 1.5);
      const Tensor b = ln ? random_tensor(Shape{C}, dt, rng) : Tensor();
      const Tensor r_in = random_tensor(Shape{N, C}, dt, rng), dy = random_tensor(Shape{N, C}, dt, rng);
      const Tensor dw0 = random_tensor(Shape{C}, DType::f32, rng), db0 = random_tensor(Shape{C}, DType::f32, rng);
      // CPU.
      Tensor y = Tensor::empty(Shape{N, C}, dt), r_out = Tensor::empty(Shape{N, C}, dt);
      Tensor mean = ln ? Tensor::empty(Shape{N}, DType::f32) : Tensor(), rstd = Tensor::empty(Shape{N}, DType::f32);
      ops::residual_norm_forward(kind, r_out, y, mean, rstd, r_in, x, w, b, 1e-5f);
      Tensor dx = Tensor::empty(Shape{N, C}, dt), dw = to_host(gpu_copy_of(dw0)), db = ln ? to_host(gpu_copy_of(db0)) : Tensor();
      ops::norm_backward(kind, dx, dw, db, dy, r_out, w, mean, rstd, r_in);
      // GPU.
      const Tensor gx = to_gpu(x), gw = to_gpu(w), gb = ln ? to_gpu(b) : Tensor(), gr_in = to_gpu(r_in), gdy = to_gpu(dy);
      Tensor gy = gpu_poisoned(Shape{N, C}, dt), gr_out = gpu_poisoned(Shape{N, C}, dt);
      Tensor gmean = ln ? gpu_poisoned(Shape{N}, DType::f32) : Tensor(), grstd = gpu_poisoned(Shape{N}, DType::f32);
      ops::residual_norm_forward(kind, gr_out, gy, gmean, grstd, gr_in, gx, gw, gb, 1e-5f);
      Tensor gdx = gpu_poisoned(Shape{N, C}, dt), gdw = to_gpu(dw0), gdb = ln ? to_gpu(db0) : Tensor();
      ops::norm_backward(kind, gdx, gdw, gdb, gdy, gr_out, gw, gmean, grstd, gr_in);
      EXPECT_TRUE(matches(gr_out, r_out, tol(dt), "r_out"));
      EXPECT_TRUE(matches(gy, y, tol(dt), "y")) << N << "x" << C;
      EXPECT_TRUE(matches(grstd, rstd, 1e-5, "rstd"));
      // mean is a difference-prone f32 sum (values near 0 for small C): relative to its max, 1e-4.
      if (ln) {
        EXPECT_TRUE(matches(gmean, mean, 1e-4, "mean"));
      }
      EXPECT_TRUE(matches(gdx, dx, tol(dt), "dx")) << N << "x" << C;
      EXPECT_TRUE(matches(gdw, dw, tol(dt), "dw"));
      if (ln) {
        EXPECT_TRUE(matches(gdb, db, tol(dt), "db"));
      }
      {  // Each kernel: where the one pass runs, the two passes on its
         // blocks write its bits (training races them, and the automatic
         // call above took one of them); elsewhere both are the two passes
         // over row chunks.
        Tensor odx = gpu_poisoned(Shape{N, C}, dt), odw = to_gpu(dw0), odb = ln ? to_gpu(db0) : Tensor();
        cuda::norm_backward(!ln, odx, odw, odb, gdy, gr_out, gw, gmean, grstd, gr_in, false,
                            cuda::NormBackwardKernel::one_pass);
        Tensor tdx = gpu_poisoned(Shape{N, C}, dt), tdw = to_gpu(dw0), tdb = ln ? to_gpu(db0) : Tensor();
        cuda::norm_backward(!ln, tdx, tdw, tdb, gdy, gr_out, gw, gmean, grstd, gr_in, false,
                            cuda::NormBackwardKernel::two_pass);
        EXPECT_TRUE(matches(tdx, dx, tol(dt), "two-pass dx")) << N << "x" << C;
        EXPECT_TRUE(matches(tdw, dw, tol(dt), "two-pass dw"));
        EXPECT_EQ(values_of(tdx), values_of(odx)) << "two passes against one: dx";
        EXPECT_EQ(values_of(tdw), values_of(odw)) << "two passes against one: dw";
        EXPECT_EQ(values_of(gdx), values_of(odx)) << "the automatic call's dx";
        EXPECT_EQ(values_of(gdw), values_of(odw)) << "the automatic call's dw";
        if (ln) {
          EXPECT_TRUE(matches(tdb, db, tol(dt), "two-pass db"));
          EXPECT_EQ(values_of(tdb), values_of(odb)) << "two passes against one: db";
        }
      }
      // Deterministic dw: a second run from the same start gives the same bits.
      Tensor gdw2 = to_gpu(dw0), gdx2 = gpu_poisoned(Shape{N, C}, dt);
      ops::norm_backward(kind, gdx2, gdw2, Tensor(), gdy, gr_out, gw, gmean, grstd, Tensor());
      Tensor gdw3 = to_gpu(dw0);
      ops::norm_backward(kind, gdx2, gdw3, Tensor(), gdy, gr_out, gw, gmean, grstd, Tensor());
      EXPECT_EQ(values_of(gdw2), values_of(gdw3));
      // A step's first write (GradWrite::overwrite): dw and db written over
      // NaN, never read - the bits of the same sums added into zeros.
      Tensor zeros = Tensor::empty(Shape{C}, DType::f32);
      ops::fill(zeros, 0.0);
      Tensor gdw4 = gpu_poisoned(Shape{C}, DType::f32), gdb4 = ln ? gpu_poisoned(Shape{C}, DType::f32) : Tensor();
      ops::norm_backward(kind, gdx2, gdw4, gdb4, gdy, gr_out, gw, gmean, grstd, gr_in, ops::GradWrite::overwrite);
      Tensor gdw5 = to_gpu(zeros), gdb5 = ln ? to_gpu(zeros) : Tensor();
      ops::norm_backward(kind, gdx2, gdw5, gdb5, gdy, gr_out, gw, gmean, grstd, gr_in);
      EXPECT_EQ(values_of(gdw4), values_of(gdw5)) << "dw written over";
      if (ln) {
        EXPECT_EQ(values_of(gdb4), values_of(gdb5)) << "db written over";
      }
    }
  }
}

// Training races the norm backward's one pass against two passes on its
// blocks per shape of call (kernel_race.h): every call on the way writes
// the one pass's bits, and the race ends with each timed 3 times and the
// faster kept.
TEST_P(CudaKernels, NormBackwardRaceKeepsTheBits) {
  ZT_REQUIRE_GPU();
  if (const char* pin = std::getenv("ZT_CUDA_NORM_BACKWARD"); pin && *pin && std::string(pin) != "auto")
    GTEST_SKIP() << "ZT_CUDA_NORM_BACKWARD pins the norm backward: training races none";
  if (!cuda::kernel_races_on()) GTEST_SKIP() << "ZT_CUDA_KERNEL_RACES=0: no kernel races";
  const DType dt = GetParam();
  auto rng = make_rng(17);
  const Device gpu = Device::cuda(0);
  // Rows no other test uses, so that this test sees each race from its start.
  for (auto [kind, N, C] : {std::tuple<ops::NormKind, int64_t, int64_t>{ops::NormKind::layernorm, 777, 768},
                            {ops::NormKind::rmsnorm, 333, 1024}}) {
    const bool ln = kind == ops::NormKind::layernorm;
    SCOPED_TRACE(::testing::Message() << (ln ? "layernorm " : "rmsnorm ") << N << " x " << C);
    const Tensor x = to_gpu(random_tensor(Shape{N, C}, dt, rng));
    const Tensor w = to_gpu(random_tensor(Shape{C}, dt, rng, 0.5, 1.5));
    const Tensor b = ln ? to_gpu(random_tensor(Shape{C}, dt, rng)) : Tensor();
    const Tensor dy = to_gpu(random_tensor(Shape{N, C}, dt, rng)), dres = to_gpu(random_tensor(Shape{N, C}, dt, rng));
    Tensor y = gpu_poisoned(Shape{N, C}, dt), rstd = gpu_poisoned(Shape{N}, DType::f32);
    Tensor mean = ln ? gpu_poisoned(Shape{N}, DType::f32) : Tensor();
    ops::norm_forward(kind, y, mean, rstd, x, w, b, 1e-5f);
    Tensor wdx = gpu_poisoned(Shape{N, C}, dt), wdw = gpu_poisoned(Shape{C}, DType::f32);
    Tensor wdb = ln ? gpu_poisoned(Shape{C}, DType::f32) : Tensor();
    cuda::norm_backward(!ln, wdx, wdw, wdb, dy, x, w, mean, rstd, dres, true, cuda::NormBackwardKernel::one_pass);
    const std::vector<double> want_dx = values_of(wdx), want_dw = values_of(wdw);
    const std::vector<double> want_db = ln ? values_of(wdb) : std::vector<double>();
    for (int call = 0; call < 2 * cuda::kRaceSamples + 2; ++call) {  // the race, then the winner
      Tensor dx = gpu_poisoned(Shape{N, C}, dt), dw = gpu_poisoned(Shape{C}, DType::f32);
      Tensor db = ln ? gpu_poisoned(Shape{C}, DType::f32) : Tensor();
      cuda::norm_backward(!ln, dx, dw, db, dy, x, w, mean, rstd, dres, true);  // dw, db overwritten
      EXPECT_EQ(values_of(dx), want_dx) << "call " << call;
      EXPECT_EQ(values_of(dw), want_dw) << "call " << call;
      if (ln) {
        EXPECT_EQ(values_of(db), want_db) << "call " << call;
      }
      cuda::synchronize(gpu);  // so that the next call reads this one's time
    }
    const std::string call = std::string("norm backward ") + (ln ? "layernorm " : "rmsnorm ") + std::to_string(N) +
                             " x " + std::to_string(C) + " " + std::string(dtype_name(dt));
    const std::vector<std::string> lines = cuda::kernel_race_lines();
    const auto line = std::ranges::find_if(lines, [&](const std::string& l) { return l.starts_with(call); });
    ASSERT_NE(line, lines.end()) << "no race line for " << call;
    std::printf("%s\n", line->c_str());
    std::string timed = "(";  // (appended: GCC 12 warns on "(" + std::string with -Wrestrict)
    timed += std::to_string(cuda::kRaceSamples);
    timed += " calls)";
    EXPECT_TRUE(line->find("one_pass ") != std::string::npos && line->find(timed) != std::string::npos)
        << *line;
    EXPECT_TRUE(line->ends_with("-> one_pass") || line->ends_with("-> two_pass")) << *line;
  }
}

// Training races the pointwise activations' launch shapes per shape of
// call (activation.cu): every call on the way writes the first call's bits
// (a pack a thread, on a capped grid), and each race ends with every shape
// timed 3 times and one chosen.
TEST_P(CudaKernels, PointwiseLaunchRaceKeepsTheBits) {
  ZT_REQUIRE_GPU();
  if (!cuda::kernel_races_on()) GTEST_SKIP() << "ZT_CUDA_KERNEL_RACES=0: no kernel races";
  const DType dt = GetParam();
  auto rng = make_rng(18);
  const Device gpu = Device::cuda(0);
  // Sizes no other test uses, so that this test sees each race from its start.
  const int64_t n = 3 * 1024 * 401, rows = 301, H = 2048;
  const Tensor x = to_gpu(random_tensor(Shape{n}, dt, rng, -5, 5)), dy = to_gpu(random_tensor(Shape{n}, dt, rng));
  const Tensor sx = to_gpu(random_tensor(Shape{rows, 2 * H}, dt, rng, -5, 5));
  const Tensor sdy = to_gpu(random_tensor(Shape{rows, H}, dt, rng));
  std::vector<std::vector<double>> first;
  for (int call = 0; call < 3 * cuda::kRaceSamples + 2; ++call) {  // the race, then the winner
    Tensor y = gpu_poisoned(Shape{n}, dt), dx = gpu_poisoned(Shape{n}, dt), sy = gpu_poisoned(Shape{rows, H}, dt);
    Tensor sdx = Tensor::empty(Shape{rows, 2 * H}, dt, gpu);
    ops::copy(sdx, sx);
    ops::gelu_forward(y, x);
    ops::gelu_backward(dx, dy, x);
    ops::swiglu_forward(sy, sx);
    ops::swiglu_backward(sdx, sdy, sdx);  // in place over its input, as the model calls it
    const std::vector<std::vector<double>> got = {values_of(y), values_of(dx), values_of(sy), values_of(sdx)};
    if (call == 0) first = got;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], first[i]) << "output " << i << ", call " << call;
    cuda::synchronize(gpu);  // so that the next call reads this one's time
  }
  const int64_t pack = dt == DType::f32 ? 4 : 8;  // elements in 16 bytes
  const std::vector<std::string> lines = cuda::kernel_race_lines();
  for (const auto& [op, elements] : {std::pair<std::string, int64_t>{"gelu_forward", n}, {"gelu_backward", n},
                                     {"swiglu_forward", rows * H}, {"swiglu_backward", rows * H}}) {
    const std::string call = "pointwise " + op + " " + std::to_string(elements / pack) + " packs of " +
                             std::to_string(pack) + " " + std::string(dtype_name(dt));
    const auto line = std::ranges::find_if(lines, [&](const std::string& l) { return l.starts_with(call); });
    ASSERT_NE(line, lines.end()) << "no race line for " << call;
    std::printf("%s\n", line->c_str());
    EXPECT_EQ(line->find("racing"), std::string::npos) << *line;
    EXPECT_EQ(line->find("untimed"), std::string::npos) << *line;
  }
}

TEST_P(CudaKernels, ActivationsForwardAndBackward) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(2);
  // H = 257: an element per load; H = 256: 16-byte packs (the launch's choice).
  for (const int64_t H : {int64_t(257), int64_t(256)}) {
    SCOPED_TRACE(::testing::Message() << "H " << H);
    const int64_t N = 33;
    const Tensor x = random_tensor(Shape{N, 2 * H}, dt, rng, -4, 4), dy2 = random_tensor(Shape{N, 2 * H}, dt, rng);
    const Tensor dy = random_tensor(Shape{N, H}, dt, rng);
    Tensor y = Tensor::empty(Shape{N, 2 * H}, dt), dx = Tensor::empty(Shape{N, 2 * H}, dt);
    ops::gelu_forward(y, x);
    ops::gelu_backward(dx, dy2, x);
    Tensor gy = gpu_poisoned(Shape{N, 2 * H}, dt), gdx = gpu_poisoned(Shape{N, 2 * H}, dt);
    ops::gelu_forward(gy, to_gpu(x));
    ops::gelu_backward(gdx, to_gpu(dy2), to_gpu(x));
    EXPECT_TRUE(matches(gy, y, tol(dt), "gelu y"));
    EXPECT_TRUE(matches(gdx, dx, tol(dt), "gelu dx"));
    Tensor s = Tensor::empty(Shape{N, H}, dt), ds = Tensor::empty(Shape{N, 2 * H}, dt);
    ops::swiglu_forward(s, x);
    ops::swiglu_backward(ds, dy, x);
    Tensor gs = gpu_poisoned(Shape{N, H}, dt), gds = gpu_poisoned(Shape{N, 2 * H}, dt);
    ops::swiglu_forward(gs, to_gpu(x));
    ops::swiglu_backward(gds, to_gpu(dy), to_gpu(x));
    EXPECT_TRUE(matches(gs, s, tol(dt), "swiglu y"));
    EXPECT_TRUE(matches(gds, ds, tol(dt), "swiglu dx"));
    Tensor in_place = to_gpu(x);  // dx over x, as the model calls it: the same bits
    ops::swiglu_backward(in_place, to_gpu(dy), in_place);
    EXPECT_EQ(values_of(in_place), values_of(gds)) << "swiglu dx in place";
  }
}

TEST_P(CudaKernels, ElementwiseAndReductions) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(3);
  // 1024 elements: add and scale in 16-byte packs; 1001: an element per load.
  for (const int64_t n : {int64_t(1024), int64_t(1001)}) {
    const Tensor a = random_tensor(Shape{n}, dt, rng), b = random_tensor(Shape{n}, dt, rng);
    Tensor out = Tensor::empty(Shape{n}, dt), gout = gpu_poisoned(Shape{n}, dt);
    ops::add(out, a, b);
    ops::add(gout, to_gpu(a), to_gpu(b));
    EXPECT_TRUE(matches(gout, out, tol(dt), "add")) << n;
    ops::scale(out, a, -0.37f);
    ops::scale(gout, to_gpu(a), -0.37f);
    EXPECT_TRUE(matches(gout, out, tol(dt), "scale")) << n;
  }
  const Tensor a = random_tensor(Shape{1001}, dt, rng);
  Tensor y = random_tensor(Shape{1001}, DType::f32, rng), gy = to_gpu(y);
  ops::axpy(y, 0.5f, a);
  ops::axpy(gy, 0.5f, to_gpu(a));
  EXPECT_TRUE(matches(gy, y, 1e-6, "axpy"));
  for (DType to : {DType::f32, DType::bf16, DType::f16}) {
    Tensor c = Tensor::empty(Shape{1001}, to), gc = gpu_poisoned(Shape{1001}, to);
    ops::cast(c, a);
    ops::cast(gc, to_gpu(a));
    EXPECT_EQ(values_of(gc), to_f64(c)) << "cast to " << dtype_name(to);  // both round to nearest even
  }
  const Tensor big = random_tensor(Shape{300001}, dt, rng);
  const double ref = ops::sum_squares(big), got = ops::sum_squares(to_gpu(big));
  EXPECT_NEAR(got / ref, 1.0, 1e-9);
  EXPECT_EQ(got, ops::sum_squares(to_gpu(big))) << "sum of squares must be reproducible";
  Generator g1(42, 7), g2(42, 7);
  Tensor n = Tensor::empty(Shape{4097}, DType::f32), gn = gpu_poisoned(Shape{4097}, DType::f32);
  ops::fill_normal(n, g1, 0.1f, 0.02f);
  ops::fill_normal(gn, g2, 0.1f, 0.02f);
  EXPECT_TRUE(matches(gn, n, 1e-5, "fill_normal"));
  EXPECT_EQ(g1.offset(), g2.offset());
  Tensor f = gpu_poisoned(Shape{77}, dt);
  ops::fill(f, 1.0);
  for (double v : values_of(f)) ASSERT_EQ(v, 1.0);
}

TEST_P(CudaKernels, EmbeddingWithRepeatedTokensIsDeterministic) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(4);
  const int64_t B = 3, T = 50, V = 11, C = 130, Tmax = 64;
  const Tensor tok = random_tokens(Shape{B, T}, V, rng);  // few ids: many repeats
  const Tensor wte = random_tensor(Shape{V, C}, dt, rng), wpe = random_tensor(Shape{Tmax, C}, dt, rng);
  Tensor out = Tensor::empty(Shape{B, T, C}, dt), gout = gpu_poisoned(Shape{B, T, C}, dt);
  ops::embedding_forward(out, tok, wte, wpe, 5);
  ops::embedding_forward(gout, to_gpu(tok), to_gpu(wte), to_gpu(wpe), 5);
  EXPECT_TRUE(matches(gout, out, tol(dt), "embedding out"));
  {  // C = 128: the gather in 16-byte packs (130: an element per load)
    const Tensor w128 = random_tensor(Shape{V, 128}, dt, rng), p128 = random_tensor(Shape{Tmax, 128}, dt, rng);
    Tensor o128 = Tensor::empty(Shape{B, T, 128}, dt), go128 = gpu_poisoned(Shape{B, T, 128}, dt);
    ops::embedding_forward(o128, tok, w128, p128, 5);
    ops::embedding_forward(go128, tok, to_gpu(w128), to_gpu(p128), 5);
    EXPECT_EQ(values_of(go128), to_f64(o128)) << "embedding out, packs";
  }
  const Tensor dout = random_tensor(Shape{B, T, C}, dt, rng);
  const Tensor dwte0 = random_tensor(Shape{V, C}, DType::f32, rng), dwpe0 = random_tensor(Shape{Tmax, C}, DType::f32, rng);
  Tensor dwte = to_host(to_gpu(dwte0)), dwpe = to_host(to_gpu(dwpe0));
  ops::embedding_backward(dwte, dwpe, dout, tok, 5);
  Tensor gdwte = to_gpu(dwte0), gdwpe = to_gpu(dwpe0);
  ops::embedding_backward(gdwte, gdwpe, to_gpu(dout), to_gpu(tok), 5);
  EXPECT_TRUE(matches(gdwte, dwte, 1e-5, "dwte"));
  EXPECT_TRUE(matches(gdwpe, dwpe, 1e-5, "dwpe"));
  Tensor again = to_gpu(dwte0);
  ops::embedding_backward(again, Tensor(), to_gpu(dout), to_gpu(tok), 5);
  EXPECT_EQ(values_of(again), values_of(gdwte));
  {  // Two ids over 200 positions: groups longer than a segment, summed in pieces (embedding_kernels.cuh).
    const Tensor few = random_tokens(Shape{4, 50}, 2, rng);
    const Tensor dout_few = random_tensor(Shape{4, 50, C}, dt, rng);
    const Tensor dw0 = random_tensor(Shape{2, C}, DType::f32, rng);
    Tensor ref = to_host(to_gpu(dw0)), got = to_gpu(dw0), got_again = to_gpu(dw0);
    ops::embedding_backward(ref, Tensor(), dout_few, few, 0);
    ops::embedding_backward(got, Tensor(), to_gpu(dout_few), few, 0);
    ops::embedding_backward(got_again, Tensor(), to_gpu(dout_few), few, 0);
    EXPECT_TRUE(matches(got, ref, 1e-5, "dwte, long groups"));
    EXPECT_EQ(values_of(got_again), values_of(got));
  }
  // Host tokens (the model's way: validated there, uploaded without a wait) give the same numbers.
  Tensor hout = gpu_poisoned(Shape{B, T, C}, dt), hdwte = to_gpu(dwte0);
  ops::embedding_forward(hout, tok, to_gpu(wte), to_gpu(wpe), 5);
  EXPECT_EQ(values_of(hout), values_of(gout));
  ops::embedding_backward(hdwte, Tensor(), to_gpu(dout), tok, 5);
  EXPECT_EQ(values_of(hdwte), values_of(gdwte));
  Tensor bad = tok;
  bad.data<int32_t>()[17] = int32_t(V);
  const std::string cpu_msg = error_of([&] { ops::embedding_forward(out, bad, wte, wpe, 5); });
  const std::string gpu_msg = error_of([&] { ops::embedding_forward(gout, to_gpu(bad), to_gpu(wte), to_gpu(wpe), 5); });
  EXPECT_EQ(gpu_msg, cpu_msg);
  EXPECT_EQ(error_of([&] { ops::embedding_forward(gout, bad, to_gpu(wte), to_gpu(wpe), 5); }), cpu_msg);
  // Ids on a GPU for an op on the host: named.
  EXPECT_NE(error_of([&] { ops::embedding_forward(out, to_gpu(tok), wte, wpe, 5); })
                .find("pass ids on that device or on the host"),
            std::string::npos);
}

TEST_P(CudaKernels, RopeTableAndRotation) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(5);
  // D = 64: 16-byte packs of pairs; D = 42: a pair per thread (the launch's choice).
  for (const int64_t D : {int64_t(64), int64_t(42)}) {
    SCOPED_TRACE(::testing::Message() << "D " << D);
    const int64_t B = 2, T = 19, H = 3, Tmax = 40;
    ops::RopeScaling sc;
    sc.enabled = true;
    sc.original_max_position = 16;
    Tensor table = Tensor::empty(Shape{Tmax, D / 2, 2}, DType::f32);
    Tensor gtable = gpu_poisoned(Shape{Tmax, D / 2, 2}, DType::f32);
    ops::rope_table(table, D, 500000.0, sc);
    ops::rope_table(gtable, D, 500000.0, sc);
    EXPECT_EQ(values_of(gtable), to_f64(table));
    const Tensor x = random_tensor(Shape{B, T, H, D}, dt, rng);
    Tensor y = Tensor::empty(x.shape(), dt);
    ops::rope_forward(y, x, table, 3);
    Tensor gx = to_gpu(x);
    ops::rope_forward(gx, gx, gtable, 3);  // in place
    EXPECT_TRUE(matches(gx, y, tol(dt), "rope"));
    ops::rope_backward(gx, gx, gtable, 3);
    EXPECT_TRUE(matches(gx, x, tol(dt), "rope inverse"));
  }
}

// The fused qkv product's split into rotated q, k and copied v, and its
// gradient's join; then its query and key heads rotated in place (the GPU's
// form of Llama's q, k, v) and its gradient's, the value heads keeping their
// bits. Against the CPU.
TEST_P(CudaKernels, RopeSplitsOrRotatesTheFusedQkv) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(15);
  struct Heads {
    int64_t Hq, Hkv, D;
  };
  // Small GQA heads (D 42: no 16-byte packs), and Llama 3.2 1B's 32 / 8.
  for (const Heads& h : {Heads{4, 2, 64}, Heads{4, 2, 42}, Heads{32, 8, 64}}) {
    const int64_t Hq = h.Hq, Hkv = h.Hkv, D = h.D;
    SCOPED_TRACE(::testing::Message() << "Hq " << Hq << " Hkv " << Hkv << " D " << D);
    const int64_t B = 2, T = 19, Tmax = 24;
    Tensor table = Tensor::empty(Shape{Tmax, D / 2, 2}, DType::f32);
    Tensor gtable = gpu_poisoned(Shape{Tmax, D / 2, 2}, DType::f32);
    ops::rope_table(table, D, 500000.0, ops::RopeScaling{});
    ops::rope_table(gtable, D, 500000.0, ops::RopeScaling{});
    const Shape qs{B, T, Hq, D}, kvs{B, T, Hkv, D}, packed{B, T, Hq + 2 * Hkv, D};
    const Tensor qkv = random_tensor(packed, dt, rng);
    Tensor q = Tensor::empty(qs, dt), k = Tensor::empty(kvs, dt), v = Tensor::empty(kvs, dt);
    ops::rope_split_qkv_forward(q, k, v, qkv, table, 5);
    Tensor gq = gpu_poisoned(qs, dt), gk = gpu_poisoned(kvs, dt), gv = gpu_poisoned(kvs, dt);
    ops::rope_split_qkv_forward(gq, gk, gv, to_gpu(qkv), gtable, 5);
    EXPECT_TRUE(matches(gq, q, tol(dt), "q"));
    EXPECT_TRUE(matches(gk, k, tol(dt), "k"));
    EXPECT_EQ(values_of(gv), to_f64(v)) << "v is copied";
    const Tensor dq = random_tensor(qs, dt, rng), dk = random_tensor(kvs, dt, rng), dv = random_tensor(kvs, dt, rng);
    Tensor dqkv = Tensor::empty(packed, dt);
    ops::rope_split_qkv_backward(dqkv, dq, dk, dv, table, 5);
    Tensor gdqkv = gpu_poisoned(packed, dt);
    ops::rope_split_qkv_backward(gdqkv, to_gpu(dq), to_gpu(dk), to_gpu(dv), gtable, 5);
    EXPECT_TRUE(matches(gdqkv, dqkv, tol(dt), "dqkv"));
    for (const bool backward : {false, true}) {
      SCOPED_TRACE(backward ? "in place, backward" : "in place, forward");
      Tensor want = Tensor::empty(packed, dt);
      std::memcpy(want.data_ptr(), qkv.data_ptr(), qkv.nbytes());
      Tensor got = to_gpu(qkv);
      if (backward) {
        ops::rope_packed_qkv_backward(want, Hq, Hkv, table, 5);
        ops::rope_packed_qkv_backward(got, Hq, Hkv, gtable, 5);
      } else {
        ops::rope_packed_qkv_forward(want, Hq, Hkv, table, 5);
        ops::rope_packed_qkv_forward(got, Hq, Hkv, gtable, 5);
      }
      EXPECT_TRUE(matches(got, want, tol(dt), "qkv"));
      EXPECT_EQ(to_f64(heads_of(to_host(got), Hq + Hkv, Hkv)), to_f64(heads_of(qkv, Hq + Hkv, Hkv)))
          << "v heads untouched";
    }
  }
}

TEST_P(CudaKernels, CrossEntropyLossAndGradient) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(6);
  // 600 and 2000 rows: more than the blocks of every kernel (at most 528 on a
  // 132-SM GPU), so each block strides over rows. Llama's 128256 columns: the
  // staged kernel's tail (packs past the shared memory) in both passes; then
  // a narrower row and the wide one again (the staged kernel's shared memory
  // limit, raised for the wide row, must not be lowered by the narrow one).
  for (auto [N, Vp, V] : {std::tuple<int64_t, int64_t, int64_t>{1, 8, 5}, {100, 1000, 997}, {64, 50304, 50257},
                          {600, 50304, 50257}, {2000, 1000, 997}, {300, 128256, 128256}, {50, 20000, 19999},
                          {30, 128256, 128256}}) {
    const Tensor logits = random_tensor(Shape{N, Vp}, dt, rng, -8, 8);
    Tensor targets = random_tokens(Shape{N}, V, rng);
    targets.data<int32_t>()[0] = -1;  // ignored row
    Tensor losses = Tensor::empty(Shape{N}, DType::f32), d = Tensor::empty(Shape{N, Vp}, dt);
    ops::softmax_cross_entropy(losses, d, logits, targets, V, 0.25f);
    Tensor gl = to_gpu(logits), glosses = gpu_poisoned(Shape{N}, DType::f32);
    ops::softmax_cross_entropy(glosses, gl, gl, to_gpu(targets), V, 0.25f);  // in place
    EXPECT_TRUE(matches(glosses, losses, dt == DType::f32 ? 1e-5 : 1e-3, "losses")) << Vp;
    EXPECT_TRUE(matches(gl, d, tol(dt), "dlogits")) << Vp;
    // Host targets: the same numbers.
    Tensor hl = to_gpu(logits), hlosses = gpu_poisoned(Shape{N}, DType::f32);
    ops::softmax_cross_entropy(hlosses, hl, hl, targets, V, 0.25f);
    EXPECT_EQ(values_of(hlosses), values_of(glosses)) << Vp;
    EXPECT_EQ(values_of(hl), values_of(gl)) << Vp;
    // Every kernel (the kernel bench's sweep): the same bits, in place and
    // into a tensor of their own, and the losses alone.
    const Tensor gpu_targets = to_gpu(targets);
    // Read back once: at 300 x 128256 each is a 308 MB vector of doubles.
    const std::vector<double> want_losses = values_of(glosses), want_dlogits = values_of(gl),
                              logits_values = values_of(logits);
    using Kernel = cuda::ClassifierKernel;
    for (const Kernel k : {Kernel{.staged = true}, Kernel{.rows_per_sm = 1}, Kernel{.rows_per_sm = 2},
                           Kernel{.rows_per_sm = 4}}) {
      SCOPED_TRACE(::testing::Message() << Vp << " columns, " << (k.staged ? "staged" : "re-read at ")
                                        << (k.staged ? "" : std::to_string(k.rows_per_sm) + " rows per SM"));
      Tensor rl = to_gpu(logits), rlosses = gpu_poisoned(Shape{N}, DType::f32);
      cuda::softmax_cross_entropy(rlosses, rl, rl, gpu_targets, V, 0.25f, k);
      EXPECT_EQ(values_of(rlosses), want_losses);
      EXPECT_EQ(values_of(rl), want_dlogits);
      const Tensor ol = to_gpu(logits);
      Tensor od = gpu_poisoned(Shape{N, Vp}, dt), olosses = gpu_poisoned(Shape{N}, DType::f32);
      cuda::softmax_cross_entropy(olosses, od, ol, gpu_targets, V, 0.25f, k);
      EXPECT_EQ(values_of(od), want_dlogits) << "out of place";
      EXPECT_EQ(values_of(ol), logits_values) << "the logits read, not written";
      Tensor llosses = gpu_poisoned(Shape{N}, DType::f32);
      cuda::softmax_cross_entropy(llosses, Tensor(), ol, gpu_targets, V, 0.25f, k);
      EXPECT_EQ(values_of(llosses), want_losses) << "losses alone";
    }
  }
}

// Training's classifier races its kernels per shape of call (kernel_race.h):
// every call on the way - each candidate in turn, then the winner - writes
// the bits of a pinned kernel, and the race ends decided with each candidate
// timed kRaceSamples times, every time measured (the choice among them is
// RaceTally's, tested without a GPU in kernel_race_test.cpp).
TEST_P(CudaKernels, ClassifierRaceKeepsTheBitsAndTimesEachKernel) {
  ZT_REQUIRE_GPU();
  if (cuda::pinned_classifier_kernel())
    GTEST_SKIP() << "ZT_CUDA_CE_STAGED or ZT_CUDA_CE_ROWS pins the classifier's kernel: training races none";
  if (!cuda::kernel_races_on()) GTEST_SKIP() << "ZT_CUDA_KERNEL_RACES=0: no kernel races";
  const DType dt = GetParam();
  auto rng = make_rng(16);
  const Device gpu = Device::cuda(0);
  // Rows no other test uses, so that this test sees each race from its start.
  for (auto [N, Vp, V] : {std::tuple<int64_t, int64_t, int64_t>{613, 50304, 50257}, {211, 128256, 128256}}) {
    SCOPED_TRACE(::testing::Message() << N << " x " << Vp);
    const Tensor logits = random_tensor(Shape{N, Vp}, dt, rng, -8, 8);
    const Tensor targets = to_gpu(random_tokens(Shape{N}, V, rng));
    Tensor want = to_gpu(logits), want_losses = gpu_poisoned(Shape{N}, DType::f32);
    cuda::softmax_cross_entropy(want_losses, want, want, targets, V, 0.5f, cuda::ClassifierKernel{.rows_per_sm = 4});
    const std::vector<double> want_d = values_of(want), want_l = values_of(want_losses);
    const int candidates = int(std::size(cuda::kClassifierCandidates));
    const int calls = candidates * cuda::kRaceSamples + 2;  // the race, then the winner
    for (int call = 0; call < calls; ++call) {
      Tensor d = to_gpu(logits), losses = gpu_poisoned(Shape{N}, DType::f32);
      cuda::softmax_cross_entropy(losses, d, d, targets, V, 0.5f);  // in place, as training calls it
      EXPECT_EQ(values_of(d), want_d) << "call " << call;
      EXPECT_EQ(values_of(losses), want_l) << "call " << call;
      cuda::synchronize(gpu);  // so that the next call reads this one's time
    }
    const std::string prefix = std::to_string(N) + " x " + std::to_string(Vp) + " " + std::string(dtype_name(dt));
    const std::vector<cuda::ClassifierRaceStanding> races = cuda::classifier_races();
    const auto race = std::ranges::find_if(races, [&](const auto& r) { return r.call.starts_with(prefix); });
    ASSERT_NE(race, races.end()) << "no race for " << prefix;
    const std::vector<std::string> lines = cuda::kernel_race_lines();
    const auto line =
        std::ranges::find_if(lines, [&](const std::string& l) { return l.starts_with("classifier " + prefix); });
    ASSERT_NE(line, lines.end()) << "no race line for " << prefix;
    std::printf("%s\n", line->c_str());
    const cuda::RaceTally& t = race->tally;
    ASSERT_TRUE(t.decided()) << *line;
    EXPECT_TRUE(t.available(0)) << "the re-reading kernel runs every shape";
    for (int c = 0; c < candidates; ++c) {
      if (!t.available(c)) continue;
      SCOPED_TRACE(cuda::classifier_kernel_name(cuda::kClassifierCandidates[c]));
      EXPECT_GE(t.timed_calls(c), cuda::kRaceSamples) << *line;
      // Timing marks that measure nothing (0) or never come back (inf) fail here.
      EXPECT_TRUE(t.best_ms(c) > 0.0 && std::isfinite(t.best_ms(c))) << *line;
    }
    // The staged kernel runs these shapes (16-byte packs tile the rows; a
    // row, or whole sweeps of one, fit a block's shared memory).
    EXPECT_TRUE(t.available(1)) << *line;
  }
}

// Tensor parallelism's vocabulary slices: a rank's embedding rows (the last
// one past the vocabulary, padding) and the three cross-entropy passes over its
// logit columns, against the CPU backend with the same reduced statistics.
TEST_P(CudaKernels, VocabularySlicesOfEmbeddingAndCrossEntropy) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(8);
  const int64_t B = 2, T = 40, V = 12, C = 130, Tmax = 48;
  const Tensor tok = random_tokens(Shape{B, T}, V, rng);
  for (const auto& [start, rows] : {std::pair<int64_t, int64_t>{4, 4}, {8, 5}}) {
    SCOPED_TRACE("embedding rows [" + std::to_string(start) + ", " + std::to_string(start + rows) + ")");
    const ops::VocabSlice slice{start, V};
    const Tensor wte = random_tensor(Shape{rows, C}, dt, rng), wpe = random_tensor(Shape{Tmax, C}, dt, rng);
    Tensor out = Tensor::empty(Shape{B, T, C}, dt), gout = gpu_poisoned(Shape{B, T, C}, dt);
    ops::embedding_forward(out, tok, wte, wpe, 3, slice);
    ops::embedding_forward(gout, tok, to_gpu(wte), to_gpu(wpe), 3, slice);
    EXPECT_TRUE(matches(gout, out, tol(dt), "embedding out"));
    const Tensor dout = random_tensor(Shape{B, T, C}, dt, rng), dwte0 = random_tensor(Shape{rows, C}, DType::f32, rng);
    Tensor dwte = to_host(to_gpu(dwte0)), gdwte = to_gpu(dwte0);
    ops::embedding_backward(dwte, Tensor(), dout, tok, 3, slice);
    ops::embedding_backward(gdwte, Tensor(), to_gpu(dout), tok, 3, slice);
    EXPECT_TRUE(matches(gdwte, dwte, 1e-5, "dwte"));
  }
  // Cross entropy: 1000 ids over 2 ranks of 520 columns (40 padding columns on rank 1).
  const int64_t N = 37, Vv = 1000, Vl = 520;
  Tensor targets = random_tokens(Shape{N}, Vv, rng);
  targets.data<int32_t>()[2] = -1;
  std::vector<Tensor> logits;
  for (int r = 0; r < 2; ++r) logits.push_back(random_tensor(Shape{N, Vl}, dt, rng, -8, 8));
  Tensor row_max = Tensor::empty(Shape{N}, DType::f32), grow_max = gpu_poisoned(Shape{N}, DType::f32);
  Tensor m1 = Tensor::empty(Shape{N}, DType::f32);
  ops::vocab_parallel_ce_max(row_max, logits[0], 0, Vv);
  ops::vocab_parallel_ce_max(m1, logits[1], Vl, Vv);
  ops::vocab_parallel_ce_max(grow_max, to_gpu(logits[1]), Vl, Vv);
  EXPECT_EQ(values_of(grow_max), to_f64(m1)) << "row max of rank 1";
  for (int64_t n = 0; n < N; ++n) row_max.data<float>()[n] = std::max(row_max.data<float>()[n], m1.data<float>()[n]);
  const Tensor g_rm = to_gpu(row_max);
  Tensor se[2], tl[2];
  for (int r = 0; r < 2; ++r) {
    se[r] = Tensor::empty(Shape{N}, DType::f32);
    tl[r] = Tensor::empty(Shape{N}, DType::f32);
    ops::vocab_parallel_ce_sums(se[r], tl[r], logits[size_t(r)], row_max, targets, r * Vl, Vv);
    Tensor gse = gpu_poisoned(Shape{N}, DType::f32), gtl = gpu_poisoned(Shape{N}, DType::f32);
    ops::vocab_parallel_ce_sums(gse, gtl, to_gpu(logits[size_t(r)]), g_rm, targets, r * Vl, Vv);
    EXPECT_TRUE(matches(gse, se[r], 1e-5, "exp sums")) << "rank " << r;
    EXPECT_EQ(values_of(gtl), to_f64(tl[r])) << "target logits of rank " << r;
  }
  Tensor sum_exp = Tensor::empty(Shape{N}, DType::f32), target_logit = Tensor::empty(Shape{N}, DType::f32);
  for (int64_t n = 0; n < N; ++n) {
    sum_exp.data<float>()[n] = se[0].data<float>()[n] + se[1].data<float>()[n];
    target_logit.data<float>()[n] = tl[0].data<float>()[n] + tl[1].data<float>()[n];
  }
  for (int r = 0; r < 2; ++r) {
    Tensor losses = Tensor::empty(Shape{N}, DType::f32), d = Tensor::empty(Shape{N, Vl}, dt);
    ops::vocab_parallel_ce_finish(losses, d, logits[size_t(r)], row_max, sum_exp, target_logit, targets, r * Vl, Vv,
                                  0.25f);
    Tensor gl = to_gpu(logits[size_t(r)]), glosses = gpu_poisoned(Shape{N}, DType::f32);
    ops::vocab_parallel_ce_finish(glosses, gl, gl, g_rm, to_gpu(sum_exp), to_gpu(target_logit), targets, r * Vl, Vv,
                                  0.25f);  // in place, host targets
    EXPECT_TRUE(matches(glosses, losses, 1e-5, "losses")) << "rank " << r;
    EXPECT_TRUE(matches(gl, d, tol(dt), "dlogits")) << "rank " << r;
  }
}

TEST_P(CudaKernels, AdamWMatchesTheCpu) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(7);
  const int64_t n = 10007;
  Tensor p = random_tensor(Shape{n}, DType::f32, rng), m = random_tensor(Shape{n}, DType::f32, rng, -0.01, 0.01);
  Tensor v = random_tensor(Shape{n}, DType::f32, rng, 0, 1e-4), g = random_tensor(Shape{n}, dt, rng);
  Tensor gp = to_gpu(p), gm = to_gpu(m), gv = to_gpu(v), gg = to_gpu(g);
  Tensor copy = Tensor::empty(Shape{n}, DType::bf16), gcopy = gpu_poisoned(Shape{n}, DType::bf16);
  ops::AdamWParams hp;
  hp.weight_decay = 0.1f;
  for (int64_t step = 1; step <= 3; ++step) {
    hp.step = step;
    ops::adamw_step(p, g, m, v, copy, hp);
    ops::adamw_step(gp, gg, gm, gv, gcopy, hp);
  }
  EXPECT_TRUE(matches(gp, p, 1e-6, "master"));
  EXPECT_TRUE(matches(gm, m, 1e-6, "m"));
  EXPECT_TRUE(matches(gv, v, 1e-6, "v"));
  EXPECT_TRUE(matches(gcopy, copy, 1e-2, "model copy"));
  // Stochastic rounding: the GPU's copy is its own master rounded with each
  // element's random word (the CPU rule; the masters may differ in the last place).
  hp.step = 4;
  hp.stochastic_rounding = true;
  hp.rounding_seed = 99;
  hp.rounding_offset = 13;
  ops::adamw_step(gp, gg, gm, gv, gcopy, hp);
  const Tensor host_master = ops::to_device(gp, Device::cpu()), host_copy = ops::to_device(gcopy, Device::cpu());
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i)
    bad += host_copy.data<bf16>()[i].bits !=
           bf16_bits_stochastic_at(host_master.data<float>()[i], 99, 4, uint64_t(13 + i));
  EXPECT_EQ(bad, 0) << "of " << n << " stochastically rounded elements differ from the CPU's rule";
}

// The GeLU backward fused into the product (cuBLASLt's DGELU epilogue)
// against the CPU's matmul then gelu_backward. bf16 widths that are multiples
// of 8 must take the fused path; other widths fall back to the two ops.
TEST_P(CudaKernels, MatmulGeluBackwardMatchesTheCpu) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(12);
  for (const auto& [M, K, N] : {std::tuple<int64_t, int64_t, int64_t>{64, 96, 128}, {300, 768, 3072}, {5, 40, 30}}) {
    const Tensor a = random_tensor(Shape{M, K}, dt, rng), b = random_tensor(Shape{K, N}, dt, rng);
    const Tensor pre = random_tensor(Shape{M, N}, dt, rng, -4.0, 4.0);
    Tensor out = Tensor::empty(Shape{M, N}, dt);
    ops::matmul_gelu_backward(out, a, b, pre);
    const Tensor ga = to_gpu(a), gb = to_gpu(b), gpre = to_gpu(pre);
    Tensor gout = gpu_poisoned(Shape{M, N}, dt);
    const bool fused = cuda::matmul_gelu_backward(gout, ga, gb, gpre);
    if (N % 8 != 0) {
      EXPECT_FALSE(fused);
    } else if (dt == DType::bf16) {  // the training dtype: the fused path must be there
      EXPECT_TRUE(fused) << "cuBLASLt has no DGELU algorithm for " << M << "x" << K << "x" << N;
    }
    if (!fused) ops::matmul_gelu_backward(gout, ga, gb, gpre);
    // f32: the epilogue evaluates GeLU's derivative with its own tanh, not
    // the CPU's tanhf; measured on an H100 (2026-11-26) 1.14e-5 at K = 96
    // and 1.25e-5 at K = 768 (the same at any K: elementwise, not the sum).
    EXPECT_TRUE(matches(gout, out, dt == DType::f32 ? 5e-5 : 2e-2, "out")) << M << "x" << K << "x" << N;
  }
}

// The GeLU forward fused into the product before it (cuBLASLt's GELU_AUX and
// GELU_AUX_BIAS epilogues, ZT_CUDA_GELU_EPILOGUE=1) against the CPU's linear
// then GeLU: pre and act both, with and without a bias, GPT-2's widths.
// bf16 widths that are multiples of 8 must take the fused path; others fall
// back to the two ops, having written nothing.
TEST_P(CudaKernels, LinearGeluForwardMatchesTheCpu) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(19);
  for (const auto& [R, C, OC] : {std::tuple<int64_t, int64_t, int64_t>{64, 96, 128}, {300, 768, 3072}, {5, 40, 30}})
    for (const bool bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << R << "x" << C << "x" << OC << (bias ? " bias" : ""));
      const Tensor x = random_tensor(Shape{R, C}, dt, rng), w = random_tensor(Shape{OC, C}, dt, rng);
      const Tensor b = bias ? random_tensor(Shape{OC}, dt, rng) : Tensor();
      Tensor act = Tensor::empty(Shape{R, OC}, dt), pre = Tensor::empty(Shape{R, OC}, dt);
      ops::linear_forward(pre, x, w, b);
      ops::gelu_forward(act, pre);
      Tensor gact = gpu_poisoned(Shape{R, OC}, dt), gpre = gpu_poisoned(Shape{R, OC}, dt);
      const bool fused = cuda::linear_gelu_forward(gact, gpre, to_gpu(x), to_gpu(w), bias ? to_gpu(b) : Tensor());
      if (OC % 8 != 0) {
        EXPECT_FALSE(fused);
        continue;  // nothing written: the ops path's two ops run instead (the tests above)
      }
      if (dt == DType::bf16) {
        EXPECT_TRUE(fused) << "cuBLASLt has no GELU_AUX algorithm";
      }
      if (!fused) continue;
      EXPECT_TRUE(matches(gpre, pre, tol(dt), "pre"));
      // The epilogue's own tanh, as DGELU's: f32 within 5e-5.
      EXPECT_TRUE(matches(gact, act, dt == DType::f32 ? 5e-5 : 2e-2, "act"));
    }
}

// Every implementation against the CPU backend: the ops entry (automatic:
// cuDNN or mma for bf16, the tensor-core path for f32), the simple kernel,
// the tensor-core path with a workspace budget of one kv head's group (head
// chunks), the two fused kernels, flash (WMMA) and mma (bf16), and cuDNN's
// fused attention where this build has cuDNN. Shapes cover partial tiles,
// several tiles, every head dim the fused kernels take and GQA groups of 1, 2
// and 4. cuDNN must take the model shapes (head dim 64 or 128, T >= 64) and
// its backward must be bitwise repeatable.
TEST_P(CudaKernels, AttentionForwardBackwardGqa) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(8);
  struct S { int64_t B, T, Hq, Hkv, D; };
  enum class Path { ops, simple, gemm_chunked, flash, mma, cudnn, cudnn_chunked, cudnn_atomic };
  for (S s : {S{1, 1, 1, 1, 64}, S{2, 17, 4, 2, 64}, S{1, 100, 6, 6, 32}, S{1, 70, 4, 1, 128},
              S{2, 130, 4, 2, 16}, S{2, 259, 8, 2, 64}, S{1, 512, 4, 4, 64}}) {
    const Tensor q = random_tensor(Shape{s.B, s.T, s.Hq, s.D}, dt, rng);
    const Tensor k = random_tensor(Shape{s.B, s.T, s.Hkv, s.D}, dt, rng);
    const Tensor v = random_tensor(Shape{s.B, s.T, s.Hkv, s.D}, dt, rng);
    const Tensor dout = random_tensor(Shape{s.B, s.T, s.Hq, s.D}, dt, rng);
    Tensor out = Tensor::empty(q.shape(), dt), lse = Tensor::empty(Shape{s.B, s.Hq, s.T}, DType::f32);
    ops::attention_forward(out, lse, q, k, v);
    Tensor dq = Tensor::empty(q.shape(), dt), dk = Tensor::empty(k.shape(), dt), dv = Tensor::empty(v.shape(), dt);
    ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
    const Tensor gq = to_gpu(q), gk = to_gpu(k), gv = to_gpu(v), gdout = to_gpu(dout);
    const float scale = float(1.0 / std::sqrt(double(s.D)));
    // One kv head's group of (T, T) matrices in backward (f32 S, dP; P, dS): forces one head per chunk.
    const int64_t ld = (s.T + 7) / 8 * 8;
    const int64_t one_group = (s.Hq / s.Hkv) * s.T * ld * (8 + 2 * int64_t(dtype_size(dt)));
    // The fused kernels take bf16 / f16 only; they must say so for f32 rather than run.
    const cuda::AttentionShape shape = cuda::attention_shape(gq, gk);
    const std::string fused_blocker = cuda::flash_attention_unsupported(shape);
    EXPECT_EQ(cuda::mma_attention_unsupported(shape), fused_blocker);
    if (dt == DType::f32) EXPECT_NE(fused_blocker.find("dtype f32"), std::string::npos) << fused_blocker;
    else EXPECT_EQ(fused_blocker, "");
    const cuda::AttentionPass forward_pass, backward_pass{true}, atomic_pass{true, false};
    const std::string cudnn_fwd = cuda::cudnn_attention_unsupported(shape, scale, forward_pass);
    const std::string cudnn_bwd = cuda::cudnn_attention_unsupported(shape, scale, backward_pass);
    // The backward with atomics (train.deterministic = false).
    const std::string cudnn_atomic_bwd = cuda::cudnn_attention_unsupported(shape, scale, atomic_pass);
    const bool cudnn_takes_it = cudnn_fwd.empty() && cudnn_bwd.empty();
    const bool cudnn_atomic_takes_it = cudnn_fwd.empty() && cudnn_atomic_bwd.empty();
    if (dt != DType::f32 && (s.D == 64 || s.D == 128) && s.T >= 64) {
      EXPECT_TRUE(cudnn_takes_it) << "cuDNN refused a model shape, T " << s.T << " D " << s.D
                                  << ": forward: " << cudnn_fwd << "; backward: " << cudnn_bwd;
      EXPECT_TRUE(cudnn_atomic_takes_it) << "cuDNN's backward with atomics refused a model shape, T " << s.T << " D "
                                         << s.D << ": " << cudnn_atomic_bwd;
    } else if (!cudnn_takes_it || !cudnn_atomic_takes_it) {
      std::printf("[   INFO   ] cuDNN does not take %s T=%lld D=%lld: forward: %s; backward: %s; with atomics: %s\n",
                  std::string(dtype_name(dt)).c_str(), (long long)s.T, (long long)s.D, cudnn_fwd.c_str(),
                  cudnn_bwd.c_str(), cudnn_atomic_bwd.c_str());
    }
    for (const Path path : {Path::ops, Path::simple, Path::gemm_chunked, Path::flash, Path::mma, Path::cudnn,
                            Path::cudnn_chunked, Path::cudnn_atomic}) {
      if ((path == Path::flash || path == Path::mma) && !fused_blocker.empty()) continue;
      if ((path == Path::cudnn || path == Path::cudnn_chunked) && !cudnn_takes_it) continue;
      if (path == Path::cudnn_atomic && !cudnn_atomic_takes_it) continue;
      if (path == Path::cudnn_chunked && s.B < 2) continue;
      SCOPED_TRACE(path == Path::ops             ? "ops"
                   : path == Path::simple        ? "simple kernel"
                   : path == Path::gemm_chunked  ? "tensor-core path, chunked"
                   : path == Path::flash         ? "flash kernel"
                   : path == Path::mma           ? "mma kernel"
                   : path == Path::cudnn         ? "cuDNN"
                   : path == Path::cudnn_chunked ? "cuDNN in batch chunks"
                                                 : "cuDNN, atomic dq (ops, not deterministic)");
      Tensor gout = gpu_poisoned(q.shape(), dt), glse = gpu_poisoned(lse.shape(), DType::f32);
      Tensor gdq = gpu_poisoned(q.shape(), dt), gdk = gpu_poisoned(k.shape(), dt), gdv = gpu_poisoned(v.shape(), dt);
      if (path == Path::ops) {
        // Each direction allocates for itself exactly the workspace the memory plan counts for it.
        Allocator& alloc = allocator_for(gq.device());
        for (const bool backward : {false, true}) {
          const int64_t before = alloc.stats().current(MemCategory::workspace);
          alloc.reset_window_peak();
          if (backward) ops::attention_backward(gdq, gdk, gdv, gdout, gq, gk, gv, gout, glse);
          else ops::attention_forward(gout, glse, gq, gk, gv);
          EXPECT_EQ(alloc.stats().window_peak(MemCategory::workspace) - before,
                    cuda::attention_workspace_bytes(shape, scale, cuda::AttentionPass{backward}))
              << (backward ? "backward" : "forward") << " T " << s.T << " D " << s.D;
        }
      } else if (path == Path::simple) {
        cuda::attention_forward(gout, glse, gq, gk, gv, scale, cuda::AttentionKernel::simple);
        cuda::attention_backward(gdq, gdk, gdv, gdout, gq, gk, gv, gout, glse, scale, cuda::AttentionKernel::simple);
      } else if (path == Path::cudnn_chunked) {
        // A workspace budget one byte under the whole batch's: calls of fewer
        // sequences, each allocating at most what the plan's count says.
        const int64_t budget = cuda::cudnn_attention_workspace_bytes(shape, scale, backward_pass) - 1;
        cuda::cudnn_attention_forward(gout, glse, gq, gk, gv, scale, budget);
        Allocator& alloc = allocator_for(gq.device());
        const int64_t before = alloc.stats().current(MemCategory::workspace);
        alloc.reset_window_peak();
        cuda::cudnn_attention_backward(gdq, gdk, gdv, gdout, gq, gk, gv, gout, glse, scale, budget);
        const int64_t used = alloc.stats().window_peak(MemCategory::workspace) - before;
        EXPECT_LE(used, budget);
        EXPECT_EQ(used, cuda::cudnn_attention_workspace_bytes(shape, scale, backward_pass, budget));
      } else if (path == Path::cudnn_atomic) {
        // Through ops with determinism off: the dispatcher takes cuDNN's
        // atomic backward, which allocates exactly what the plan counts for it.
        const DeterminismScope atomics(false);
        ops::attention_forward(gout, glse, gq, gk, gv);
        Allocator& alloc = allocator_for(gq.device());
        const int64_t before = alloc.stats().current(MemCategory::workspace);
        alloc.reset_window_peak();
        ops::attention_backward(gdq, gdk, gdv, gdout, gq, gk, gv, gout, glse);
        EXPECT_EQ(alloc.stats().window_peak(MemCategory::workspace) - before,
                  cuda::attention_workspace_bytes(shape, scale, atomic_pass));
        // Whether it happens to repeat its bits here is reported, not
        // required (the order of its atomic additions is the GPU's): the
        // data for whether it could ever be the default.
        Tensor again = gpu_poisoned(q.shape(), dt);
        ops::attention_backward(again, gpu_poisoned(k.shape(), dt), gpu_poisoned(v.shape(), dt), gdout, gq, gk, gv,
                                gout, glse);
        std::printf("[   INFO   ] cuDNN's backward with atomics, %s B=%lld T=%lld Hq=%lld Hkv=%lld D=%lld: dq %s\n",
                    std::string(dtype_name(dt)).c_str(), (long long)s.B, (long long)s.T, (long long)s.Hq,
                    (long long)s.Hkv, (long long)s.D,
                    values_of(again) == values_of(gdq) ? "repeated bit for bit" : "differed between two runs");
      } else if (path == Path::gemm_chunked) {
        cuda::gemm_attention_forward(gout, glse, gq, gk, gv, scale, one_group);
        cuda::gemm_attention_backward(gdq, gdk, gdv, gdout, gq, gk, gv, glse, scale, one_group);
      } else {
        const cuda::AttentionKernel kernel = path == Path::flash ? cuda::AttentionKernel::flash
                                             : path == Path::mma ? cuda::AttentionKernel::mma
                                                                 : cuda::AttentionKernel::cudnn;
        cuda::attention_forward(gout, glse, gq, gk, gv, scale, kernel);
        cuda::attention_backward(gdq, gdk, gdv, gdout, gq, gk, gv, gout, glse, scale, kernel);
        if (path == Path::cudnn) {  // deterministic: a second backward gives the same bits
          Tensor again[3] = {gpu_poisoned(q.shape(), dt), gpu_poisoned(k.shape(), dt), gpu_poisoned(v.shape(), dt)};
          cuda::attention_backward(again[0], again[1], again[2], gdout, gq, gk, gv, gout, glse, scale, kernel);
          EXPECT_EQ(values_of(again[0]), values_of(gdq));
          EXPECT_EQ(values_of(again[1]), values_of(gdk));
          EXPECT_EQ(values_of(again[2]), values_of(gdv));
        }
      }
      const double lim = tol(dt);
      EXPECT_TRUE(matches(gout, out, lim, "out")) << s.T << " " << s.D;
      EXPECT_TRUE(matches(glse, lse, 1e-5, "lse"));
      if (s.T == 1) {
        // One key: softmax is 1, so dq = dk = 0 exactly (dP - delta = dout.v - dout.out = 0); the CPU's are
        // rounding noise, so check the GPU's are zero to rounding instead of a relative error against noise.
        for (const Tensor* t : {&gdq, &gdk})
          for (double x : values_of(*t)) ASSERT_LE(std::fabs(x), 1e-5);
      } else {
        EXPECT_TRUE(matches(gdq, dq, lim, "dq")) << s.T << " " << s.D;
        EXPECT_TRUE(matches(gdk, dk, lim, "dk")) << s.T << " " << s.D;
      }
      EXPECT_TRUE(matches(gdv, dv, lim, "dv")) << s.T << " " << s.D;
    }
  }
}

// Context parallelism's pieces on the GPU: unmasked key blocks of c queries
// x 2c keys and 2c x c (the ring's remote blocks) through the dispatcher
// (its workspace exactly what the plan counts), the simple kernel and, in
// bf16 at head dims 64 and 128, cuDNN (which must take them: the ring's fast
// path); mma, flash and gemm refuse them by name. Then the ring's merge and
// its strided copies (ops::copy_columns) against the CPU.
TEST_P(CudaKernels, UnmaskedKeyBlocksMergeAndColumnCopies) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(9);
  struct S { int64_t B, T, Tk, Hq, Hkv, D; };
  for (S s : {S{2, 64, 128, 4, 2, 64}, S{2, 128, 64, 4, 2, 64}, S{1, 256, 512, 8, 2, 128}, S{1, 37, 74, 3, 1, 32},
              S{3, 10, 5, 2, 2, 16}}) {
    SCOPED_TRACE(::testing::Message() << "B " << s.B << " T " << s.T << " Tk " << s.Tk << " Hq " << s.Hq << " Hkv "
                                      << s.Hkv << " D " << s.D);
    const auto none = ops::AttentionMask::none;
    const Tensor q = random_tensor(Shape{s.B, s.T, s.Hq, s.D}, dt, rng);
    const Tensor k = random_tensor(Shape{s.B, s.Tk, s.Hkv, s.D}, dt, rng);
    const Tensor v = random_tensor(Shape{s.B, s.Tk, s.Hkv, s.D}, dt, rng);
    const Tensor dout = random_tensor(q.shape(), dt, rng);
    Tensor out = Tensor::empty(q.shape(), dt), lse = Tensor::empty(Shape{s.B, s.Hq, s.T}, DType::f32);
    ops::attention_forward(out, lse, q, k, v, 0.0f, none);
    Tensor dq = Tensor::empty(q.shape(), dt), dk = Tensor::empty(k.shape(), dt), dv = Tensor::empty(v.shape(), dt);
    ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, 0.0f, none);
    const Tensor gq = to_gpu(q), gk = to_gpu(k), gv = to_gpu(v), gdout = to_gpu(dout);
    const float scale = float(1.0 / std::sqrt(double(s.D)));
    const cuda::AttentionShape shape = cuda::attention_shape(gq, gk, /*causal=*/false);
    ASSERT_EQ(shape.keys(), s.Tk);
    EXPECT_NE(cuda::mma_attention_unsupported(shape).find("unmasked"), std::string::npos);
    EXPECT_NE(cuda::flash_attention_unsupported(shape).find("unmasked"), std::string::npos);
    EXPECT_NE(error_of([&] {
                Tensor o = gpu_poisoned(q.shape(), dt), l = gpu_poisoned(lse.shape(), DType::f32);
                cuda::attention_forward(o, l, gq, gk, gv, scale, cuda::AttentionKernel::gemm, /*causal=*/false);
              }).find("causal only"),
              std::string::npos);
    const std::string cudnn_fwd = cuda::cudnn_attention_unsupported(shape, scale, cuda::AttentionPass{});
    const std::string cudnn_bwd = cuda::cudnn_attention_unsupported(shape, scale, cuda::AttentionPass{true});
    if (dt != DType::f32 && (s.D == 64 || s.D == 128)) {
      EXPECT_TRUE(cudnn_fwd.empty() && cudnn_bwd.empty()) << "cuDNN refused a ring block: " << cudnn_fwd << "; "
                                                          << cudnn_bwd;
    }
    for (const cuda::AttentionKernel kernel :
         {cuda::AttentionKernel::automatic, cuda::AttentionKernel::simple, cuda::AttentionKernel::cudnn}) {
      if (kernel == cuda::AttentionKernel::cudnn && !(cudnn_fwd.empty() && cudnn_bwd.empty())) continue;
      SCOPED_TRACE(kernel == cuda::AttentionKernel::automatic ? "ops (automatic)"
                   : kernel == cuda::AttentionKernel::simple  ? "simple kernel"
                                                              : "cuDNN");
      Tensor gout = gpu_poisoned(q.shape(), dt), glse = gpu_poisoned(lse.shape(), DType::f32);
      Tensor gdq = gpu_poisoned(q.shape(), dt), gdk = gpu_poisoned(k.shape(), dt), gdv = gpu_poisoned(v.shape(), dt);
      if (kernel == cuda::AttentionKernel::automatic) {
        Allocator& alloc = allocator_for(gq.device());
        for (const bool backward : {false, true}) {
          const int64_t before = alloc.stats().current(MemCategory::workspace);
          alloc.reset_window_peak();
          if (backward) ops::attention_backward(gdq, gdk, gdv, gdout, gq, gk, gv, gout, glse, 0.0f, none);
          else ops::attention_forward(gout, glse, gq, gk, gv, 0.0f, none);
          EXPECT_EQ(alloc.stats().window_peak(MemCategory::workspace) - before,
                    cuda::attention_workspace_bytes(shape, scale, cuda::AttentionPass{backward}))
              << (backward ? "backward" : "forward");
        }
      } else {
        cuda::attention_forward(gout, glse, gq, gk, gv, scale, kernel, /*causal=*/false);
        cuda::attention_backward(gdq, gdk, gdv, gdout, gq, gk, gv, gout, glse, scale, kernel, true,
                                 /*causal=*/false);
      }
      const double lim = tol(dt);
      EXPECT_TRUE(matches(gout, out, lim, "out"));
      EXPECT_TRUE(matches(glse, lse, 1e-5, "lse"));
      EXPECT_TRUE(matches(gdq, dq, lim, "dq"));
      EXPECT_TRUE(matches(gdk, dk, lim, "dk"));
      EXPECT_TRUE(matches(gdv, dv, lim, "dv"));
    }
  }
  // The merge of a block into a running result at rows [4, 12) of 16, the
  // first four rows' running lse -inf (nothing merged yet).
  const int64_t B = 2, T = 16, H = 3, D = 40, n = 8, row0 = 4;
  Tensor acc = random_tensor(Shape{B, T, H, D}, DType::f32, rng);
  Tensor acc_lse = random_tensor(Shape{B, H, T}, DType::f32, rng, -3, 3);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = row0; t < row0 + 4; ++t) acc_lse.data<float>()[bh * T + t] = -INFINITY;
  const Tensor part = random_tensor(Shape{B, n, H, D}, dt, rng);
  const Tensor part_lse = random_tensor(Shape{B, H, n}, DType::f32, rng, -3, 3);
  const Tensor g_acc = to_gpu(acc), g_lse = to_gpu(acc_lse);
  ops::attention_merge(g_acc, g_lse, to_gpu(part), to_gpu(part_lse), row0);
  ops::attention_merge(acc, acc_lse, part, part_lse, row0);
  EXPECT_TRUE(matches(g_acc, acc, 1e-6, "merged out"));
  EXPECT_TRUE(matches(g_lse, acc_lse, 1e-6, "merged lse"));
  // Columns [5, 12) of each of 6 rows of 20 into columns [1, 8) of rows of 9.
  const Tensor src = random_tensor(Shape{6, 20}, dt, rng), dst = Tensor::empty(Shape{6, 9}, dt);
  poison(dst);
  const Tensor g_dst = to_gpu(dst);
  ops::copy_columns(g_dst, 1, to_gpu(src), 5, 7, 6);
  ops::copy_columns(dst, 1, src, 5, 7, 6);
  const Tensor back = to_host(g_dst);
  EXPECT_EQ(std::memcmp(back.data_ptr(), dst.data_ptr(), size_t(dst.nbytes())), 0) << "copy_columns";
}

// q, k, v as the heads of one (B, T, Hq + 2 Hkv, D) tensor and the backward
// writing dq, dk, dv into one (a fused qkv product's output and its
// gradient): cuDNN reads and writes them in place (strides), every other
// kernel runs on copies and must give the bits of the separate call. Against
// the CPU; the ops entry allocates exactly the workspace the plan counts.
TEST_P(CudaKernels, AttentionOnPackedHeads) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(9);
  struct S { int64_t B, T, Hq, Hkv, D; };
  // {4, 65, 2, 1}: Hq T = 130, so batch chunks start at even sequences (lse's 16-byte alignment).
  // {2, 33, 3, 1, 7}: an odd head dim (f32, the simple kernel) for the split and join's copies.
  for (S s : {S{2, 130, 4, 2, 64}, S{1, 512, 4, 4, 64}, S{2, 259, 8, 2, 64}, S{1, 70, 4, 1, 128},
              S{4, 65, 2, 1, 64}, S{2, 33, 3, 1, 7}}) {
    const bool odd = s.D % 2 == 1;
    if (odd && dt != DType::f32) continue;
    SCOPED_TRACE(::testing::Message() << "B " << s.B << " T " << s.T << " Hq " << s.Hq << " Hkv " << s.Hkv << " D "
                                      << s.D);
    const int64_t H = s.Hq + 2 * s.Hkv;
    const Tensor qkv = random_tensor(Shape{s.B, s.T, H, s.D}, dt, rng);
    const Tensor dout = random_tensor(Shape{s.B, s.T, s.Hq, s.D}, dt, rng);
    const Tensor q = heads_of(qkv, 0, s.Hq), k = heads_of(qkv, s.Hq, s.Hkv), v = heads_of(qkv, s.Hq + s.Hkv, s.Hkv);
    Tensor out = Tensor::empty(q.shape(), dt), lse = Tensor::empty(Shape{s.B, s.Hq, s.T}, DType::f32);
    ops::attention_forward(out, lse, q, k, v);
    Tensor dq = Tensor::empty(q.shape(), dt), dk = Tensor::empty(k.shape(), dt), dv = Tensor::empty(v.shape(), dt);
    ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
    const Tensor dqkv = heads_joined({dq, dk, dv});
    const Tensor gqkv = to_gpu(qkv), gdout = to_gpu(dout), gq = to_gpu(q), gk = to_gpu(k), gv = to_gpu(v);
    const float scale = float(1.0 / std::sqrt(double(s.D)));
    const cuda::AttentionShape packed = cuda::packed_attention_shape(gqkv, s.Hq, s.Hkv);
    const bool cudnn_takes_it = cuda::cudnn_attention_unsupported(packed, scale, cuda::AttentionPass{}).empty() &&
                                cuda::cudnn_attention_unsupported(packed, scale, cuda::AttentionPass{true}).empty();
    if (dt != DType::f32) {
      EXPECT_TRUE(cudnn_takes_it) << "cuDNN refused packed heads of a model shape";
    }
    for (const cuda::AttentionKernel kernel : {cuda::AttentionKernel::automatic, cuda::AttentionKernel::cudnn,
                                               cuda::AttentionKernel::mma, cuda::AttentionKernel::simple}) {
      if (kernel == cuda::AttentionKernel::cudnn && !cudnn_takes_it) continue;
      if (kernel == cuda::AttentionKernel::mma && dt == DType::f32) continue;
      if (odd && kernel != cuda::AttentionKernel::simple) continue;
      SCOPED_TRACE(kernel == cuda::AttentionKernel::automatic ? "ops (automatic)"
                   : kernel == cuda::AttentionKernel::cudnn   ? "cuDNN"
                   : kernel == cuda::AttentionKernel::mma     ? "mma"
                                                              : "simple");
      Tensor gout = gpu_poisoned(q.shape(), dt), glse = gpu_poisoned(lse.shape(), DType::f32);
      Tensor gdqkv = gpu_poisoned(qkv.shape(), dt);
      if (kernel == cuda::AttentionKernel::automatic) {
        Allocator& alloc = allocator_for(gqkv.device());
        for (const bool backward : {false, true}) {
          const int64_t before = alloc.stats().current(MemCategory::workspace);
          alloc.reset_window_peak();
          if (backward) ops::attention_backward_packed(gdqkv, gdout, gqkv, gout, glse, s.Hq, s.Hkv);
          else ops::attention_forward_packed(gout, glse, gqkv, s.Hq, s.Hkv);
          EXPECT_EQ(alloc.stats().window_peak(MemCategory::workspace) - before,
                    cuda::attention_workspace_bytes(packed, scale, cuda::AttentionPass{backward}))
              << (backward ? "backward" : "forward");
        }
      } else {
        cuda::attention_forward_packed(gout, glse, gqkv, s.Hq, s.Hkv, scale, kernel);
        cuda::attention_backward_packed(gdqkv, gdout, gqkv, gout, glse, s.Hq, s.Hkv, scale, kernel);
        // The same kernel on separate tensors.
        Tensor sout = gpu_poisoned(q.shape(), dt), slse = gpu_poisoned(lse.shape(), DType::f32);
        Tensor sdq = gpu_poisoned(q.shape(), dt), sdk = gpu_poisoned(k.shape(), dt), sdv = gpu_poisoned(v.shape(), dt);
        cuda::attention_forward(sout, slse, gq, gk, gv, scale, kernel);
        cuda::attention_backward(sdq, sdk, sdv, gdout, gq, gk, gv, sout, slse, scale, kernel);
        const std::vector<double> joined = to_f64(heads_joined({to_host(sdq), to_host(sdk), to_host(sdv)}));
        if (kernel == cuda::AttentionKernel::cudnn) {  // another plan (strided operands): the same math
          const double lim = 2e-2;
          EXPECT_TRUE(matches(gout, to_host(sout), lim, "out against cuDNN on separate tensors"));
          EXPECT_TRUE(rel_error_within(to_host(gdqkv), joined, lim, "dqkv against cuDNN on separate tensors"));
        } else {  // the same kernel on copies: the same bits
          EXPECT_EQ(values_of(gout), values_of(sout)) << "out";
          EXPECT_EQ(values_of(glse), values_of(slse)) << "lse";
          EXPECT_EQ(values_of(gdqkv), joined) << "dqkv";
        }
      }
      const double lim = tol(dt);
      EXPECT_TRUE(matches(gout, out, lim, "out"));
      EXPECT_TRUE(matches(glse, lse, 1e-5, "lse"));
      EXPECT_TRUE(matches(gdqkv, dqkv, lim, "dqkv"));
    }
    // cuDNN on packed heads in batch chunks (a budget one byte under the
    // whole batch's, as GPT-2 at B = 128 trains), each call allocating at
    // most what the plan's count says.
    const cuda::AttentionPass backward_pass{true}, atomic_pass{true, false};
    if (cudnn_takes_it && s.B >= 2) {
      SCOPED_TRACE("cuDNN in batch chunks");
      const int64_t budget = cuda::cudnn_attention_workspace_bytes(packed, scale, backward_pass) - 1;
      Tensor gout = gpu_poisoned(q.shape(), dt), glse = gpu_poisoned(lse.shape(), DType::f32);
      Tensor gdqkv = gpu_poisoned(qkv.shape(), dt);
      cuda::cudnn_attention_forward_packed(gout, glse, gqkv, s.Hq, s.Hkv, scale, budget);
      Allocator& alloc = allocator_for(gqkv.device());
      const int64_t before = alloc.stats().current(MemCategory::workspace);
      alloc.reset_window_peak();
      cuda::cudnn_attention_backward_packed(gdqkv, gdout, gqkv, gout, glse, s.Hq, s.Hkv, scale, budget);
      const int64_t used = alloc.stats().window_peak(MemCategory::workspace) - before;
      EXPECT_LE(used, budget);
      EXPECT_EQ(used, cuda::cudnn_attention_workspace_bytes(packed, scale, backward_pass, budget));
      EXPECT_TRUE(matches(gout, out, 2e-2, "out"));
      EXPECT_TRUE(matches(glse, lse, 1e-5, "lse"));
      EXPECT_TRUE(matches(gdqkv, dqkv, 2e-2, "dqkv"));
    }
    // Its backward with atomics (train.deterministic = false) through ops.
    if (cudnn_takes_it && cuda::cudnn_attention_unsupported(packed, scale, atomic_pass).empty()) {
      SCOPED_TRACE("cuDNN's backward with atomics");
      const DeterminismScope atomics(false);
      Tensor gdqkv = gpu_poisoned(qkv.shape(), dt);
      const Tensor gout = to_gpu(out), glse = to_gpu(lse);
      Allocator& alloc = allocator_for(gqkv.device());
      const int64_t before = alloc.stats().current(MemCategory::workspace);
      alloc.reset_window_peak();
      ops::attention_backward_packed(gdqkv, gdout, gqkv, gout, glse, s.Hq, s.Hkv);
      EXPECT_EQ(alloc.stats().window_peak(MemCategory::workspace) - before,
                cuda::attention_workspace_bytes(packed, scale, atomic_pass));
      EXPECT_TRUE(matches(gdqkv, dqkv, 2e-2, "dqkv"));
    }
  }
}

// The mixture-of-experts ops on the GPU: routing (with balancing biases, the
// z-loss's logsumexp), the dispatch plan from the GPU's choice, the rows'
// gather and combine and all their backwards, against the CPU. E = 40 spans
// two passes of a warp's lanes; C = 264 tiles 16-byte packs of either dtype,
// C = 100 does not.
TEST_P(CudaKernels, MixtureOfExpertsRoutingAndRows) {
  ZT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto rng = make_rng(14);
  for (const int64_t C : {int64_t(264), int64_t(100)}) {
    const int64_t N = 77, E = 40, k = 3;
    SCOPED_TRACE(::testing::Message() << "C " << C);
    const Tensor logits = random_tensor(Shape{N, E}, DType::f32, rng, -3, 3);
    const Tensor bias = random_tensor(Shape{E}, DType::f32, rng, -0.05, 0.05);
    Tensor probs = Tensor::empty(Shape{N, E}, DType::f32), choice = Tensor::empty(Shape{N, k}, DType::i32);
    Tensor weight = Tensor::empty(Shape{N, k}, DType::f32), lse = Tensor::empty(Shape{N}, DType::f32);
    ops::moe_route(probs, choice, weight, logits, true, lse, bias);
    Tensor gprobs = gpu_poisoned(Shape{N, E}, DType::f32), gchoice = gpu_poisoned(Shape{N, k}, DType::i32);
    Tensor gweight = gpu_poisoned(Shape{N, k}, DType::f32), glse = gpu_poisoned(Shape{N}, DType::f32);
    ops::moe_route(gprobs, gchoice, gweight, to_gpu(logits), true, glse, to_gpu(bias));
    EXPECT_TRUE(matches(gprobs, probs, 1e-5, "probs"));
    EXPECT_TRUE(matches(glse, lse, 1e-5, "lse"));
    // The same choices where no two scores at the top-k boundary are within
    // rounding of each other (a random draw: all of them, or nearly).
    const std::vector<double> got_choice = values_of(gchoice), ref_choice = to_f64(choice);
    int64_t differ = 0;
    for (size_t i = 0; i < ref_choice.size(); ++i) differ += got_choice[i] != ref_choice[i];
    EXPECT_LE(differ, 2) << "choices differing from the CPU's";
    // From here on both sides take the GPU's routing.
    choice = to_host(gchoice);
    weight = to_host(gweight);
    probs = to_host(gprobs);
    Tensor order = Tensor::empty(Shape{N * k}, DType::i32), where = Tensor::empty(Shape{N * k}, DType::i32);
    std::vector<int64_t> offsets, goffsets;
    ops::moe_dispatch_plan(order, where, offsets, choice, E);
    Tensor gorder = Tensor::empty(Shape{N * k}, DType::i32), gwhere = Tensor::empty(Shape{N * k}, DType::i32);
    ops::moe_dispatch_plan(gorder, gwhere, goffsets, gchoice, E);  // the plan of a GPU's choice, on the host
    EXPECT_EQ(goffsets, offsets);
    EXPECT_EQ(to_f64(gorder), to_f64(order));
    EXPECT_EQ(to_f64(gwhere), to_f64(where));
    // Routing backward, with the balancing loss's and the z-loss's terms.
    const Tensor dweight = random_tensor(Shape{N, k}, DType::f32, rng), aux = random_tensor(Shape{E}, DType::f32, rng);
    const Tensor dlse = random_tensor(Shape{N}, DType::f32, rng);
    Tensor dlogits = Tensor::empty(Shape{N, E}, DType::f32), gdlogits = gpu_poisoned(Shape{N, E}, DType::f32);
    ops::moe_route_backward(dlogits, dweight, probs, choice, weight, true, aux, dlse);
    ops::moe_route_backward(gdlogits, to_gpu(dweight), gprobs, gchoice, gweight, true, to_gpu(aux), to_gpu(dlse));
    EXPECT_TRUE(matches(gdlogits, dlogits, 1e-5, "dlogits"));
    // Rows, of every slot and of a plan whose experts take 2 slots each
    // (the rest dropped: where -1).
    for (const int64_t capacity : {int64_t(-1), int64_t(2)}) {
      SCOPED_TRACE(::testing::Message() << "capacity " << capacity);
      ops::moe_dispatch_plan(order, where, offsets, choice, E, capacity);
      const int64_t R = offsets.back();
      const Tensor kept = order.slice(0, R);
      const Tensor x = random_tensor(Shape{N, C}, dt, rng), ys = random_tensor(Shape{R, C}, dt, rng);
      const Tensor dout = random_tensor(Shape{N, C}, dt, rng), residual = random_tensor(Shape{N, C}, dt, rng);
      const Tensor dx0 = random_tensor(Shape{N, C}, dt, rng);
      Tensor xs = Tensor::empty(Shape{R, C}, dt), gxs = gpu_poisoned(Shape{R, C}, dt);
      ops::moe_gather(xs, x, kept, k);
      ops::moe_gather(gxs, to_gpu(x), kept, k);
      EXPECT_EQ(values_of(gxs), to_f64(xs)) << "gather (copies)";
      Tensor dx = to_host(to_gpu(dx0)), gdx = to_gpu(dx0);
      ops::moe_gather_backward(dx, ys, where, k, true);
      ops::moe_gather_backward(gdx, to_gpu(ys), where, k, true);
      EXPECT_EQ(values_of(gdx), to_f64(dx)) << "gather backward (sums in slot order)";
      Tensor out = Tensor::empty(Shape{N, C}, dt), gout = gpu_poisoned(Shape{N, C}, dt);
      ops::moe_combine(out, ys, weight, where, residual);
      ops::moe_combine(gout, to_gpu(ys), gweight, where, to_gpu(residual));
      EXPECT_TRUE(matches(gout, out, tol(dt), "combine"));
      Tensor dys = Tensor::empty(Shape{R, C}, dt), gdys = gpu_poisoned(Shape{R, C}, dt);
      Tensor dw = Tensor::empty(Shape{N, k}, DType::f32), gdw = gpu_poisoned(Shape{N, k}, DType::f32);
      ops::moe_combine_backward(dys, dw, dout, ys, weight, where);
      ops::moe_combine_backward(gdys, gdw, to_gpu(dout), to_gpu(ys), gweight, where);
      EXPECT_EQ(values_of(gdys), to_f64(dys)) << "dys (one rounded product)";
      EXPECT_TRUE(matches(gdw, dw, 1e-5, "dweight"));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaKernels, ::testing::Values(DType::f32, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace zt::test
