// Tests of grouped-query attention (ops/attention.h), causal and unmasked,
// against a float64 reference that builds the full softmax (with the causal
// mask) row by row.
#include "backend/cpu/attention.h"

#include <cstdint>
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "test_util.h"

namespace zt {
namespace {

using test::all_close;
using test::poison;
using test::random_tensor;
using test::to_f64;

struct Dims {
  int64_t B, T, Hq, Hkv, D;
  int64_t unmasked_keys = 0;  // 0: causal (T keys); > 0: that many keys, no mask
  bool causal() const { return unmasked_keys == 0; }
  int64_t Tk() const { return causal() ? T : unmasked_keys; }
  // The keys query t sees: [0, keys_seen(t)).
  int64_t keys_seen(int64_t t) const { return causal() ? t + 1 : unmasked_keys; }
  ops::AttentionMask mask() const { return causal() ? ops::AttentionMask::causal : ops::AttentionMask::none; }
  Shape q() const { return Shape{B, T, Hq, D}; }
  Shape kv() const { return Shape{B, Tk(), Hkv, D}; }
  Shape lse() const { return Shape{B, Hq, T}; }
  std::string str() const {
    return "B=" + std::to_string(B) + " T=" + std::to_string(T) + " Hq=" + std::to_string(Hq) +
           " Hkv=" + std::to_string(Hkv) + " D=" + std::to_string(D) +
           (causal() ? " causal" : " unmasked Tk=" + std::to_string(unmasked_keys));
  }
};

// ---------------------------------------------------------------------------
// float64 reference. Layout (B, T, H, D); kv head of query head h is h / (Hq / Hkv).

struct RefOut {
  std::vector<double> out, lse;
};
struct RefGrad {
  std::vector<double> dq, dk, dv;
};

// Probabilities P_s (s < keys_seen(t)) of query (b, t, h) and the logsumexp.
void ref_probs(const Dims& d, const std::vector<double>& q, const std::vector<double>& k, double scale, int64_t b,
               int64_t t, int64_t h, std::vector<double>& p, double& lse) {
  const int64_t g = h / (d.Hq / d.Hkv), ns = d.keys_seen(t);
  p.assign(size_t(ns), 0.0);
  double mx = -INFINITY;
  for (int64_t s = 0; s < ns; ++s) {
    double dot = 0.0;
    for (int64_t c = 0; c < d.D; ++c)
      dot += q[size_t(((b * d.T + t) * d.Hq + h) * d.D + c)] * k[size_t(((b * d.Tk() + s) * d.Hkv + g) * d.D + c)];
    p[size_t(s)] = scale * dot;
    mx = std::max(mx, p[size_t(s)]);
  }
  double sum = 0.0;
  for (double& x : p) sum += std::exp(x - mx);
  lse = mx + std::log(sum);
  for (double& x : p) x = std::exp(x - lse);
}

RefOut ref_forward(const Dims& d, const std::vector<double>& q, const std::vector<double>& k,
                   const std::vector<double>& v, double scale) {
  RefOut r;
  r.out.assign(size_t(d.q().numel()), 0.0);
  r.lse.assign(size_t(d.lse().numel()), 0.0);
  std::vector<double> p;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t g = h / (d.Hq / d.Hkv);
        ref_probs(d, q, k, scale, b, t, h, p, r.lse[size_t((b * d.Hq + h) * d.T + t)]);
        for (int64_t s = 0; s < d.keys_seen(t); ++s)
          for (int64_t c = 0; c < d.D; ++c)
            r.out[size_t(((b * d.T + t) * d.Hq + h) * d.D + c)] +=
                p[size_t(s)] * v[size_t(((b * d.Tk() + s) * d.Hkv + g) * d.D + c)];
      }
  return r;
}

// Gradient of L = sum(dout * out) from first principles: dP_s = dout . v_s,
// dS_s = P_s (dP_s - sum_s' P_s' dP_s'), dq = scale dS k, dk_s += scale dS_s q,
// dv_s += P_s dout.
RefGrad ref_backward(const Dims& d, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, const std::vector<double>& dout, double scale) {
  RefGrad r;
  r.dq.assign(size_t(d.q().numel()), 0.0);
  r.dk.assign(size_t(d.kv().numel()), 0.0);
  r.dv.assign(size_t(d.kv().numel()), 0.0);
  std::vector<double> p, dp;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.Hq; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        const int64_t g = h / (d.Hq / d.Hkv);
        double lse;
        ref_probs(d, q, k, scale, b, t, h, p, lse);
        const size_t qo = size_t(((b * d.T + t) * d.Hq + h) * d.D);
        const int64_t ns = d.keys_seen(t);
        dp.assign(size_t(ns), 0.0);
        double dsum = 0.0;
        for (int64_t s = 0; s < ns; ++s) {
          const size_t ko = size_t(((b * d.Tk() + s) * d.Hkv + g) * d.D);
          for (int64_t c = 0; c < d.D; ++c) dp[size_t(s)] += dout[qo + size_t(c)] * v[ko + size_t(c)];
          dsum += p[size_t(s)] * dp[size_t(s)];
        }
        for (int64_t s = 0; s < ns; ++s) {
          const size_t ko = size_t(((b * d.Tk() + s) * d.Hkv + g) * d.D);
          const double ds = p[size_t(s)] * (dp[size_t(s)] - dsum);
          for (int64_t c = 0; c < d.D; ++c) {
            r.dq[qo + size_t(c)] += scale * ds * k[ko + size_t(c)];
            r.dk[ko + size_t(c)] += scale * ds * q[qo + size_t(c)];
            r.dv[ko + size_t(c)] += p[size_t(s)] * dout[qo + size_t(c)];
          }
        }
      }
  return r;
}

