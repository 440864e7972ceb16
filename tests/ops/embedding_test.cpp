// Token + position embedding against float64 references.
//
// Forward: one rounding of wte + wpe to the table dtype: f32 rtol 2^-23 (one
// ulp), bf16 rtol 2^-7 (one bf16 ulp); without wpe the rows are copied
// bit for bit. Backward: the kernel sums k rows in f32 and adds once, so the
// error is <= ~k ulp of sum|terms|: we check |got - ref| <= 1e-6 * (|before| +
// sum|terms|) elementwise, plus half a bf16 ulp of the result for bf16 grads.
#include "ops/embedding.h"

#include <cstdint>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using test::make_rng;
using test::poison;
using test::random_tensor;
using test::random_tokens;
using test::to_f64;

using test::error_of;
using test::fake_cuda;

struct Case {
  int64_t B, T, C, V, Tmax, pos_offset;
};
const Case kCases[] = {{1, 1, 1, 1, 1, 0},   {2, 5, 7, 11, 9, 3},   {3, 17, 64, 5, 20, 2},
                       {1, 33, 129, 1000, 40, 7}, {4, 8, 768, 3, 8, 0}, {5, 3, 3, 2, 3, 0}};

// out = wte[tok] + wpe[t + off] in float64 (wpe may be empty).
std::vector<double> ref_forward(const std::vector<int32_t>& tok, const std::vector<double>& wte,
                                const std::vector<double>& wpe, int64_t B, int64_t T, int64_t C, int64_t off) {
  std::vector<double> out(size_t(B * T * C));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c)
        out[size_t((b * T + t) * C + c)] = wte[size_t(tok[size_t(b * T + t)] * C + c)] +
                                           (wpe.empty() ? 0.0 : wpe[size_t((t + off) * C + c)]);
  return out;
}

struct GradRef {
  std::vector<double> dwte, dwte_abs, dwpe, dwpe_abs;  // value and |before| + sum|terms|
};

GradRef ref_backward(const std::vector<double>& dwte0, const std::vector<double>& dwpe0, const std::vector<double>& dout,
                     const std::vector<int32_t>& tok, int64_t B, int64_t T, int64_t C, int64_t off) {
  GradRef r{dwte0, dwte0, dwpe0, dwpe0};
  for (double& x : r.dwte_abs) x = std::fabs(x);
  for (double& x : r.dwpe_abs) x = std::fabs(x);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        const double d = dout[size_t((b * T + t) * C + c)];
        const size_t iv = size_t(tok[size_t(b * T + t)] * C + c), ip = size_t((t + off) * C + c);
        r.dwte[iv] += d;
        r.dwte_abs[iv] += std::fabs(d);
        r.dwpe[ip] += d;
        r.dwpe_abs[ip] += std::fabs(d);
      }
  return r;
}

void expect_grad_close(const Tensor& got, const std::vector<double>& ref, const std::vector<double>& mag) {
  const double round = got.dtype() == DType::bf16 ? 0x1p-8 : 0.0;
  int64_t bad = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = test::load_f64(got, i), r = ref[size_t(i)];
    const double tol = 1e-6 * mag[size_t(i)] + round * std::fabs(r);
    if (!(std::fabs(g - r) <= tol) && bad++ < 3)
      ADD_FAILURE() << got.str() << " element " << i << ": got " << g << ", reference " << r << " (tol " << tol
                    << ", seed " << test::test_seed() << ")";
  }
  EXPECT_EQ(bad, 0);
}

std::vector<int32_t> tokens_vec(const Tensor& t) {
  return std::vector<int32_t>(t.data<int32_t>(), t.data<int32_t>() + t.numel());
}

