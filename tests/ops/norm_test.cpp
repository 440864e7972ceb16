// LayerNorm / RMSNorm (ops/norm.h): forward, fused residual forward and
// backward against float64 references written here, the reference backward
// against central finite differences of the reference forward, aliasing,
// thread-count determinism of dw/db, and argument validation.
//
// Tolerances. Each output element is compared on the scale of the terms it is
// computed from: |got - ref| <= tol (|ref| + scale), where scale is the sum of
// the absolute values of the terms of its formula (in f64):
//   mean  ms = |mean| + mean_c |x_c - mean|   (an f32 row sum is accurate to
//         eps * sum |terms|, and the saved f32 mean rounds at ulp(mean))
//   xhat  xs = rstd (|x - mean| + ms)         (x - mean, with that mean)
//   y     xs |w| + |b|
//   dx    rstd (|g| + mean|g| + xs mean(|g| xs)) + |dx_add|,   g = dy w
//   dw    |dw before| + sum |dy| xs;   db  |db before| + sum |dy|
// Rounding errors of sums are bounded by eps * sum |terms|, so this is the
// yardstick any f32 implementation is held to where terms cancel: x ~ mean
// (xhat ~ 0), y ~ 0 when xhat w ~ -b, dx whenever its three terms nearly
// cancel (C = 1: dx is exactly 0 for LayerNorm and rstd = 1/sqrt(eps)
// amplifies the rounding of g), and the large-mean case (x = 100 + U(-1, 1),
// where the backward must recompute xhat from the f32-rounded saved mean).
//   f32 outputs   tol 1e-5 (mean and rstd included). The kernels do O(1) f32
//                 operations per element after row sums of C <= 768 terms
//                 (16-lane partial sums: error <= ~C/16 eps ~ 3e-6 worst case,
//                 ~1e-7 typical); everything passes at 1e-6 in practice, so
//                 this keeps a 10x margin and still catches any wrong term.
//   bf16 outputs  tol 1e-2 against the reference of the bf16-rounded inputs:
//                 the output rounding alone is 2^-9 relative.
//   large mean    the rstd check (rtol 1e-5) is what catches an unstable
//                 variance: E[x^2] - E[x]^2 in f32 would lose every digit there.
#include "ops/norm.h"

#include <cstdint>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using ops::NormKind;
using test::make_rng;
using test::poison;
using test::random_tensor;
using test::to_f64;
using Vec = std::vector<double>;

constexpr float kEps = 1e-5f;

const char* kind_name(NormKind k) { return k == NormKind::layernorm ? "layernorm" : "rmsnorm"; }

