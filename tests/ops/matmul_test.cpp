// Tests for ops::matmul, ops::linear_forward and ops::linear_backward against
// float64 references.
//
// Tolerance: a float64 reference of the exact (already rounded) input values,
// and per element the classic floating-point bound for an f32 dot product of
// length K plus the alpha/beta/bias roundings, in any summation order:
//   |got - ref| <= (K + 4) * 2^-24 * mag,   mag = |alpha| sum_k |a_mk b_kn| + |beta out| + |bias|
// A bf16 output is then rounded to nearest even once, adding at most 2^-8 of
// the value: tol_bf16 = tol + 2^-8 * (|ref| + tol). This is a worst-case bound
// (real errors are far below it) yet still orders of magnitude below the error
// of any wrong term, and it holds for near-zero results where a relative
// tolerance would not.
#include "ops/matmul.h"

#include <cstdint>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/matmul.h"
#include "test_util.h"

namespace zt {
namespace {

using test::make_rng;
using test::poison;
using test::random_tensor;
using test::to_f64;

constexpr double kU = 0x1p-24;  // unit roundoff of f32

// Element-wise check against the bound described at the top of the file.
::testing::AssertionResult close_to_bound(const Tensor& got, const std::vector<double>& ref,
                                          const std::vector<double>& mag, int64_t K) {
  if (size_t(got.numel()) != ref.size() || ref.size() != mag.size())
    return ::testing::AssertionFailure() << "size mismatch: got " << got.numel() << " ref " << ref.size();
  const bool bf = got.dtype() == DType::bf16;
  const std::vector<double> g = to_f64(got);
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double acc = double(K + 4) * kU * mag[i];
    const double tol = acc + (bf ? 0x1p-8 * (std::fabs(ref[i]) + acc) : 0.0) + 1e-37;
    const double err = std::fabs(g[i] - ref[i]);
    if (!(std::isfinite(g[i]) && err <= tol)) {
      ++bad;
      const double ratio = std::isfinite(g[i]) ? err / tol : INFINITY;
      if (worst < 0 || ratio > worst_ratio) worst = int64_t(i), worst_ratio = ratio;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << got.numel() << " elements of " << got.str()
                                       << " outside the bound; worst at flat index " << worst << ": got "
                                       << g[size_t(worst)] << ", reference " << ref[size_t(worst)] << ", magnitude "
                                       << mag[size_t(worst)] << " (seed " << test::test_seed() << ")";
}

// --- matmul reference -------------------------------------------------------

struct MatmulCase {
  std::vector<int64_t> batch;  // batch dims of a and out
  int64_t M, N, K;
  bool ta = false, tb = false;
  bool b_shared = false;  // b is 2-D
  float alpha = 1.0f, beta = 0.0f;
  bool bias = false;
  DType in = DType::f32, out = DType::f32, bias_dt = DType::f32;

  std::string str() const {
    std::string s = "batch(";
    for (auto d : batch) s += std::to_string(d) + ",";
    return s + ") M" + std::to_string(M) + " N" + std::to_string(N) + " K" + std::to_string(K) +
           (ta ? " ta" : "") + (tb ? " tb" : "") + (b_shared ? " shared-b" : "") + " alpha " +
           std::to_string(alpha) + " beta " + std::to_string(beta) + (bias ? " bias " : " ") +
           std::string(dtype_name(in)) + "->" + std::string(dtype_name(out)) +
           (bias ? " bias " + std::string(dtype_name(bias_dt)) : "");
  }
};

Shape make_shape(const std::vector<int64_t>& lead, int64_t r, int64_t c) {
  Shape s(lead.begin(), lead.end());
  s.push_back(r);
  s.push_back(c);
  return s;
}

// Fills ref/mag for out = alpha op(a) op(b) + beta prev + bias.
void matmul_ref(const MatmulCase& c, const std::vector<double>& a, const std::vector<double>& b,
                const std::vector<double>& prev, const std::vector<double>& bias, std::vector<double>& ref,
                std::vector<double>& mag) {
  int64_t batch = 1;
  for (auto d : c.batch) batch *= d;
  const int64_t M = c.M, N = c.N, K = c.K;
  ref.assign(size_t(batch * M * N), 0.0);
  mag.assign(ref.size(), 0.0);
  for (int64_t i = 0; i < batch; ++i) {
    const double* A = a.data() + i * M * K;
    const double* B = b.data() + (c.b_shared ? 0 : i * K * N);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double s = 0, sm = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double av = c.ta ? A[k * M + m] : A[m * K + k];
          const double bv = c.tb ? B[n * K + k] : B[k * N + n];
          s += av * bv;
          sm += std::fabs(av * bv);
        }
        const size_t o = size_t((i * M + m) * N + n);
        double r = double(c.alpha) * s, mg = std::fabs(double(c.alpha)) * sm;
        if (c.beta != 0.0f) r += double(c.beta) * prev[o], mg += std::fabs(double(c.beta) * prev[o]);
        if (c.bias) r += bias[size_t(n)], mg += std::fabs(bias[size_t(n)]);
        ref[o] = r;
        mag[o] = mg;
      }
    }
  }
}