TEST(EmbeddingTest, ForwardMatchesFloat64) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(31);
  for (DType dt : {DType::f32, DType::bf16}) {
    for (const Case& c : kCases) {
      for (bool with_wpe : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                     " C=" + std::to_string(c.C) + " V=" + std::to_string(c.V) + (with_wpe ? " wpe" : " no wpe"));
        Tensor tok = random_tokens(Shape{c.B, c.T}, c.V, rng);
        Tensor wte = random_tensor(Shape{c.V, c.C}, dt, rng);
        Tensor wpe = with_wpe ? random_tensor(Shape{c.Tmax, c.C}, dt, rng) : Tensor();
        const int64_t off = with_wpe ? c.pos_offset : 0;
        Tensor out = Tensor::empty(Shape{c.B, c.T, c.C}, dt);
        poison(out);
        ops::embedding_forward(out, tok, wte, wpe, off);
        const auto ref = ref_forward(tokens_vec(tok), to_f64(wte), with_wpe ? to_f64(wpe) : std::vector<double>(),
                                     c.B, c.T, c.C, off);
        const double rtol = dt == DType::f32 ? 0x1p-23 : 0x1p-7;
        EXPECT_TRUE(test::all_close(out, ref, rtol, dt == DType::f32 ? 0x1p-149 : 0x1p-133));
        if (!with_wpe) {  // a plain gather: bit-exact rows
          const size_t row = size_t(c.C) * dtype_size(dt);
          for (int64_t i = 0; i < c.B * c.T; ++i)
            ASSERT_EQ(std::memcmp(static_cast<char*>(out.data_ptr()) + size_t(i) * row,
                                  static_cast<char*>(wte.data_ptr()) + size_t(tok.data<int32_t>()[i]) * row, row),
                      0);
        }
      }
    }
  }
}

TEST(EmbeddingTest, BackwardAccumulatesRepeatedTokens) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(32);
  for (DType dt : {DType::f32, DType::bf16}) {       // dout dtype
    for (DType gdt : {DType::f32, dt}) {              // grad dtype: f32 or the table's
      for (const Case& c : kCases) {
        SCOPED_TRACE(std::string("dout ") + std::string(dtype_name(dt)) + " grads " +
                     std::string(dtype_name(gdt)) + " B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                     " C=" + std::to_string(c.C) + " V=" + std::to_string(c.V));
        Tensor tok = random_tokens(Shape{c.B, c.T}, c.V, rng);  // V small: many repeats
        if (c.B * c.T > 4) tok.data<int32_t>()[3] = tok.data<int32_t>()[1];
        Tensor dout = random_tensor(Shape{c.B, c.T, c.C}, dt, rng);
        Tensor dwte = random_tensor(Shape{c.V, c.C}, gdt, rng);  // accumulated into
        Tensor dwpe = random_tensor(Shape{c.Tmax, c.C}, gdt, rng);
        const auto dwte0 = to_f64(dwte), dwpe0 = to_f64(dwpe);
        ops::embedding_backward(dwte, dwpe, dout, tok, c.pos_offset);
        const GradRef r = ref_backward(dwte0, dwpe0, to_f64(dout), tokens_vec(tok), c.B, c.T, c.C, c.pos_offset);
        expect_grad_close(dwte, r.dwte, r.dwte_abs);
        expect_grad_close(dwpe, r.dwpe, r.dwpe_abs);
        // Rows of dwpe outside [pos_offset, pos_offset + T) are untouched.
        for (int64_t t = 0; t < c.Tmax; ++t)
          if (t < c.pos_offset || t >= c.pos_offset + c.T) {
            for (int64_t k = 0; k < c.C; ++k)
              ASSERT_EQ(test::load_f64(dwpe, t * c.C + k), dwpe0[size_t(t * c.C + k)]);
          }

        // Either gradient alone.
        Tensor dwte_only = random_tensor(Shape{c.V, c.C}, gdt, rng);
        const auto w0 = to_f64(dwte_only);
        ops::embedding_backward(dwte_only, Tensor(), dout, tok, c.pos_offset);
        const GradRef r2 = ref_backward(w0, dwpe0, to_f64(dout), tokens_vec(tok), c.B, c.T, c.C, c.pos_offset);
        expect_grad_close(dwte_only, r2.dwte, r2.dwte_abs);
      }
    }
  }
}