// Every element finite and |got - ref| <= tol (|ref| + scale); names the worst.
::testing::AssertionResult close(const Tensor& got, const Vec& ref, const Vec& scale, double tol) {
  if (size_t(got.numel()) != ref.size() || ref.size() != scale.size())
    return ::testing::AssertionFailure() << "size mismatch";
  int64_t worst = -1, bad = 0;
  double worst_excess = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const size_t k = size_t(i);
    const double g = test::load_f64(got, i), lim = tol * (std::fabs(ref[k]) + scale[k]);
    const double err = std::fabs(g - ref[k]);
    if (!std::isfinite(g) || err > lim) {
      const double excess = std::isfinite(g) ? err / lim : INFINITY;
      ++bad;
      if (worst < 0 || excess > worst_excess) worst = i, worst_excess = excess;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  const size_t w = size_t(worst);
  return ::testing::AssertionFailure() << bad << " of " << got.numel() << " elements of " << got.str()
                                       << " outside tol " << tol << " x (|ref| + scale); worst at flat index "
                                       << worst << ": got " << test::load_f64(got, worst) << ", reference " << ref[w]
                                       << ", scale " << scale[w] << " (seed " << test::test_seed() << ")";
}

double out_rtol(DType dt) { return dt == DType::f32 ? 1e-5 : 1e-2; }

// --- float64 reference -----------------------------------------------------------

struct RefFwd {
  Vec y, mean, rstd;
  Vec mean_scale;  // |mean| + mean_c |x_c - mean|
  Vec xs;          // scale of xhat: rstd (|x - mean| + mean_scale)
  Vec y_scale;     // xs |w| + |b|
};

RefFwd ref_forward(NormKind kind, const Vec& x, const Vec& w, const Vec* b, int64_t N, int64_t C, double eps) {
  const size_t NC = size_t(N * C);
  RefFwd r{Vec(NC), Vec(size_t(N)), Vec(size_t(N)), Vec(size_t(N)), Vec(NC), Vec(NC)};
  for (int64_t i = 0; i < N; ++i) {
    const double* xr = &x[size_t(i * C)];
    double mean = 0;
    if (kind == NormKind::layernorm) {
      for (int64_t c = 0; c < C; ++c) mean += xr[c];
      mean /= double(C);
    }
    double var = 0, disp = 0;
    for (int64_t c = 0; c < C; ++c) {
      var += (xr[c] - mean) * (xr[c] - mean);
      disp += std::fabs(xr[c] - mean);
    }
    var /= double(C);
    const double rstd = 1.0 / std::sqrt(var + eps);
    const double mean_scale = std::fabs(mean) + disp / double(C);
    for (int64_t c = 0; c < C; ++c) {
      const size_t k = size_t(i * C + c);
      const double xw = (xr[c] - mean) * rstd * w[size_t(c)], bc = b ? (*b)[size_t(c)] : 0.0;
      r.y[k] = xw + bc;
      r.xs[k] = rstd * (std::fabs(xr[c] - mean) + mean_scale);
      r.y_scale[k] = r.xs[k] * std::fabs(w[size_t(c)]) + std::fabs(bc);
    }
    r.mean[size_t(i)] = mean;
    r.rstd[size_t(i)] = rstd;
    r.mean_scale[size_t(i)] = mean_scale;
  }
  return r;
}

struct RefBwd {
  Vec dx, dw, db;
  Vec dx_scale, dw_scale, db_scale;  // sums of |terms| (see the header comment)
};

// Analytic gradients of L = sum(y * dy) (stats recomputed in f64 from x).
RefBwd ref_backward(NormKind kind, const Vec& dy, const Vec& x, const Vec& w, int64_t N, int64_t C, double eps) {
  const RefFwd f = ref_forward(kind, x, w, nullptr, N, C, eps);
  RefBwd r{Vec(size_t(N * C)), Vec(size_t(C), 0.0), Vec(size_t(C), 0.0),
           Vec(size_t(N * C)), Vec(size_t(C), 0.0), Vec(size_t(C), 0.0)};
  Vec xhat(static_cast<size_t>(C)), xs(static_cast<size_t>(C)), g(static_cast<size_t>(C));
  for (int64_t i = 0; i < N; ++i) {
    const double mean = f.mean[size_t(i)], rstd = f.rstd[size_t(i)];
    double mg = 0, mgx = 0, mg_abs = 0, mgx_abs = 0;
    for (int64_t c = 0; c < C; ++c) {
      const size_t k = size_t(i * C + c), cc = size_t(c);
      xhat[cc] = (x[k] - mean) * rstd;
      xs[cc] = f.xs[k];
      g[cc] = dy[k] * w[cc];
      mg += g[cc];
      mgx += g[cc] * xhat[cc];
      mg_abs += std::fabs(g[cc]);
      mgx_abs += std::fabs(g[cc]) * xs[cc];
      r.dw[cc] += dy[k] * xhat[cc];
      r.db[cc] += dy[k];
      r.dw_scale[cc] += std::fabs(dy[k]) * xs[cc];
      r.db_scale[cc] += std::fabs(dy[k]);
    }
    const bool ln = kind == NormKind::layernorm;
    mg = ln ? mg / double(C) : 0.0;
    mg_abs = ln ? mg_abs / double(C) : 0.0;
    mgx /= double(C);
    mgx_abs /= double(C);
    for (int64_t c = 0; c < C; ++c) {
      const size_t cc = size_t(c);
      r.dx[size_t(i * C + c)] = rstd * (g[cc] - mg - xhat[cc] * mgx);
      r.dx_scale[size_t(i * C + c)] = rstd * (std::fabs(g[cc]) + mg_abs + xs[cc] * mgx_abs);
    }
  }
  return r;
}

Vec plus(const Vec& a, const Vec& b) {
  Vec r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] + b[i];
  return r;
}

Vec plus_abs(const Vec& a, const Vec& b) {
  Vec r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = a[i] + std::fabs(b[i]);
  return r;
}

using test::error_of;

// A fake CUDA tensor (never dereferenced).
using test::fake_cuda;

// --- the reference itself --------------------------------------------------------

TEST(NormReference, BackwardMatchesFiniteDifferences) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(1);
  std::uniform_real_distribution<double> U(-1.0, 1.0);
  const int64_t N = 3, C = 5;
  const double eps = 1e-5, h = 1e-6;
  for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
    SCOPED_TRACE(kind_name(kind));
    Vec x(N * C), w(C), b(C), dy(N * C);
    for (auto* v : {&x, &w, &b, &dy})
      for (double& e : *v) e = U(rng);
    const bool ln = kind == NormKind::layernorm;
    auto loss = [&](const Vec& xx, const Vec& ww, const Vec& bb) {
      const RefFwd f = ref_forward(kind, xx, ww, ln ? &bb : nullptr, N, C, eps);
      double L = 0;
      for (size_t i = 0; i < dy.size(); ++i) L += f.y[i] * dy[i];
      return L;
    };
    const RefBwd g = ref_backward(kind, dy, x, w, N, C, eps);
    auto fd = [&](Vec& v, size_t i) {
      const double v0 = v[i];
      v[i] = v0 + h;
      const double lp = loss(x, w, b);
      v[i] = v0 - h;
      const double lm = loss(x, w, b);
      v[i] = v0;
      return (lp - lm) / (2 * h);
    };
    // Central differences: truncation O(h^2 |f'''|) ~ 1e-12, round-off ~ 1e-16 / h.
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(g.dx[i], fd(x, i), 1e-7) << "dx[" << i << "]";
    for (size_t c = 0; c < w.size(); ++c) EXPECT_NEAR(g.dw[c], fd(w, c), 1e-7) << "dw[" << c << "]";
    if (ln) {
      for (size_t c = 0; c < b.size(); ++c) EXPECT_NEAR(g.db[c], fd(b, c), 1e-7) << "db[" << c << "]";
    }
  }
}