// ---------------------------------------------------------------------------

using test::error_of;

void expect_error(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  const std::string msg = error_of(f);
  for (const char* part : parts) EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

struct Tolerance {
  double rtol, atol;  // atol is relative to the largest |reference| element
};

::testing::AssertionResult close(const Tensor& got, const std::vector<double>& ref, Tolerance tol) {
  double mx = 1.0;  // inputs are O(1): absolute errors are at least eps-level of 1
  for (double x : ref) mx = std::max(mx, std::fabs(x));
  return all_close(got, ref, tol.rtol, tol.atol * mx);
}

// Runs forward and backward on fresh inputs of the given dtype and compares
// with the float64 reference of the (rounded) inputs.
void check_case(const Dims& d, DType dtype, float scale, uint64_t salt) {
  SCOPED_TRACE(d.str() + " " + std::string(dtype_name(dtype)) + " scale=" + std::to_string(scale));
  auto rng = test::make_rng(salt);
  Tensor q = random_tensor(d.q(), dtype, rng), k = random_tensor(d.kv(), dtype, rng),
         v = random_tensor(d.kv(), dtype, rng), dout = random_tensor(d.q(), dtype, rng);
  const double s = scale > 0 ? double(scale) : 1.0 / std::sqrt(double(d.D));

  // f32: every product is a fixed-order f32 sum of <= max(T, D) terms and one
  // exp with ~1e-7 relative error; errors observed are ~1e-6 of the tensor's
  // scale. bf16: outputs are rounded once (2^-9 relative) and the backward
  // uses the rounded out in D_t = dout . out, so ~1e-2 of the scale.
  const bool bf = dtype == DType::bf16;
  const Tolerance t_out = bf ? Tolerance{1e-2, 4e-3} : Tolerance{1e-5, 2e-6};
  const Tolerance t_lse{1e-5, 1e-6};  // lse is f32 in both cases
  const Tolerance t_grad = bf ? Tolerance{2e-2, 1e-2} : Tolerance{1e-4, 1e-5};

  Tensor out = Tensor::empty(d.q(), dtype), lse = Tensor::empty(d.lse(), DType::f32);
  poison(out);
  poison(lse);
  ops::attention_forward(out, lse, q, k, v, scale, d.mask());
  const RefOut ref = ref_forward(d, to_f64(q), to_f64(k), to_f64(v), s);
  EXPECT_TRUE(close(out, ref.out, t_out)) << "out";
  EXPECT_TRUE(close(lse, ref.lse, t_lse)) << "lse";

  Tensor dq = Tensor::empty(d.q(), dtype), dk = Tensor::empty(d.kv(), dtype), dv = Tensor::empty(d.kv(), dtype);
  poison(dq);
  poison(dk);
  poison(dv);
  ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, d.mask());
  const RefGrad g = ref_backward(d, to_f64(q), to_f64(k), to_f64(v), to_f64(dout), s);
  EXPECT_TRUE(close(dq, g.dq, t_grad)) << "dq";
  EXPECT_TRUE(close(dk, g.dk, t_grad)) << "dk";
  EXPECT_TRUE(close(dv, g.dv, t_grad)) << "dv";

  // Both backward schedules of the CPU kernel give the same bits as the call above.
  for (auto schedule : {cpu::BackwardSchedule::fused, cpu::BackwardSchedule::split}) {
    Tensor dq2 = Tensor::empty(d.q(), dtype), dk2 = Tensor::empty(d.kv(), dtype), dv2 = Tensor::empty(d.kv(), dtype);
    poison(dq2);
    poison(dk2);
    poison(dv2);
    cpu::attention_backward(dq2, dk2, dv2, dout, q, k, v, out, lse, float(s), d.causal(), schedule);
    const char* name = schedule == cpu::BackwardSchedule::fused ? "fused" : "split";
    EXPECT_EQ(std::memcmp(dq2.data_ptr(), dq.data_ptr(), dq.nbytes()), 0) << "dq, " << name << " schedule";
    EXPECT_EQ(std::memcmp(dk2.data_ptr(), dk.data_ptr(), dk.nbytes()), 0) << "dk, " << name << " schedule";
    EXPECT_EQ(std::memcmp(dv2.data_ptr(), dv.data_ptr(), dv.nbytes()), 0) << "dv, " << name << " schedule";
  }
}

// ---------------------------------------------------------------------------

