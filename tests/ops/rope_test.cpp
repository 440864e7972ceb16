// Tests of rotary position embedding (ops/rope.h) against float64 references:
// frequencies (Llama 3 scaling written independently here), the cos/sin
// table, the rotation and its gradient.
#include "ops/rope.h"

#include <cstdint>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "test_util.h"

namespace zt {
namespace {

using ops::RopeScaling;
using test::all_close;
using test::poison;
using test::random_tensor;
using test::to_f64;

constexpr double kPi = 3.14159265358979323846;

RopeScaling llama31() {
  RopeScaling s;
  s.enabled = true;
  s.factor = 8.0f;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_max_position = 8192;
  return s;
}

enum class Band { high, smooth, low };

// The Llama 3 rule written in terms of r = L / wavelength = L freq / (2 pi),
// the number of periods in the original context: r > high_freq_factor keeps
// freq, r < low_freq_factor divides it by factor, in between it blends
// linearly in r.
double expected_frequency(int64_t i, int64_t D, double theta, const RopeScaling& s, Band* band = nullptr) {
  const double base = 1.0 / std::pow(theta, double(2 * i) / double(D));
  if (!s.enabled) return base;
  const double r = double(s.original_max_position) * base / (2.0 * kPi);
  const double lo = s.low_freq_factor, hi = s.high_freq_factor;
  if (r > hi) {
    if (band) *band = Band::high;
    return base;
  }
  if (r < lo) {
    if (band) *band = Band::low;
    return base / s.factor;
  }
  if (band) *band = Band::smooth;
  const double w = (r - lo) / (hi - lo);  // 0 at the low edge, 1 at the high edge
  return base * (w + (1.0 - w) / s.factor);
}

std::vector<double> expected_freqs(int64_t D, double theta, const RopeScaling& s) {
  std::vector<double> f(size_t(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) f[size_t(i)] = expected_frequency(i, D, theta, s);
  return f;
}

Tensor make_table(int64_t T_max, int64_t D, double theta, const RopeScaling& s) {
  Tensor table = Tensor::empty(Shape{T_max, D / 2, 2}, DType::f32);
  poison(table);
  ops::rope_table(table, D, theta, s);
  return table;
}

// float64 rotation of x (B, T, H, D) at positions t + offset; the inverse
// rotates by -angle.
std::vector<double> ref_rotate(const std::vector<double>& x, const Shape& shape, const std::vector<double>& freqs,
                               int64_t offset, bool inverse) {
  const int64_t B = shape[0], T = shape[1], H = shape[2], D = shape[3];
  std::vector<double> y(x.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          const double a = double(t + offset) * freqs[size_t(i)];
          const double c = std::cos(a), s = inverse ? -std::sin(a) : std::sin(a);
          const size_t o = size_t(((b * T + t) * H + h) * D + 2 * i);
          y[o] = x[o] * c - x[o + 1] * s;
          y[o + 1] = x[o] * s + x[o + 1] * c;
        }
  return y;
}

using test::error_of;

void expect_error(const std::function<void()>& f, std::initializer_list<const char*> parts) {
  const std::string msg = error_of(f);
  for (const char* part : parts) EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
}

// ---------------------------------------------------------------------------

TEST(Rope, FrequencyWithoutScaling) {
  ZT_TEST_TRACE_SEED();
  for (int64_t D : {2, 8, 64, 128}) {
    for (double theta : {10000.0, 500000.0}) {
      for (int64_t i = 0; i < D / 2; ++i) {
        const double want = expected_frequency(i, D, theta, RopeScaling{});
        EXPECT_NEAR(ops::rope_frequency(i, D, theta, RopeScaling{}), want, 1e-14 * want) << D << " " << i;
      }
    }
  }
  EXPECT_EQ(ops::rope_frequency(0, 16, 10000.0, RopeScaling{}), 1.0);
  // A disabled scaling struct with odd values is ignored.
  RopeScaling off = llama31();
  off.enabled = false;
  off.factor = -1.0f;
  EXPECT_EQ(ops::rope_frequency(40, 128, 500000.0, off), ops::rope_frequency(40, 128, 500000.0, RopeScaling{}));
}

TEST(Rope, FrequencyLlama3Scaling) {
  ZT_TEST_TRACE_SEED();
  const int64_t D = 128;
  const double theta = 500000.0;
  const RopeScaling s = llama31();
  int counts[3] = {0, 0, 0};
  for (int64_t i = 0; i < D / 2; ++i) {
    Band band;
    const double want = expected_frequency(i, D, theta, s, &band);
    ++counts[int(band)];
    const double got = ops::rope_frequency(i, D, theta, s);
    EXPECT_NEAR(got, want, 1e-13 * want) << "pair " << i;
    const double unscaled = ops::rope_frequency(i, D, theta, RopeScaling{});
    switch (band) {
      case Band::high:
        EXPECT_EQ(got, unscaled) << "pair " << i;
        break;
      case Band::low:
        EXPECT_NEAR(got, unscaled / 8.0, 1e-15 * unscaled) << "pair " << i;
        break;
      case Band::smooth:
        EXPECT_GT(got, unscaled / 8.0) << "pair " << i;
        EXPECT_LT(got, unscaled) << "pair " << i;
        break;
    }
  }
  // theta = 500000, D = 128, L = 8192: pairs 0..28 high, 29..34 smooth, 35..63 low.
  EXPECT_GT(counts[int(Band::high)], 0);
  EXPECT_GT(counts[int(Band::smooth)], 0);
  EXPECT_GT(counts[int(Band::low)], 0);
  EXPECT_EQ(counts[int(Band::high)], 29);
  EXPECT_EQ(counts[int(Band::smooth)], 6);
  // Frequencies stay monotone across the band edges.
  for (int64_t i = 1; i < D / 2; ++i)
    EXPECT_LT(ops::rope_frequency(i, D, theta, s), ops::rope_frequency(i - 1, D, theta, s)) << i;
}

TEST(Rope, TableMatchesFloat64) {
  ZT_TEST_TRACE_SEED();
  for (bool scaled : {false, true}) {
    const RopeScaling s = scaled ? llama31() : RopeScaling{};
    const int64_t T_max = 300, D = 128;
    const double theta = 500000.0;
    Tensor table = make_table(T_max, D, theta, s);
    const std::vector<double> f = expected_freqs(D, theta, s);
    std::vector<double> ref(size_t(table.numel()));
    for (int64_t t = 0; t < T_max; ++t)
      for (int64_t i = 0; i < D / 2; ++i) {
        ref[size_t((t * (D / 2) + i) * 2)] = std::cos(double(t) * f[size_t(i)]);
        ref[size_t((t * (D / 2) + i) * 2 + 1)] = std::sin(double(t) * f[size_t(i)]);
      }
    // One f32 rounding of values in [-1, 1]: <= 2^-25 absolute.
    EXPECT_TRUE(all_close(table, ref, 0.0, 3.0e-8)) << "scaled " << scaled;
  }
}

void check_forward_backward(const Shape& shape, int64_t T_max, int64_t offset, double theta, const RopeScaling& s,
                            DType dtype, uint64_t salt) {
  SCOPED_TRACE(shape.str() + " offset " + std::to_string(offset) + " " + std::string(dtype_name(dtype)) +
               (s.enabled ? " scaled" : ""));
  auto rng = test::make_rng(salt);
  const int64_t D = shape[3];
  Tensor table = make_table(T_max, D, theta, s);
  const std::vector<double> f = expected_freqs(D, theta, s);
  // f32: the table's rounding (2^-25) and a few f32 operations on O(1)
  // values; bf16: the output is rounded once (2^-9 relative).
  const bool bf = dtype == DType::bf16;
  const double rtol = bf ? 4e-3 : 1e-6, atol = bf ? 1e-5 : 1e-6;

  Tensor x = random_tensor(shape, dtype, rng);
  Tensor y = Tensor::empty(shape, dtype);
  poison(y);
  ops::rope_forward(y, x, table, offset);
  EXPECT_TRUE(all_close(y, ref_rotate(to_f64(x), shape, f, offset, false), rtol, atol)) << "forward";

  Tensor dy = random_tensor(shape, dtype, rng);
  Tensor dx = Tensor::empty(shape, dtype);
  poison(dx);
  ops::rope_backward(dx, dy, table, offset);
  EXPECT_TRUE(all_close(dx, ref_rotate(to_f64(dy), shape, f, offset, true), rtol, atol)) << "backward";

  // In place gives the same bits as out of place.
  Tensor xi = Tensor::empty(shape, dtype), dyi = Tensor::empty(shape, dtype);
  std::memcpy(xi.data_ptr(), x.data_ptr(), x.nbytes());
  std::memcpy(dyi.data_ptr(), dy.data_ptr(), dy.nbytes());
  ops::rope_forward(xi, xi, table, offset);
  ops::rope_backward(dyi, dyi, table, offset);
  EXPECT_EQ(std::memcmp(xi.data_ptr(), y.data_ptr(), y.nbytes()), 0) << "in-place forward";
  EXPECT_EQ(std::memcmp(dyi.data_ptr(), dx.data_ptr(), dx.nbytes()), 0) << "in-place backward";
}

TEST(Rope, F32MatchesReference) {
  ZT_TEST_TRACE_SEED();
  check_forward_backward(Shape{2, 5, 3, 8}, 10, 3, 10000.0, RopeScaling{}, DType::f32, 1);
  check_forward_backward(Shape{1, 1, 1, 2}, 1, 0, 10000.0, RopeScaling{}, DType::f32, 2);  // D = 2, T = 1
  check_forward_backward(Shape{2, 7, 2, 128}, 40, 33, 500000.0, llama31(), DType::f32, 3);
  check_forward_backward(Shape{1, 9, 4, 6}, 9, 0, 500000.0, llama31(), DType::f32, 4);  // T = T_max
  check_forward_backward(Shape{3, 4, 1, 34}, 1000, 990, 10000.0, RopeScaling{}, DType::f32, 5);
}

TEST(Rope, Bf16MatchesReference) {
  ZT_TEST_TRACE_SEED();
  check_forward_backward(Shape{2, 5, 3, 8}, 10, 3, 10000.0, RopeScaling{}, DType::bf16, 11);
  check_forward_backward(Shape{2, 7, 2, 128}, 40, 33, 500000.0, llama31(), DType::bf16, 12);
}

TEST(Rope, BackwardInvertsForward) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(20);
  const Shape shape{2, 33, 3, 64};
  Tensor table = make_table(100, 64, 500000.0, llama31());
  Tensor x = random_tensor(shape, DType::f32, rng);
  Tensor y = Tensor::empty(shape, DType::f32), back = Tensor::empty(shape, DType::f32);
  poison(y);
  poison(back);
  ops::rope_forward(y, x, table, 50);
  ops::rope_backward(back, y, table, 50);
  EXPECT_TRUE(all_close(back, to_f64(x), 0.0, 1e-6));
  // Without the right offset it is not the identity.
  ops::rope_backward(back, y, table, 49);
  EXPECT_FALSE(all_close(back, to_f64(x), 0.0, 1e-3));
}

// The fused qkv product's output (B, T, Hq + 2 Hkv, D) against float64:
// its split into rotated q, k and copied v, and its gradient's join, the
// split's q and k with the bits of rope_forward on the same heads (what three
// products would feed it); then RoPE in place on it, its query and key heads
// against float64 and with those bits too, its value heads untouched to the
// bit, and the gradient the same with the inverse.
void check_fused_qkv(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, int64_t offset, DType dtype,
                     uint64_t salt) {
  SCOPED_TRACE(::testing::Message() << B << "x" << T << "x(" << Hq << "+2x" << Hkv << ")x" << D << " offset "
                                    << offset << " " << dtype_name(dtype));
  auto rng = test::make_rng(salt);
  const RopeScaling s = llama31();
  Tensor table = make_table(offset + T + 2, D, 500000.0, s);
  const std::vector<double> f = expected_freqs(D, 500000.0, s);
  const bool bf = dtype == DType::bf16;
  const double rtol = bf ? 4e-3 : 1e-6, atol = bf ? 1e-5 : 1e-6;
  const Shape qs{B, T, Hq, D}, kvs{B, T, Hkv, D}, packed{B, T, Hq + 2 * Hkv, D};

  const Tensor qkv = random_tensor(packed, dtype, rng);
  Tensor q = Tensor::empty(qs, dtype), k = Tensor::empty(kvs, dtype), v = Tensor::empty(kvs, dtype);
  poison(q);
  poison(k);
  poison(v);
  ops::rope_split_qkv_forward(q, k, v, qkv, table, offset);
  const Tensor q_heads = test::heads_of(qkv, 0, Hq);
  EXPECT_TRUE(all_close(q, ref_rotate(to_f64(q_heads), qs, f, offset, false), rtol, atol)) << "q";
  EXPECT_TRUE(all_close(k, ref_rotate(to_f64(test::heads_of(qkv, Hq, Hkv)), kvs, f, offset, false), rtol, atol))
      << "k";
  EXPECT_TRUE(all_close(v, to_f64(test::heads_of(qkv, Hq + Hkv, Hkv)), 0.0, 0.0)) << "v is copied";
  // The same bits as rope_forward of the query heads alone.
  Tensor q_rope = Tensor::empty(qs, dtype);
  ops::rope_forward(q_rope, q_heads, table, offset);
  EXPECT_EQ(std::memcmp(q_rope.data_ptr(), q.data_ptr(), q.nbytes()), 0) << "q as rope_forward computes it";

  const Tensor dq = random_tensor(qs, dtype, rng), dk = random_tensor(kvs, dtype, rng),
               dv = random_tensor(kvs, dtype, rng);
  Tensor dqkv = Tensor::empty(packed, dtype);
  poison(dqkv);
  ops::rope_split_qkv_backward(dqkv, dq, dk, dv, table, offset);
  const std::vector<double> gq = ref_rotate(to_f64(dq), qs, f, offset, true),
                            gk = ref_rotate(to_f64(dk), kvs, f, offset, true), gv = to_f64(dv);
  std::vector<double> want;
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (const auto* part : {&gq, &gk, &gv}) {
      const int64_t n = part == &gq ? Hq : Hkv;
      want.insert(want.end(), part->begin() + bt * n * D, part->begin() + (bt + 1) * n * D);
    }
  EXPECT_TRUE(all_close(dqkv, want, rtol, atol)) << "dqkv";
  EXPECT_EQ(to_f64(test::heads_of(dqkv, Hq + Hkv, Hkv)), gv) << "dv is copied into dqkv";
  for (const bool backward : {false, true}) {
    SCOPED_TRACE(backward ? "in place, backward" : "in place, forward");
    const Tensor before = random_tensor(packed, dtype, rng);
    Tensor rotated = Tensor::empty(packed, dtype);
    std::memcpy(rotated.data_ptr(), before.data_ptr(), before.nbytes());
    if (backward) ops::rope_packed_qkv_backward(rotated, Hq, Hkv, table, offset);
    else ops::rope_packed_qkv_forward(rotated, Hq, Hkv, table, offset);
    const Tensor q0 = test::heads_of(before, 0, Hq), k0 = test::heads_of(before, Hq, Hkv);
    const std::vector<double> want_q = ref_rotate(to_f64(q0), qs, f, offset, backward),
                              want_k = ref_rotate(to_f64(k0), kvs, f, offset, backward);
    EXPECT_TRUE(all_close(test::heads_of(rotated, 0, Hq), want_q, rtol, atol)) << "query heads";
    EXPECT_TRUE(all_close(test::heads_of(rotated, Hq, Hkv), want_k, rtol, atol)) << "key heads";
    EXPECT_EQ(to_f64(test::heads_of(rotated, Hq + Hkv, Hkv)), to_f64(test::heads_of(before, Hq + Hkv, Hkv)))
        << "value heads untouched";
    // The bits of the separate rotation, which the split also gives.
    Tensor q_sep = Tensor::empty(qs, dtype), k_sep = Tensor::empty(kvs, dtype);
    if (backward) {
      ops::rope_backward(q_sep, q0, table, offset);
      ops::rope_backward(k_sep, k0, table, offset);
    } else {
      ops::rope_forward(q_sep, q0, table, offset);
      ops::rope_forward(k_sep, k0, table, offset);
    }
    EXPECT_EQ(to_f64(test::heads_of(rotated, 0, Hq)), to_f64(q_sep)) << "query heads as rope on their own";
    EXPECT_EQ(to_f64(test::heads_of(rotated, Hq, Hkv)), to_f64(k_sep)) << "key heads as rope on their own";
  }
}

TEST(Rope, SplitQkvBadArguments) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(54);
  const DType f = DType::f32;
  Tensor table = make_table(8, 8, 10000.0, RopeScaling{});
  const Tensor qkv = random_tensor(Shape{2, 5, 8, 8}, f, rng);
  Tensor q = Tensor::empty(Shape{2, 5, 4, 8}, f), k = Tensor::empty(Shape{2, 5, 2, 8}, f),
         v = Tensor::empty(Shape{2, 5, 2, 8}, f);
  ops::rope_split_qkv_forward(q, k, v, qkv, table, 3);  // valid
  ops::rope_split_qkv_backward(qkv, q, k, v, table, 3);  // valid: qkv is written

