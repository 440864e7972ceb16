// The CUDA mixture-of-experts kernels (moe_kernels.cuh), run by the warp
// emulator with moe.cu's launch shapes, against the CPU backend (itself
// checked against float64 in tests/ops/moe_test.cpp): the routing's
// softmax, logsumexp and top k with and without balancing biases (E under,
// at and over a warp's 32 lanes, k up to 8, token counts that leave a
// routing block partly empty; exact ties to the lower index), its backward
// with the aux and z-loss terms, and the row kernels - gather and its
// (accumulating) backward, the weighted combine with and without a
// residual, and the combine's backward - in f32 and bf16, an element or a
// 16-byte pack per load, on grids small enough that the stride loops run.
// Outputs are poisoned first; every element is compared.
#include "cuda_emu/warp_emulator.h"  // first: it defines what the kernel headers emulate

#include "backend/cuda/moe_kernels.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cuda_emu/emu_test_util.h"
#include "ops/moe.h"
#include "test_util.h"

namespace zt::test {
namespace {

namespace mk = cuda::moe_kernels;
using namespace emu_util;

struct RouteCase {
  int64_t N, E, k;
};
constexpr RouteCase kRouteCases[] = {{1, 2, 1}, {13, 8, 2}, {40, 32, 4}, {21, 40, 8}, {17, 64, 6}, {9, 3, 3}};

unsigned route_grid(int64_t N) { return unsigned((N + mk::kRouteWarps - 1) / mk::kRouteWarps); }

struct Routed {
  Tensor probs, choice, weight, lse;
};

Routed poisoned_route(int64_t N, int64_t E, int64_t k) {
  return {poisoned(Shape{N, E}, DType::f32), poisoned(Shape{N, k}, DType::i32), poisoned(Shape{N, k}, DType::f32),
          poisoned(Shape{N}, DType::f32)};
}

// The gap between the k-th and the (k+1)-th largest score of row t: rows
// where it is below a rounding's reach may rank differently on the two
// backends (their sums run in other orders), so their choice is not compared.
double boundary_gap(const Tensor& probs, const Tensor& bias, int64_t t, int64_t E, int64_t k) {
  if (k == E) return INFINITY;
  std::vector<double> s(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    s[size_t(e)] = double(probs.data<float>()[t * E + e]) + (bias.defined() ? double(bias.data<float>()[e]) : 0.0);
  std::sort(s.begin(), s.end(), std::greater<>());
  return s[size_t(k - 1)] - s[size_t(k)];
}

TEST(MoeKernelsEmu, RoutingMatchesTheCpu) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(31);
  for (const RouteCase& c : kRouteCases)
    for (bool normalize : {true, false})
      for (bool biased : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "N " << c.N << " E " << c.E << " k " << c.k << " normalize " << normalize
                                          << (biased ? " biased" : ""));
        const Tensor logits = random_tensor(Shape{c.N, c.E}, DType::f32, rng, -3.0, 3.0);
        const Tensor bias = biased ? random_tensor(Shape{c.E}, DType::f32, rng, -0.2, 0.2) : Tensor();
        const Routed ref = poisoned_route(c.N, c.E, c.k);
        ops::moe_route(ref.probs, ref.choice, ref.weight, logits, normalize, ref.lse, bias);
        const Routed got = poisoned_route(c.N, c.E, c.k);
        emu::launch(dim3(route_grid(c.N)), mk::kRouteWarps * 32, 0,
                    normalize ? mk::route_kernel<true> : mk::route_kernel<false>, p<float>(got.probs),
                    p<int32_t>(got.choice), p<float>(got.weight), p<float>(got.lse), p<float>(logits),
                    p<float>(bias), c.N, int(c.E), int(c.k));
        EXPECT_TRUE(close(got.probs, ref.probs, 1e-6, "probs"));
        EXPECT_TRUE(close(got.lse, ref.lse, 1e-6, "lse"));
        int64_t compared = 0;
        for (int64_t t = 0; t < c.N; ++t) {
          if (boundary_gap(ref.probs, bias, t, c.E, c.k) < 1e-5) continue;
          ++compared;
          for (int64_t j = 0; j < c.k; ++j) {
            const int64_t i = t * c.k + j;
            EXPECT_EQ(got.choice.data<int32_t>()[i], ref.choice.data<int32_t>()[i]) << "token " << t << " slot " << j;
            EXPECT_NEAR(got.weight.data<float>()[i], ref.weight.data<float>()[i],
                        1e-6 * std::fabs(ref.weight.data<float>()[i]))
                << "token " << t << " slot " << j;
          }
        }
        EXPECT_GE(compared, (c.N * 3 + 3) / 4) << "most rows rank clearly";
      }
}

// Identical logits give identical probabilities on both: exact ties, which
// the kernel breaks as the CPU does, towards the lower expert.
TEST(MoeKernelsEmu, TiesGoToTheLowerExpert) {
  const int64_t N = 3, E = 37, k = 4;
  Tensor logits = Tensor::empty(Shape{N, E}, DType::f32);
  for (int64_t i = 0; i < N * E; ++i) logits.data<float>()[i] = 0.25f;  // row 0: all tied
  for (int64_t e = 0; e < E; ++e) logits.data<float>()[E + e] = e % 3 == 2 ? 1.0f : -1.0f;  // row 1: ties among 12
  for (int64_t e = 0; e < E; ++e) logits.data<float>()[2 * E + e] = e == 36 || e == 35 ? 2.0f : 0.0f;  // lanes 3, 4 of the second pass
  const Routed got = poisoned_route(N, E, k);
  emu::launch(dim3(route_grid(N)), mk::kRouteWarps * 32, 0, mk::route_kernel<true>, p<float>(got.probs),
              p<int32_t>(got.choice), p<float>(got.weight), p<float>(got.lse), p<float>(logits),
              static_cast<const float*>(nullptr), N, int(E), int(k));
  const std::vector<int32_t> want = {0, 1, 2, 3, 2, 5, 8, 11, 35, 36, 0, 1};
  EXPECT_EQ(std::vector<int32_t>(got.choice.data<int32_t>(), got.choice.data<int32_t>() + N * k), want);
}

TEST(MoeKernelsEmu, RoutingBackwardMatchesTheCpu) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(32);
  for (const RouteCase& c : kRouteCases)
    for (bool normalize : {true, false})
      for (bool extras : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "N " << c.N << " E " << c.E << " k " << c.k << " normalize " << normalize
                                          << (extras ? " aux + z" : ""));
        const Tensor logits = random_tensor(Shape{c.N, c.E}, DType::f32, rng, -3.0, 3.0);
        const Routed r = poisoned_route(c.N, c.E, c.k);
        ops::moe_route(r.probs, r.choice, r.weight, logits, normalize, r.lse);
        const Tensor dweight = random_tensor(Shape{c.N, c.k}, DType::f32, rng);
        const Tensor aux = extras ? random_tensor(Shape{c.E}, DType::f32, rng, -0.1, 0.1) : Tensor();
        const Tensor dlse = extras ? random_tensor(Shape{c.N}, DType::f32, rng, -0.1, 0.1) : Tensor();
        const Tensor ref = poisoned(Shape{c.N, c.E}, DType::f32);
        ops::moe_route_backward(ref, dweight, r.probs, r.choice, r.weight, normalize, aux, dlse);
        const Tensor got = poisoned(Shape{c.N, c.E}, DType::f32);
        emu::launch(dim3(route_grid(c.N)), mk::kRouteWarps * 32, 0,
                    normalize ? mk::route_backward_kernel<true> : mk::route_backward_kernel<false>, p<float>(got),
                    p<float>(dweight), p<float>(r.probs), p<int32_t>(r.choice), p<float>(r.weight), p<float>(aux),
                    p<float>(dlse), c.N, int(c.E), int(c.k));
        EXPECT_TRUE(close(got, ref, 1e-5, "dlogits"));
      }
}