TEST(EmbeddingTest, ReferenceGradientMatchesFiniteDifferences) {
  ZT_TEST_TRACE_SEED();
  // L = sum(out * dout) with the float64 forward; dL/dwte and dL/dwpe must be
  // the analytic reference (zero initial grads).
  auto rng = make_rng(33);
  const int64_t B = 2, T = 3, C = 2, V = 3, Tmax = 5, off = 1;
  const std::vector<int32_t> tok = {0, 2, 0, 1, 0, 0};
  std::uniform_real_distribution<double> u(-1, 1);
  std::vector<double> wte(size_t(V * C)), wpe(size_t(Tmax * C)), dout(size_t(B * T * C));
  for (std::vector<double>* v : {&wte, &wpe, &dout})
    for (double& x : *v) x = u(rng);
  auto loss = [&](const std::vector<double>& a, const std::vector<double>& p) {
    const auto out = ref_forward(tok, a, p, B, T, C, off);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * dout[i];
    return s;
  };
  const GradRef r = ref_backward(std::vector<double>(wte.size(), 0.0), std::vector<double>(wpe.size(), 0.0), dout,
                                 tok, B, T, C, off);
  const double h = 1e-6;
  for (size_t i = 0; i < wte.size(); ++i) {
    auto ap = wte, am = wte;
    ap[i] += h;
    am[i] -= h;
    EXPECT_NEAR(r.dwte[i], (loss(ap, wpe) - loss(am, wpe)) / (2 * h), 1e-8) << "dwte " << i;
  }
  for (size_t i = 0; i < wpe.size(); ++i) {
    auto pp = wpe, pm = wpe;
    pp[i] += h;
    pm[i] -= h;
    EXPECT_NEAR(r.dwpe[i], (loss(wte, pp) - loss(wte, pm)) / (2 * h), 1e-8) << "dwpe " << i;
  }
}

TEST(EmbeddingTest, BackwardIsBitwiseThreadCountIndependent) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(34);
  const int64_t B = 4, T = 200, C = 96, V = 37, Tmax = 256;
  const int saved = omp_get_max_threads();
  for (DType dt : {DType::f32, DType::bf16}) {
    Tensor tok = random_tokens(Shape{B, T}, V, rng);
    Tensor dout = random_tensor(Shape{B, T, C}, dt, rng);
    Tensor w0 = random_tensor(Shape{V, C}, dt, rng), p0 = random_tensor(Shape{Tmax, C}, dt, rng);
    std::vector<std::vector<uint8_t>> results;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      Tensor w = Tensor::empty(w0.shape(), dt), p = Tensor::empty(p0.shape(), dt);
      std::memcpy(w.data_ptr(), w0.data_ptr(), w0.nbytes());
      std::memcpy(p.data_ptr(), p0.data_ptr(), p0.nbytes());
      ops::embedding_backward(w, p, dout, tok, 13);
      std::vector<uint8_t> bytes(w.nbytes() + p.nbytes());
      std::memcpy(bytes.data(), w.data_ptr(), w.nbytes());
      std::memcpy(bytes.data() + w.nbytes(), p.data_ptr(), p.nbytes());
      results.push_back(std::move(bytes));
    }
    omp_set_num_threads(saved);
    EXPECT_TRUE(results[0] == results[1]) << dtype_name(dt) << ": 1 vs 2 threads";
    EXPECT_TRUE(results[0] == results[2]) << dtype_name(dt) << ": 1 vs 3 threads";
  }
}

TEST(EmbeddingTest, BadTokenIdsAreReportedBeforeWriting) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(35);
  const int64_t B = 2, T = 4, C = 3, V = 10;
  Tensor wte = random_tensor(Shape{V, C}, DType::f32, rng), wpe = random_tensor(Shape{T, C}, DType::f32, rng);
  for (int32_t bad : {10, -1, 123456}) {
    Tensor tok = random_tokens(Shape{B, T}, V, rng);
    tok.data<int32_t>()[1 * T + 2] = bad;  // (b=1, t=2)
    Tensor out = Tensor::empty(Shape{B, T, C}, DType::f32);
    poison(out);
    std::string msg = error_of([&] { ops::embedding_forward(out, tok, wte, wpe, 0); });
    EXPECT_THAT(msg, HasSubstr("embedding_forward"));
    EXPECT_THAT(msg, HasSubstr("token id " + std::to_string(bad)));
    EXPECT_THAT(msg, HasSubstr("(b=1, t=2)"));
    EXPECT_THAT(msg, HasSubstr("V = 10"));
    for (int64_t i = 0; i < out.numel(); ++i) ASSERT_TRUE(std::isnan(out.data<float>()[i]));

    Tensor dwte = Tensor::empty(Shape{V, C}, DType::f32), dwpe = Tensor::empty(Shape{T, C}, DType::f32);
    poison(dwte);
    poison(dwpe);
    msg = error_of([&] { ops::embedding_backward(dwte, dwpe, out, tok, 0); });
    EXPECT_THAT(msg, HasSubstr("embedding_backward"));
    EXPECT_THAT(msg, HasSubstr("(b=1, t=2)"));
    for (int64_t i = 0; i < dwpe.numel(); ++i) ASSERT_TRUE(std::isnan(dwpe.data<float>()[i]));
  }
}

