// The fused flash-attention kernels - mma.sync (attention_mma_kernels.cuh)
// and WMMA (attention_flash_kernels.cuh), the very code the GPU runs -
// executed by the warp emulator on the CPU and checked against a float64
// reference of causal GQA attention computed here from the same (rounded)
// inputs: forward out and lse, backward dq, dk, dv. Outputs are poisoned
// first. Shapes cover T = 1, partial and several tiles (64-row tiles, the mma
// dK dV kernel's 32-query tiles), GQA groups of 1, 2 and 4, every head dim
// the kernels take, bf16 and f16.
#include "cuda_emu/warp_emulator.h"  // first: it defines what the kernel headers emulate

#include "backend/cuda/attention_flash_kernels.cuh"
#include "backend/cuda/attention_mma_kernels.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"

namespace zt::test {
namespace {

namespace mk = cuda::mma_attention;
namespace wk = cuda::wmma_attention;

struct Shape5 {
  int64_t B, T, Hq, Hkv, D;
};

// Causal GQA attention in float64 from the stored (rounded) inputs.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

Reference reference(const Shape5& s, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout, double scale) {
  const int64_t B = s.B, T = s.T, Hq = s.Hq, Hkv = s.Hkv, D = s.D, g = Hq / Hkv;
  Reference r;
  r.out.assign(size_t(B * T * Hq * D), 0.0);
  r.dq.assign(r.out.size(), 0.0);
  r.lse.assign(size_t(B * Hq * T), 0.0);
  r.dk.assign(size_t(B * T * Hkv * D), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  auto qi = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * Hq + h) * D; };
  auto ki = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * Hkv + h) * D; };
  std::vector<double> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int64_t kv = h / g;
        double mx = -INFINITY;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[size_t(qi(b, t, h) + d)] * k[size_t(ki(b, u, kv) + d)];
          p[size_t(u)] = scale * dot;
          mx = std::max(mx, p[size_t(u)]);
        }
        double sum = 0;
        for (int64_t u = 0; u <= t; ++u) sum += std::exp(p[size_t(u)] - mx);
        r.lse[size_t((b * Hq + h) * T + t)] = mx + std::log(sum);
        for (int64_t u = 0; u <= t; ++u) p[size_t(u)] = std::exp(p[size_t(u)] - mx) / sum;
        double delta = 0;
        for (int64_t u = 0; u <= t; ++u) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            r.out[size_t(qi(b, t, h) + d)] += p[size_t(u)] * v[size_t(ki(b, u, kv) + d)];
            dot += dout[size_t(qi(b, t, h) + d)] * v[size_t(ki(b, u, kv) + d)];
          }
          dp[size_t(u)] = dot;
          delta += p[size_t(u)] * dot;
        }
        for (int64_t u = 0; u <= t; ++u) {
          const double ds = p[size_t(u)] * (dp[size_t(u)] - delta);
          for (int64_t d = 0; d < D; ++d) {
            r.dq[size_t(qi(b, t, h) + d)] += scale * ds * k[size_t(ki(b, u, kv) + d)];
            r.dk[size_t(ki(b, u, kv) + d)] += scale * ds * q[size_t(qi(b, t, h) + d)];
            r.dv[size_t(ki(b, u, kv) + d)] += p[size_t(u)] * dout[size_t(qi(b, t, h) + d)];
          }
        }
      }
  return r;
}