void check_matmul(const MatmulCase& c, std::mt19937_64& rng) {
  SCOPED_TRACE(c.str());
  const Shape as = c.ta ? make_shape(c.batch, c.K, c.M) : make_shape(c.batch, c.M, c.K);
  const std::vector<int64_t> none;
  const Shape bs = make_shape(c.b_shared ? none : c.batch, c.tb ? c.N : c.K, c.tb ? c.K : c.N);
  const Shape os = make_shape(c.batch, c.M, c.N);
  const Tensor a = random_tensor(as, c.in, rng);
  const Tensor b = random_tensor(bs, c.in, rng);
  Tensor out;
  if (c.beta != 0.0f) {
    out = random_tensor(os, c.out, rng);
  } else {
    out = Tensor::empty(os, c.out);
    poison(out);  // beta = 0 must never read out
  }
  const std::vector<double> prev = to_f64(out);
  Tensor bias;
  if (c.bias) bias = random_tensor(Shape{c.N}, c.bias_dt, rng);
  ops::matmul(out, a, b, c.ta, c.tb, c.alpha, c.beta, bias);
  std::vector<double> ref, mag;
  matmul_ref(c, to_f64(a), to_f64(b), prev, c.bias ? to_f64(bias) : std::vector<double>(), ref, mag);
  EXPECT_TRUE(close_to_bound(out, ref, mag, c.K));
}

struct DtypeCombo {
  DType in, out;
};
const DtypeCombo kCombos[] = {{DType::f32, DType::f32}, {DType::bf16, DType::f32}, {DType::bf16, DType::bf16}};

// Sets the matmul scratch budget for a scope (to force panelling in small tests).
struct ScopedBudget {
  size_t old;
  explicit ScopedBudget(size_t floats) : old(cpu::set_matmul_scratch_budget(floats)) {}
  ~ScopedBudget() { cpu::set_matmul_scratch_budget(old); }
};

// --- matmul -------------------------------------------------------------------

TEST(MatmulTest, EveryTransposeAndOddShape) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(1);
  const int64_t shapes[][3] = {{1, 1, 1},  {7, 13, 5}, {1, 19, 37}, {23, 11, 1},
                               {17, 1, 9}, {1, 1, 40}, {64, 48, 80}, {33, 65, 17}};  // M, N, K
  for (const auto& combo : kCombos)
    for (const auto& s : shapes)
      for (int t = 0; t < 4; ++t) {
        MatmulCase c{{}, s[0], s[1], s[2]};
        c.ta = t & 1, c.tb = t & 2;
        c.in = combo.in, c.out = combo.out;
        check_matmul(c, rng);
      }
}

TEST(MatmulTest, AlphaBetaAccumulateIntoPrefilledOut) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(2);
  const float ab[][2] = {{1.0f, 1.0f}, {-1.5f, 0.5f}, {0.25f, -2.0f}, {2.0f, 0.0f}, {0.0f, 1.0f}, {0.0f, 0.0f}};
  for (const auto& combo : kCombos)
    for (const auto& p : ab)
      for (int t = 0; t < 8; ++t) {
        MatmulCase c{{}, t & 4 ? 1 : 13, 22, 31};  // one row: the sgemv path
        c.ta = t & 1, c.tb = t & 2;
        c.alpha = p[0], c.beta = p[1];
        c.in = combo.in, c.out = combo.out;
        check_matmul(c, rng);
      }
}

TEST(MatmulTest, BiasBroadcastOverRows) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(3);
  for (const auto& combo : kCombos) {
    for (DType bias_dt : {DType::f32, combo.out}) {
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        for (int t = 0; t < 4; ++t) {
          MatmulCase c{{}, 9, 27, 14};
          c.ta = t & 1, c.tb = t & 2;
          c.beta = beta, c.alpha = 0.75f;
          c.bias = true, c.bias_dt = bias_dt;
          c.in = combo.in, c.out = combo.out;
          check_matmul(c, rng);
        }
      }
    }
  }
}

TEST(MatmulTest, BatchedWithBatchedAndSharedB) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(4);
  const std::vector<int64_t> batches[] = {{1}, {3}, {2, 3}};
  for (const auto& combo : kCombos)
    for (const auto& bd : batches)
      for (bool shared : {false, true})
        for (int t = 0; t < 4; ++t) {
          MatmulCase c{bd, 6, 10, 7};
          c.ta = t & 1, c.tb = t & 2, c.b_shared = shared;
          c.beta = (t == 3) ? 1.0f : 0.0f;
          c.bias = (t == 2);
          c.in = combo.in, c.out = combo.out;
          check_matmul(c, rng);
        }
}

