// GPU tests for ops::matmul, ops::linear_forward and ops::linear_backward on
// CUDA (cuBLASLt) against the CPU backend.
//
// Reference: the CPU op run in f32 on exactly the GPU's input values (bf16
// inputs widened exactly), so it is at least as precise as the GPU result.
// matmul's error is measured against the scale of each output's terms, the
// forward-error bound of a sum of products, |out - ref| <= gamma_K (|alpha|
// |A| |B| + |beta| |out0| + |bias|), elementwise: max over elements of
// |out - ref| / that scale (gemm_error). Relative to |ref| an output whose K
// terms cancel is ill-conditioned (seen on an H100: M = N = 1, K = 257 in f32,
// 1.5e-4 of a near-zero sum). A term left out or added twice still costs about
// 1 / K of the scale. Its bounds (gemm_tolerance):
//   f32 operands, f32 out   2e-6   (CUDA-core f32 on both sides, only the order differs: two f32 orders,
//                                   simulated up to 512 x 768 x 3072, differ by at most 2.9e-7 in this
//                                   measure; a TF32 path by about 1e-5)
//   bf16 operands, f32 out  3e-5   (the products are exact in f32, but tensor cores do not accumulate with
//                                   IEEE rounding: linear's 1e-4 over the factor, about 3 at K = 300, by which
//                                   the terms' scale exceeds max |ref|)
//   bf16 out                1e-2   (one rounding of out, at most 2^-8 of |out| <= the scale)
// linear's checks use the max-norm relative error (max_rel_error) of outputs
// with many elements, with bounds (tolerance):
//   f32 operands, f32 out          1e-5   (true fp32 on both sides, only the summation order differs)
//   bf16 operands, f32 out         1e-4   (bf16 products are exact in f32; f32 accumulation)
//   bf16 out                       1e-2   (one bf16 rounding of out is 2^-8 relative)
// Outputs that beta = 0 (or dx) overwrite start as NaN bytes, so an element
// never written fails; accumulated outputs start from random values copied to
// both sides.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backend/cuda/matmul.h"
#include "core/allocator.h"
#include "core/determinism.h"
#include "cuda/cuda_test_util.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"

namespace zt {
namespace {

using test::gpu;
using test::gpu_poisoned;
using test::make_rng;
using test::max_rel_error;
using test::poison;
using test::random_tensor;
using test::tensor_from;
using test::to_f64;
using test::to_gpu;
using test::to_host;

// An f32 copy of a host tensor (exact for bf16).
Tensor as_f32(const Tensor& t) { return tensor_from(to_f64(t), t.shape(), DType::f32); }

double tolerance(DType in, DType out) {
  if (out == DType::bf16) return 1e-2;
  return in == DType::bf16 ? 1e-4 : 1e-5;
}

double gemm_tolerance(DType in, DType out) {
  if (out == DType::bf16) return 1e-2;
  return in == DType::bf16 ? 3e-5 : 2e-6;
}

Shape make_shape(const std::vector<int64_t>& lead, int64_t r, int64_t c) {
  Shape s(lead.begin(), lead.end());
  s.push_back(r);
  s.push_back(c);
  return s;
}

// A GPU copy of `host` starting `offset` elements into a larger buffer
// (offset 1 makes the view only element-aligned).
Tensor to_gpu_at(const Tensor& host, int64_t offset) {
  if (offset == 0) return to_gpu(host);
  Tensor big = Tensor::empty(Shape{host.numel() + offset}, host.dtype(), gpu());
  Tensor view = big.flat_view(offset, host.shape());
  ops::copy(view, host);
  return view;
}

// NaN-filled GPU tensor `offset` elements into a larger buffer.
Tensor gpu_poisoned_at(const Shape& shape, DType dtype, int64_t offset) {
  if (offset == 0) return gpu_poisoned(shape, dtype);
  return gpu_poisoned(Shape{shape.numel() + offset}, dtype).flat_view(offset, shape);
}

struct MatmulCase {
  std::vector<int64_t> batch;  // batch dims of a and out
  int64_t M, N, K;
  bool ta = false, tb = false;
  bool b_shared = false;  // b is 2-D
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  DType in = DType::f32, out = DType::f32, bias_dt = DType::f32;
  int64_t misalign = 0;  // element offset of every GPU operand's view