template <template <typename, int> class Kernels, typename T, int kD>
void run_case(const Shape5& s, DType dt, std::mt19937_64& rng) {
  using K = Kernels<T, kD>;  // the kernel header's own table, as the launcher uses it
  SCOPED_TRACE(::testing::Message() << "B " << s.B << " T " << s.T << " Hq " << s.Hq << " Hkv " << s.Hkv << " D "
                                    << s.D << " " << dtype_name(dt));
  const Tensor q = random_tensor(Shape{s.B, s.T, s.Hq, s.D}, dt, rng);
  const Tensor k = random_tensor(Shape{s.B, s.T, s.Hkv, s.D}, dt, rng);
  const Tensor v = random_tensor(Shape{s.B, s.T, s.Hkv, s.D}, dt, rng);
  const Tensor dout = random_tensor(Shape{s.B, s.T, s.Hq, s.D}, dt, rng);
  const float scale = float(1.0 / std::sqrt(double(s.D)));
  Tensor out = Tensor::empty(q.shape(), dt), lse = Tensor::empty(Shape{s.B, s.Hq, s.T}, DType::f32);
  Tensor dq = Tensor::empty(q.shape(), dt), dk = Tensor::empty(k.shape(), dt), dv = Tensor::empty(v.shape(), dt);
  for (const Tensor* t : {&out, &lse, &dq, &dk, &dv}) poison(*t);
  const mk::Dims d{s.B, s.T, s.Hq, s.Hkv};
  auto ptr = [](const Tensor& t) { return static_cast<T*>(t.data_ptr()); };

  const unsigned tiles = unsigned(d.tiles(K::block_rows));
  emu::launch(dim3(tiles, unsigned(s.Hq), unsigned(s.B)), mk::kThreads, K::forward_bytes, K::forward(), ptr(out),
              lse.data<float>(),
              static_cast<const T*>(ptr(q)), static_cast<const T*>(ptr(k)), static_cast<const T*>(ptr(v)), d, scale);
  // delta = rowsum(dout * out) in f32 from the stored output, as attention_delta computes it.
  Tensor delta = Tensor::empty(lse.shape(), DType::f32);
  const std::vector<double> o = to_f64(out), g = to_f64(dout);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.Hq; ++h)
      for (int64_t t = 0; t < s.T; ++t) {
        float acc = 0.0f;
        for (int64_t e = 0; e < s.D; ++e) {
          const size_t i = size_t(((b * s.T + t) * s.Hq + h) * s.D + e);
          acc += float(o[i]) * float(g[i]);
        }
        delta.data<float>()[(b * s.Hq + h) * s.T + t] = acc;
      }
  emu::launch(dim3(tiles, unsigned(s.Hkv), unsigned(s.B)), mk::kThreads, K::dkdv_bytes, K::dkdv(), ptr(dk), ptr(dv),
              static_cast<const T*>(ptr(dout)), static_cast<const T*>(ptr(q)), static_cast<const T*>(ptr(k)),
              static_cast<const T*>(ptr(v)), static_cast<const float*>(lse.data<float>()),
              static_cast<const float*>(delta.data<float>()), d, scale);
  emu::launch(dim3(tiles, unsigned(s.Hq), unsigned(s.B)), mk::kThreads, K::dq_bytes, K::dq(), ptr(dq),
              static_cast<const T*>(ptr(dout)),
              static_cast<const T*>(ptr(q)), static_cast<const T*>(ptr(k)), static_cast<const T*>(ptr(v)),
              static_cast<const float*>(lse.data<float>()), static_cast<const float*>(delta.data<float>()), d,
              scale);

  const Reference r = reference(s, to_f64(q), to_f64(k), to_f64(v), to_f64(dout), double(scale));
  // P and dS are rounded to the operand type before their products, the
  // outputs too: a few 2^-9 relative steps (bf16), less for f16.
  const double lim = 2e-2;
  EXPECT_TRUE(rel_error_within(out, r.out, lim, "out"));
  EXPECT_TRUE(rel_error_within(lse, r.lse, 1e-5, "lse"));
  EXPECT_TRUE(rel_error_within(dq, r.dq, lim, "dq"));
  EXPECT_TRUE(rel_error_within(dk, r.dk, lim, "dk"));
  EXPECT_TRUE(rel_error_within(dv, r.dv, lim, "dv"));
}

template <template <typename, int> class Kernels, typename T>
void run(const Shape5& s, DType dt, std::mt19937_64& rng) {
  switch (s.D) {
    case 16: return run_case<Kernels, T, 16>(s, dt, rng);
    case 32: return run_case<Kernels, T, 32>(s, dt, rng);
    case 64: return run_case<Kernels, T, 64>(s, dt, rng);
    case 128: return run_case<Kernels, T, 128>(s, dt, rng);
    default: FAIL() << "head dim " << s.D;
  }
}

// One implementation on every bf16 shape, and on f16.
template <template <typename, int> class Kernels>
void check_implementation(uint64_t seed) {
  auto rng = make_rng(seed);
  for (const Shape5 s : {Shape5{1, 1, 1, 1, 16}, Shape5{2, 17, 4, 2, 32}, Shape5{1, 70, 4, 1, 16},
                         Shape5{1, 130, 2, 2, 64}, Shape5{1, 40, 2, 1, 128}})
    run<Kernels, __nv_bfloat16>(s, DType::bf16, rng);
  run<Kernels, __half>(Shape5{1, 75, 2, 1, 32}, DType::f16, rng);
}

TEST(FusedAttentionEmulated, MmaMatchesFloat64Reference) { check_implementation<mk::Kernels>(31); }

TEST(FusedAttentionEmulated, WmmaMatchesFloat64Reference) { check_implementation<wk::Kernels>(33); }

}  // namespace
}  // namespace zt::test