TEST(MatmulTest, BatchParallelAndSequentialPaths) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(5);
  // Many small products: one single-threaded sgemm per entry on the threads.
  cpu::GemmDesc small;
  small.batch = 10, small.M = 16, small.N = 24, small.K = 20;
  EXPECT_TRUE(cpu::matmul_batch_parallel(small, false, 2));
  EXPECT_TRUE(cpu::matmul_batch_parallel(small, true, 2));
  EXPECT_FALSE(cpu::matmul_batch_parallel(small, false, 1));
  // Three big products on two threads would leave a thread idle a third of
  // the time: one threaded sgemm after another instead.
  cpu::GemmDesc big;
  big.batch = 3, big.M = 160, big.N = 144, big.K = 104;
  EXPECT_FALSE(cpu::matmul_batch_parallel(big, false, 2));
  big.batch = 4;
  EXPECT_TRUE(cpu::matmul_batch_parallel(big, false, 2));

  for (const auto& combo : kCombos) {
    for (bool shared : {false, true}) {
      for (int t = 0; t < 4; ++t) {
        MatmulCase c{{10}, 16, 24, 20};
        c.ta = t & 1, c.tb = t & 2, c.b_shared = shared, c.beta = t == 1 ? 0.5f : 0.0f, c.bias = t == 2;
        c.in = combo.in, c.out = combo.out;
        check_matmul(c, rng);
        if (shared != bool(t & 1)) continue;  // the big case at half the combinations: keep the test fast
        MatmulCase d{{3}, 160, 144, 104};
        d.ta = t & 1, d.tb = t & 2, d.b_shared = shared, d.beta = t == 3 ? 1.0f : 0.0f, d.bias = t == 0;
        d.in = combo.in, d.out = combo.out;
        check_matmul(d, rng);
      }
    }
  }
}

TEST(MatmulTest, Bf16PanelsAlongEachDimension) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(6);
  // A tiny budget forces narrow panels: along M (M largest), N, and K.
  ScopedBudget budget(1500);
  const int64_t shapes[][3] = {{70, 21, 18}, {19, 75, 23}, {22, 17, 90}};
  for (DType out : {DType::f32, DType::bf16})
    for (const auto& s : shapes)
      for (int t = 0; t < 4; ++t) {
        MatmulCase c{{}, s[0], s[1], s[2]};
        c.ta = t & 1, c.tb = t & 2;
        c.in = DType::bf16, c.out = out;
        c.beta = (t & 1) ? 1.0f : 0.0f;
        c.alpha = 1.25f;
        c.bias = t >= 2;
        check_matmul(c, rng);
      }
  // A batch with a shared bf16 b and transposed a (not collapsible into one
  // product), batched panels too.
  for (bool ta : {false, true}) {
    MatmulCase c{{2}, 40, 12, 30};
    c.ta = ta, c.b_shared = true, c.in = DType::bf16, c.out = DType::bf16, c.beta = 0.5f;
    check_matmul(c, rng);
  }
}

TEST(MatmulTest, SharedBf16BWidenedOnceForBatch) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(7);
  for (DType out : {DType::f32, DType::bf16})
    for (int t = 0; t < 4; ++t) {
      MatmulCase c{{5}, 12, 9, 11};
      c.ta = t & 1, c.tb = t & 2, c.b_shared = true, c.in = DType::bf16, c.out = out, c.bias = t == 1;
      check_matmul(c, rng);
    }
}

TEST(MatmulTest, EmptyReductionGivesBetaOutPlusBias) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(8);
  for (const auto& combo : kCombos)
    for (float beta : {0.0f, 0.5f}) {
      MatmulCase c{{}, 5, 6, 0};
      c.beta = beta, c.bias = true, c.in = combo.in, c.out = combo.out;
      check_matmul(c, rng);
    }
}

TEST(MatmulTest, ResultDoesNotDependOnThreadCount) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(9);
  const Tensor a = random_tensor(Shape{6, 40, 33}, DType::bf16, rng);
  const Tensor b = random_tensor(Shape{6, 33, 50}, DType::bf16, rng);
  Tensor o1 = Tensor::empty(Shape{6, 40, 50}, DType::bf16), o2 = Tensor::empty(Shape{6, 40, 50}, DType::bf16);
  poison(o1);
  poison(o2);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  ops::matmul(o1, a, b);
  omp_set_num_threads(threads);
  ops::matmul(o2, a, b);
  EXPECT_EQ(std::memcmp(o1.data_ptr(), o2.data_ptr(), o1.nbytes()), 0);
}

// Products of a few rows (a decoding step's: one row a sequence; our own
// kernel, not sgemm): large enough that they run threaded, every transpose,
// against float64, and the same bits on one thread and on all; then every
// row count up to the kernel's limit and one past it, with a bias and beta.
TEST(MatmulTest, FewRowProductsMatchAndDoNotDependOnThreadCount) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(10);
  for (const auto& combo : kCombos)
    for (int64_t M : {1, 3, 8})
      for (int t = 0; t < 4; ++t) {
        MatmulCase c{{}, M, 3001, 517};
        c.ta = t & 1, c.tb = t & 2;
        c.in = combo.in, c.out = combo.out;
        check_matmul(c, rng);
        const Tensor a = random_tensor(c.ta ? Shape{c.K, M} : Shape{M, c.K}, c.in, rng);
        const Tensor b = random_tensor(c.tb ? Shape{c.N, c.K} : Shape{c.K, c.N}, c.in, rng);
        Tensor o1 = Tensor::empty(Shape{M, c.N}, c.out), o2 = Tensor::empty(Shape{M, c.N}, c.out);
        poison(o1);
        poison(o2);
        const int threads = omp_get_max_threads();
        omp_set_num_threads(1);
        ops::matmul(o1, a, b, c.ta, c.tb);
        omp_set_num_threads(std::max(2, threads));
        ops::matmul(o2, a, b, c.ta, c.tb);
        omp_set_num_threads(threads);
        EXPECT_EQ(std::memcmp(o1.data_ptr(), o2.data_ptr(), o1.nbytes()), 0) << c.str();
      }
  for (const auto& combo : kCombos)
    for (int64_t M = 1; M <= 9; ++M)
      for (int t = 0; t < 4; ++t) {
        MatmulCase c{{}, M, 45, 37};  // K and N not multiples of any vector width
        c.ta = t & 1, c.tb = t & 2;
        c.in = combo.in, c.out = combo.out;
        c.bias = true, c.bias_dt = DType::f32;
        c.alpha = 0.5f, c.beta = M % 2 ? 0.0f : 1.5f;
        check_matmul(c, rng);
      }
}