  std::string str() const {
    std::string s = "batch(";
    for (auto d : batch) s += std::to_string(d) + ",";
    return s + ") M" + std::to_string(M) + " N" + std::to_string(N) + " K" + std::to_string(K) +
           (ta ? " ta" : "") + (tb ? " tb" : "") + (b_shared ? " shared-b" : "") + " alpha " +
           std::to_string(alpha) + " beta " + std::to_string(beta) + " " + std::string(dtype_name(in)) + "->" +
           std::string(dtype_name(out)) + (bias ? " bias " + std::string(dtype_name(bias_dt)) : "") +
           (misalign ? " misaligned" : "") + " (seed " + std::to_string(test::test_seed()) + ")";
  }
};

// |t| elementwise, as a host f32 tensor.
Tensor abs_f32(const Tensor& t) {
  std::vector<double> v = to_f64(t);
  for (double& x : v) x = std::abs(x);
  return tensor_from(v, t.shape(), DType::f32);
}

// max over elements of |got - ref| / scale, scale the size of the element's
// terms (the header's bound); an element whose terms are all zero must match.
double gemm_error(const Tensor& got, const Tensor& ref, const Tensor& scale) {
  const std::vector<double> g = to_f64(got), r = to_f64(ref), sc = to_f64(scale);
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    const double e = std::abs(g[i] - r[i]);
    worst = std::max(worst, sc[i] > 0 ? e / sc[i] : (e == 0 ? 0.0 : INFINITY));
  }
  return worst;
}

// Runs c on the GPU and (in f32, same values) on the CPU; returns the GPU out.
Tensor check_matmul(const MatmulCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(c.str());
  const Shape as = c.ta ? make_shape(c.batch, c.K, c.M) : make_shape(c.batch, c.M, c.K);
  const std::vector<int64_t> none;
  const Shape bs = make_shape(c.b_shared ? none : c.batch, c.tb ? c.N : c.K, c.tb ? c.K : c.N);
  const Shape os = make_shape(c.batch, c.M, c.N);
  const Tensor a = random_tensor(as, c.in, rng);
  const Tensor b = random_tensor(bs, c.in, rng);
  const Tensor bias = c.bias ? random_tensor(Shape{c.N}, c.bias_dt, rng) : Tensor();
  const Tensor init = c.beta != 0.0f ? random_tensor(os, c.out, rng) : Tensor();

  Tensor ref;
  if (init.defined()) {
    ref = as_f32(init);
  } else {
    ref = Tensor::empty(os, DType::f32);
    poison(ref);
  }
  ops::matmul(ref, as_f32(a), as_f32(b), c.ta, c.tb, c.alpha, c.beta, c.bias ? as_f32(bias) : Tensor());

  const int64_t off = c.misalign;
  const Tensor out = init.defined() ? to_gpu_at(init, off) : gpu_poisoned_at(os, c.out, off);
  ops::matmul(out, to_gpu_at(a, off), to_gpu_at(b, off), c.ta, c.tb, c.alpha, c.beta,
              c.bias ? to_gpu_at(bias, off) : Tensor());
  const Tensor got = to_host(out);
  // The terms' scale: |alpha| |A| |B| + |bias|, then + |beta| |out0|.
  Tensor scale = Tensor::empty(os, DType::f32);
  ops::matmul(scale, abs_f32(a), abs_f32(b), c.ta, c.tb, std::abs(c.alpha), 0.0f,
              c.bias ? abs_f32(bias) : Tensor());
  if (init.defined()) ops::axpy(scale, std::abs(c.beta), abs_f32(init));
  EXPECT_LE(gemm_error(got, ref, scale), gemm_tolerance(c.in, c.out)) << c.str();
  return got;
}

struct DtypeCombo {
  DType in, out;
};
const DtypeCombo kCombos[] = {{DType::f32, DType::f32}, {DType::bf16, DType::f32}, {DType::bf16, DType::bf16}};

// --- matmul -------------------------------------------------------------------

TEST(CudaMatmul, EveryTransposeDtypeAndOddShape) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(101);
  const int64_t shapes[][3] = {{1, 1, 1},  {1, 37, 29},  {37, 1, 29},  {37, 53, 1},
                               {37, 53, 29}, {8, 16, 32}, {130, 70, 300}, {1, 1, 257}};
  for (const auto& s : shapes)
    for (int t = 0; t < 4; ++t)
      for (const auto& dc : kCombos) {
        MatmulCase c{.batch = {}, .M = s[0], .N = s[1], .K = s[2], .ta = bool(t & 1), .tb = bool(t & 2)};
        c.in = dc.in, c.out = dc.out;
        check_matmul(c, rng);
      }
}

TEST(CudaMatmul, LargeProduct) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(102);
  for (int t = 0; t < 4; ++t) {
    MatmulCase c{.batch = {}, .M = 512, .N = 768, .K = 3072, .ta = bool(t & 1), .tb = bool(t & 2)};
    check_matmul(c, rng);
  }
  for (const auto& dc : {kCombos[1], kCombos[2]}) {
    MatmulCase c{.batch = {}, .M = 512, .N = 768, .K = 3072, .tb = true, .bias = true};
    c.in = dc.in, c.out = dc.out, c.bias_dt = dc.out;
    check_matmul(c, rng);
  }
}

TEST(CudaMatmul, AlphaBetaOverwriteAndAccumulate) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(103);
  const float ab[][2] = {{1.0f, 0.0f}, {0.5f, 0.0f}, {1.0f, 1.0f}, {-0.75f, 0.5f}, {2.0f, -1.0f}};
  const int64_t shapes[][3] = {{37, 53, 29}, {64, 128, 96}, {1, 40, 7}};
  for (const auto& s : shapes)
    for (const auto& v : ab)
      for (const auto& dc : kCombos)
        for (int t = 0; t < 4; t += 3) {  // NN and TT
          MatmulCase c{.batch = {}, .M = s[0], .N = s[1], .K = s[2], .ta = bool(t & 1), .tb = bool(t & 2)};
          c.alpha = v[0], c.beta = v[1], c.in = dc.in, c.out = dc.out;
          check_matmul(c, rng);
        }
}

TEST(CudaMatmul, BiasBroadcastOverRows) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(104);
  const int64_t shapes[][3] = {{37, 53, 29}, {5, 1, 8}, {64, 256, 128}};
  for (const auto& s : shapes)
    for (const auto& dc : kCombos)
      for (DType bias_dt : {DType::f32, DType::bf16}) {
        if (bias_dt == DType::bf16 && dc.out == DType::f32) continue;  // bias is f32 or out's dtype
        for (float beta : {0.0f, 1.0f}) {
          MatmulCase c{.batch = {}, .M = s[0], .N = s[1], .K = s[2], .tb = true, .alpha = 0.5f, .beta = beta, .bias = true};
          c.in = dc.in, c.out = dc.out, c.bias_dt = bias_dt;
          check_matmul(c, rng);
        }
      }
}

TEST(CudaMatmul, BatchedWithBatchedAndSharedB) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(105);
  const std::vector<std::vector<int64_t>> batches = {{3}, {2, 3}};
  for (const auto& batch : batches)
    for (int t = 0; t < 4; ++t)
      for (bool shared : {false, true})  // shared with !ta folds the batch into M; with ta it is stride 0
        for (const auto& dc : kCombos) {
          MatmulCase c{.batch = batch, .M = 19, .N = 24, .K = 33, .ta = bool(t & 1), .tb = bool(t & 2)};
          c.b_shared = shared, c.in = dc.in, c.out = dc.out;
          c.beta = t == 1 ? 1.0f : 0.0f;
          c.bias = t == 2, c.bias_dt = dc.out;
          check_matmul(c, rng);
        }
}

TEST(CudaMatmul, MisalignedViews) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(106);
  for (const auto& dc : kCombos)
    for (DType bias_dt : {DType::f32, DType::bf16}) {
      if (bias_dt == DType::bf16 && dc.out == DType::f32) continue;
      for (float beta : {0.0f, 1.0f}) {
        MatmulCase c{.batch = {}, .M = 64, .N = 96, .K = 128, .tb = true, .beta = beta, .bias = true, .misalign = 1};
        c.in = dc.in, c.out = dc.out, c.bias_dt = bias_dt;
        check_matmul(c, rng);
        MatmulCase batched{.batch = {3}, .M = 7, .N = 9, .K = 11, .ta = true, .b_shared = false, .misalign = 1};
        batched.in = dc.in, batched.out = dc.out, batched.beta = beta;
        check_matmul(batched, rng);
      }
    }
}