TEST(Attention, ReferenceBackwardMatchesFiniteDifferences) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(1);
  const Dims d{1, 4, 2, 1, 3};
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  auto rnd = [&](int64_t n) {
    std::vector<double> x(static_cast<size_t>(n));
    for (double& e : x) e = u(rng);
    return x;
  };
  std::vector<double> q = rnd(d.q().numel()), k = rnd(d.kv().numel()), v = rnd(d.kv().numel()), w = rnd(d.q().numel());
  const double scale = 0.7;
  const RefGrad g = ref_backward(d, q, k, v, w, scale);
  auto loss = [&] {
    const RefOut r = ref_forward(d, q, k, v, scale);
    double l = 0.0;
    for (size_t i = 0; i < w.size(); ++i) l += w[i] * r.out[i];
    return l;
  };
  const double h = 1e-5;
  auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + h;
      const double lp = loss();
      x[i] = x0 - h;
      const double lm = loss();
      x[i] = x0;
      EXPECT_NEAR(grad[i], (lp - lm) / (2 * h), 1e-8) << name << "[" << i << "]";
    }
  };
  check(q, g.dq, "dq");
  check(k, g.dk, "dk");
  check(v, g.dv, "dv");
  // Each query's probabilities sum to 1, and the first query sees only key 0.
  const RefOut r = ref_forward(d, q, k, v, scale);
  for (int64_t c = 0; c < d.D; ++c) EXPECT_NEAR(r.out[size_t(c)], v[size_t(c)], 1e-15);
}

TEST(Attention, F32MatchesReference) {
  ZT_TEST_TRACE_SEED();
  const Dims shapes[] = {
      {1, 1, 1, 1, 8},     // T = 1: one key
      {1, 7, 2, 2, 16},    // T = 7, Hq = Hkv
      {2, 65, 4, 1, 24},   // B = 2, T not a tile multiple, GQA (Hq = 4 Hkv), D not a multiple of 16
      {1, 65, 1, 1, 1},    // D = 1, one head
      {2, 33, 4, 2, 64},   // GQA 2:1, D = 64 (K and V read in place)
      {1, 130, 3, 3, 32},  // three tiles, the last of 2 rows
      {1, 128, 2, 1, 17},  // exact tile multiple, odd D
      {1, 64, 1, 1, 80},   // D > 64: two column panels
      {1, 70, 4, 2, 128},  // D = 128 read in place: two full column panels
  };
  uint64_t salt = 10;
  for (const Dims& d : shapes) check_case(d, DType::f32, 0.0f, salt++);
}

// Every query against a block of keys of its own length, no mask.
TEST(Attention, UnmaskedF32MatchesReference) {
  ZT_TEST_TRACE_SEED();
  const Dims shapes[] = {
      {1, 1, 1, 1, 8, 1},      // one query, one key
      {1, 7, 2, 2, 16, 5},     // fewer keys than queries
      {2, 65, 4, 1, 24, 130},  // more keys (three key tiles, the last of 2 rows), GQA
      {1, 130, 3, 3, 32, 64},  // three query tiles against one key tile
      {2, 33, 4, 2, 64, 70},   // K and V read in place
      {1, 64, 1, 1, 80, 200},  // D > 64, four key tiles
      {1, 0, 2, 1, 8, 9},      // no queries: dk, dv zero
  };
  uint64_t salt = 80;
  for (const Dims& d : shapes) check_case(d, DType::f32, 0.0f, salt++);
  check_case({1, 20, 2, 1, 8, 30}, DType::f32, 2.5f, salt++);  // sharp softmax
}

TEST(Attention, UnmaskedBf16MatchesReference) {
  ZT_TEST_TRACE_SEED();
  const Dims shapes[] = {{2, 65, 4, 1, 24, 33}, {1, 9, 3, 3, 1, 100}, {1, 70, 2, 2, 64, 64}};
  uint64_t salt = 90;
  for (const Dims& d : shapes) check_case(d, DType::bf16, 0.0f, salt++);
}