// Runs fn, expects zt::Error whose message contains every string in `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no zt::Error thrown; expected a message with '" << parts[0] << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

TEST(MatmulTest, BadArgumentsThrowWithClearMessages) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(10);
  const Tensor a = random_tensor(Shape{4, 5}, DType::f32, rng);
  const Tensor b = random_tensor(Shape{5, 6}, DType::f32, rng);
  const Tensor out = Tensor::empty(Shape{4, 6}, DType::f32);
  const Tensor b_bad = random_tensor(Shape{7, 6}, DType::f32, rng);
  // Inner dims: both shapes named.
  expect_error([&] { ops::matmul(out, a, b_bad); }, {"matmul", "inner dimensions", "(4, 5)", "(7, 6)"});
  expect_error([&] { ops::matmul(out, a, b, true, false); }, {"matmul", "inner dimensions", "'a'", "'b'"});
  // Dtypes.
  const Tensor b16 = random_tensor(Shape{5, 6}, DType::bf16, rng);
  expect_error([&] { ops::matmul(out, a, b16); }, {"matmul", "'a'", "'b'", "bf16"});
  // f16 computes on CUDA devices only.
  expect_error([&] { ops::matmul(out, Tensor::empty(Shape{4, 5}, DType::f16), Tensor::empty(Shape{5, 6}, DType::f16)); },
               {"matmul", "'a' is f16 on the CPU", "use bf16 or f32"});
  const Tensor out16 = Tensor::empty(Shape{4, 6}, DType::bf16);
  expect_error([&] { ops::matmul(out16, a, b); }, {"matmul", "'out'", "bf16"});
  const Tensor ai = Tensor::empty(Shape{4, 5}, DType::i32), bi = Tensor::empty(Shape{5, 6}, DType::i32);
  expect_error([&] { ops::matmul(out, ai, bi); }, {"matmul", "'a'", "i32"});
  const Tensor bias16 = random_tensor(Shape{6}, DType::bf16, rng);
  expect_error([&] { ops::matmul(out, a, b, false, false, 1, 0, bias16); }, {"matmul", "'bias'", "bf16"});
  // Shapes.
  const Tensor bias_bad = random_tensor(Shape{5}, DType::f32, rng);
  expect_error([&] { ops::matmul(out, a, b, false, false, 1, 0, bias_bad); }, {"matmul", "'bias'", "(5)", "(6)"});
  const Tensor out_bad = Tensor::empty(Shape{4, 7}, DType::f32);
  expect_error([&] { ops::matmul(out_bad, a, b); }, {"matmul", "'out'", "(4, 7)", "(4, 6)"});
  const Tensor a1 = random_tensor(Shape{5}, DType::f32, rng);
  expect_error([&] { ops::matmul(out, a1, b); }, {"matmul", "'a'", "(5)"});
  const Tensor a3 = random_tensor(Shape{2, 4, 5}, DType::f32, rng);
  const Tensor b3 = random_tensor(Shape{3, 5, 6}, DType::f32, rng);
  const Tensor o3 = Tensor::empty(Shape{2, 4, 6}, DType::f32);
  expect_error([&] { ops::matmul(o3, a3, b3); }, {"matmul", "'b'", "(3, 5, 6)", "batch"});
  expect_error([&] { ops::matmul(out, a3, b); }, {"matmul", "'out'", "(2, 4, 6)"});
  expect_error([&] { ops::matmul(out, a, Tensor()); }, {"matmul", "'b'", "undefined"});
  // Aliasing: out may not share memory with an input.
  const Tensor sq = random_tensor(Shape{5, 5}, DType::f32, rng);
  const Tensor sq_b = random_tensor(Shape{5, 5}, DType::f32, rng);
  expect_error([&] { ops::matmul(sq, sq, sq_b); }, {"matmul", "'out'", "overlaps", "'a'"});
  // Devices (fake CUDA tensors, never dereferenced).
  float dummy[64];
  const Tensor a_cuda = Tensor::wrap(dummy, Shape{4, 5}, DType::f32, Device::cuda(63));
  expect_error([&] { ops::matmul(out, a_cuda, b); }, {"matmul", "'a'", "cuda:63", "cpu"});
  const Tensor b_cuda = Tensor::wrap(dummy + 20, Shape{5, 6}, DType::f32, Device::cuda(63));
  Tensor out_cuda = Tensor::wrap(dummy + 50, Shape{2, 6}, DType::f32, Device::cuda(63));
  const Tensor a_cuda2 = Tensor::wrap(dummy, Shape{2, 5}, DType::f32, Device::cuda(63));
  expect_error([&] { ops::matmul(out_cuda, a_cuda2, b_cuda); }, {"matmul", "cuda:63"});
}