// --- forward ---------------------------------------------------------------------

const Shape kShapes[] = {Shape{1, 1}, Shape{1, 7}, Shape{4, 1}, Shape{5, 129}, Shape{2, 3, 33}, Shape{7}, Shape{300, 129}};

struct DTypes {
  DType x, w, grad;
};
const DTypes kDTypes[] = {{DType::f32, DType::f32, DType::f32},
                          {DType::bf16, DType::bf16, DType::f32},
                          {DType::bf16, DType::bf16, DType::bf16},
                          {DType::bf16, DType::f32, DType::f32},
                          {DType::f32, DType::bf16, DType::bf16}};

std::string dtypes_str(const DTypes& d) {
  return "x " + std::string(dtype_name(d.x)) + ", w " + std::string(dtype_name(d.w)) + ", grads " +
         std::string(dtype_name(d.grad));
}

void check_stats(NormKind kind, const Tensor& mean, const Tensor& rstd, const RefFwd& ref, const Vec& x) {
  if (kind == NormKind::layernorm) {
    EXPECT_TRUE(close(mean, ref.mean, ref.mean_scale, 1e-5)) << "mean";
  }
  EXPECT_TRUE(test::all_close(rstd, ref.rstd, 1e-5, 0.0)) << "rstd";
}

void run_forward(NormKind kind, bool bias, const Shape& shape, const DTypes& dt, std::mt19937_64& rng,
                 double lo = -1.0, double hi = 1.0) {
  SCOPED_TRACE(std::string(kind_name(kind)) + (bias ? " with bias " : " ") + shape.str() + " " + dtypes_str(dt));
  const int64_t C = shape[-1], N = shape.numel() / C;
  const Tensor x = random_tensor(shape, dt.x, rng, lo, hi);
  const Tensor w = random_tensor(Shape{C}, dt.w, rng, -1.5, 1.5);
  const Tensor b = bias ? random_tensor(Shape{C}, dt.w, rng, -1.0, 1.0) : Tensor();
  const Tensor y = Tensor::empty(shape, dt.x);
  const Tensor mean = kind == NormKind::layernorm ? Tensor::empty(Shape{N}, DType::f32) : Tensor();
  const Tensor rstd = Tensor::empty(Shape{N}, DType::f32);
  for (const Tensor* t : {&y, &mean, &rstd})
    if (t->defined()) poison(*t);
  ops::norm_forward(kind, y, mean, rstd, x, w, b, kEps);
  const Vec xv = to_f64(x), bv = bias ? to_f64(b) : Vec();
  const RefFwd ref = ref_forward(kind, xv, to_f64(w), bias ? &bv : nullptr, N, C, kEps);
  EXPECT_TRUE(close(y, ref.y, ref.y_scale, out_rtol(dt.x))) << "y";
  check_stats(kind, mean, rstd, ref, xv);
}

TEST(Norm, ForwardMatchesReference) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(2);
  for (const DTypes& dt : kDTypes)
    for (const Shape& s : kShapes) {
      run_forward(NormKind::layernorm, true, s, dt, rng, -2.0, 3.0);
      run_forward(NormKind::layernorm, false, s, dt, rng);
      run_forward(NormKind::rmsnorm, false, s, dt, rng, -2.0, 3.0);
    }
}

TEST(Norm, LayerNormForwardLargeMean) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(3);
  // |mean| / std ~ 170: E[x^2] - E[x]^2 in f32 would lose every digit here.
  for (const DTypes& dt : {kDTypes[0], kDTypes[1]})
    for (const Shape& s : {Shape{16, 768}, Shape{3, 129}, Shape{2, 7}}) {
      run_forward(NormKind::layernorm, true, s, dt, rng, 99.0, 101.0);
      run_forward(NormKind::layernorm, true, s, dt, rng, -1001.0, -999.0);
    }
}