TEST(CudaMatmul, EmptyReductionGivesBetaOutPlusBias) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(107);
  for (const auto& dc : kCombos)
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      MatmulCase c{.batch = {}, .M = 5, .N = 7, .K = 0, .alpha = 1.0f, .beta = beta, .bias = true};
      c.in = dc.in, c.out = dc.out, c.bias_dt = DType::f32;
      check_matmul(c, rng);
    }
  // Nothing to compute: no error, nothing touched.
  Tensor out = gpu_poisoned(Shape{0, 7}, DType::f32);
  ops::matmul(out, to_gpu(random_tensor(Shape{0, 3}, DType::f32, rng)),
              to_gpu(random_tensor(Shape{3, 7}, DType::f32, rng)));
  ops::synchronize(gpu());
}

// Every algorithm cuBLASLt's heuristic ranks for a product computes it
// (MatmulCandidateScope), and so does cuBLAS's own GEMM where it applies (no
// epilogue): what choosing algorithms by measurement would rely on; the
// kernel bench times them. Cases: a bf16 product with the bias epilogue (a
// linear layer), an f32-accumulated weight gradient of bf16 operands (beta
// 1), an odd f32 product, a strided batch with a shared b.
TEST(CudaMatmul, EveryRankedCandidateComputesTheProduct) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(108);
  MatmulCase linear{.batch = {}, .M = 512, .N = 768, .K = 384, .tb = true, .bias = true};
  linear.in = linear.out = linear.bias_dt = DType::bf16;
  MatmulCase wgrad{.batch = {}, .M = 768, .N = 384, .K = 512, .ta = true, .beta = 1.0f};
  wgrad.in = DType::bf16, wgrad.out = DType::f32;
  const MatmulCase odd{.batch = {}, .M = 37, .N = 53, .K = 29};
  MatmulCase batched{.batch = {3}, .M = 40, .N = 24, .K = 56, .ta = true, .b_shared = true};
  batched.in = batched.out = DType::bf16;
  for (const MatmulCase& c : {linear, wgrad, odd, batched}) {
    int ranked = 0;
    for (int n = 0; n < cuda::kMatmulCandidates; ++n) {
      const cuda::MatmulCandidateScope scope(n);
      SCOPED_TRACE("candidate " + std::to_string(n));
      const int64_t prefilled_before = cuda::prefilled_matmul_launches();
      try {
        check_matmul(c, rng);
      } catch (const Error& e) {  // the list ends
        EXPECT_NE(std::string(e.what()).find("so there is no candidate"), std::string::npos) << e.what();
        break;
      }
      EXPECT_EQ(cuda::last_matmul_algorithm().rfind("algo ", 0), 0u) << cuda::last_matmul_algorithm();
      // An epilogue's candidate refused at launch: the prefill pass's plain
      // product ran (its own candidate n), not this one.
      if (cuda::prefilled_matmul_launches() != prefilled_before) {
        std::printf("[   INFO   ] %s: candidate %d refused its epilogue at launch (the prefill pass ran)\n",
                    c.str().c_str(), n);
        continue;
      }
      ++ranked;
    }
    std::printf("%s: cuBLASLt ranks %d candidate(s) (%d asked for); last: %s\n", c.str().c_str(), ranked,
                cuda::kMatmulCandidates, cuda::last_matmul_algorithm().c_str());
    EXPECT_GE(ranked, 1) << c.str();
    // cuBLAS's own GEMM: the product, or no candidate where an epilogue is asked for.
    const cuda::MatmulCandidateScope scope(cuda::kCublasCandidate);
    const int64_t before = cuda::cublas_matmul_launches();
    if (c.bias && c.bias_dt == c.out) {
      try {
        check_matmul(c, rng);
        ADD_FAILURE() << c.str() << ": cuBLAS's GEMM took a product with the bias epilogue";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("so there is no candidate"), std::string::npos) << e.what();
      }
    } else {
      SCOPED_TRACE("cuBLAS's own GEMM");
      check_matmul(c, rng);
      EXPECT_GT(cuda::cublas_matmul_launches(), before) << c.str();
      EXPECT_EQ(cuda::last_matmul_algorithm(), "cublas");
    }
  }
}

// Under a MatmulWorkspaceScope the products plan for the caller's workspace
// and run with it (the kernel bench's larger-workspace sweep): each ranked
// candidate still computes the product, including a long reduction over a
// small output, where split-K algorithms need workspace for their partials.
TEST(CudaMatmul, WorkspaceScopeComputesTheProduct) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(110);
  MatmulCase linear{.batch = {}, .M = 512, .N = 768, .K = 384, .tb = true, .bias = true};
  linear.in = linear.out = linear.bias_dt = DType::bf16;
  // 4 output tiles over a long reduction (split-K territory); drawn and
  // checked on the host once per candidate, so K stays at 16384.
  MatmulCase long_k{.batch = {}, .M = 256, .N = 256, .K = 16384, .tb = true};
  long_k.in = long_k.out = DType::bf16;
  ops::init_device(gpu());  // the workspace below is the first allocation on the GPU of a one-test process
  const Tensor workspace =
      Tensor::empty(Shape{int64_t(64) << 18}, DType::u32, gpu(), MemCategory::workspace);  // 64 MiB
  for (const MatmulCase& c : {linear, long_k}) {
    const cuda::MatmulWorkspaceScope scope(workspace);
    for (int n = 0; n < cuda::kMatmulCandidates; ++n) {
      const cuda::MatmulCandidateScope candidate(n);
      SCOPED_TRACE(c.str() + ", 64 MiB of workspace, candidate " + std::to_string(n));
      try {
        check_matmul(c, rng);
      } catch (const Error& e) {  // the list ends
        EXPECT_NE(std::string(e.what()).find("so there is no candidate"), std::string::npos) << e.what();
        EXPECT_GE(n, 1) << "no candidate at all";
        break;
      }
    }
  }
  check_matmul(long_k, rng);  // the device's workspace again, the scope gone
}