// --- linear -------------------------------------------------------------------

// y[n, o] = sum_c x[n, c] w[o, c] + b[o]; returns ref and mag (sum of |terms|).
void linear_ref(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>* b,
                int64_t N, int64_t C, int64_t OC, std::vector<double>& y, std::vector<double>& mag) {
  y.assign(size_t(N * OC), 0.0);
  mag.assign(y.size(), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      double s = b ? (*b)[size_t(o)] : 0.0, m = b ? std::fabs((*b)[size_t(o)]) : 0.0;
      for (int64_t c = 0; c < C; ++c) {
        s += x[size_t(n * C + c)] * w[size_t(o * C + c)];
        m += std::fabs(x[size_t(n * C + c)] * w[size_t(o * C + c)]);
      }
      y[size_t(n * OC + o)] = s;
      mag[size_t(n * OC + o)] = m;
    }
}

// Analytic float64 gradients of L = sum(dy * y): dx = dy w, dw = dy^T x, db = colsum(dy),
// and the magnitudes (sums of |terms|) for the error bound.
struct LinearGrads {
  std::vector<double> dx, dw, db, dx_mag, dw_mag, db_mag;
};
LinearGrads linear_backward_ref(const std::vector<double>& dy, const std::vector<double>& x,
                                const std::vector<double>& w, int64_t N, int64_t C, int64_t OC) {
  LinearGrads g;
  g.dx.assign(size_t(N * C), 0.0), g.dx_mag = g.dx;
  g.dw.assign(size_t(OC * C), 0.0), g.dw_mag = g.dw;
  g.db.assign(size_t(OC), 0.0), g.db_mag = g.db;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < OC; ++o) {
      const double d = dy[size_t(n * OC + o)];
      g.db[size_t(o)] += d;
      g.db_mag[size_t(o)] += std::fabs(d);
      for (int64_t c = 0; c < C; ++c) {
        g.dx[size_t(n * C + c)] += d * w[size_t(o * C + c)];
        g.dx_mag[size_t(n * C + c)] += std::fabs(d * w[size_t(o * C + c)]);
        g.dw[size_t(o * C + c)] += d * x[size_t(n * C + c)];
        g.dw_mag[size_t(o * C + c)] += std::fabs(d * x[size_t(n * C + c)]);
      }
    }
  return g;
}

Shape lead_shape(const std::vector<int64_t>& lead, int64_t last) {
  Shape s(lead.begin(), lead.end());
  s.push_back(last);
  return s;
}

TEST(LinearTest, ForwardMatchesReference) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(20);
  const std::vector<int64_t> leads[] = {{2, 7}, {13}, {}, {1, 1}};
  const int64_t dims[][2] = {{12, 20}, {1, 5}, {9, 1}, {33, 17}};  // C, OC
  for (const auto& combo : kCombos)
    for (const auto& lead : leads)
      for (const auto& cd : dims)
        for (int with_bias = 0; with_bias < 3; ++with_bias) {
          const int64_t C = cd[0], OC = cd[1];
          const DType bias_dt = with_bias == 2 ? combo.out : DType::f32;
          SCOPED_TRACE(std::string(dtype_name(combo.in)) + "->" + std::string(dtype_name(combo.out)) + " C " +
                       std::to_string(C) + " OC " + std::to_string(OC) + " bias " + std::to_string(with_bias));
          const Tensor x = random_tensor(lead_shape(lead, C), combo.in, rng);
          const Tensor w = random_tensor(Shape{OC, C}, combo.in, rng);
          const Tensor b = with_bias ? random_tensor(Shape{OC}, bias_dt, rng) : Tensor();
          const Tensor y = Tensor::empty(lead_shape(lead, OC), combo.out);
          poison(y);
          ops::linear_forward(y, x, w, b);
          const int64_t N = x.numel() / C;
          std::vector<double> ref, mag;
          const std::vector<double> bv = with_bias ? to_f64(b) : std::vector<double>();
          linear_ref(to_f64(x), to_f64(w), with_bias ? &bv : nullptr, N, C, OC, ref, mag);
          EXPECT_TRUE(close_to_bound(y, ref, mag, C));
        }
}