TEST(Norm, ResidualForwardMatchesReference) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(4);
  for (const DTypes& dt : kDTypes)
    for (const Shape& shape : kShapes)
      for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm})
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(std::string(kind_name(kind)) + " " + shape.str() + " " + dtypes_str(dt) +
                       (in_place ? " r_out = r_in" : ""));
          const int64_t C = shape[-1], N = shape.numel() / C;
          const bool bias = kind == NormKind::layernorm;
          const Tensor r_in = random_tensor(shape, dt.x, rng, -2.0, 2.0);
          const Tensor x = random_tensor(shape, dt.x, rng, -1.0, 1.0);
          const Tensor w = random_tensor(Shape{C}, dt.w, rng, -1.5, 1.5);
          const Tensor b = bias ? random_tensor(Shape{C}, dt.w, rng) : Tensor();
          const Vec r_in_v = to_f64(r_in), xv = to_f64(x);
          const Tensor r_out = in_place ? r_in : Tensor::empty(shape, dt.x);
          const Tensor y = Tensor::empty(shape, dt.x);
          const Tensor mean = bias ? Tensor::empty(Shape{N}, DType::f32) : Tensor();
          const Tensor rstd = Tensor::empty(Shape{N}, DType::f32);
          for (const Tensor* t : {&y, &mean, &rstd})
            if (t->defined()) poison(*t);
          if (!in_place) poison(r_out);
          ops::residual_norm_forward(kind, r_out, y, mean, rstd, r_in, x, w, b, kEps);
          // r_out is the sum rounded once to the dtype (f32: correctly rounded).
          const Vec sum = plus(r_in_v, xv);
          EXPECT_TRUE(test::all_close(r_out, sum, dt.x == DType::f32 ? 1e-7 : 4e-3, 0.0)) << "r_out";
          // y is the norm of r_out as stored (what the backward will see).
          const Vec rv = to_f64(r_out), bv = bias ? to_f64(b) : Vec();
          const RefFwd ref = ref_forward(kind, rv, to_f64(w), bias ? &bv : nullptr, N, C, kEps);
          EXPECT_TRUE(close(y, ref.y, ref.y_scale, out_rtol(dt.x))) << "y";
          check_stats(kind, mean, rstd, ref, rv);
        }
}

// --- backward --------------------------------------------------------------------

enum class Alias { none, dx_is_dx_add, dx_is_dy };

void run_backward(NormKind kind, bool with_db, bool with_add, Alias alias, const Shape& shape, const DTypes& dt,
                  std::mt19937_64& rng, double lo = -1.0, double hi = 1.0) {
  SCOPED_TRACE(std::string(kind_name(kind)) + (with_db ? " db" : "") + (with_add ? " dx_add" : "") +
               (alias == Alias::dx_is_dx_add ? " dx=dx_add" : alias == Alias::dx_is_dy ? " dx=dy" : "") + " " +
               shape.str() + " " + dtypes_str(dt));
  const int64_t C = shape[-1], N = shape.numel() / C;
  const bool ln = kind == NormKind::layernorm;
  const Tensor x = random_tensor(shape, dt.x, rng, lo, hi);
  const Tensor w = random_tensor(Shape{C}, dt.w, rng, -1.5, 1.5);
  // Saved statistics from the op's own forward, as in training.
  const Tensor mean = ln ? Tensor::empty(Shape{N}, DType::f32) : Tensor();
  const Tensor rstd = Tensor::empty(Shape{N}, DType::f32);
  ops::norm_forward(kind, Tensor::empty(shape, dt.x), mean, rstd, x, w, Tensor(), kEps);

  const Tensor dy = random_tensor(shape, dt.x, rng);
  const Tensor dx_add = with_add ? random_tensor(shape, dt.x, rng) : Tensor();
  const Vec dyv = to_f64(dy), addv = with_add ? to_f64(dx_add) : Vec();
  Tensor dx;
  if (alias == Alias::dx_is_dx_add) {
    dx = dx_add;
  } else if (alias == Alias::dx_is_dy) {
    dx = dy;
  } else {
    dx = Tensor::empty(shape, dt.x);
    poison(dx);
  }
  const Tensor dw = random_tensor(Shape{C}, dt.grad, rng);
  const Tensor db = with_db ? random_tensor(Shape{C}, dt.grad, rng) : Tensor();
  const Vec dw0 = to_f64(dw), db0 = with_db ? to_f64(db) : Vec();

  ops::norm_backward(kind, dx, dw, db, dy, x, w, mean, rstd, dx_add);

  const RefBwd ref = ref_backward(kind, dyv, to_f64(x), to_f64(w), N, C, kEps);
  const double tx = out_rtol(dt.x), tg = out_rtol(dt.grad);
  if (with_add) {
    EXPECT_TRUE(close(dx, plus(ref.dx, addv), plus_abs(ref.dx_scale, addv), tx)) << "dx";
  } else {
    EXPECT_TRUE(close(dx, ref.dx, ref.dx_scale, tx)) << "dx";
  }
  // dw/db accumulate: after = before + sum over rows.
  EXPECT_TRUE(close(dw, plus(dw0, ref.dw), plus_abs(ref.dw_scale, dw0), tg)) << "dw";
  if (with_db) {
    EXPECT_TRUE(close(db, plus(db0, ref.db), plus_abs(ref.db_scale, db0), tg)) << "db";
  }
}