// The softmax over keys split into blocks is the blocks' softmaxes merged by
// their lse (what context parallelism's ring does): lse = log sum_b exp(lse_b),
// out = sum_b exp(lse_b - lse) out_b. The backward of each block, given the
// merged out and lse, is that block's share of the whole gradient: the dq sum
// to the whole dq, the blocks' dk and dv are the whole ones' rows.
TEST(Attention, KeyBlocksMergedByLseGiveTheWholeSoftmax) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(95);
  const Dims whole{2, 70, 4, 2, 24, 100};
  const int64_t split = 37;  // block 0: keys [0, 37), block 1: [37, 100)
  const Dims blocks[2] = {{2, 70, 4, 2, 24, split}, {2, 70, 4, 2, 24, whole.Tk() - split}};
  const DType f = DType::f32;
  Tensor q = random_tensor(whole.q(), f, rng), k = random_tensor(whole.kv(), f, rng),
         v = random_tensor(whole.kv(), f, rng), dout = random_tensor(whole.q(), f, rng);
  // Block b's keys and values: rows [b0, b0 + Tk) of every batch.
  auto key_rows = [&](const Tensor& t, int64_t b0, int64_t n) {
    Tensor r = Tensor::empty(Shape{whole.B, n, whole.Hkv, whole.D}, f);
    const int64_t row = whole.Hkv * whole.D;
    for (int64_t b = 0; b < whole.B; ++b)
      std::memcpy(r.data<float>() + b * n * row, t.data<float>() + (b * whole.Tk() + b0) * row,
                  size_t(n * row) * sizeof(float));
    return r;
  };
  Tensor kb[2] = {key_rows(k, 0, split), key_rows(k, split, whole.Tk() - split)};
  Tensor vb[2] = {key_rows(v, 0, split), key_rows(v, split, whole.Tk() - split)};

  std::vector<double> outs[2], lses[2];
  for (int b = 0; b < 2; ++b) {
    Tensor out = Tensor::empty(whole.q(), f), lse = Tensor::empty(whole.lse(), DType::f32);
    poison(out);
    poison(lse);
    ops::attention_forward(out, lse, q, kb[b], vb[b], 0.0f, ops::AttentionMask::none);
    outs[b] = to_f64(out);
    lses[b] = to_f64(lse);
  }
  std::vector<double> merged_out(outs[0].size()), merged_lse(lses[0].size());
  for (int64_t bb = 0; bb < whole.B; ++bb)
    for (int64_t t = 0; t < whole.T; ++t)
      for (int64_t h = 0; h < whole.Hq; ++h) {
        const size_t li = size_t((bb * whole.Hq + h) * whole.T + t);
        const double l0 = lses[0][li], l1 = lses[1][li], mx = std::max(l0, l1);
        const double l = mx + std::log(std::exp(l0 - mx) + std::exp(l1 - mx));
        merged_lse[li] = l;
        for (int64_t c = 0; c < whole.D; ++c) {
          const size_t oi = size_t(((bb * whole.T + t) * whole.Hq + h) * whole.D + c);
          merged_out[oi] = std::exp(l0 - l) * outs[0][oi] + std::exp(l1 - l) * outs[1][oi];
        }
      }
  const double scale = 1.0 / std::sqrt(double(whole.D));
  const RefOut ref = ref_forward(whole, to_f64(q), to_f64(k), to_f64(v), scale);
  auto as_tensor = [&](const std::vector<double>& x, const Shape& shape) {
    Tensor t = Tensor::empty(shape, f);
    for (size_t i = 0; i < x.size(); ++i) t.data<float>()[i] = float(x[i]);
    return t;
  };
  const Tensor out = as_tensor(merged_out, whole.q()), lse = as_tensor(merged_lse, whole.lse());
  EXPECT_TRUE(close(out, ref.out, {1e-5, 2e-6})) << "merged out";
  EXPECT_TRUE(close(lse, ref.lse, {1e-5, 1e-6})) << "merged lse";

  const RefGrad g = ref_backward(whole, to_f64(q), to_f64(k), to_f64(v), to_f64(dout), scale);
  std::vector<double> dq_sum(size_t(whole.q().numel()), 0.0);
  for (int b = 0; b < 2; ++b) {
    Tensor dq = Tensor::empty(whole.q(), f), dk = Tensor::empty(blocks[b].kv(), f), dv = Tensor::empty(blocks[b].kv(), f);
    poison(dq);
    poison(dk);
    poison(dv);
    ops::attention_backward(dq, dk, dv, dout, q, kb[b], vb[b], out, lse, 0.0f, ops::AttentionMask::none);
    const std::vector<double> dqb = to_f64(dq);
    for (size_t i = 0; i < dq_sum.size(); ++i) dq_sum[i] += dqb[i];
    // The whole gradient's rows of this block.
    const int64_t b0 = b == 0 ? 0 : split, n = blocks[b].Tk(), row = whole.Hkv * whole.D;
    std::vector<double> dk_ref, dv_ref;
    for (int64_t bb = 0; bb < whole.B; ++bb) {
      const auto first = size_t((bb * whole.Tk() + b0) * row), last = first + size_t(n * row);
      dk_ref.insert(dk_ref.end(), g.dk.begin() + long(first), g.dk.begin() + long(last));
      dv_ref.insert(dv_ref.end(), g.dv.begin() + long(first), g.dv.begin() + long(last));
    }
    EXPECT_TRUE(close(dk, dk_ref, {1e-4, 1e-5})) << "dk of block " << b;
    EXPECT_TRUE(close(dv, dv_ref, {1e-4, 1e-5})) << "dv of block " << b;
  }
  EXPECT_TRUE(close(as_tensor(dq_sum, whole.q()), g.dq, {1e-4, 1e-5})) << "dq summed over the blocks";
}