TEST(EmbeddingTest, BadArguments) {
  ZT_TEST_TRACE_SEED();
  const int64_t B = 2, T = 4, C = 3, V = 10;
  Tensor tok = Tensor::empty(Shape{B, T}, DType::i32);
  for (int64_t i = 0; i < tok.numel(); ++i) tok.data<int32_t>()[i] = int32_t(i % V);
  Tensor wte = Tensor::empty(Shape{V, C}, DType::f32), wpe = Tensor::empty(Shape{6, C}, DType::f32);
  Tensor out = Tensor::empty(Shape{B, T, C}, DType::f32);
  auto fwd = [&](const std::string& msg, const char* what) {
    EXPECT_THAT(msg, HasSubstr("embedding_forward"));
    EXPECT_THAT(msg, HasSubstr(what));
  };
  fwd(error_of([&] { ops::embedding_forward(out, Tensor::empty(Shape{B, T}, DType::i64), wte, wpe, 0); }), "'tokens'");
  fwd(error_of([&] { ops::embedding_forward(out, tok.view(Shape{B * T}), wte, wpe, 0); }), "'tokens'");
  fwd(error_of([&] { ops::embedding_forward(out, tok, wte, Tensor::empty(Shape{6, C + 1}, DType::f32), 0); }),
      "'wpe'");
  fwd(error_of([&] { ops::embedding_forward(out, tok, wte, Tensor::empty(Shape{6, C}, DType::bf16), 0); }), "'wpe'");
  fwd(error_of([&] { ops::embedding_forward(out, tok, wte, wpe, 3); }), "pos_offset");
  fwd(error_of([&] { ops::embedding_forward(out, tok, wte, wpe, -1); }), "pos_offset");
  fwd(error_of([&] { ops::embedding_forward(Tensor::empty(Shape{B, T, C + 1}, DType::f32), tok, wte, wpe, 0); }),
      "'out'");
  fwd(error_of([&] { ops::embedding_forward(Tensor::empty(Shape{B, T, C}, DType::bf16), tok, wte, wpe, 0); }),
      "'out'");
  fwd(error_of([&] { ops::embedding_forward(out, tok, Tensor::empty(Shape{V, C}, DType::f16), Tensor(), 0); }),
      "'wte'");
  fwd(error_of([&] { ops::embedding_forward(out, tok, fake_cuda(Shape{V, C}, DType::f32), Tensor(), 0); }), "'wte'");
  fwd(error_of([&] { ops::embedding_forward(out, tok, out.view(Shape{B * T, C}), Tensor(), 0); }), "overlaps");

  auto bwd = [&](const std::string& msg, const char* what) {
    EXPECT_THAT(msg, HasSubstr("embedding_backward"));
    EXPECT_THAT(msg, HasSubstr(what));
  };
  Tensor dwte = Tensor::empty(Shape{V, C}, DType::f32), dwpe = Tensor::empty(Shape{6, C}, DType::f32);
  bwd(error_of([&] { ops::embedding_backward(dwte, dwpe, out.view(Shape{B * T, C}), tok, 0); }), "'dout'");
  bwd(error_of([&] { ops::embedding_backward(dwte, dwpe, out, Tensor::empty(Shape{B, T + 1}, DType::i32), 0); }),
      "'tokens'");
  bwd(error_of([&] { ops::embedding_backward(Tensor::empty(Shape{V, C}, DType::bf16), dwpe, out, tok, 0); }),
      "'dwte'");
  Tensor out_bf16 = Tensor::empty(Shape{B, T, C}, DType::bf16);
  bwd(error_of([&] { ops::embedding_backward(Tensor::empty(Shape{V, C}, DType::f16), Tensor(), out_bf16, tok, 0); }),
      "'dwte'");
  bwd(error_of([&] { ops::embedding_backward(Tensor::empty(Shape{V, C + 2}, DType::f32), dwpe, out, tok, 0); }),
      "'dwte'");
  bwd(error_of([&] { ops::embedding_backward(dwte, dwpe, out, tok, 5); }), "pos_offset");
  bwd(error_of([&] { ops::embedding_backward(dwte, fake_cuda(Shape{6, C}, DType::f32), out, tok, 0); }), "'dwpe'");
  bwd(error_of([&] { ops::embedding_backward(dwte, dwte.view(Shape{V, C}).slice(0, 6), out, tok, 0); }), "overlaps");
}

}  // namespace
}  // namespace zt