TEST(Norm, BackwardMatchesReference) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(5);
  for (const DTypes& dt : kDTypes)
    for (const Shape& s : kShapes) {
      run_backward(NormKind::layernorm, true, false, Alias::none, s, dt, rng, -2.0, 3.0);
      run_backward(NormKind::layernorm, false, true, Alias::none, s, dt, rng);
      run_backward(NormKind::rmsnorm, false, false, Alias::none, s, dt, rng, -2.0, 3.0);
      run_backward(NormKind::rmsnorm, false, true, Alias::none, s, dt, rng);
    }
}

TEST(Norm, BackwardInPlace) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(6);
  for (const DTypes& dt : {kDTypes[0], kDTypes[1]})
    for (const Shape& s : {Shape{1, 7}, Shape{5, 129}, Shape{300, 129}})
      for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
        const bool ln = kind == NormKind::layernorm;
        run_backward(kind, ln, true, Alias::dx_is_dx_add, s, dt, rng);
        run_backward(kind, ln, false, Alias::dx_is_dy, s, dt, rng);
        run_backward(kind, ln, true, Alias::dx_is_dy, s, dt, rng);
      }
}

TEST(Norm, LayerNormBackwardLargeMean) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(7);
  for (const Shape& s : {Shape{16, 768}, Shape{3, 129}})
    run_backward(NormKind::layernorm, true, true, Alias::none, s, kDTypes[0], rng, 99.0, 101.0);
}

// dw/db are bitwise identical for any thread count (fixed chunking, fixed order).
TEST(Norm, ParamGradsDeterministicAcrossThreadCounts) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(8);
  const int64_t N = 333, C = 129;  // large enough to take the threaded path
  const int saved = omp_get_max_threads();
  for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
    SCOPED_TRACE(kind_name(kind));
    const bool ln = kind == NormKind::layernorm;
    const Tensor x = random_tensor(Shape{N, C}, DType::f32, rng);
    const Tensor w = random_tensor(Shape{C}, DType::f32, rng);
    const Tensor dy = random_tensor(Shape{N, C}, DType::f32, rng);
    const Tensor mean = ln ? Tensor::empty(Shape{N}, DType::f32) : Tensor();
    const Tensor rstd = Tensor::empty(Shape{N}, DType::f32);
    ops::norm_forward(kind, Tensor::empty(Shape{N, C}, DType::f32), mean, rstd, x, w, Tensor(), kEps);
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2, 3, 5}) {
      omp_set_num_threads(threads);
      const Tensor dw = Tensor::empty(Shape{C}, DType::f32), db = Tensor::empty(Shape{C}, DType::f32);
      std::memset(dw.data_ptr(), 0, dw.nbytes());
      std::memset(db.data_ptr(), 0, db.nbytes());
      const Tensor dx = Tensor::empty(Shape{N, C}, DType::f32);
      ops::norm_backward(kind, dx, dw, ln ? db : Tensor(), dy, x, w, mean, rstd);
      std::vector<float> r(dw.data<float>(), dw.data<float>() + C);
      if (ln) r.insert(r.end(), db.data<float>(), db.data<float>() + C);
      results.push_back(std::move(r));
    }
    omp_set_num_threads(saved);
    for (size_t i = 1; i < results.size(); ++i)
      EXPECT_EQ(std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(float)), 0)
          << "thread setting #" << i << " differs from 1 thread";
  }
}

// GradWrite::overwrite (a step's first write of a parameter gradient) writes
// dw and db without reading them: over NaN it gives the bits of the sums
// added into zeros; dx is the same either way. An empty batch writes zeros.
TEST(Norm, BackwardOverwritesParameterGradientsWithoutReadingThem) {
  auto rng = test::make_rng(46);
  for (const NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
    for (const DType dt : {DType::f32, DType::bf16}) {
      for (const int64_t N : {int64_t(37), int64_t(0)}) {
        SCOPED_TRACE(std::string(kind == NormKind::rmsnorm ? "rmsnorm " : "layernorm ") +
                     std::string(dtype_name(dt)) + ", N " + std::to_string(N));
        const int64_t C = 24;
        const bool ln = kind == NormKind::layernorm;
        const Tensor x = random_tensor(Shape{N, C}, dt, rng), dy = random_tensor(Shape{N, C}, dt, rng);
        const Tensor w = random_tensor(Shape{C}, dt, rng), b = ln ? random_tensor(Shape{C}, dt, rng) : Tensor();
        Tensor y = Tensor::empty(Shape{N, C}, dt), rstd = Tensor::empty(Shape{N}, DType::f32);
        Tensor mean = ln ? Tensor::empty(Shape{N}, DType::f32) : Tensor();
        ops::norm_forward(kind, y, mean, rstd, x, w, b, kEps);
        auto run = [&](ops::GradWrite write, bool poisoned) {
          Tensor dx = Tensor::empty(Shape{N, C}, dt), dw = Tensor::empty(Shape{C}, DType::f32);
          Tensor db = ln ? Tensor::empty(Shape{C}, DType::f32) : Tensor();
          for (const Tensor* t : {&dw, &db})
            if (t->defined()) poisoned ? poison(*t) : (void)std::memset(t->data_ptr(), 0, t->nbytes());
          ops::norm_backward(kind, dx, dw, db, dy, x, w, mean, rstd, Tensor(), write);
          return std::vector<std::vector<double>>{to_f64(dx), to_f64(dw), ln ? to_f64(db) : std::vector<double>{}};
        };
        EXPECT_EQ(run(ops::GradWrite::overwrite, true), run(ops::GradWrite::accumulate, false));
      }
    }
  }
}

