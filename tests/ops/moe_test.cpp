// Mixture-of-experts routing, dispatch and combine against float64
// references on fresh random inputs (outputs poisoned first).
//
// Routing: probs within 1e-6 relative (f32 softmax of E terms), choice equal
// to the float64 top k (lower index on ties), weights and each row's
// logsumexp within 1e-6. The route backward (with the load-balancing and
// z-loss terms) against central differences of a float64 forward at the
// fixed choice (the function is smooth there): 1e-4 relative in the max norm.
// Combine and gather: f32 sums of k terms, within 1e-6 relative to the sum of
// |terms|; bf16 within one bf16 ulp of the result.
#include "ops/moe.h"

#include <cstdint>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "test_util.h"

namespace zt {
namespace {

using ::testing::HasSubstr;
using test::error_of;
using test::load_f64;
using test::make_rng;
using test::poison;
using test::random_tensor;
using test::to_f64;

struct RouteCase {
  int64_t N, E, k;
};
const RouteCase kRouteCases[] = {{1, 1, 1}, {7, 4, 2}, {33, 8, 2}, {64, 16, 4}, {5, 3, 3}, {100, 64, 6}};

std::vector<double> softmax_rows(const std::vector<double>& l, int64_t N, int64_t E) {
  std::vector<double> p(l.size());
  for (int64_t t = 0; t < N; ++t) {
    double mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, l[size_t(t * E + e)]);
    for (int64_t e = 0; e < E; ++e) sum += p[size_t(t * E + e)] = std::exp(l[size_t(t * E + e)] - mx);
    for (int64_t e = 0; e < E; ++e) p[size_t(t * E + e)] /= sum;
  }
  return p;
}

// The top k of a row, descending, the lower index first on ties.
std::vector<int32_t> top_k(const std::vector<double>& p, int64_t t, int64_t E, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(E));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return p[size_t(t * E + a)] > p[size_t(t * E + b)]; });
  idx.resize(size_t(k));
  return idx;
}

struct RouteOut {
  Tensor probs, choice, weight, lse;
};

RouteOut route(const Tensor& logits, int64_t k, bool normalize, const Tensor& bias = {}) {
  const int64_t N = logits.size(0), E = logits.size(1);
  RouteOut r{Tensor::empty(Shape{N, E}, DType::f32), Tensor::empty(Shape{N, k}, DType::i32),
             Tensor::empty(Shape{N, k}, DType::f32), Tensor::empty(Shape{N}, DType::f32)};
  poison(r.probs);
  poison(r.choice);
  poison(r.weight);
  poison(r.lse);
  ops::moe_route(r.probs, r.choice, r.weight, logits, normalize, r.lse, bias);
  return r;
}

// Each row's logsumexp in float64.
std::vector<double> logsumexp_rows(const std::vector<double>& l, int64_t N, int64_t E) {
  std::vector<double> z(static_cast<size_t>(N));
  for (int64_t t = 0; t < N; ++t) {
    double mx = -INFINITY, sum = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, l[size_t(t * E + e)]);
    for (int64_t e = 0; e < E; ++e) sum += std::exp(l[size_t(t * E + e)] - mx);
    z[size_t(t)] = mx + std::log(sum);
  }
  return z;
}

// The op's choice is each row's top k by `score` (ties to the lower
// expert) and its weights those experts' float64 probabilities p, over
// their sum when normalize.
void expect_top_k_weighted(const RouteOut& r, const std::vector<double>& score, const std::vector<double>& p,
                           const RouteCase& c, bool normalize) {
  std::vector<double> w_ref;
  for (int64_t t = 0; t < c.N; ++t) {
    const std::vector<int32_t> top = top_k(score, t, c.E, c.k);
    double S = 0;
    for (int32_t e : top) S += p[size_t(t * c.E + e)];
    for (int64_t j = 0; j < c.k; ++j) {
      EXPECT_EQ(r.choice.data<int32_t>()[t * c.k + j], top[size_t(j)]) << "token " << t << " slot " << j;
      w_ref.push_back(p[size_t(t * c.E + top[size_t(j)])] / (normalize ? S : 1.0));
    }
  }
  EXPECT_TRUE(test::all_close(r.weight, w_ref, 1e-6, 1e-9));
}