// ops::attention_merge against float64: a running (out, lse) of 11 rows
// takes a block at rows [3, 8) - running lse of -inf (nothing merged yet),
// below, equal to and above the block's -, and the rows outside the block
// keep their bits. f32 and bf16 blocks.
TEST(Attention, MergeOpMatchesFloat64) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(96);
  const int64_t B = 2, T = 11, H = 3, D = 20, n = 5, row0 = 3;
  for (const DType dt : {DType::f32, DType::bf16}) {
    Tensor out = random_tensor(Shape{B, T, H, D}, DType::f32, rng);
    Tensor lse = random_tensor(Shape{B, H, T}, DType::f32, rng, -3, 3);
    const Tensor part = random_tensor(Shape{B, n, H, D}, dt, rng);
    const Tensor part_lse = random_tensor(Shape{B, H, n}, DType::f32, rng, -3, 3);
    float* l = lse.data<float>();
    const float* pl = part_lse.data<float>();
    l[(0 * H + 0) * T + row0] = -INFINITY;                      // nothing merged yet
    l[(0 * H + 1) * T + row0 + 1] = pl[(0 * H + 1) * n + 1];    // equal weights
    l[(1 * H + 2) * T + row0 + 4] = pl[(1 * H + 2) * n + 4] + 30.0f;  // the block all but vanishes
    const std::vector<double> out0 = to_f64(out), lse0 = to_f64(lse), p = to_f64(part), p_lse = to_f64(part_lse);
    std::vector<double> want_out = out0, want_lse = lse0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < n; ++i) {
          const size_t li = size_t((b * H + h) * T + row0 + i);
          const double run = lse0[li], blk = p_lse[size_t((b * H + h) * n + i)];
          const double merged =
              std::isinf(run) ? blk : std::max(run, blk) + std::log1p(std::exp(-std::fabs(run - blk)));
          want_lse[li] = merged;
          for (int64_t d = 0; d < D; ++d) {
            const size_t oi = size_t(((b * T + row0 + i) * H + h) * D + d);
            const double w_run = std::isinf(run) ? 0.0 : std::exp(run - merged);
            want_out[oi] = w_run * out0[oi] + std::exp(blk - merged) * p[size_t(((b * n + i) * H + h) * D + d)];
          }
        }
    ops::attention_merge(out, lse, part, part_lse, row0);
    EXPECT_TRUE(close(out, want_out, {2e-6, 1e-7})) << dtype_name(dt) << " out";
    EXPECT_TRUE(close(lse, want_lse, {1e-6, 1e-7})) << dtype_name(dt) << " lse";
    for (int64_t b = 0; b < B; ++b)  // rows outside the block: the same bits
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t) {
          if (t >= row0 && t < row0 + n) continue;
          const size_t li = size_t((b * H + h) * T + t);
          ASSERT_EQ(lse.data<float>()[li], float(lse0[li])) << "lse row " << t << " outside the block changed";
          for (int64_t d = 0; d < D; ++d) {
            const size_t oi = size_t(((b * T + t) * H + h) * D + d);
            ASSERT_EQ(out.data<float>()[oi], float(out0[oi])) << "out row " << t << " outside the block changed";
          }
        }
  }
}

TEST(Attention, MergeBadArguments) {
  ZT_TEST_TRACE_SEED();
  const Tensor out = Tensor::empty(Shape{1, 8, 2, 4}, DType::f32), lse = Tensor::empty(Shape{1, 2, 8}, DType::f32);
  const Tensor part = Tensor::empty(Shape{1, 4, 2, 4}, DType::f32);
  const Tensor part_lse = Tensor::empty(Shape{1, 2, 4}, DType::f32);
  expect_error([&] { ops::attention_merge(out, lse, part, part_lse, 5); },
               {"attention_merge", "rows [5, 9)", "within the 8 rows of 'out'"});
  expect_error([&] { ops::attention_merge(part, lse, out, part_lse, 0); }, {"attention_merge", "'lse'"});
  const Tensor bf16_out = Tensor::empty(Shape{1, 8, 2, 4}, DType::bf16);
  expect_error([&] { ops::attention_merge(bf16_out, lse, part, part_lse, 0); }, {"attention_merge", "'out'", "bf16"});
  expect_error([&] { ops::attention_merge(out, lse, out.slice(0, 1), part_lse, 0); }, {"attention_merge"});
}

TEST(Attention, ExplicitScale) {
  ZT_TEST_TRACE_SEED();
  check_case({1, 20, 2, 1, 8}, DType::f32, 2.5f, 30);  // sharp softmax
  check_case({2, 9, 1, 1, 4}, DType::f32, 0.05f, 31);
}

TEST(Attention, Bf16MatchesReference) {
  ZT_TEST_TRACE_SEED();
  const Dims shapes[] = {{1, 1, 1, 1, 8}, {2, 65, 4, 1, 24}, {1, 70, 2, 2, 64}, {1, 9, 3, 3, 1}};
  uint64_t salt = 40;
  for (const Dims& d : shapes) check_case(d, DType::bf16, 0.0f, salt++);
}