// A dispatch plan of N tokens' top-k choices among E experts (drawn, not
// routed: any plan the CPU makes is one the kernels must follow); with a
// capacity of half an expert's mean share, some slots dropped.
struct Plan {
  Tensor order, where;
  std::vector<int64_t> offsets;
};
Plan random_plan(int64_t N, int64_t E, int64_t k, bool capacity, std::mt19937_64& rng) {
  Tensor choice = Tensor::empty(Shape{N, k}, DType::i32);
  for (int64_t t = 0; t < N; ++t) {
    std::vector<int32_t> experts(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) experts[size_t(e)] = int32_t(e);
    std::shuffle(experts.begin(), experts.end(), rng);
    for (int64_t j = 0; j < k; ++j) choice.data<int32_t>()[t * k + j] = experts[size_t(j)];
  }
  Plan plan{Tensor::empty(Shape{N * k}, DType::i32), Tensor::empty(Shape{N * k}, DType::i32), {}};
  ops::moe_dispatch_plan(plan.order, plan.where, plan.offsets, choice, E,
                         capacity ? std::max<int64_t>(1, N * k / (2 * E)) : -1);
  return plan;
}

template <typename T>
void rows_case(int64_t N, int64_t C, int64_t E, int64_t k, bool capacity, std::mt19937_64& rng) {
  const DType dt = dtype_of<T>();
  SCOPED_TRACE(::testing::Message() << "N " << N << " C " << C << " E " << E << " k " << k << " " << dtype_name(dt)
                                    << (capacity ? ", capacity" : ""));
  const Plan plan = random_plan(N, E, k, capacity, rng);
  const int64_t R = plan.offsets.back();  // the kept slots' rows (N k, dropless)
  if (capacity && N * k > 2 * E) {
    EXPECT_LT(R, N * k) << "slots dropped";
  }
  const int32_t* order = p<int32_t>(plan.order);
  const int32_t* where = p<int32_t>(plan.where);
  const Tensor x = random_tensor(Shape{N, C}, dt, rng), dxs = random_tensor(Shape{R, C}, dt, rng);
  const Tensor ys = random_tensor(Shape{R, C}, dt, rng), dout = random_tensor(Shape{N, C}, dt, rng);
  const Tensor residual = random_tensor(Shape{N, C}, dt, rng), dx0 = random_tensor(Shape{N, C}, dt, rng);
  const Tensor weight = random_tensor(Shape{N, k}, DType::f32, rng, 0.0, 1.0);
  // The CPU backend.
  const Tensor xs = poisoned(Shape{R, C}, dt);
  ops::moe_gather(xs, x, plan.order.slice(0, R), k);
  const Tensor dx = poisoned(Shape{N, C}, dt), dx_acc = copy_of(dx0);
  ops::moe_gather_backward(dx, dxs, plan.where, k, false);
  ops::moe_gather_backward(dx_acc, dxs, plan.where, k, true);
  const Tensor out = poisoned(Shape{N, C}, dt), out_res = poisoned(Shape{N, C}, dt);
  ops::moe_combine(out, ys, weight, plan.where, Tensor());
  ops::moe_combine(out_res, ys, weight, plan.where, residual);
  const Tensor dys = poisoned(Shape{R, C}, dt), dweight = poisoned(Shape{N, k}, DType::f32);
  ops::moe_combine_backward(dys, dweight, dout, ys, weight, plan.where);

  auto each_width = [&](auto&& body) {
    body(std::integral_constant<int, 1>{});
    if (C % cuda::kPack16<T> == 0) body(std::integral_constant<int, cuda::kPack16<T>>{});
  };
  each_width([&](auto v) {
    constexpr int V = decltype(v)::value;
    SCOPED_TRACE(::testing::Message() << V << " element(s) per load");
    const Tensor g_xs = poisoned(Shape{R, C}, dt);
    emu::launch(dim3(stride_grid(R * C / V)), mk::kThreads, 0, mk::gather_kernel<T, V>, p<T>(g_xs), p<T>(x), order,
                R, k, C);
    EXPECT_TRUE(all_close(g_xs, to_f64(xs), 0.0, 0.0)) << "xs (copies)";
    // Slot sums in slot order with one rounding: the CPU's bits.
    const Tensor g_dx = poisoned(Shape{N, C}, dt), g_dx_acc = copy_of(dx0);
    const float* plain = nullptr;  // no weights: each slot's row itself
    emu::launch(dim3(stride_grid(N * C / V)), mk::kThreads, 0, mk::weighted_sum_kernel<T, V>, p<T>(g_dx), p<T>(dxs),
                plain, where, static_cast<const T*>(nullptr), N, k, C);
    emu::launch(dim3(stride_grid(N * C / V)), mk::kThreads, 0, mk::weighted_sum_kernel<T, V>, p<T>(g_dx_acc),
                p<T>(dxs), plain, where, p<T>(g_dx_acc), N, k, C);
    EXPECT_TRUE(all_close(g_dx, to_f64(dx), 0.0, 0.0)) << "dx";
    EXPECT_TRUE(all_close(g_dx_acc, to_f64(dx_acc), 0.0, 0.0)) << "dx accumulated";
    const Tensor g_out = poisoned(Shape{N, C}, dt), g_out_res = poisoned(Shape{N, C}, dt);
    emu::launch(dim3(stride_grid(N * C / V)), mk::kThreads, 0, mk::weighted_sum_kernel<T, V>, p<T>(g_out),
                p<T>(ys), p<float>(weight), where, static_cast<const T*>(nullptr), N, k, C);
    emu::launch(dim3(stride_grid(N * C / V)), mk::kThreads, 0, mk::weighted_sum_kernel<T, V>, p<T>(g_out_res),
                p<T>(ys), p<float>(weight), where, p<T>(residual), N, k, C);
    EXPECT_TRUE(close(g_out, out, tol(dt), "out"));
    EXPECT_TRUE(close(g_out_res, out_res, tol(dt), "out with the residual"));
    // One block per token; dys = w dout is one rounded product (exact), the
    // dots reduce in another order than the CPU's.
    const Tensor g_dys = poisoned(Shape{R, C}, dt), g_dweight = poisoned(Shape{N, k}, DType::f32);
    emu::launch(dim3(unsigned(N)), mk::kCombineThreads, 0, mk::combine_backward_kernel<T, V>, p<T>(g_dys),
                p<float>(g_dweight), p<T>(dout), p<T>(ys), p<float>(weight), where, N, k, C);
    EXPECT_TRUE(all_close(g_dys, to_f64(dys), 0.0, 0.0)) << "dys";
    EXPECT_TRUE(close(g_dweight, dweight, 1e-5, "dweight"));
  });
}

TEST(MoeKernelsEmu, GatherCombineAndTheirBackwardsMatchTheCpu) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(33);
  for (bool capacity : {false, true}) {
    rows_case<float>(11, 20, 4, 2, capacity, rng);     // C not a multiple of a pack
    rows_case<float>(50, 24, 8, 2, capacity, rng);     // packs of 4; the stride loops run
    rows_case<float>(7, 300, 5, 3, capacity, rng);     // rows wider than the combine backward's block
    rows_case<__nv_bfloat16>(13, 40, 6, 2, capacity, rng);
    rows_case<__nv_bfloat16>(9, 264, 4, 4, capacity, rng);  // packs of 8, k = E
    rows_case<__nv_bfloat16>(3, 18, 3, 1, capacity, rng);
  }
}

}  // namespace
}  // namespace zt::test