  Tensor k3 = Tensor::empty(Shape{2, 5, 3, 8}, f);
  expect_error([&] { ops::rope_split_qkv_forward(q, k3, k3, qkv, table); },
               {"rope_split_qkv_forward", "'qkv'", "(2, 5, 10, 8)"});
  expect_error([&] { ops::rope_split_qkv_forward(q, k, k3, qkv, table); },
               {"rope_split_qkv_forward", "'v'", "(2, 5, 2, 8)"});
  Tensor k_short = Tensor::empty(Shape{2, 4, 2, 8}, f);
  expect_error([&] { ops::rope_split_qkv_backward(qkv, q, k_short, v, table); }, {"rope_split_qkv_backward", "'dk'"});
  Tensor v_bf = Tensor::empty(v.shape(), DType::bf16);
  expect_error([&] { ops::rope_split_qkv_forward(q, k, v_bf, qkv, table); },
               {"rope_split_qkv_forward", "'v'", "bf16"});
  expect_error([&] { ops::rope_split_qkv_forward(q, k, v, qkv, table, 4); },
               {"rope_split_qkv_forward", "'table'", "pos_offset 4"});
  Tensor q7 = Tensor::empty(Shape{2, 5, 4, 7}, f);
  expect_error([&] { ops::rope_split_qkv_forward(q7, k, v, qkv, table); }, {"rope_split_qkv_forward", "'q'", "even"});
  // Outputs inside the input: the split reads heads it would overwrite.
  Tensor buf = Tensor::empty(Shape{qkv.numel()}, f);
  Tensor packed = buf.view(qkv.shape()), q_in = buf.flat_view(0, q.shape());
  expect_error([&] { ops::rope_split_qkv_forward(q_in, k, v, packed, table); },
               {"rope_split_qkv_forward", "'qkv'", "'q'", "overlaps"});
  expect_error([&] { ops::rope_split_qkv_backward(qkv, q, k, k, table); }, {"rope_split_qkv_backward", "'dk'", "'dv'"});
}

// The fused product's two RoPE forms on the same shapes.
TEST(Rope, FusedQkvSplitAndInPlaceMatchReference) {
  ZT_TEST_TRACE_SEED();
  struct S { int64_t B, T, Hq, Hkv, D, offset; DType dtype; };
  uint64_t salt = 50;
  for (const S s : {S{2, 5, 4, 2, 8, 3, DType::f32},  // GQA, 2 query heads per kv head
                    S{1, 3, 2, 2, 6, 0, DType::f32},  // one kv head per query head
                    S{2, 7, 8, 2, 64, 9, DType::bf16}, S{1, 4, 3, 1, 128, 1, DType::bf16}}) {
    check_fused_qkv(s.B, s.T, s.Hq, s.Hkv, s.D, s.offset, s.dtype, salt++);
  }
}

TEST(Rope, PackedQkvBadArguments) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(64);
  Tensor table = make_table(8, 8, 10000.0, RopeScaling{});
  Tensor qkv = random_tensor(Shape{2, 5, 8, 8}, DType::f32, rng);
  ops::rope_packed_qkv_forward(qkv, 4, 2, table, 3);  // valid
  ops::rope_packed_qkv_backward(qkv, 4, 2, table, 3);
  expect_error([&] { ops::rope_packed_qkv_forward(qkv, 4, 1, table); },
               {"rope_packed_qkv_forward", "'qkv'", "(2, 5, 8, 8)", "make 6 heads"});
  expect_error([&] { ops::rope_packed_qkv_backward(qkv, 8, 0, table); },
               {"rope_packed_qkv_backward", "Hkv is 0", "at least one"});
  expect_error([&] { ops::rope_packed_qkv_forward(qkv, 4, 2, table, 4); },
               {"rope_packed_qkv_forward", "'table'", "pos_offset 4"});
  Tensor odd = random_tensor(Shape{2, 5, 8, 7}, DType::f32, rng);
  expect_error([&] { ops::rope_packed_qkv_forward(odd, 4, 2, table); }, {"rope_packed_qkv_forward", "'qkv'", "even"});
  Tensor flat = random_tensor(Shape{10, 64}, DType::f32, rng);
  expect_error([&] { ops::rope_packed_qkv_forward(flat, 4, 2, table); }, {"rope_packed_qkv_forward", "'qkv'"});
}