TEST(Norm, EmptyBatchIsANoOp) {
  const Tensor x = Tensor::empty(Shape{0, 8}, DType::f32);
  const Tensor w = Tensor::empty(Shape{8}, DType::f32);
  const Tensor stats = Tensor::empty(Shape{0}, DType::f32), stats2 = Tensor::empty(Shape{0}, DType::f32);
  EXPECT_NO_THROW(ops::norm_forward(NormKind::layernorm, Tensor::empty(Shape{0, 8}, DType::f32), stats, stats2, x,
                                    w, Tensor(), kEps));
}

// --- argument validation -----------------------------------------------------------

struct FwdArgs {
  Tensor y, mean, rstd, x, w, b;
};

FwdArgs good_forward(NormKind kind, DType dt = DType::f32) {
  const int64_t N = 4, C = 8;
  FwdArgs a;
  a.x = Tensor::empty(Shape{N, C}, dt);
  a.y = Tensor::empty(Shape{N, C}, dt);
  a.w = Tensor::empty(Shape{C}, dt);
  if (kind == NormKind::layernorm) {
    a.b = Tensor::empty(Shape{C}, dt);
    a.mean = Tensor::empty(Shape{N}, DType::f32);
  }
  a.rstd = Tensor::empty(Shape{N}, DType::f32);
  for (const Tensor* t : {&a.x, &a.w, &a.b})
    if (t->defined()) std::memset(t->data_ptr(), 0, t->nbytes());
  return a;
}

std::string fwd_error(NormKind kind, const FwdArgs& a, float eps = kEps) {
  return error_of([&] { ops::norm_forward(kind, a.y, a.mean, a.rstd, a.x, a.w, a.b, eps); });
}