TEST(MoeRoute, SoftmaxTopKAndWeightsMatchFloat64) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(1);
  for (const RouteCase& c : kRouteCases)
    for (bool normalize : {true, false}) {
      SCOPED_TRACE(testing::Message() << "N " << c.N << " E " << c.E << " k " << c.k << " normalize " << normalize);
      const Tensor logits = random_tensor(Shape{c.N, c.E}, DType::f32, rng, -4.0, 4.0);
      const RouteOut r = route(logits, c.k, normalize);
      const std::vector<double> p = softmax_rows(to_f64(logits), c.N, c.E);
      EXPECT_TRUE(test::all_close(r.probs, p, 1e-6, 1e-9));
      EXPECT_TRUE(test::all_close(r.lse, logsumexp_rows(to_f64(logits), c.N, c.E), 1e-6, 1e-6)) << "logsumexp";
      expect_top_k_weighted(r, p, p, c, normalize);
    }
}

// Aux-loss-free balancing's bias moves the choice, not the weights: the k
// largest of probs + bias (the op's f32 probabilities plus the bias, as the
// op adds them, so that the reference's ranking sees the same scores), each
// weighted by its float64 probability.
TEST(MoeRoute, BiasMovesTheChoiceButNotTheWeights) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(7);
  for (const RouteCase& c : kRouteCases)
    for (bool normalize : {true, false}) {
      SCOPED_TRACE(testing::Message() << "N " << c.N << " E " << c.E << " k " << c.k << " normalize " << normalize);
      const Tensor logits = random_tensor(Shape{c.N, c.E}, DType::f32, rng, -2.0, 2.0);
      const Tensor bias = random_tensor(Shape{c.E}, DType::f32, rng, -0.3, 0.3);
      const RouteOut r = route(logits, c.k, normalize, bias);
      const std::vector<double> p = softmax_rows(to_f64(logits), c.N, c.E);
      EXPECT_TRUE(test::all_close(r.probs, p, 1e-6, 1e-9)) << "the probabilities are the softmax's, unbiased";
      std::vector<double> score(size_t(c.N * c.E));
      for (int64_t i = 0; i < c.N * c.E; ++i)
        score[size_t(i)] = double(r.probs.data<float>()[i] + bias.data<float>()[i % c.E]);
      expect_top_k_weighted(r, score, p, c, normalize);
      int64_t moved = 0;  // rows whose choice the bias changed
      for (int64_t t = 0; t < c.N; ++t) moved += top_k(score, t, c.E, c.k) != top_k(p, t, c.E, c.k);
      if (c.N >= 30 && c.E > c.k) {
        EXPECT_GT(moved, 0) << "a bias this large changes some rows' choice";
      }
    }
  const Tensor logits = random_tensor(Shape{4, 8}, DType::f32, rng, -1.0, 1.0);
  const auto refused = [&](const Tensor& bias) {
    return error_of([&] { route(logits, 2, true, bias); });
  };
  EXPECT_THAT(refused(Tensor::empty(Shape{7}, DType::f32)), HasSubstr("bias"));
  EXPECT_THAT(refused(Tensor::empty(Shape{8}, DType::bf16)), HasSubstr("bias"));
}

TEST(MoeRoute, TiesGoToTheLowerExpert) {
  const Tensor logits = test::tensor_from({0.5, 1.0, 1.0, 1.0, -2, -2, -2, -2}, Shape{2, 4}, DType::f32);
  const RouteOut r = route(logits, 2, true);
  const int32_t* ch = r.choice.data<int32_t>();
  EXPECT_EQ(std::vector<int32_t>(ch, ch + 4), (std::vector<int32_t>{1, 2, 0, 1}));
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(r.weight.data<float>()[i], 0.5f);
}

// Row t's part of L(logits) = sum_tj dw[t, j] w[t, j] + sum_te aux[e] p[t, e]
// + sum_t dz[t] logsumexp(l_t) at a fixed choice, in float64 (rows are
// independent).
double route_objective(const std::vector<double>& l, const std::vector<int32_t>& ch, const std::vector<double>& dw,
                       const std::vector<double>& aux, const std::vector<double>& dz, int64_t t, int64_t E, int64_t k,
                       bool normalize) {
  const std::vector<double> p =
      softmax_rows(std::vector<double>(l.begin() + t * E, l.begin() + (t + 1) * E), 1, E);
  double L = 0;
  {
    double S = 0;
    for (int64_t j = 0; j < k; ++j) S += p[size_t(ch[size_t(t * k + j)])];
    for (int64_t j = 0; j < k; ++j) L += dw[size_t(t * k + j)] * p[size_t(ch[size_t(t * k + j)])] / (normalize ? S : 1.0);
    for (int64_t e = 0; e < E && !aux.empty(); ++e) L += aux[size_t(e)] * p[size_t(e)];
    if (!dz.empty())
      L += dz[size_t(t)] * logsumexp_rows(std::vector<double>(l.begin() + t * E, l.begin() + (t + 1) * E), 1, E)[0];
  }
  return L;
}