// With ZT_CUDA_MATMUL_TUNE=1 (the ctest entry gpu.matmul_tuned runs these
// suites with it), a new product times its ranked candidates on its first
// call, keeps the fastest, and the result still matches the CPU; the other
// cases of the suites check the tuned products of every kind.
TEST(CudaMatmul, TuningTimesTheRankedCandidates) {
  ZT_REQUIRE_GPU();
  const char* tune = std::getenv("ZT_CUDA_MATMUL_TUNE");
  if (!tune || std::string(tune) != "1") GTEST_SKIP() << "ZT_CUDA_MATMUL_TUNE is not 1 (ctest's gpu.matmul_tuned sets it)";
  auto rng = make_rng(109);
  const int64_t before = cuda::tuned_matmul_plans();
  MatmulCase c{.batch = {}, .M = 1024, .N = 768, .K = 2304, .tb = true};  // a shape no other case uses
  c.in = DType::bf16, c.out = DType::f32;
  check_matmul(c, rng);
  EXPECT_EQ(cuda::tuned_matmul_plans(), before + 1) << "no candidate was timed";
  // Accumulating (another shape, so another plan): the timing launches go to
  // a scratch, and out gets exactly one product added.
  MatmulCase acc = c;
  acc.K = 2048, acc.beta = 1.0f;
  check_matmul(acc, rng);
  EXPECT_EQ(cuda::tuned_matmul_plans(), before + 2);
}

// Without ZT_CUDA_MATMUL_TUNE, products tune exactly while bitwise repetition
// is not asked for (DeterminismScope(false), train.deterministic =
// false), and a deterministic product never takes a tuned plan.
TEST(CudaMatmul, TuningFollowsTheDeterminismSwitch) {
  ZT_REQUIRE_GPU();
  if (const char* tune = std::getenv("ZT_CUDA_MATMUL_TUNE"); tune && *tune)
    GTEST_SKIP() << "ZT_CUDA_MATMUL_TUNE is set: it overrides the switch";
  auto rng = make_rng(113);
  MatmulCase c{.batch = {}, .M = 1024, .N = 768, .K = 1792, .tb = true};  // a shape no other case uses
  c.in = DType::bf16, c.out = DType::f32;
  const int64_t before = cuda::tuned_matmul_plans();
  {
    const DeterminismScope exact(true);
    check_matmul(c, rng);
  }
  EXPECT_EQ(cuda::tuned_matmul_plans(), before) << "tuned while deterministic";
  {
    const DeterminismScope fast(false);
    check_matmul(c, rng);
  }
  EXPECT_EQ(cuda::tuned_matmul_plans(), before + 1) << "not tuned with determinism off";
  {
    const DeterminismScope exact(true);  // the untuned plan again: nothing timed
    check_matmul(c, rng);
  }
  EXPECT_EQ(cuda::tuned_matmul_plans(), before + 1);
}

// With ZT_CUDA_MATMUL_PLANS (the ctest entry gpu.matmul_switches sets it, to
// a file it removes first), a tuned product records its choice, and the same
// product run deterministically takes it: the algorithm the tuned run kept,
// from an untuned plan, counted as replayed (without the count the check of
// the algorithm could pass by chance: with ZT_CUDA_MATMUL_CUBLAS=1, as that
// entry sets, an unreplayed product runs cuBLAS's GEMM, which tuning may
// have kept too).
TEST(CudaMatmul, DeterministicRunsTakeTheRecordedTunedChoice) {
  ZT_REQUIRE_GPU();
  const char* path = std::getenv("ZT_CUDA_MATMUL_PLANS");
  if (!path || !*path) GTEST_SKIP() << "ZT_CUDA_MATMUL_PLANS is unset (ctest's gpu.matmul_switches sets it)";
  if (const char* tune = std::getenv("ZT_CUDA_MATMUL_TUNE"); tune && *tune)
    GTEST_SKIP() << "ZT_CUDA_MATMUL_TUNE is set: it overrides the switch";
  auto rng = make_rng(115);
  MatmulCase c{.batch = {}, .M = 1024, .N = 640, .K = 1536, .tb = true};  // a shape no other case uses
  c.in = DType::bf16, c.out = DType::f32;
  std::string tuned;
  {
    const DeterminismScope fast(false);
    const int64_t before = cuda::tuned_matmul_plans();
    check_matmul(c, rng);
    ASSERT_EQ(cuda::tuned_matmul_plans(), before + 1);
    tuned = cuda::last_matmul_algorithm();
  }
  std::ifstream in(path);
  int lines = 0;
  for (std::string line; std::getline(in, line);) lines += line.find(" M 1024 N 640 K 1536 ") != std::string::npos;
  EXPECT_EQ(lines, 1) << "the tuned product's line in " << path;
  {
    const DeterminismScope exact(true);
    const int64_t before = cuda::tuned_matmul_plans(), replayed = cuda::replayed_matmul_plans();
    check_matmul(c, rng);
    EXPECT_EQ(cuda::tuned_matmul_plans(), before) << "a deterministic product tuned";
    EXPECT_EQ(cuda::replayed_matmul_plans(), replayed + 1) << "the recorded choice was not looked up and taken";
    EXPECT_EQ(cuda::last_matmul_algorithm(), tuned) << "not the recorded choice";
  }
}

TEST(CudaMatmul, CandidateScopeNamesItsRange) {  // no GPU needed
  for (int n : {-1, cuda::kCublasCandidate + 1}) {
    try {
      const cuda::MatmulCandidateScope scope(n);
      ADD_FAILURE() << "candidate " << n << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("outside 0.." + std::to_string(cuda::kCublasCandidate)),
                std::string::npos)
          << e.what();
    }
  }
}

// With ZT_CUDA_MATMUL_CUBLAS=1 (the ctest entry gpu.matmul_switches runs these
// suites with it), a product without an epilogue runs through cuBLAS's own
// GEMM and one with the bias epilogue through cuBLASLt; both match the CPU,
// and the suites' other cases check the rest. Tuning, when on, chooses instead.
TEST(CudaMatmul, CublasSwitchRunsThePlainProducts) {
  ZT_REQUIRE_GPU();
  const char* on = std::getenv("ZT_CUDA_MATMUL_CUBLAS");
  if (!on || std::string(on) != "1")
    GTEST_SKIP() << "ZT_CUDA_MATMUL_CUBLAS is not 1 (ctest's gpu.matmul_switches sets it)";
  const DeterminismScope exact(true);  // no tuning (unless ZT_CUDA_MATMUL_TUNE=1 forces it)
  if (const char* tune = std::getenv("ZT_CUDA_MATMUL_TUNE"); tune && std::string(tune) == "1")
    GTEST_SKIP() << "ZT_CUDA_MATMUL_TUNE=1: tuning chooses";
  auto rng = make_rng(114);
  MatmulCase plain{.batch = {}, .M = 256, .N = 384, .K = 512, .tb = true};
  plain.in = plain.out = DType::bf16;
  int64_t before = cuda::cublas_matmul_launches();
  check_matmul(plain, rng);
  EXPECT_EQ(cuda::cublas_matmul_launches(), before + 1);
  EXPECT_EQ(cuda::last_matmul_algorithm(), "cublas");
  MatmulCase linear = plain;
  linear.bias = true, linear.bias_dt = DType::bf16;
  before = cuda::cublas_matmul_launches();
  const int64_t prefilled = cuda::prefilled_matmul_launches();
  check_matmul(linear, rng);
  // Unless no algorithm took the bias epilogue: then the prefill path's own
  // plain product may run on cuBLAS's GEMM.
  if (cuda::prefilled_matmul_launches() == prefilled) {
    EXPECT_EQ(cuda::cublas_matmul_launches(), before) << "a product with the bias epilogue went to cuBLAS's GEMM";
    EXPECT_EQ(cuda::last_matmul_algorithm().rfind("algo ", 0), 0u) << cuda::last_matmul_algorithm();
  }
}