// Same bits with 1, 2 and 3 threads. With B * Hkv = 4 tasks, 3 threads (and
// with B * Hkv = 1, 2 or 3 threads) switch the backward to the split
// schedule, which must agree with the fused one.
TEST(Attention, DeterministicAcrossThreadCounts) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(50);
  const int saved = omp_get_max_threads();
  const Dims shapes[] = {{2, 100, 4, 2, 24}, {1, 150, 3, 1, 16}, {1, 150, 3, 1, 16, 90}, {2, 70, 4, 2, 8, 200}};
  for (const Dims& d : shapes) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(d.str() + " " + std::string(dtype_name(dtype)));
      Tensor q = random_tensor(d.q(), dtype, rng), k = random_tensor(d.kv(), dtype, rng),
             v = random_tensor(d.kv(), dtype, rng), dout = random_tensor(d.q(), dtype, rng);
      std::vector<Tensor> results[3];
      for (int run = 0; run < 3; ++run) {
        omp_set_num_threads(run + 1);
        Tensor out = Tensor::empty(d.q(), dtype), lse = Tensor::empty(d.lse(), DType::f32);
        Tensor dq = Tensor::empty(d.q(), dtype), dk = Tensor::empty(d.kv(), dtype), dv = Tensor::empty(d.kv(), dtype);
        ops::attention_forward(out, lse, q, k, v, 0.0f, d.mask());
        ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, 0.0f, d.mask());
        results[run] = {out, lse, dq, dk, dv};
      }
      omp_set_num_threads(saved);
      const char* names[] = {"out", "lse", "dq", "dk", "dv"};
      for (int run = 1; run < 3; ++run)
        for (size_t i = 0; i < 5; ++i)
          EXPECT_EQ(std::memcmp(results[0][i].data_ptr(), results[run][i].data_ptr(), results[0][i].nbytes()), 0)
              << names[i] << " differs between 1 and " << run + 1 << " threads";
    }
  }
}

// Zero-sized batch or sequence: nothing to compute, no error; with B * T > 0
// but no query heads, dk and dv are zero (nothing attends to the keys).
TEST(Attention, EmptyShapes) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(55);
  for (const Dims& d : {Dims{0, 5, 2, 1, 8}, Dims{2, 0, 2, 1, 8}, Dims{2, 3, 0, 1, 8}}) {
    SCOPED_TRACE(d.str());
    Tensor q = random_tensor(d.q(), DType::f32, rng), k = random_tensor(d.kv(), DType::f32, rng),
           v = random_tensor(d.kv(), DType::f32, rng), dout = random_tensor(d.q(), DType::f32, rng);
    Tensor out = Tensor::empty(d.q(), DType::f32), lse = Tensor::empty(d.lse(), DType::f32);
    Tensor dq = Tensor::empty(d.q(), DType::f32), dk = Tensor::empty(d.kv(), DType::f32),
           dv = Tensor::empty(d.kv(), DType::f32);
    poison(dk);
    poison(dv);
    ops::attention_forward(out, lse, q, k, v);
    ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
    const std::vector<double> zeros(size_t(d.kv().numel()), 0.0);
    EXPECT_TRUE(all_close(dk, zeros, 0.0, 0.0));
    EXPECT_TRUE(all_close(dv, zeros, 0.0, 0.0));
  }
}