TEST(MoeRoute, BackwardMatchesFiniteDifferencesOfFloat64) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(2);
  for (const RouteCase& c : kRouteCases)
    for (bool normalize : {true, false})
      for (bool with_aux : {false, true}) {
        const bool with_z = with_aux;  // the z-loss's per-row gradient alongside the balance's per-expert one
        SCOPED_TRACE(testing::Message() << "N " << c.N << " E " << c.E << " k " << c.k << " normalize " << normalize
                                        << " aux and z " << with_aux);
        const Tensor logits = random_tensor(Shape{c.N, c.E}, DType::f32, rng, -3.0, 3.0);
        const RouteOut r = route(logits, c.k, normalize);
        const Tensor dweight = random_tensor(Shape{c.N, c.k}, DType::f32, rng);
        const Tensor aux = with_aux ? random_tensor(Shape{c.E}, DType::f32, rng, 0.0, 0.5) : Tensor();
        const Tensor dlse = with_z ? random_tensor(Shape{c.N}, DType::f32, rng, -1.0, 1.0) : Tensor();
        Tensor dlogits = Tensor::empty(Shape{c.N, c.E}, DType::f32);
        poison(dlogits);
        ops::moe_route_backward(dlogits, dweight, r.probs, r.choice, r.weight, normalize, aux, dlse);
        const std::vector<int32_t> ch(r.choice.data<int32_t>(), r.choice.data<int32_t>() + c.N * c.k);
        const std::vector<double> dw = to_f64(dweight), ax = with_aux ? to_f64(aux) : std::vector<double>{};
        const std::vector<double> dz = with_z ? to_f64(dlse) : std::vector<double>{};
        std::vector<double> l = to_f64(logits), ref(l.size());
        const double h = 1e-5;
        for (size_t i = 0; i < l.size(); ++i) {
          const double x = l[i];
          l[i] = x + h;
          const double up = route_objective(l, ch, dw, ax, dz, int64_t(i) / c.E, c.E, c.k, normalize);
          l[i] = x - h;
          const double down = route_objective(l, ch, dw, ax, dz, int64_t(i) / c.E, c.E, c.k, normalize);
          l[i] = x;
          ref[i] = (up - down) / (2 * h);
        }
        EXPECT_LT(test::max_rel_error(dlogits, ref), 1e-4);
      }
}

TEST(MoeDispatch, GroupsSlotsByExpertInSlotOrder) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(3);
  for (const RouteCase& c : kRouteCases) {
    const Tensor logits = random_tensor(Shape{c.N, c.E}, DType::f32, rng, -4.0, 4.0);
    const RouteOut r = route(logits, c.k, true);
    Tensor order = Tensor::empty(Shape{c.N * c.k}, DType::i32), where = Tensor::empty(Shape{c.N * c.k}, DType::i32);
    poison(order);
    poison(where);
    std::vector<int64_t> offsets{-7};
    ops::moe_dispatch_plan(order, where, offsets, r.choice, c.E);
    ASSERT_EQ(offsets.size(), size_t(c.E + 1));
    EXPECT_EQ(offsets.front(), 0);
    EXPECT_EQ(offsets.back(), c.N * c.k);
    const int32_t* ch = r.choice.data<int32_t>();
    const int32_t* ord = order.data<int32_t>();
    const int32_t* wh = where.data<int32_t>();
    // Reference: the slots of each expert in slot order, experts in order.
    std::vector<int32_t> ref;
    for (int64_t e = 0; e < c.E; ++e) {
      for (int64_t s = 0; s < c.N * c.k; ++s)
        if (ch[s] == e) ref.push_back(int32_t(s));
      EXPECT_EQ(int64_t(ref.size()), offsets[size_t(e + 1)]) << "expert " << e;
    }
    EXPECT_EQ(std::vector<int32_t>(ord, ord + c.N * c.k), ref);
    for (int64_t s = 0; s < c.N * c.k; ++s) EXPECT_EQ(ord[wh[s]], s);
  }
}