TEST(NormArgs, ForwardRejectsBadArguments) {
  for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
    SCOPED_TRACE(kind_name(kind));
    const std::string op = std::string(kind_name(kind)) + "_forward";
    EXPECT_EQ(fwd_error(kind, good_forward(kind)), "<no zt::Error thrown>");
    {  // wrong w shape
      FwdArgs a = good_forward(kind);
      a.w = Tensor::empty(Shape{5}, DType::f32);
      const std::string msg = fwd_error(kind, a);
      EXPECT_THAT(msg, HasSubstr(op));
      EXPECT_THAT(msg, HasSubstr("'w' has shape (5) but (8) is required"));
    }
    {  // y shape mismatch
      FwdArgs a = good_forward(kind);
      a.y = Tensor::empty(Shape{4, 9}, DType::f32);
      EXPECT_THAT(fwd_error(kind, a), HasSubstr("'y' has shape (4, 9)"));
    }
    {  // dtype mismatch between x and y
      FwdArgs a = good_forward(kind);
      a.y = Tensor::empty(Shape{4, 8}, DType::bf16);
      const std::string msg = fwd_error(kind, a);
      EXPECT_THAT(msg, HasSubstr(op));
      EXPECT_THAT(msg, HasSubstr("'y' is bf16 but 'x' is f32"));
    }
    {  // unsupported dtype
      FwdArgs a = good_forward(kind);
      a.x = Tensor::empty(Shape{4, 8}, DType::f16);
      EXPECT_THAT(fwd_error(kind, a), HasSubstr("'x' is f16 on the CPU"));
    }
    {  // rstd wrong shape / dtype
      FwdArgs a = good_forward(kind);
      a.rstd = Tensor::empty(Shape{4, 1}, DType::f32);
      EXPECT_THAT(fwd_error(kind, a), HasSubstr("'rstd' has shape (4, 1) but (4) is required"));
      a.rstd = Tensor::empty(Shape{4}, DType::bf16);
      EXPECT_THAT(fwd_error(kind, a), HasSubstr("'rstd' has dtype bf16"));
    }
    {  // device mismatch
      FwdArgs a = good_forward(kind);
      a.w = fake_cuda(Shape{8}, DType::f32);
      const std::string msg = fwd_error(kind, a);
      EXPECT_THAT(msg, HasSubstr(op));
      EXPECT_THAT(msg, HasSubstr("'w' is on cuda:63"));
    }
    {  // all on a device without a kernel
      FwdArgs a = good_forward(kind);
      a.x = fake_cuda(Shape{4, 8}, DType::f32);
      a.y = fake_cuda(Shape{4, 8}, DType::f32);
      a.w = fake_cuda(Shape{8}, DType::f32);
      a.b = a.b.defined() ? fake_cuda(Shape{8}, DType::f32) : Tensor();
      a.mean = a.mean.defined() ? fake_cuda(Shape{4}, DType::f32) : Tensor();
      a.rstd = fake_cuda(Shape{4}, DType::f32);
      EXPECT_THAT(fwd_error(kind, a), HasSubstr("cuda:63"));
    }
    {  // y overlapping x
      FwdArgs a = good_forward(kind);
      a.y = a.x;
      EXPECT_THAT(fwd_error(kind, a), HasSubstr("'y'"));
    }
    {  // missing rstd, bad eps, 0-d x
      FwdArgs a = good_forward(kind);
      EXPECT_THAT(fwd_error(kind, a, -1.0f), HasSubstr("eps"));
      EXPECT_THAT(fwd_error(kind, a, NAN), HasSubstr("eps"));
      a.rstd = Tensor();
      EXPECT_THAT(fwd_error(kind, a), HasSubstr("'rstd' is required"));
      FwdArgs s = good_forward(kind);
      s.x = Tensor::empty(Shape{}, DType::f32);
      EXPECT_THAT(fwd_error(kind, s), HasSubstr("'x' has shape ()"));
    }
  }
  {  // LayerNorm: b of the wrong shape / dtype, mean missing
    FwdArgs a = good_forward(NormKind::layernorm);
    a.b = Tensor::empty(Shape{7}, DType::f32);
    EXPECT_THAT(fwd_error(NormKind::layernorm, a), HasSubstr("'b' has shape (7) but (8) is required"));
    a.b = Tensor::empty(Shape{8}, DType::bf16);
    EXPECT_THAT(fwd_error(NormKind::layernorm, a), HasSubstr("'b' is bf16 but 'w' is f32"));
    FwdArgs m = good_forward(NormKind::layernorm);
    m.mean = Tensor();
    EXPECT_THAT(fwd_error(NormKind::layernorm, m), HasSubstr("layernorm_forward: argument 'mean' is required"));
  }
  {  // RMSNorm: b or mean given
    FwdArgs a = good_forward(NormKind::rmsnorm);
    a.b = Tensor::empty(Shape{8}, DType::f32);
    std::string msg = fwd_error(NormKind::rmsnorm, a);
    EXPECT_THAT(msg, HasSubstr("rmsnorm_forward"));
    EXPECT_THAT(msg, HasSubstr("'b' must be undefined for RMSNorm"));
    FwdArgs m = good_forward(NormKind::rmsnorm);
    m.mean = Tensor::empty(Shape{4}, DType::f32);
    EXPECT_THAT(fwd_error(NormKind::rmsnorm, m), HasSubstr("'mean' must be undefined for RMSNorm"));
  }
}

struct BwdArgs {
  Tensor dx, dw, db, dy, x, w, mean, rstd, dx_add;
};

BwdArgs good_backward(NormKind kind) {
  const int64_t N = 4, C = 8;
  BwdArgs a;
  for (Tensor* t : {&a.dx, &a.dy, &a.x, &a.dx_add}) *t = Tensor::empty(Shape{N, C}, DType::f32);
  a.w = Tensor::empty(Shape{C}, DType::f32);
  a.dw = Tensor::empty(Shape{C}, DType::f32);
  a.rstd = Tensor::empty(Shape{N}, DType::f32);
  if (kind == NormKind::layernorm) {
    a.db = Tensor::empty(Shape{C}, DType::f32);
    a.mean = Tensor::empty(Shape{N}, DType::f32);
  }
  for (const Tensor* t : {&a.dx, &a.dw, &a.db, &a.dy, &a.x, &a.w, &a.mean, &a.rstd, &a.dx_add})
    if (t->defined()) std::memset(t->data_ptr(), 0, t->nbytes());
  return a;
}

std::string bwd_error(NormKind kind, const BwdArgs& a) {
  return error_of([&] { ops::norm_backward(kind, a.dx, a.dw, a.db, a.dy, a.x, a.w, a.mean, a.rstd, a.dx_add); });
}