TEST(CudaMatmul, MeasuredBf16GemmThroughput) {
  ZT_REQUIRE_GPU();
  const double tflops = cuda::measure_bf16_gemm_tflops(gpu());
  std::printf("measured bf16 GEMM (8192^3): %.1f TFLOP/s\n", tflops);
  EXPECT_TRUE(std::isfinite(tflops));
  EXPECT_GT(tflops, 1.0);
  EXPECT_LT(tflops, 1e5);
}

// --- linear -------------------------------------------------------------------

TEST(CudaLinear, ForwardMatchesCpu) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(201);
  const std::vector<std::vector<int64_t>> xshapes = {{2, 5, 37}, {1, 37}, {300, 37}};
  for (const auto& xs : xshapes)
    for (const auto& dc : kCombos)
      for (int bias = 0; bias < 3; ++bias) {  // none, f32, out's dtype
        SCOPED_TRACE(std::to_string(xs.size()) + "-D x, " + std::string(dtype_name(dc.in)) + "->" +
                     std::string(dtype_name(dc.out)) + " bias " + std::to_string(bias) + " seed " +
                     std::to_string(test::test_seed()));
        const int64_t C = xs.back(), OC = 53;
        Shape ys(xs.begin(), xs.end());
        ys[-1] = OC;
        const Tensor x = random_tensor(Shape(xs.begin(), xs.end()), dc.in, rng);
        const Tensor w = random_tensor(Shape{OC, C}, dc.in, rng);
        const Tensor b = bias == 0 ? Tensor() : random_tensor(Shape{OC}, bias == 1 ? DType::f32 : dc.out, rng);
        Tensor ref = Tensor::empty(ys, DType::f32);
        ops::linear_forward(ref, as_f32(x), as_f32(w), b.defined() ? as_f32(b) : Tensor());
        const Tensor y = gpu_poisoned(ys, dc.out);
        ops::linear_forward(y, to_gpu(x), to_gpu(w), b.defined() ? to_gpu(b) : Tensor());
        EXPECT_LE(max_rel_error(to_host(y), to_f64(ref)), tolerance(dc.in, dc.out));
      }
}

// y = residual + x W^T + b with the residual as the product's C apart from
// its D (a block's residual connection): GPT-2's bf16 shapes with the bias
// epilogue, Llama's without, odd f32 and bf16 ones, a residual view that is
// only element-aligned (the heuristic plans for it, or the f32 prefill path
// runs), an empty reduction, and tuned (the timing launches write y, never
// the residual). The residual must come out as it went in; cuBLAS's own
// GEMM (no D apart from C) must not run it even under ZT_CUDA_MATMUL_CUBLAS
// (the prefill path's own product, plain, may go there). Whether the models'
// shapes took the prefill path instead (a pass of its own over y: the fusion
// would not pay) is printed, not failed: it is speed, which the kernel
// bench's forward_residual rows weigh.
TEST(CudaLinear, ForwardAddsTheResidual) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(206);
  struct Case {
    int64_t N, C, OC;
    DType in, out;
    bool bias;
    int64_t misalign;  // element offset of the residual's view
    bool tuned;
    bool model = false;  // a model's product: cuBLASLt should take the residual as C
  };
  const Case cases[] = {
      {1024, 768, 768, DType::bf16, DType::bf16, true, 0, false, true},     // GPT-2's attn.proj
      {1024, 3072, 768, DType::bf16, DType::bf16, true, 0, false, true},    // GPT-2's mlp.out
      {512, 8192, 2048, DType::bf16, DType::bf16, false, 0, false, true},   // Llama's mlp.out
      {300, 37, 53, DType::bf16, DType::bf16, true, 0, false},        // odd
      {300, 37, 53, DType::f32, DType::f32, true, 0, false},
      {300, 37, 53, DType::bf16, DType::f32, false, 0, false},
      {256, 96, 64, DType::bf16, DType::bf16, true, 1, false},        // misaligned residual
      {256, 96, 64, DType::f32, DType::f32, false, 1, false},
      {7, 0, 24, DType::bf16, DType::bf16, true, 0, false},           // empty reduction: residual + b
      {1024, 1280, 768, DType::bf16, DType::bf16, true, 0, true, true},  // tuned (a shape no other case uses)
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("N " + std::to_string(c.N) + " C " + std::to_string(c.C) + " OC " + std::to_string(c.OC) + " " +
                 std::string(dtype_name(c.in)) + "->" + std::string(dtype_name(c.out)) + (c.bias ? " bias" : "") +
                 (c.misalign ? " misaligned" : "") + (c.tuned ? " tuned" : "") + " seed " +
                 std::to_string(test::test_seed()));
    const Tensor x = random_tensor(Shape{c.N, c.C}, c.in, rng);
    const Tensor w = random_tensor(Shape{c.OC, c.C}, c.in, rng);
    const Tensor b = c.bias ? random_tensor(Shape{c.OC}, c.out, rng) : Tensor();
    const Tensor residual = random_tensor(Shape{c.N, c.OC}, c.out, rng);
    Tensor ref = Tensor::empty(Shape{c.N, c.OC}, DType::f32);
    ops::linear_forward(ref, as_f32(x), as_f32(w), b.defined() ? as_f32(b) : Tensor(), as_f32(residual));
    const Tensor y = gpu_poisoned(Shape{c.N, c.OC}, c.out);
    const Tensor residual_gpu = to_gpu_at(residual, c.misalign);
    const int64_t cublas_before = cuda::cublas_matmul_launches(), tuned_before = cuda::tuned_matmul_plans(),
                  prefilled_before = cuda::prefilled_matmul_launches();
    {
      const DeterminismScope mode(!c.tuned);
      ops::linear_forward(y, to_gpu(x), to_gpu(w), b.defined() ? to_gpu(b) : Tensor(), residual_gpu);
    }
    EXPECT_LE(max_rel_error(to_host(y), to_f64(ref)), tolerance(c.in, c.out));
    EXPECT_EQ(to_f64(to_host(residual_gpu)), to_f64(residual)) << "the residual was written";
    const bool prefilled = cuda::prefilled_matmul_launches() != prefilled_before;
    if (!prefilled) {
      EXPECT_EQ(cuda::cublas_matmul_launches(), cublas_before) << "cuBLAS's GEMM has no D apart from C";
    }
    if (c.model && prefilled)
      std::printf("[   INFO   ] cuBLASLt took no residual as C for a model's product (N %lld C %lld OC %lld%s): "
                  "the prefill pass ran\n",
                  (long long)c.N, (long long)c.C, (long long)c.OC, c.bias ? ", bias" : "");
    if (c.tuned && !std::getenv("ZT_CUDA_MATMUL_TUNE")) {
      // The prefill pass's plain product always times (cuBLAS's GEMM beside
      // cuBLASLt's); the residual's product once, unless it is offered a
      // single algorithm that writes D apart from C (no candidate 1).
      const int64_t timed = cuda::tuned_matmul_plans() - tuned_before;
      if (prefilled) {
        EXPECT_GE(timed, 1) << "the prefill pass's product timed no candidate";
      } else if (timed == 0) {
        const cuda::MatmulCandidateScope second(1);
        const std::string e = test::error_of([&] {
          ops::linear_forward(y, to_gpu(x), to_gpu(w), b.defined() ? to_gpu(b) : Tensor(), residual_gpu);
        });
        EXPECT_NE(e.find("so there is no candidate"), std::string::npos) << "the tuned product timed none of its "
                                                                            "algorithms: " << e;
      } else {
        EXPECT_EQ(timed, 1) << "the tuned residual product was timed more than once";
      }
    }
  }
}