// Under a capacity each expert keeps its first `cap` slots in slot order:
// the reference is the dropless grouping cut at cap per expert; the dropped
// slots' where is -1, order's tail past the kept rows -1, and routed counts
// what the router chose.
TEST(MoeDispatch, ACapacityKeepsEachExpertsFirstSlots) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(13);
  for (const RouteCase& c : kRouteCases)
    for (int64_t cap : {int64_t(0), int64_t(1), (c.N * c.k + c.E - 1) / c.E, c.N * c.k}) {
      SCOPED_TRACE(testing::Message() << "N " << c.N << " E " << c.E << " k " << c.k << " capacity " << cap);
      // Skewed logits, so that some experts are over any capacity below N k.
      Tensor logits = random_tensor(Shape{c.N, c.E}, DType::f32, rng, -1.0, 1.0);
      for (int64_t t = 0; t < c.N; ++t) logits.data<float>()[t * c.E] += 2.0f;
      const RouteOut r = route(logits, c.k, true);
      const int64_t NK = c.N * c.k;
      Tensor order = Tensor::empty(Shape{NK}, DType::i32), where = Tensor::empty(Shape{NK}, DType::i32);
      poison(order);
      poison(where);
      std::vector<int64_t> offsets, routed{-3};
      ops::moe_dispatch_plan(order, where, offsets, r.choice, c.E, cap, &routed);
      const int32_t* ch = r.choice.data<int32_t>();
      std::vector<int32_t> kept, where_ref(size_t(NK), -1);
      std::vector<int64_t> offsets_ref{0}, routed_ref(size_t(c.E), 0);
      for (int64_t e = 0; e < c.E; ++e) {
        for (int64_t s = 0; s < NK; ++s)
          if (ch[s] == e && routed_ref[size_t(e)]++ < cap) {
            where_ref[size_t(s)] = int32_t(kept.size());
            kept.push_back(int32_t(s));
          }
        offsets_ref.push_back(int64_t(kept.size()));
      }
      EXPECT_EQ(offsets, offsets_ref);
      EXPECT_EQ(routed, routed_ref);
      std::vector<int32_t> order_ref = kept;
      order_ref.resize(size_t(NK), -1);
      EXPECT_EQ(std::vector<int32_t>(order.data<int32_t>(), order.data<int32_t>() + NK), order_ref);
      EXPECT_EQ(std::vector<int32_t>(where.data<int32_t>(), where.data<int32_t>() + NK), where_ref);
      if (cap == 1 && c.N > c.E) {
        EXPECT_LT(int64_t(kept.size()), NK) << "a capacity of 1 drops slots";
      }
    }
  const Tensor choice = test::tensor_from({0, 1}, Shape{1, 2}, DType::i32);
  Tensor order = Tensor::empty(Shape{2}, DType::i32), where = Tensor::empty(Shape{2}, DType::i32);
  std::vector<int64_t> offsets;
  EXPECT_THAT(error_of([&] { ops::moe_dispatch_plan(order, where, offsets, choice, 2, -2); }),
              HasSubstr("capacity -2 must be >= 0 slots an expert, or -1 for none"));
}