TEST(Attention, BadArguments) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(60);
  const Dims d{2, 5, 4, 2, 8};
  const DType f = DType::f32;
  Tensor q = random_tensor(d.q(), f, rng), k = random_tensor(d.kv(), f, rng), v = random_tensor(d.kv(), f, rng);
  Tensor out = Tensor::empty(d.q(), f), lse = Tensor::empty(d.lse(), f);
  Tensor dq = Tensor::empty(d.q(), f), dk = Tensor::empty(d.kv(), f), dv = Tensor::empty(d.kv(), f);
  Tensor dout = random_tensor(d.q(), f, rng);
  ops::attention_forward(out, lse, q, k, v);  // valid: no throw
  ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);

  const char* fw = "attention_forward";
  const char* bw = "attention_backward";
  // Hq not divisible by Hkv.
  Tensor k3 = random_tensor(Shape{2, 5, 3, 8}, f, rng), v3 = random_tensor(Shape{2, 5, 3, 8}, f, rng);
  expect_error([&] { ops::attention_forward(out, lse, q, k3, v3); }, {fw, "'q' has 4 heads", "'k'"});
  // Mismatched shapes.
  Tensor k_t = random_tensor(Shape{2, 6, 2, 8}, f, rng);
  expect_error([&] { ops::attention_forward(out, lse, q, k_t, v); }, {fw, "'k'", "(2, 6, 2, 8)"});
  Tensor k_d = random_tensor(Shape{2, 5, 2, 4}, f, rng);
  expect_error([&] { ops::attention_forward(out, lse, q, k_d, v); }, {fw, "'k'"});
  expect_error([&] { ops::attention_forward(out, lse, q, k, k_t); }, {fw, "'v'"});
  Tensor q3 = random_tensor(Shape{2, 5, 32}, f, rng);
  expect_error([&] { ops::attention_forward(out, lse, q3, k, v); }, {fw, "'q'", "4-dimensional"});
  Tensor out_bad = Tensor::empty(Shape{2, 5, 4, 4}, f);
  expect_error([&] { ops::attention_forward(out_bad, lse, q, k, v); }, {fw, "'out'"});
  // lse wrong shape (B, T, Hq instead of B, Hq, T) and dtype.
  Tensor lse_t = Tensor::empty(Shape{2, 5, 4}, f);
  expect_error([&] { ops::attention_forward(out, lse_t, q, k, v); }, {fw, "'lse'", "(2, 4, 5)"});
  expect_error([&] { ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse_t); }, {bw, "'lse'"});
  Tensor lse_bf = Tensor::empty(d.lse(), DType::bf16);
  expect_error([&] { ops::attention_forward(out, lse_bf, q, k, v); }, {fw, "'lse'", "bf16"});
  // Dtype mismatch and unsupported dtype.
  Tensor k_bf = random_tensor(d.kv(), DType::bf16, rng);
  expect_error([&] { ops::attention_forward(out, lse, q, k_bf, v); }, {fw, "'k'", "bf16"});
  Tensor out_bf = Tensor::empty(d.q(), DType::bf16);
  expect_error([&] { ops::attention_forward(out_bf, lse, q, k, v); }, {fw, "'out'"});
  Tensor qi = Tensor::empty(d.q(), DType::i32), ki = Tensor::empty(d.kv(), DType::i32),
         vi = Tensor::empty(d.kv(), DType::i32);
  expect_error([&] { ops::attention_forward(out, lse, qi, ki, vi); }, {fw, "'q'", "i32"});
  Tensor dk_bf = Tensor::empty(d.kv(), DType::bf16);
  expect_error([&] { ops::attention_backward(dq, dk_bf, dv, dout, q, k, v, out, lse); }, {bw, "'dk'"});
  // Backward shapes.
  Tensor dk_q = Tensor::empty(d.q(), f);
  expect_error([&] { ops::attention_backward(dq, dk_q, dv, dout, q, k, v, out, lse); }, {bw, "'dk'"});
  expect_error([&] { ops::attention_backward(dq, dk, dk_q, dout, q, k, v, out, lse); }, {bw, "'dv'"});
  expect_error([&] { ops::attention_backward(dk, dk, dv, dout, q, k, v, out, lse); }, {bw, "'dq'"});
  expect_error([&] { ops::attention_backward(dq, dk, dv, dk, q, k, v, out, lse); }, {bw, "'dout'"});
  // Device mismatch (a fake CUDA tensor, never dereferenced).
  Tensor k_cuda = Tensor::wrap(k.data_ptr(), d.kv(), f, Device::cuda(63));
  expect_error([&] { ops::attention_forward(out, lse, q, k_cuda, v); }, {fw, "'k'", "cuda:63"});
  Tensor lse_cuda = Tensor::wrap(lse.data_ptr(), d.lse(), f, Device::cuda(63));
  expect_error([&] { ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse_cuda); }, {bw, "'lse'", "cuda:63"});
  // All on CUDA: no kernel in this build.
  Tensor qc = Tensor::wrap(q.data_ptr(), d.q(), f, Device::cuda(63)),
         kc = Tensor::wrap(k.data_ptr(), d.kv(), f, Device::cuda(63)),
         vc = Tensor::wrap(v.data_ptr(), d.kv(), f, Device::cuda(63)),
         oc = Tensor::wrap(out.data_ptr(), d.q(), f, Device::cuda(63));
  expect_error([&] { ops::attention_forward(oc, lse_cuda, qc, kc, vc); }, {fw, "cuda"});
  // Overlapping outputs and inputs.
  expect_error([&] { ops::attention_forward(q, lse, q, k, v); }, {fw, "'out'", "'q'"});
  expect_error([&] { ops::attention_backward(dq, dk, dk, dout, q, k, v, out, lse); }, {bw, "'dk'", "'dv'"});
  expect_error([&] { ops::attention_backward(dout, dk, dv, dout, q, k, v, out, lse); }, {bw, "'dq'", "'dout'"});
  // Bad scale.
  expect_error([&] { ops::attention_forward(out, lse, q, k, v, NAN); }, {fw, "'scale'"});
  // Unmasked: any number of keys but at least one; CPU only.
  const auto none = ops::AttentionMask::none;
  Tensor k0 = Tensor::empty(Shape{2, 0, 2, 8}, f), v0 = Tensor::empty(Shape{2, 0, 2, 8}, f);
  expect_error([&] { ops::attention_forward(out, lse, q, k0, v0, 0.0f, none); }, {fw, "'k'", "no keys"});
  Tensor v_t = random_tensor(Shape{2, 6, 2, 8}, f, rng);
  ops::attention_forward(out, lse, q, k_t, v_t, 0.0f, none);  // 6 keys for 5 queries: valid unmasked
  expect_error([&] { ops::attention_forward(out, lse, q, k_t, v, 0.0f, none); }, {fw, "'v'", "(2, 6, 2, 8)"});
  Tensor dk_t = Tensor::empty(Shape{2, 6, 2, 8}, f), dv_t = Tensor::empty(Shape{2, 6, 2, 8}, f);
  expect_error([&] { ops::attention_backward(dq, dk, dv_t, dout, q, k_t, v_t, out, lse, 0.0f, none); }, {bw, "'dk'"});
  ops::attention_backward(dq, dk_t, dv_t, dout, q, k_t, v_t, out, lse, 0.0f, none);
  Tensor dq_c = Tensor::wrap(dq.data_ptr(), d.q(), f, Device::cuda(63)),
         dk_c = Tensor::wrap(dk.data_ptr(), d.kv(), f, Device::cuda(63)),
         dv_c = Tensor::wrap(dv.data_ptr(), d.kv(), f, Device::cuda(63)),
         do_c = Tensor::wrap(dout.data_ptr(), d.q(), f, Device::cuda(63));
  // An unmasked block on a GPU passes the checks (CUDA runs it too): only the missing device stops it.
  expect_error([&] { ops::attention_forward(oc, lse_cuda, qc, kc, vc, 0.0f, none); }, {fw, "cuda:63"});
  expect_error([&] { ops::attention_backward(dq_c, dk_c, dv_c, do_c, qc, kc, vc, oc, lse_cuda, 0.0f, none); },
               {bw, "cuda:63"});
}