TEST(NormArgs, BackwardRejectsBadArguments) {
  for (NormKind kind : {NormKind::layernorm, NormKind::rmsnorm}) {
    SCOPED_TRACE(kind_name(kind));
    const std::string op = std::string(kind_name(kind)) + "_backward";
    EXPECT_EQ(bwd_error(kind, good_backward(kind)), "<no zt::Error thrown>");
    {
      BwdArgs a = good_backward(kind);
      a.w = Tensor::empty(Shape{9}, DType::f32);
      const std::string msg = bwd_error(kind, a);
      EXPECT_THAT(msg, HasSubstr(op));
      EXPECT_THAT(msg, HasSubstr("'w' has shape (9) but (8) is required"));
    }
    {
      BwdArgs a = good_backward(kind);
      a.dw = Tensor::empty(Shape{8, 1}, DType::f32);
      EXPECT_THAT(bwd_error(kind, a), HasSubstr("'dw' has shape (8, 1)"));
    }
    {  // dw must be f32 or w's dtype
      BwdArgs a = good_backward(kind);
      a.dw = Tensor::empty(Shape{8}, DType::bf16);
      EXPECT_THAT(bwd_error(kind, a), HasSubstr("'dw' has dtype bf16"));
    }
    {
      BwdArgs a = good_backward(kind);
      a.dy = Tensor::empty(Shape{4, 8}, DType::bf16);
      const std::string msg = bwd_error(kind, a);
      EXPECT_THAT(msg, HasSubstr(op));
      EXPECT_THAT(msg, HasSubstr("'dy' is bf16 but 'x' is f32"));
    }
    {
      BwdArgs a = good_backward(kind);
      a.dx_add = Tensor::empty(Shape{3, 8}, DType::f32);
      EXPECT_THAT(bwd_error(kind, a), HasSubstr("'dx_add' has shape (3, 8)"));
    }
    {
      BwdArgs a = good_backward(kind);
      a.dy = fake_cuda(Shape{4, 8}, DType::f32);
      const std::string msg = bwd_error(kind, a);
      EXPECT_THAT(msg, HasSubstr(op));
      EXPECT_THAT(msg, HasSubstr("'dy' is on cuda:63"));
    }
    {  // dx partially overlapping dy
      BwdArgs a = good_backward(kind);
      const Tensor big = Tensor::empty(Shape{5, 8}, DType::f32);
      a.dy = big.slice(0, 4);
      a.dx = big.slice(1, 5);
      EXPECT_THAT(bwd_error(kind, a), HasSubstr("'dx' f32(4, 8) on cpu partially overlaps 'dy'"));
    }
    {  // dx aliasing x, dw aliasing dx
      BwdArgs a = good_backward(kind);
      a.dx = a.x;
      EXPECT_THAT(bwd_error(kind, a), HasSubstr("'dx' f32(4, 8) on cpu overlaps 'x'"));
      BwdArgs b = good_backward(kind);
      b.dw = b.dx.flatten().flat_view(0, Shape{8});
      EXPECT_THAT(bwd_error(kind, b), HasSubstr("overlaps"));
    }
  }
  {
    BwdArgs a = good_backward(NormKind::rmsnorm);
    a.db = Tensor::empty(Shape{8}, DType::f32);
    EXPECT_THAT(bwd_error(NormKind::rmsnorm, a), HasSubstr("rmsnorm_backward: 'db' must be undefined for RMSNorm"));
    BwdArgs m = good_backward(NormKind::layernorm);
    m.mean = Tensor::empty(Shape{5}, DType::f32);
    EXPECT_THAT(bwd_error(NormKind::layernorm, m), HasSubstr("'mean' has shape (5) but (4) is required"));
  }
}

TEST(NormArgs, ResidualForwardRejectsBadArguments) {
  const NormKind kind = NormKind::layernorm;
  FwdArgs a = good_forward(kind);
  Tensor r_in = Tensor::empty(Shape{4, 8}, DType::f32), r_out = Tensor::empty(Shape{4, 8}, DType::f32);
  auto err = [&](const Tensor& ro, const Tensor& ri, const FwdArgs& f) {
    return error_of([&] { ops::residual_norm_forward(kind, ro, f.y, f.mean, f.rstd, ri, f.x, f.w, f.b, kEps); });
  };
  EXPECT_EQ(err(r_out, r_in, a), "<no zt::Error thrown>");
  EXPECT_EQ(err(r_in, r_in, a), "<no zt::Error thrown>");  // in place
  EXPECT_THAT(err(r_out, Tensor::empty(Shape{4, 8}, DType::bf16), a),
              HasSubstr("residual_layernorm_forward: 'r_in' is bf16 but 'x' is f32"));
  EXPECT_THAT(err(Tensor::empty(Shape{2, 8}, DType::f32), r_in, a), HasSubstr("'r_out' has shape (2, 8)"));
  EXPECT_THAT(err(r_out, fake_cuda(Shape{4, 8}, DType::f32), a), HasSubstr("'r_in' is on cuda:63"));
  EXPECT_THAT(err(a.x, r_in, a), HasSubstr("'r_out' f32(4, 8) on cpu overlaps 'x'"));
  EXPECT_THAT(err(r_out, r_in, [&] {
                FwdArgs f = a;
                f.y = r_out;
                return f;
              }()),
              HasSubstr("overlaps 'y'"));
  FwdArgs r = good_forward(NormKind::rmsnorm);
  EXPECT_THAT(error_of([&] {
                ops::residual_norm_forward(NormKind::rmsnorm, r_out, r.y, r.mean, r.rstd, r_in, r.x, r.w,
                                           Tensor::empty(Shape{8}, DType::f32), kEps);
              }),
              HasSubstr("residual_rmsnorm_forward: 'b' must be undefined for RMSNorm"));
}

}  // namespace
}  // namespace zt