// Context parallelism's first come (ops::SlotRuns): a routing call of B
// sequences of 2P chunks split over P ranks in the zigzag layout (rank r:
// chunks r and 2P - 1 - r of each sequence, nn/ring_attention.h), each rank
// planning its own slots with the counts ahead of each of its runs, keeps
// exactly the slots the whole call keeps. The counts ahead come from a
// plain prefix count over the whole call's slot order.
TEST(MoeDispatch, RunsOfACallSplitOverRanksKeepTheCallsSlots) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(17);
  for (int64_t P : {2, 3, 4})
    for (int64_t B : {1, 2})
      for (int64_t k : {1, 2}) {
        const int64_t E = 4, c = 3, T = 2 * P * c, N = B * T, NK = N * k;
        SCOPED_TRACE(testing::Message() << "P " << P << " B " << B << " k " << k);
        Tensor logits = random_tensor(Shape{N, E}, DType::f32, rng, -1.0, 1.0);
        for (int64_t t = 0; t < N; ++t) logits.data<float>()[t * E + 1] += 1.5f;  // expert 1 over any capacity
        const RouteOut r = route(logits, k, true);
        const int64_t cap = (NK + E - 1) / E;  // capacity factor 1
        Tensor order = Tensor::empty(Shape{NK}, DType::i32), where = Tensor::empty(Shape{NK}, DType::i32);
        std::vector<int64_t> offsets;
        ops::moe_dispatch_plan(order, where, offsets, r.choice, E, cap);
        const int32_t* ch = r.choice.data<int32_t>();
        const int32_t* call_where = where.data<int32_t>();
        ASSERT_LT(offsets[size_t(E)], NK) << "the call drops slots";
        int64_t kept_over_ranks = 0;
        for (int64_t rank = 0; rank < P; ++rank) {
          // This rank's tokens: per sequence chunk `rank`, then chunk 2P - 1 - rank.
          std::vector<int64_t> tokens;
          ops::SlotRuns runs;
          for (int64_t b = 0; b < B; ++b)
            for (int64_t q : {rank, 2 * P - 1 - rank}) {
              const int64_t first = b * T + q * c;
              runs.start.push_back(int64_t(tokens.size()) * k);
              for (int64_t e = 0; e < E; ++e)
                runs.ahead.push_back(std::count(ch, ch + first * k, int32_t(e)));
              for (int64_t t = first; t < first + c; ++t) tokens.push_back(t);
            }
          const int64_t n = int64_t(tokens.size());
          Tensor local = Tensor::empty(Shape{n, k}, DType::i32);
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < k; ++j) local.data<int32_t>()[i * k + j] = ch[tokens[size_t(i)] * k + j];
          Tensor lorder = Tensor::empty(Shape{n * k}, DType::i32), lwhere = Tensor::empty(Shape{n * k}, DType::i32);
          poison(lorder);
          poison(lwhere);
          std::vector<int64_t> loffsets, routed;
          ops::moe_dispatch_plan(lorder, lwhere, loffsets, local, E, cap, &routed, &runs);
          const int32_t* lw = lwhere.data<int32_t>();
          for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < k; ++j)
              EXPECT_EQ(lw[i * k + j] >= 0, call_where[tokens[size_t(i)] * k + j] >= 0)
                  << "rank " << rank << " token " << tokens[size_t(i)] << " choice " << j;
          for (int64_t e = 0; e < E; ++e)
            EXPECT_EQ(routed[size_t(e)], std::count(local.data<int32_t>(), local.data<int32_t>() + n * k, int32_t(e)));
          for (int64_t p = 0; p < loffsets[size_t(E)]; ++p) EXPECT_EQ(lw[lorder.data<int32_t>()[p]], p);
          kept_over_ranks += loffsets[size_t(E)];
        }
        EXPECT_EQ(kept_over_ranks, offsets[size_t(E)]);
      }
  // Runs that do not describe the slots are named.
  const Tensor choice = test::tensor_from({0, 1, 1, 0}, Shape{2, 2}, DType::i32);
  Tensor order = Tensor::empty(Shape{4}, DType::i32), where = Tensor::empty(Shape{4}, DType::i32);
  std::vector<int64_t> offsets;
  const ops::SlotRuns late{{1}, {0, 0}}, short_counts{{0, 2}, {0, 0, 0}}, negative{{0}, {0, -1}};
  for (const ops::SlotRuns* bad : {&late, &short_counts})
    EXPECT_THAT(error_of([&] { ops::moe_dispatch_plan(order, where, offsets, choice, 2, 1, nullptr, bad); }),
                HasSubstr("must start at 0, ascend within the 4 slots and give E = 2 counts a run"));
  EXPECT_THAT(error_of([&] { ops::moe_dispatch_plan(order, where, offsets, choice, 2, 1, nullptr, &negative); }),
              HasSubstr("a run has -1 slots ahead of it"));
}