namespace zt {
namespace {

// Tensor-parallel vocabulary slices: slice r holds rows [r Vl, r Vl + Vl)
// (the last ones padded past V). The slices' forward outputs summed (slice 0
// adding the positions) equal the float64 reference, and each slice's
// gradient equals its rows of the reference; tokens of other slices are
// skipped, padding rows get nothing.
TEST(EmbeddingTest, VocabSlicesAddUpToTheWholeTable) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(31);
  const int64_t B = 3, T = 11, C = 37, V = 101, tp = 4, Vl = (V + tp - 1) / tp, off = 2;
  Tensor tokens = test::random_tokens(Shape{B, T}, V, rng);
  Tensor wte = test::random_tensor(Shape{tp * Vl, C}, DType::f32, rng);
  Tensor wpe = test::random_tensor(Shape{T + off, C}, DType::f32, rng);
  Tensor dout = test::random_tensor(Shape{B, T, C}, DType::f32, rng);
  const auto tok = tokens_vec(tokens);
  const auto wte64 = to_f64(wte);
  const auto want = ref_forward(tok, std::vector<double>(wte64.begin(), wte64.begin() + V * C), to_f64(wpe), B, T, C, off);
  std::vector<double> sum(size_t(B * T * C), 0.0);
  for (int64_t r = 0; r < tp; ++r) {
    Tensor out = Tensor::empty(Shape{B, T, C}, DType::f32);
    poison(out);
    const Tensor w = wte.slice(r * Vl, (r + 1) * Vl);
    ops::embedding_forward(out, tokens, w, r == 0 ? wpe : Tensor(), off, ops::VocabSlice{r * Vl, V});
    const auto o = to_f64(out);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += o[i];
    Tensor dw = test::random_tensor(Shape{Vl, C}, DType::f32, rng);
    const auto dw0 = to_f64(dw);
    ops::embedding_backward(dw, Tensor(), dout, tokens, off, ops::VocabSlice{r * Vl, V});
    // Reference: the rows this slice holds, accumulated onto its starting values.
    std::vector<double> grad = dw0, mag(dw0.size());
    for (size_t i = 0; i < mag.size(); ++i) mag[i] = std::fabs(dw0[i]);
    const auto d = to_f64(dout);
    for (int64_t i = 0; i < B * T; ++i) {
      const int64_t v = tok[size_t(i)] - r * Vl;
      if (v < 0 || v >= Vl) continue;
      for (int64_t c = 0; c < C; ++c) {
        grad[size_t(v * C + c)] += d[size_t(i * C + c)];
        mag[size_t(v * C + c)] += std::fabs(d[size_t(i * C + c)]);
      }
    }
    expect_grad_close(dw, grad, mag);
  }
  for (size_t i = 0; i < sum.size(); ++i) ASSERT_NEAR(sum[i], want[i], 1e-6 * (std::fabs(want[i]) + 1)) << i;
  // A token past the whole vocabulary is still an error, whichever slice sees it.
  tokens.data<int32_t>()[5] = int32_t(V);
  Tensor out = Tensor::empty(Shape{B, T, C}, DType::f32);
  EXPECT_THAT(error_of([&] {
                ops::embedding_forward(out, tokens, wte.slice(0, Vl), Tensor(), 0, ops::VocabSlice{0, V});
              }),
              HasSubstr("token id 101"));
}

}  // namespace
}  // namespace zt