struct BackwardCase {
  int64_t N, C, OC;
  DType in, grad;               // dy/x/w dtype; dx/dw/db dtype
  bool dx = true, dw = true, db = true;  // which outputs to compute
  bool overwrite = false;                // dw, db written over NaN (GradWrite::overwrite), not added into
};

void check_backward(const BackwardCase& c, std::mt19937_64& rng) {
  const std::string what = "N " + std::to_string(c.N) + " C " + std::to_string(c.C) + " OC " + std::to_string(c.OC) +
                           " " + std::string(dtype_name(c.in)) + " grads " + std::string(dtype_name(c.grad)) +
                           (c.dx ? " dx" : "") + (c.dw ? " dw" : "") + (c.db ? " db" : "") +
                           (c.overwrite ? " overwritten" : "") + " seed " +
                           std::to_string(test::test_seed());
  SCOPED_TRACE(what);
  const Tensor dy = random_tensor(Shape{c.N, c.OC}, c.in, rng);
  const Tensor x = random_tensor(Shape{c.N, c.C}, c.in, rng);
  const Tensor w = random_tensor(Shape{c.OC, c.C}, c.in, rng);
  const Tensor dw0 = random_tensor(Shape{c.OC, c.C}, c.grad, rng);
  const Tensor db0 = random_tensor(Shape{c.OC}, c.grad, rng);

  Tensor dx_ref, dw_ref, db_ref;
  if (c.dx) {
    dx_ref = Tensor::empty(Shape{c.N, c.C}, DType::f32);
    poison(dx_ref);
  }
  if (c.dw) dw_ref = as_f32(dw0);
  if (c.db) db_ref = as_f32(db0);
  const ops::GradWrite write = c.overwrite ? ops::GradWrite::overwrite : ops::GradWrite::accumulate;
  ops::linear_backward(dx_ref, dw_ref, db_ref, as_f32(dy), as_f32(x), as_f32(w), write);

  const Tensor dx = c.dx ? gpu_poisoned(Shape{c.N, c.C}, c.grad) : Tensor();
  const Tensor dw = !c.dw ? Tensor() : c.overwrite ? gpu_poisoned(dw0.shape(), c.grad) : to_gpu(dw0);
  const Tensor db = !c.db ? Tensor() : c.overwrite ? gpu_poisoned(db0.shape(), c.grad) : to_gpu(db0);
  ops::linear_backward(dx, dw, db, to_gpu(dy), to_gpu(x), to_gpu(w), write);
  const double tol = tolerance(c.in, c.grad);
  if (c.dx) {
    EXPECT_LE(max_rel_error(to_host(dx), to_f64(dx_ref)), tol) << "dx";
  }
  if (c.dw) {
    EXPECT_LE(max_rel_error(to_host(dw), to_f64(dw_ref)), tol) << "dw";
  }
  if (c.db) {
    EXPECT_LE(max_rel_error(to_host(db), to_f64(db_ref)), tol) << "db";
  }
}

TEST(CudaLinear, BackwardMatchesCpu) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(202);
  const int64_t shapes[][3] = {{1, 29, 53}, {37, 29, 53}, {300, 29, 53}, {5000, 40, 33}, {4096, 256, 384}};
  for (const auto& s : shapes)
    for (const auto& dc : kCombos) check_backward({s[0], s[1], s[2], dc.in, dc.out}, rng);
}