TEST(MoeDispatch, BadExpertIdsAndForeignPlansAreNamed) {
  const Tensor choice = test::tensor_from({0, 3, 1, 4}, Shape{2, 2}, DType::i32);
  Tensor order = Tensor::empty(Shape{4}, DType::i32), where = Tensor::empty(Shape{4}, DType::i32);
  std::vector<int64_t> offsets;
  EXPECT_THAT(error_of([&] { ops::moe_dispatch_plan(order, where, offsets, choice, 4); }),
              HasSubstr("slot 3 (token 1) chose expert 4, outside [0, E) with E = 4"));
  const Tensor x = Tensor::empty(Shape{2, 3}, DType::f32), xs = Tensor::empty(Shape{4, 3}, DType::f32);
  const Tensor bad = test::tensor_from({0, 1, 2, 9}, Shape{4}, DType::i32);
  EXPECT_THAT(error_of([&] { ops::moe_gather(xs, x, bad, 2); }), HasSubstr("'order'[3] = 9 is outside [0, N k)"));
  const Tensor xs_gpu = test::fake_cuda(Shape{4, 3}, DType::f32), x_gpu = test::fake_cuda(Shape{2, 3}, DType::f32);
  EXPECT_THAT(error_of([&] { ops::moe_gather(xs_gpu, x_gpu, bad, 2); }), HasSubstr("moe_gather"));
  // The plan lives on the host, where it is checked (a GPU op uploads it).
  const Tensor order_gpu = test::fake_cuda(Shape{4}, DType::i32);
  EXPECT_THAT(error_of([&] { ops::moe_gather(xs, x, order_gpu, 2); }),
              HasSubstr("'order' must be on the host (the dispatch plan is read there)"));
  const Tensor good = test::tensor_from({0, 1, 2, 3}, Shape{4}, DType::i32);
  EXPECT_THAT(error_of([&] { ops::moe_gather(xs_gpu, x, good, 2); }), HasSubstr("'xs' is on cuda:63"));
}

struct RowCase {
  int64_t N, E, k, C;
};
const RowCase kRowCases[] = {{1, 1, 1, 1}, {9, 4, 2, 5}, {40, 8, 2, 64}, {17, 6, 3, 130}, {3, 2, 2, 768}};

// A random plan: a routing of random logits, dropless or with each expert
// taking at most half its mean share of the slots (some dropped wherever
// more than one slot an expert is routed).
struct Plan {
  RouteOut r;
  Tensor order, where;
  std::vector<int64_t> offsets;
  int64_t rows() const { return offsets.back(); }  // the kept slots
  Tensor kept_order() const { return order.slice(0, rows()); }
};
Plan random_plan(const RowCase& c, std::mt19937_64& rng, bool capacity) {
  Plan p{route(random_tensor(Shape{c.N, c.E}, DType::f32, rng, -2.0, 2.0), c.k, true),
         Tensor::empty(Shape{c.N * c.k}, DType::i32), Tensor::empty(Shape{c.N * c.k}, DType::i32), {}};
  ops::moe_dispatch_plan(p.order, p.where, p.offsets, p.r.choice, c.E,
                         capacity ? std::max<int64_t>(1, c.N * c.k / (2 * c.E)) : -1);
  return p;
}

double rtol_of(DType dt) { return dt == DType::bf16 ? 0x1p-8 : 1e-6; }

TEST(MoeRows, GatherAndItsBackwardMatchFloat64) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(4);
  for (DType dt : {DType::f32, DType::bf16})
    for (const RowCase& c : kRowCases)
      for (bool accumulate : {false, true})
        for (bool capacity : {false, true}) {
          SCOPED_TRACE(testing::Message() << dtype_name(dt) << " N " << c.N << " k " << c.k << " C " << c.C
                                          << (capacity ? " capacity" : ""));
          const Plan p = random_plan(c, rng, capacity);
          const int64_t R = p.rows();
          const Tensor x = random_tensor(Shape{c.N, c.C}, dt, rng);
          Tensor xs = Tensor::empty(Shape{R, c.C}, dt);
          poison(xs);
          ops::moe_gather(xs, x, p.kept_order(), c.k);
          const std::vector<double> xv = to_f64(x);
          std::vector<double> ref;
          for (int64_t q = 0; q < R; ++q)
            for (int64_t ch = 0; ch < c.C; ++ch) ref.push_back(xv[size_t(p.order.data<int32_t>()[q] / c.k * c.C + ch)]);
          EXPECT_TRUE(test::all_close(xs, ref, 0.0, 0.0)) << "gather copies rows bit for bit";
          const Tensor dxs = random_tensor(Shape{R, c.C}, dt, rng);
          Tensor dx = random_tensor(Shape{c.N, c.C}, dt, rng);
          const std::vector<double> before = to_f64(dx), g = to_f64(dxs);
          if (!accumulate) poison(dx);
          ops::moe_gather_backward(dx, dxs, p.where, c.k, accumulate);
          std::vector<double> want(size_t(c.N * c.C)), scale(size_t(c.N * c.C));
          for (int64_t t = 0; t < c.N; ++t)
            for (int64_t ch = 0; ch < c.C; ++ch) {
              double s = accumulate ? before[size_t(t * c.C + ch)] : 0.0, a = std::fabs(s);
              for (int64_t j = 0; j < c.k; ++j) {
                const int64_t q = p.where.data<int32_t>()[t * c.k + j];
                if (q < 0) continue;  // dropped
                const double v = g[size_t(q * c.C + ch)];
                s += v;
                a += std::fabs(v);
              }
              want[size_t(t * c.C + ch)] = s;
              scale[size_t(t * c.C + ch)] = a;
            }
          for (int64_t i = 0; i < c.N * c.C; ++i)
            ASSERT_LE(std::fabs(load_f64(dx, i) - want[size_t(i)]), rtol_of(dt) * scale[size_t(i)] + 1e-30) << i;
        }
}