// y = residual + x W^T + b: the residual is added in the product (a block's
// residual connection); y poisoned first, the residual left as it was. Also
// with a scratch budget that cuts the products into panels (each panel's
// prefill reads its own block of the residual).
TEST(LinearTest, ForwardAddsTheResidual) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(27);
  const std::vector<int64_t> leads[] = {{2, 7}, {13}, {}, {40, 3}};
  const int64_t dims[][2] = {{12, 20}, {1, 5}, {33, 17}, {0, 6}};  // C, OC (C 0: y = residual + b)
  for (const size_t budget : {size_t(0), size_t(300)})
    for (const auto& combo : kCombos)
      for (const auto& lead : leads)
        for (const auto& cd : dims)
          for (int with_bias = 0; with_bias < 2; ++with_bias) {
            const int64_t C = cd[0], OC = cd[1];
            SCOPED_TRACE(std::string(dtype_name(combo.in)) + "->" + std::string(dtype_name(combo.out)) + " C " +
                         std::to_string(C) + " OC " + std::to_string(OC) + " bias " + std::to_string(with_bias) +
                         " budget " + std::to_string(budget));
            std::optional<ScopedBudget> panels;
            if (budget > 0) panels.emplace(budget);
            const Tensor x = random_tensor(lead_shape(lead, C), combo.in, rng);
            const Tensor w = random_tensor(Shape{OC, C}, combo.in, rng);
            const Tensor b = with_bias ? random_tensor(Shape{OC}, DType::f32, rng) : Tensor();
            const Tensor residual = random_tensor(lead_shape(lead, OC), combo.out, rng);
            const std::vector<double> res = to_f64(residual);
            const Tensor y = Tensor::empty(lead_shape(lead, OC), combo.out);
            poison(y);
            ops::linear_forward(y, x, w, b, residual);
            const int64_t N = residual.numel() / OC;
            std::vector<double> ref, mag;
            const std::vector<double> bv = with_bias ? to_f64(b) : std::vector<double>();
            linear_ref(to_f64(x), to_f64(w), with_bias ? &bv : nullptr, N, C, OC, ref, mag);
            ASSERT_EQ(ref.size(), res.size());
            for (size_t i = 0; i < ref.size(); ++i) ref[i] += res[i], mag[i] += std::fabs(res[i]);
            EXPECT_TRUE(close_to_bound(y, ref, mag, C));
            EXPECT_EQ(to_f64(residual), res) << "the residual is an input";
          }
}

// Runs linear_backward with the outputs selected by `which` (bit 0 dx, 1 dw,
// 2 db) and checks each: dx overwritten (poisoned before), dw and db
// accumulated onto random values.
void check_linear_backward(const std::vector<int64_t>& lead, int64_t C, int64_t OC, DType in, DType gx, DType gw,
                           int which, std::mt19937_64& rng) {
  SCOPED_TRACE(std::string(dtype_name(in)) + " dx " + std::string(dtype_name(gx)) + " dw/db " +
               std::string(dtype_name(gw)) + " C " + std::to_string(C) + " OC " + std::to_string(OC) + " which " +
               std::to_string(which));
  const Tensor x = random_tensor(lead_shape(lead, C), in, rng);
  const Tensor dy = random_tensor(lead_shape(lead, OC), in, rng);
  const Tensor w = random_tensor(Shape{OC, C}, in, rng);
  const int64_t N = x.numel() / std::max<int64_t>(C, 1);
  Tensor dx, dw, db;
  if (which & 1) {
    dx = Tensor::empty(x.shape(), gx);
    poison(dx);
  }
  if (which & 2) dw = random_tensor(Shape{OC, C}, gw, rng);
  if (which & 4) db = random_tensor(Shape{OC}, gw, rng);
  const std::vector<double> dw0 = dw.defined() ? to_f64(dw) : std::vector<double>();
  const std::vector<double> db0 = db.defined() ? to_f64(db) : std::vector<double>();
  ops::linear_backward(dx, dw, db, dy, x, w);
  const LinearGrads g = linear_backward_ref(to_f64(dy), to_f64(x), to_f64(w), N, C, OC);
  if (dx.defined()) {
    EXPECT_TRUE(close_to_bound(dx, g.dx, g.dx_mag, OC)) << "dx";
  }
  if (dw.defined()) {
    std::vector<double> ref = g.dw, mag = g.dw_mag;
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += dw0[i], mag[i] += std::fabs(dw0[i]);
    EXPECT_TRUE(close_to_bound(dw, ref, mag, N)) << "dw";
  }
  if (db.defined()) {
    std::vector<double> ref = g.db, mag = g.db_mag;
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += db0[i], mag[i] += std::fabs(db0[i]);
    EXPECT_TRUE(close_to_bound(db, ref, mag, N)) << "db";
  }
}

TEST(LinearTest, BackwardMatchesAnalyticReference) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(21);
  const std::vector<int64_t> leads[] = {{3, 5}, {1}, {40}};
  const int64_t dims[][2] = {{8, 12}, {1, 3}, {7, 1}, {24, 20}};
  for (const auto& lead : leads)
    for (const auto& cd : dims) {
      check_linear_backward(lead, cd[0], cd[1], DType::f32, DType::f32, DType::f32, 7, rng);
      check_linear_backward(lead, cd[0], cd[1], DType::bf16, DType::bf16, DType::bf16, 7, rng);
      check_linear_backward(lead, cd[0], cd[1], DType::bf16, DType::f32, DType::f32, 7, rng);  // fp32 grads
      check_linear_backward(lead, cd[0], cd[1], DType::bf16, DType::bf16, DType::f32, 7, rng);
    }
}

TEST(LinearTest, BackwardSkipsUndefinedOutputs) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(22);
  for (int which = 0; which < 8; ++which) {
    check_linear_backward({2, 9}, 10, 6, DType::f32, DType::f32, DType::f32, which, rng);
    check_linear_backward({2, 9}, 10, 6, DType::bf16, DType::bf16, DType::f32, which, rng);
  }
}