// The reference gradient (the inverse rotation) against central differences
// of L = sum(w * rope(x)) in float64.
TEST(Rope, ReferenceGradientMatchesFiniteDifferences) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(30);
  const Shape shape{1, 3, 2, 6};
  const std::vector<double> f = expected_freqs(6, 10000.0, RopeScaling{});
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> x(size_t(shape.numel())), w(size_t(shape.numel()));
  for (double& e : x) e = u(rng);
  for (double& e : w) e = u(rng);
  const std::vector<double> grad = ref_rotate(w, shape, f, 2, true);
  auto loss = [&] {
    const std::vector<double> y = ref_rotate(x, shape, f, 2, false);
    double l = 0.0;
    for (size_t i = 0; i < y.size(); ++i) l += w[i] * y[i];
    return l;
  };
  const double h = 1e-5;
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + h;
    const double lp = loss();
    x[i] = x0 - h;
    const double lm = loss();
    x[i] = x0;
    EXPECT_NEAR(grad[i], (lp - lm) / (2 * h), 1e-9) << i;
  }
}

TEST(Rope, BadArguments) {
  ZT_TEST_TRACE_SEED();
  auto rng = test::make_rng(40);
  const DType f = DType::f32;
  Tensor table = make_table(8, 8, 10000.0, RopeScaling{});
  Tensor x = random_tensor(Shape{2, 5, 3, 8}, f, rng);
  Tensor y = Tensor::empty(x.shape(), f);
  ops::rope_forward(y, x, table, 3);  // valid: positions 3..7 < 8

  // D odd.
  Tensor x7 = random_tensor(Shape{2, 5, 3, 7}, f, rng), y7 = Tensor::empty(Shape{2, 5, 3, 7}, f);
  expect_error([&] { ops::rope_forward(y7, x7, table); }, {"rope_forward", "'x'", "even"});
  expect_error([&] { ops::rope_backward(y7, x7, table); }, {"rope_backward", "'dy'", "even"});
  expect_error([&] { ops::rope_frequency(0, 7, 10000.0, RopeScaling{}); }, {"rope_frequency", "head_dim"});
  Tensor table7 = Tensor::empty(Shape{8, 3, 2}, f);
  expect_error([&] { ops::rope_table(table7, 7, 10000.0, RopeScaling{}); }, {"rope_table", "head_dim"});
  // Mismatched shapes.
  Tensor y_bad = Tensor::empty(Shape{2, 5, 3, 6}, f);
  expect_error([&] { ops::rope_forward(y_bad, x, table); }, {"rope_forward", "'y'", "(2, 5, 3, 8)"});
  expect_error([&] { ops::rope_backward(y_bad, x, table); }, {"rope_backward", "'dx'"});
  Tensor table_d = make_table(8, 6, 10000.0, RopeScaling{});
  expect_error([&] { ops::rope_forward(y, x, table_d); }, {"rope_forward", "'table'", "(8, 4, 2)"});
  Tensor x3 = random_tensor(Shape{10, 3, 8}, f, rng);
  expect_error([&] { ops::rope_forward(x3, x3, table); }, {"rope_forward", "'x'", "4-dimensional"});
  expect_error([&] { ops::rope_table(table, 6, 10000.0, RopeScaling{}); }, {"rope_table", "'table'"});
  // Dtypes.
  Tensor y_bf = Tensor::empty(x.shape(), DType::bf16);
  expect_error([&] { ops::rope_forward(y_bf, x, table); }, {"rope_forward", "'y'", "bf16"});
  Tensor table_bf = Tensor::empty(table.shape(), DType::bf16);
  expect_error([&] { ops::rope_forward(y, x, table_bf); }, {"rope_forward", "'table'", "bf16"});
  Tensor xi = Tensor::empty(x.shape(), DType::i32);
  expect_error([&] { ops::rope_forward(xi, xi, table); }, {"rope_forward", "'x'", "i32"});
  // Device mismatch.
  Tensor table_cuda = Tensor::wrap(table.data_ptr(), table.shape(), f, Device::cuda(63));
  expect_error([&] { ops::rope_forward(y, x, table_cuda); }, {"rope_forward", "'table'", "cuda:63"});
  Tensor y_cuda = Tensor::wrap(y.data_ptr(), y.shape(), f, Device::cuda(63));
  expect_error([&] { ops::rope_backward(y_cuda, x, table); }, {"rope_backward", "'dx'", "cuda:63"});
  expect_error([&] { ops::rope_table(table_cuda, 8, 10000.0, RopeScaling{}); }, {"rope_table", "cuda"});
  // Positions beyond the table.
  expect_error([&] { ops::rope_forward(y, x, table, 4); }, {"rope_forward", "'table'", "pos_offset 4"});
  expect_error([&] { ops::rope_backward(y, x, table, -1); }, {"rope_backward", "'table'"});
  Tensor table_short = make_table(4, 8, 10000.0, RopeScaling{});
  expect_error([&] { ops::rope_forward(y, x, table_short); }, {"rope_forward", "'table'", "T_max"});
  // Partial overlap (in place must be the same tensor).
  Tensor buf = Tensor::empty(Shape{2 * x.numel()}, f);
  Tensor a = buf.flat_view(0, x.shape()), b = buf.flat_view(8, x.shape());
  expect_error([&] { ops::rope_forward(b, a, table); }, {"rope_forward", "'y'", "overlaps"});
  // Frequency and scaling arguments.
  expect_error([&] { ops::rope_frequency(4, 8, 10000.0, RopeScaling{}); }, {"rope_frequency", "pair index 4"});
  expect_error([&] { ops::rope_frequency(0, 8, -1.0, RopeScaling{}); }, {"rope_frequency", "theta"});
  RopeScaling bad = llama31();
  bad.high_freq_factor = 1.0f;
  expect_error([&] { ops::rope_frequency(0, 8, 10000.0, bad); }, {"rope_frequency", "high_freq_factor"});
  bad = llama31();
  bad.factor = 0.0f;
  expect_error([&] { ops::rope_table(table, 8, 10000.0, bad); }, {"rope_table", "factor"});
}

}  // namespace
}  // namespace zt