// q, k, v as the heads of one (B, T, Hq + 2 Hkv, D) tensor, and the
// backward's dq, dk, dv into one: the same bits as the calls on separate
// tensors (the CPU runs those on copies).
TEST(Attention, PackedHeadsGiveTheBitsOfSeparateTensors) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(70);
  for (const DType dt : {DType::f32, DType::bf16}) {
    for (const Dims& d : {Dims{2, 9, 4, 2, 8}, Dims{1, 33, 3, 3, 16}, Dims{2, 5, 4, 1, 6}}) {
      SCOPED_TRACE(d.str() + " " + std::string(dtype_name(dt)));
      const int64_t H = d.Hq + 2 * d.Hkv;
      const Tensor qkv = random_tensor(Shape{d.B, d.T, H, d.D}, dt, rng), dout = random_tensor(d.q(), dt, rng);
      const Tensor q = test::heads_of(qkv, 0, d.Hq), k = test::heads_of(qkv, d.Hq, d.Hkv),
                   v = test::heads_of(qkv, d.Hq + d.Hkv, d.Hkv);
      Tensor out = Tensor::empty(d.q(), dt), lse = Tensor::empty(d.lse(), DType::f32);
      ops::attention_forward(out, lse, q, k, v);
      Tensor dq = Tensor::empty(d.q(), dt), dk = Tensor::empty(d.kv(), dt), dv = Tensor::empty(d.kv(), dt);
      ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);

      Tensor pout = Tensor::empty(d.q(), dt), plse = Tensor::empty(d.lse(), DType::f32);
      Tensor dqkv = Tensor::empty(qkv.shape(), dt);
      poison(pout);
      poison(plse);
      poison(dqkv);
      ops::attention_forward_packed(pout, plse, qkv, d.Hq, d.Hkv);
      EXPECT_EQ(to_f64(pout), to_f64(out)) << "out";
      EXPECT_EQ(to_f64(plse), to_f64(lse)) << "lse";
      ops::attention_backward_packed(dqkv, dout, qkv, out, lse, d.Hq, d.Hkv);
      EXPECT_EQ(to_f64(dqkv), to_f64(test::heads_joined({dq, dk, dv}))) << "dqkv";
    }
  }
}

TEST(Attention, PackedBadArguments) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(71);
  const Dims d{2, 5, 4, 2, 8};
  const DType f = DType::f32;
  const Tensor qkv = random_tensor(Shape{2, 5, 8, 8}, f, rng), dout = random_tensor(d.q(), f, rng);
  Tensor out = Tensor::empty(d.q(), f), lse = Tensor::empty(d.lse(), f), dqkv = Tensor::empty(qkv.shape(), f);
  ops::attention_forward_packed(out, lse, qkv, 4, 2);  // valid: no throw
  ops::attention_backward_packed(dqkv, dout, qkv, out, lse, 4, 2);

  const char* fw = "attention_forward";
  const char* bw = "attention_backward";
  expect_error([&] { ops::attention_forward_packed(out, lse, qkv, 4, 3); }, {fw, "Hq = 4", "Hkv = 3"});
  expect_error([&] { ops::attention_forward_packed(out, lse, qkv, 2, 2); }, {fw, "'qkv'", "6 heads"});
  Tensor out_short = Tensor::empty(Shape{2, 5, 2, 8}, f);
  expect_error([&] { ops::attention_forward_packed(out_short, lse, qkv, 4, 2); }, {fw, "'out'", "(2, 5, 4, 8)"});
  Tensor dqkv_bf = Tensor::empty(qkv.shape(), DType::bf16);
  expect_error([&] { ops::attention_backward_packed(dqkv_bf, dout, qkv, out, lse, 4, 2); }, {bw, "'dqkv'", "bf16"});
  // The gradient written over the heads it reads.
  Tensor qkv_copy = Tensor::empty(qkv.shape(), f);
  std::memcpy(qkv_copy.data_ptr(), qkv.data_ptr(), qkv.nbytes());
  expect_error([&] { ops::attention_backward_packed(qkv_copy, dout, qkv_copy, out, lse, 4, 2); },
               {bw, "'dqkv'", "'qkv'", "overlaps"});
  expect_error([&] { ops::attention_forward_packed(out, lse, qkv, 4, 2, NAN); }, {fw, "'scale'"});
}

}  // namespace
}  // namespace zt