TEST(LinearTest, BackwardBf16WithPanels) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(23);
  ScopedBudget budget(1200);  // dy not pre-widened; dx and dw run in panels
  check_linear_backward({50}, 30, 20, DType::bf16, DType::bf16, DType::bf16, 7, rng);
  check_linear_backward({50}, 30, 20, DType::bf16, DType::f32, DType::f32, 7, rng);
}

// GradWrite::overwrite (a step's first write of a parameter gradient) writes
// dw and db without reading them: over NaN it gives the bits of the sums
// added into zeros, and dx is the same either way. f32 and bf16 operands,
// f32 and bf16 gradients, and dy pre-widened or in panels.
TEST(LinearTest, BackwardOverwritesWeightGradientsWithoutReadingThem) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(24);
  for (const int64_t budget : {int64_t(1) << 30, int64_t(1200)}) {
    ScopedBudget scoped(budget);
    const std::pair<DType, DType> combos[] = {{DType::f32, DType::f32}, {DType::bf16, DType::f32}, {DType::bf16, DType::bf16}};
    for (const auto& [in, grads] : combos) {
      for (const int64_t N : {int64_t(50), int64_t(0)}) {  // no rows: zeros written
        SCOPED_TRACE(std::string(dtype_name(in)) + " -> " + std::string(dtype_name(grads)) + ", budget " +
                     std::to_string(budget) + ", N " + std::to_string(N));
        const int64_t C = 30, OC = 20;
        const Tensor x = random_tensor(Shape{N, C}, in, rng), w = random_tensor(Shape{OC, C}, in, rng);
        const Tensor dy = random_tensor(Shape{N, OC}, in, rng);
        auto run = [&](ops::GradWrite write, bool poisoned) {
          Tensor dx = Tensor::empty(Shape{N, C}, in), dw = Tensor::empty(Shape{OC, C}, grads);
          Tensor db = Tensor::empty(Shape{OC}, grads);
          for (const Tensor* t : {&dw, &db}) poisoned ? poison(*t) : (void)std::memset(t->data_ptr(), 0, t->nbytes());
          ops::linear_backward(dx, dw, db, dy, x, w, write);
          return std::vector<std::vector<double>>{to_f64(dx), to_f64(dw), to_f64(db)};
        };
        EXPECT_EQ(run(ops::GradWrite::overwrite, true), run(ops::GradWrite::accumulate, false));
      }
    }
  }
}

// The analytic float64 reference itself against central differences of the
// float64 forward, L(x, w, b) = sum(g * (x w^T + b)). L is linear in every
// parameter, so the differences agree to float64 rounding (~1e-10 here).
TEST(LinearTest, ReferenceMatchesFiniteDifferences) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(24);
  const int64_t N = 4, C = 3, OC = 5;
  std::uniform_real_distribution<double> dist(-1, 1);
  std::vector<double> x(N * C), w(OC * C), b(OC), g(N * OC);
  for (auto* v : {&x, &w, &b, &g})
    for (auto& e : *v) e = dist(rng);
  auto loss = [&] {
    std::vector<double> y, mag;
    linear_ref(x, w, &b, N, C, OC, y, mag);
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += g[i] * y[i];
    return s;
  };
  const LinearGrads an = linear_backward_ref(g, x, w, N, C, OC);
  const double h = 1e-5;
  auto fd = [&](std::vector<double>& p, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double keep = p[i];
      p[i] = keep + h;
      const double lp = loss();
      p[i] = keep - h;
      const double lm = loss();
      p[i] = keep;
      EXPECT_NEAR((lp - lm) / (2 * h), grad[i], 1e-8) << name << "[" << i << "]";
    }
  };
  fd(x, an.dx, "dx");
  fd(w, an.dw, "dw");
  fd(b, an.db, "db");
}

TEST(LinearTest, BiasGradIsDeterministicAcrossThreadCounts) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(25);
  const int64_t N = 3000, C = 4, OC = 300;  // several row chunks, column blocks
  for (DType in : {DType::f32, DType::bf16}) {
    const Tensor x = random_tensor(Shape{N, C}, in, rng);
    const Tensor dy = random_tensor(Shape{N, OC}, in, rng);
    const Tensor w = random_tensor(Shape{OC, C}, in, rng);
    const Tensor db0 = random_tensor(Shape{OC}, DType::f32, rng);
    Tensor db1 = Tensor::empty(Shape{OC}, DType::f32), db2 = Tensor::empty(Shape{OC}, DType::f32);
    std::memcpy(db1.data_ptr(), db0.data_ptr(), db0.nbytes());
    std::memcpy(db2.data_ptr(), db0.data_ptr(), db0.nbytes());
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    ops::linear_backward(Tensor(), Tensor(), db1, dy, x, w);
    omp_set_num_threads(std::max(2, threads));
    ops::linear_backward(Tensor(), Tensor(), db2, dy, x, w);
    omp_set_num_threads(threads);
    EXPECT_EQ(std::memcmp(db1.data_ptr(), db2.data_ptr(), db1.nbytes()), 0);
    const LinearGrads g = linear_backward_ref(to_f64(dy), to_f64(x), to_f64(w), N, C, OC);
    std::vector<double> ref = g.db, mag = g.db_mag;
    const std::vector<double> before = to_f64(db0);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += before[i], mag[i] += std::fabs(before[i]);
    EXPECT_TRUE(close_to_bound(db1, ref, mag, N));
  }
}