// The chunk rule of weight gradients (a host function: runs without a GPU),
// checked against the model worked by hand. Scores are whole waves' occupancy
// over 1 + 4 x chunks x 256 / rows; e.g. GPT-2's 768 x 768 (36 tiles) on
// 132 SMs over 16384 rows: 2 chunks and 8 tie at 48/99 (the fewer). From
// 32768 rows on, one product (measured: cuBLASLt splits the reduction).
TEST(CudaLinear, WeightGradientChunksFollowTheOccupancyModel) {
  EXPECT_EQ(cuda::wgrad_chunks_for(768, 768, 16384, 132), 2);  // 2 and 8 tie at 48/99: the fewer
  EXPECT_EQ(cuda::wgrad_chunks_for(768, 768, 12288, 132), 3);  // rows of 3 x 4096: 2, 3, 4 or 6 chunks divide
  EXPECT_EQ(cuda::wgrad_chunks_for(768, 768, 20480, 132), 10);  // 360 of 396 tiles, partials 0.5: 0.606
  EXPECT_EQ(cuda::wgrad_chunks_for(768, 768, 20480, 108), 5);   // an A100's SMs: 180 of 216, partials 0.25: 0.667
  EXPECT_EQ(cuda::wgrad_chunks_for(768, 768, 131072, 132), 1);   // GPT-2 at micro-batch 128: one product
  EXPECT_EQ(cuda::wgrad_chunks_for(768, 768, 32768, 132), 1);    // the first row count of one product
  EXPECT_EQ(cuda::wgrad_chunks_for(512, 2048, 32768, 132), 1);   // Llama 1B's k and v at micro-batch 32
  EXPECT_EQ(cuda::wgrad_chunks_for(512, 2048, 16384, 132), 2);   // the same at micro-batch 16
  EXPECT_EQ(cuda::wgrad_chunks_for(2048, 2048, 16384, 132), 1);  // 256 tiles: cuBLASLt alone
  EXPECT_EQ(cuda::wgrad_chunks_for(3072, 768, 16384, 132), 1);   // 144 tiles
  EXPECT_EQ(cuda::wgrad_chunks_for(768, 768, 2048, 132), 1);     // too few rows for two chunks
  EXPECT_TRUE(cuda::wgrad_chunks_usable(1, 7));
  EXPECT_TRUE(cuda::wgrad_chunks_usable(3, 12288));
  EXPECT_FALSE(cuda::wgrad_chunks_usable(3, 12289));   // unequal
  EXPECT_FALSE(cuda::wgrad_chunks_usable(16, 16384));  // 1024 rows each
  EXPECT_FALSE(cuda::wgrad_chunks_usable(2, 4100));    // 2050 rows: not 8-aligned
}

// A weight gradient with few output tiles over many rows runs as row-chunk
// products whose f32 partials are added in chunk order (matmul.h): the same
// checks against the CPU, and the same bits on a second run.
TEST(CudaLinear, ChunkedWeightGradientMatchesCpuAndRepeats) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(205);
  const int64_t N = 16384, C = 192, OC = 128;
  ASSERT_GT(cuda::wgrad_row_chunks(OC, C, N, Device::cuda(0)), 1) << "the shape must take the chunked path";
  for (const auto& dc : kCombos) {
    check_backward({N, C, OC, dc.in, dc.out}, rng);
    // Every chunk count the bench sweeps against the CPU's dW.
    const Tensor dy_h = random_tensor(Shape{N, OC}, dc.in, rng), x_h = random_tensor(Shape{N, C}, dc.in, rng);
    const Tensor dw0_h = random_tensor(Shape{OC, C}, dc.out, rng);
    Tensor ref = as_f32(dw0_h);
    ops::linear_backward(Tensor(), ref, Tensor(), as_f32(dy_h), as_f32(x_h), as_f32(random_tensor(Shape{OC, C}, dc.in, rng)));
    for (const int64_t chunks : {1, 2, 4, 8}) {
      const Tensor got = to_gpu(dw0_h);
      cuda::weight_gradient(got, to_gpu(dy_h), to_gpu(x_h), chunks);
      EXPECT_LE(max_rel_error(to_host(got), to_f64(ref)), tolerance(dc.in, dc.out)) << chunks << " chunks";
    }
    const Tensor dy = to_gpu(random_tensor(Shape{N, OC}, dc.in, rng));
    const Tensor x = to_gpu(random_tensor(Shape{N, C}, dc.in, rng));
    const Tensor w = to_gpu(random_tensor(Shape{OC, C}, dc.in, rng));
    const Tensor dw0 = random_tensor(Shape{OC, C}, dc.out, rng);
    Tensor first, second;
    for (Tensor* result : {&first, &second}) {
      const Tensor dw = to_gpu(dw0);
      Allocator& alloc = allocator_for(dw.device());
      const int64_t before = alloc.stats().current(MemCategory::workspace);
      alloc.reset_window_peak();
      ops::linear_backward(Tensor(), dw, Tensor(), dy, x, w);
      // The partials are what the memory plan counts (the second call: the
      // first may also time candidates under ZT_CUDA_MATMUL_TUNE).
      if (result == &second) {
        EXPECT_EQ(alloc.stats().window_peak(MemCategory::workspace) - before,
                  cuda::linear_backward_workspace_bytes(OC, C, N, false, dw.device()))
            << dtype_name(dc.in);
      }
      *result = to_host(dw);
    }
    EXPECT_EQ(std::memcmp(first.data_ptr(), second.data_ptr(), first.nbytes()), 0) << dtype_name(dc.in);
  }
}

// A step's first write of a weight gradient (GradWrite::overwrite): dw and db
// written over NaN, never read - by one product (beta 0), by row chunks
// (their partials' sum written), and the bias's column sums - against the
// CPU's.
TEST(CudaLinear, BackwardOverwritesWeightGradientsWithoutReadingThem) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(206);
  ASSERT_GT(cuda::wgrad_row_chunks(128, 192, 16384, Device::cuda(0)), 1) << "the last shape must take row chunks";
  const int64_t shapes[][3] = {{37, 29, 53}, {4096, 256, 384}, {16384, 192, 128}};
  for (const auto& s : shapes)
    for (const auto& dc : kCombos) {
      BackwardCase c{s[0], s[1], s[2], dc.in, dc.out};
      c.overwrite = true;
      check_backward(c, rng);
    }
}