TEST(MoeRows, CombineAndItsBackwardMatchFloat64) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(5);
  for (DType dt : {DType::f32, DType::bf16})
    for (const RowCase& c : kRowCases)
      for (bool residual : {false, true})
        for (bool capacity : {false, true}) {
          SCOPED_TRACE(testing::Message() << dtype_name(dt) << " N " << c.N << " k " << c.k << " C " << c.C
                                          << " residual " << residual << (capacity ? " capacity" : ""));
          const Plan p = random_plan(c, rng, capacity);
          const int64_t R = p.rows();
          const Tensor ys = random_tensor(Shape{R, c.C}, dt, rng);
          const Tensor res = residual ? random_tensor(Shape{c.N, c.C}, dt, rng) : Tensor();
          Tensor out = Tensor::empty(Shape{c.N, c.C}, dt);
          poison(out);
          ops::moe_combine(out, ys, p.r.weight, p.where, res);
          const std::vector<double> y = to_f64(ys), w = to_f64(p.r.weight);
          const std::vector<double> rv = residual ? to_f64(res) : std::vector<double>(size_t(c.N * c.C), 0.0);
          const int32_t* wh = p.where.data<int32_t>();
          for (int64_t t = 0; t < c.N; ++t)
            for (int64_t ch = 0; ch < c.C; ++ch) {
              double s = rv[size_t(t * c.C + ch)], a = std::fabs(s);
              for (int64_t j = 0; j < c.k; ++j) {
                if (wh[t * c.k + j] < 0) continue;  // dropped
                const double term = w[size_t(t * c.k + j)] * y[size_t(wh[t * c.k + j] * c.C + ch)];
                s += term;
                a += std::fabs(term);
              }
              ASSERT_LE(std::fabs(load_f64(out, t * c.C + ch) - s), rtol_of(dt) * a + 1e-30) << t << "," << ch;
            }
          // Backward.
          const Tensor dout = random_tensor(Shape{c.N, c.C}, dt, rng);
          Tensor dys = Tensor::empty(Shape{R, c.C}, dt), dweight = Tensor::empty(Shape{c.N, c.k}, DType::f32);
          poison(dys);
          poison(dweight);
          ops::moe_combine_backward(dys, dweight, dout, ys, p.r.weight, p.where);
          const std::vector<double> g = to_f64(dout);
          std::vector<double> dys_ref(size_t(R * c.C)), dw_ref;
          for (int64_t t = 0; t < c.N; ++t)
            for (int64_t j = 0; j < c.k; ++j) {
              const int64_t q = wh[t * c.k + j];
              if (q < 0) {
                EXPECT_EQ(load_f64(dweight, t * c.k + j), 0.0) << "a dropped slot's weight gets no gradient";
                continue;
              }
              double dot = 0, a = 0;
              for (int64_t ch = 0; ch < c.C; ++ch) {
                dys_ref[size_t(q * c.C + ch)] = w[size_t(t * c.k + j)] * g[size_t(t * c.C + ch)];
                dot += g[size_t(t * c.C + ch)] * y[size_t(q * c.C + ch)];
                a += std::fabs(g[size_t(t * c.C + ch)] * y[size_t(q * c.C + ch)]);
              }
              EXPECT_LE(std::fabs(load_f64(dweight, t * c.k + j) - dot), 1e-6 * a + 1e-30) << t << "," << j;
            }
          EXPECT_TRUE(test::all_close(dys, dys_ref, dt == DType::bf16 ? 0x1p-8 : 1e-7, 0.0));
        }
}

}  // namespace
}  // namespace zt