TEST(LinearTest, BadArgumentsThrowWithClearMessages) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(26);
  const Tensor x = random_tensor(Shape{2, 3, 4}, DType::f32, rng);
  const Tensor w = random_tensor(Shape{5, 4}, DType::f32, rng);
  const Tensor b = random_tensor(Shape{5}, DType::f32, rng);
  const Tensor y = Tensor::empty(Shape{2, 3, 5}, DType::f32);
  const Tensor w_bad = random_tensor(Shape{5, 6}, DType::f32, rng);
  expect_error([&] { ops::linear_forward(y, x, w_bad, b); }, {"linear_forward", "'w'", "(5, 6)", "(2, 3, 4)"});
  const Tensor y_bad = Tensor::empty(Shape{2, 3, 4}, DType::f32);
  expect_error([&] { ops::linear_forward(y_bad, x, w, b); }, {"linear_forward", "'y'", "(2, 3, 4)", "(2, 3, 5)"});
  const Tensor b_bad = random_tensor(Shape{4}, DType::f32, rng);
  expect_error([&] { ops::linear_forward(y, x, w, b_bad); }, {"linear_forward", "'b'", "(4)", "(5)"});
  const Tensor w16 = random_tensor(Shape{5, 4}, DType::bf16, rng);
  expect_error([&] { ops::linear_forward(y, x, w16, b); }, {"linear_forward", "'x'", "'w'", "bf16"});
  const Tensor w3 = random_tensor(Shape{1, 5, 4}, DType::f32, rng);
  expect_error([&] { ops::linear_forward(y, x, w3, b); }, {"linear_forward", "'w'", "2-dimensional"});
  const Tensor w5 = random_tensor(Shape{5, 5}, DType::f32, rng);
  expect_error([&] { ops::linear_forward(y, y, w5, b); }, {"linear_forward", "'y'", "overlaps", "'x'"});
  const Tensor r_bad = random_tensor(Shape{2, 3, 4}, DType::f32, rng);
  expect_error([&] { ops::linear_forward(y, x, w, b, r_bad); },
               {"linear_forward", "'residual'", "(2, 3, 4)", "(2, 3, 5)"});
  const Tensor r16 = random_tensor(Shape{2, 3, 5}, DType::bf16, rng);
  expect_error([&] { ops::linear_forward(y, x, w, b, r16); }, {"linear_forward", "'residual'", "bf16", "'y'"});
  expect_error([&] { ops::linear_forward(y, x, w, b, y); }, {"linear_forward", "'residual'", "overlaps", "'y'"});
  float dummy[64];
  const Tensor w_cuda = Tensor::wrap(dummy, Shape{5, 4}, DType::f32, Device::cuda(63));
  expect_error([&] { ops::linear_forward(y, x, w_cuda, b); }, {"linear_forward", "'w'", "cuda:63"});

  const Tensor dy = random_tensor(Shape{2, 3, 5}, DType::f32, rng);
  const Tensor dx = Tensor::empty(Shape{2, 3, 4}, DType::f32);
  const Tensor dw = Tensor::empty(Shape{5, 4}, DType::f32);
  const Tensor db = Tensor::empty(Shape{5}, DType::f32);
  const Tensor dy_bad = random_tensor(Shape{2, 3, 6}, DType::f32, rng);
  expect_error([&] { ops::linear_backward(dx, dw, db, dy_bad, x, w); },
               {"linear_backward", "'dy'", "(2, 3, 6)", "(2, 3, 5)"});
  const Tensor dw_bad = Tensor::empty(Shape{4, 5}, DType::f32);
  expect_error([&] { ops::linear_backward(dx, dw_bad, db, dy, x, w); }, {"linear_backward", "'dw'", "(4, 5)"});
  const Tensor db16 = Tensor::empty(Shape{5}, DType::bf16);
  expect_error([&] { ops::linear_backward(dx, dw, db16, dy, x, w); }, {"linear_backward", "'db'", "bf16"});
  const Tensor x16 = random_tensor(Shape{2, 3, 4}, DType::bf16, rng);
  expect_error([&] { ops::linear_backward(dx, dw, db, dy, x16, w); }, {"linear_backward", "'x'", "bf16"});
  expect_error([&] { ops::linear_backward(dx, dw, db, dy, x, Tensor()); }, {"linear_backward", "'w'"});
  expect_error([&] { ops::linear_backward(dx, dx.flatten().flat_view(0, Shape{5, 4}), db, dy, x, w); },
               {"linear_backward", "'dx'", "overlaps", "'dw'"});
  const Tensor db_cuda = Tensor::wrap(dummy, Shape{5}, DType::f32, Device::cuda(63));
  expect_error([&] { ops::linear_backward(dx, dw, db_cuda, dy, x, w); }, {"linear_backward", "'db'", "cuda:63"});
}

}  // namespace
}  // namespace zt