// The bias gradient from the weight gradient's own product (the BGRADB
// epilogue: cuda::weight_gradient_with_bias): dw and db against the CPU's,
// accumulated and overwritten (over NaN), db f32 and bf16, and the same bits
// on a second run. GPT-2's bf16 shapes must take it (why it exists); other
// cases may find no algorithm: false, nothing launched, nothing written.
TEST(CudaLinear, BiasGradientFromTheWeightGradientsProduct) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(207);
  struct Case {
    int64_t N, C, OC;
    bool must;  // in bf16
  };
  int taken = 0;
  for (const Case s : {Case{4096, 768, 3072, true}, Case{4096, 3072, 768, true}, Case{37, 29, 53, false},
                       Case{300, 40, 33, false}})
    for (const DType in : {DType::bf16, DType::f32})
      for (const DType db_type : {DType::f32, DType::bf16})
        for (const bool overwrite : {false, true}) {
          SCOPED_TRACE("N " + std::to_string(s.N) + " C " + std::to_string(s.C) + " OC " + std::to_string(s.OC) +
                       " " + std::string(dtype_name(in)) + ", db " + std::string(dtype_name(db_type)) +
                       (overwrite ? ", overwritten" : ", accumulated") + " seed " + std::to_string(test::test_seed()));
          const Tensor dy_h = random_tensor(Shape{s.N, s.OC}, in, rng), x_h = random_tensor(Shape{s.N, s.C}, in, rng);
          const Tensor dw0 = random_tensor(Shape{s.OC, s.C}, DType::f32, rng);
          const Tensor db0 = random_tensor(Shape{s.OC}, db_type, rng);
          Tensor dw_ref = as_f32(dw0), db_ref = as_f32(db0);
          const Tensor w_unread = Tensor::empty(Shape{s.OC, s.C}, DType::f32);  // no dx asked for
          ops::linear_backward(Tensor(), dw_ref, db_ref, as_f32(dy_h), as_f32(x_h), w_unread,
                               overwrite ? ops::GradWrite::overwrite : ops::GradWrite::accumulate);
          const Tensor dy = to_gpu(dy_h), x = to_gpu(x_h);
          Tensor runs[2][2];  // dw, db of two runs
          bool took = false;
          for (auto& run : runs) {
            const Tensor dw = overwrite ? gpu_poisoned(dw0.shape(), DType::f32) : to_gpu(dw0);
            const Tensor db = overwrite ? gpu_poisoned(db0.shape(), db_type) : to_gpu(db0);
            took = cuda::weight_gradient_with_bias(dw, db, dy, x, overwrite);
            run[0] = to_host(dw), run[1] = to_host(db);
            if (!took) break;
          }
          if (!took) {
            // Overwriting (a step's first write, the bench's every write) must
            // take it; accumulating (beta = 1) may be refused at launch, as
            // launch_plan allows for: then say so.
            EXPECT_FALSE(s.must && in == DType::bf16 && overwrite)
                << "GPT-2's shape found no algorithm with the epilogue";
            if (s.must && in == DType::bf16 && !overwrite)
              std::printf("[   INFO   ] BGRADB refused accumulating into dW (beta = 1): N %lld C %lld OC %lld, db %s\n",
                          (long long)s.N, (long long)s.C, (long long)s.OC, std::string(dtype_name(db_type)).c_str());
            if (!overwrite) {  // nothing written
              EXPECT_EQ(std::memcmp(runs[0][0].data_ptr(), dw0.data_ptr(), dw0.nbytes()), 0);
              EXPECT_EQ(std::memcmp(runs[0][1].data_ptr(), db0.data_ptr(), db0.nbytes()), 0);
            }
            continue;
          }
          ++taken;
          EXPECT_LE(max_rel_error(runs[0][0], to_f64(dw_ref)), tolerance(in, DType::f32)) << "dw";
          EXPECT_LE(max_rel_error(runs[0][1], to_f64(db_ref)), tolerance(in, db_type)) << "db";
          for (int i = 0; i < 2; ++i)
            EXPECT_EQ(std::memcmp(runs[0][i].data_ptr(), runs[1][i].data_ptr(), runs[0][i].nbytes()), 0)
                << (i == 0 ? "dw" : "db") << " differs between two runs";
        }
  std::printf("the BGRADB epilogue took %d of 32 cases\n", taken);
  // An overwritten f32 db that is not 16-byte aligned (4 bytes into its
  // buffer) takes the sums through a scratch, not straight from the epilogue:
  // the same bits as an aligned db, and the float before it untouched.
  const int64_t N = 4096, C = 768, OC = 3072;
  const Tensor dy = to_gpu(random_tensor(Shape{N, OC}, DType::bf16, rng));
  const Tensor x = to_gpu(random_tensor(Shape{N, C}, DType::bf16, rng));
  const Tensor aligned_db = gpu_poisoned(Shape{OC}, DType::f32), buffer = gpu_poisoned(Shape{OC + 1}, DType::f32);
  const Tensor before = to_host(buffer), shifted_db = buffer.flat_view(1, Shape{OC});
  const bool aligned_took =
      cuda::weight_gradient_with_bias(gpu_poisoned(Shape{OC, C}, DType::f32), aligned_db, dy, x, true);
  const bool shifted_took =
      cuda::weight_gradient_with_bias(gpu_poisoned(Shape{OC, C}, DType::f32), shifted_db, dy, x, true);
  ASSERT_TRUE(aligned_took && shifted_took) << "GPT-2's shape found no algorithm with the epilogue";
  EXPECT_EQ(test::values_of(shifted_db), test::values_of(aligned_db)) << "db 4 bytes off its alignment";
  EXPECT_EQ(std::memcmp(to_host(buffer).data_ptr(), before.data_ptr(), sizeof(float)), 0) << "the float before db";
}

TEST(CudaLinear, BackwardSkipsUndefinedOutputs) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(203);
  for (int mask = 0; mask < 8; ++mask)
    for (const auto& dc : kCombos) {
      BackwardCase c{300, 29, 53, dc.in, dc.out};
      c.dx = mask & 1, c.dw = mask & 2, c.db = mask & 4;
      check_backward(c, rng);
    }
}

TEST(CudaLinear, BiasGradIsDeterministic) {
  ZT_REQUIRE_GPU();
  auto rng = make_rng(204);
  for (const auto& dc : kCombos) {
    SCOPED_TRACE(std::string(dtype_name(dc.in)) + " -> " + std::string(dtype_name(dc.out)));
    const int64_t N = 5000, OC = 300, C = 8;
    const Tensor dy = to_gpu(random_tensor(Shape{N, OC}, dc.in, rng));
    const Tensor x = to_gpu(random_tensor(Shape{N, C}, dc.in, rng));
    const Tensor w = to_gpu(random_tensor(Shape{OC, C}, dc.in, rng));
    const Tensor db0 = random_tensor(Shape{OC}, dc.out, rng);
    Tensor first, second;
    for (Tensor* result : {&first, &second}) {
      const Tensor db = to_gpu(db0);
      ops::linear_backward(Tensor(), Tensor(), db, dy, x, w);
      *result = to_host(db);
    }
    EXPECT_EQ(std::memcmp(first.data_ptr(), second.data_ptr(), first.nbytes()), 0);
  }
}

}  // namespace
}  // namespace zt
