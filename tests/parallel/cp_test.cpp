// Context parallelism's ring attention under mpirun, cp = the world size:
// every rank's rows of out, lse, dq, dk and dv equal the single-process
// causal attention of the whole sequence (f32 to rounding, bf16 to its
// tolerance; with one rank, bit for bit), for GQA and sequences whose local
// rows span several kernel tiles; the zigzag layout covers every position
// once; a bad call fails on every rank with its message before any message
// is sent. The model with context parallelism (GPT-2 and Llama 3, every
// recompute policy): loss and every gradient summed over the ranks equal
// the single-process model's, and logits() stays whole-sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "nn/ring_attention.h"
#include "nn/transformer.h"
#include "ops/attention.h"
#include "parallel/parallel_test_util.h"
#include "test_util.h"

namespace zt::nn {
namespace {

using test::error_of;

// One seed for every rank (each process's own test seed differs): rank 0's.
uint64_t shared_seed() {
  comm::ProcessGroup& w = comm::world();
  Tensor s = Tensor::empty(Shape{1}, DType::i64);
  s.data<int64_t>()[0] = int64_t(test::test_seed() >> 1);
  w.broadcast(s, 0)->wait();
  return uint64_t(s.data<int64_t>()[0]);
}

struct Case {
  int64_t B, chunk, Hq, Hkv, D;  // seq_len = 2 cp chunk
};

void check_case(const Case& c, DType dtype, uint64_t salt) {
  comm::ProcessGroup& cp = comm::world();
  const int64_t P = cp.size(), T = 2 * P * c.chunk;
  const uint64_t seed = shared_seed();
  SCOPED_TRACE("B=" + std::to_string(c.B) + " T=" + std::to_string(T) + " Hq=" + std::to_string(c.Hq) +
               " Hkv=" + std::to_string(c.Hkv) + " D=" + std::to_string(c.D) + " " + std::string(dtype_name(dtype)) +
               " cp=" + std::to_string(P) + "; reproduce with ZT_TEST_SEED=" + std::to_string(seed << 1));
  std::mt19937_64 rng(seed ^ (salt * 0x9E3779B97F4A7C15ull));
  const Shape qs{c.B, T, c.Hq, c.D}, kvs{c.B, T, c.Hkv, c.D};
  const Tensor q = test::random_tensor(qs, dtype, rng), k = test::random_tensor(kvs, dtype, rng),
               v = test::random_tensor(kvs, dtype, rng), dout = test::random_tensor(qs, dtype, rng);

  // The single-process reference: the whole sequence on every rank.
  Tensor out = Tensor::empty(qs, dtype), lse = Tensor::empty(Shape{c.B, c.Hq, T}, DType::f32);
  ops::attention_forward(out, lse, q, k, v);
  Tensor dq = Tensor::empty(qs, dtype), dk = Tensor::empty(kvs, dtype), dv = Tensor::empty(kvs, dtype);
  ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse);

  const ContextShard shard = context_shard(T, P, cp.rank());
  const Tensor lq = shard_rows(q, shard), lk = shard_rows(k, shard), lv = shard_rows(v, shard),
               ldout = shard_rows(dout, shard);
  const int64_t Tl = shard.local_len();
  Tensor lout = Tensor::empty(lq.shape(), dtype), llse = Tensor::empty(Shape{c.B, c.Hq, Tl}, DType::f32);
  test::poison(lout);
  test::poison(llse);
  ring_attention_forward(cp, lout, llse, lq, lk, lv);
  Tensor ldq = Tensor::empty(lq.shape(), dtype), ldk = Tensor::empty(lk.shape(), dtype),
         ldv = Tensor::empty(lk.shape(), dtype);
  test::poison(ldq);
  test::poison(ldk);
  test::poison(ldv);
  // The backward takes the ring's own out and lse, as training does.
  ring_attention_backward(cp, ldq, ldk, ldv, ldout, lq, lk, lv, lout, llse);

  // lse (B, Hq, T) sharded along its last dim, through a (B, T, Hq) transpose.
  auto lse_shard = [&](const Tensor& l) {
    Tensor t = Tensor::empty(Shape{c.B, T, c.Hq}, DType::f32);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < T; ++i) t.data<float>()[(b * T + i) * c.Hq + h] = l.data<float>()[(b * c.Hq + h) * T + i];
    const Tensor s = shard_rows(t, shard);
    std::vector<double> r(size_t(s.numel()));
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t i = 0; i < Tl; ++i) r[size_t((b * c.Hq + h) * Tl + i)] = s.data<float>()[(b * Tl + i) * c.Hq + h];
    return r;
  };

  const std::vector<Tensor> got = {lout, ldq, ldk, ldv};
  const std::vector<Tensor> want = {shard_rows(out, shard), shard_rows(dq, shard), shard_rows(dk, shard),
                                    shard_rows(dv, shard)};
  const char* names[] = {"out", "dq", "dk", "dv"};
  if (P == 1) {  // the plain causal kernel, bit for bit
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(std::memcmp(got[i].data_ptr(), want[i].data_ptr(), got[i].nbytes()), 0) << names[i];
    EXPECT_EQ(std::memcmp(llse.data_ptr(), lse.data_ptr(), lse.nbytes()), 0) << "lse";
    return;
  }
  // f32: the blocks' sums in another order (~1e-6 of the scale). bf16: out
  // and the blocks' gradients are rounded once each, as in ops' own tests.
  const bool bf = dtype == DType::bf16;
  const double rtol = bf ? 2e-2 : 1e-4, atol = bf ? 1e-2 : 1e-5;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(test::all_close(got[i], test::to_f64(want[i]), rtol, atol)) << names[i];
  EXPECT_TRUE(test::all_close(llse, lse_shard(lse), 1e-5, 1e-5)) << "lse";
}

TEST(RingAttention, ZigzagShardsCoverEveryPositionOnce) {
  for (int64_t P : {1, 2, 3, 4, 8}) {
    const int64_t T = 2 * P * 3;
    std::vector<int64_t> all;
    for (int64_t r = 0; r < P; ++r) {
      const ContextShard s = context_shard(T, P, r);
      const std::vector<int64_t> p = s.positions();
      ASSERT_EQ(int64_t(p.size()), T / P);
      // Two runs of consecutive positions: chunk r, then chunk 2P-1-r.
      EXPECT_EQ(p.front(), r * 3);
      EXPECT_EQ(p[3], (2 * P - 1 - r) * 3);
      all.insert(all.end(), p.begin(), p.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> every(static_cast<size_t>(T));
    std::iota(every.begin(), every.end(), 0);
    EXPECT_EQ(all, every) << "cp = " << P;
  }
  const std::string msg = error_of([] { context_shard(30, 4, 0); });
  EXPECT_NE(msg.find("train.seq_len = 30"), std::string::npos) << msg;
  EXPECT_NE(msg.find("multiple of 8"), std::string::npos) << msg;
}

TEST(RingAttention, F32MatchesOneProcess) {
  ZT_TEST_TRACE_SEED();
  check_case({2, 5, 4, 2, 16}, DType::f32, 1);   // odd chunks, GQA 2:1
  check_case({1, 40, 2, 1, 24}, DType::f32, 2);  // local rows 80: two kernel tiles, one kv head
  check_case({1, 3, 3, 3, 8}, DType::f32, 3);    // Hq = Hkv
}

TEST(RingAttention, Bf16MatchesOneProcess) {
  ZT_TEST_TRACE_SEED();
  check_case({2, 6, 4, 2, 16}, DType::bf16, 4);
  check_case({1, 33, 2, 2, 32}, DType::bf16, 5);
}

// Every rank makes the same bad call: each gets the message, and nothing
// hangs (the checks come before the first send).
TEST(RingAttention, BadCallsFailOnEveryRankBeforeAnyMessage) {
  comm::ProcessGroup& cp = comm::world();
  const DType f = DType::f32;
  Tensor q = Tensor::empty(Shape{1, 5, 2, 8}, f), k = Tensor::empty(Shape{1, 5, 1, 8}, f),
         out = Tensor::empty(Shape{1, 5, 2, 8}, f), lse = Tensor::empty(Shape{1, 2, 5}, DType::f32);
  std::string msg = error_of([&] { ring_attention_forward(cp, out, lse, q, k, k); });
  EXPECT_NE(msg.find("ring_attention_forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("must be even"), std::string::npos) << msg;
  Tensor q6 = Tensor::empty(Shape{1, 6, 2, 8}, f), k6 = Tensor::empty(Shape{1, 6, 1, 8}, f),
         o6 = Tensor::empty(Shape{1, 6, 2, 8}, f), l6 = Tensor::empty(Shape{1, 2, 6}, DType::f32),
         k6b = Tensor::empty(Shape{1, 6, 1, 8}, DType::bf16);
  msg = error_of([&] { ring_attention_forward(cp, o6, l6, q6, k6b, k6b); });
  EXPECT_NE(msg.find("'k' is bf16"), std::string::npos) << msg;
  msg = error_of([&] { ring_attention_backward(cp, q6, k6, k6, q6, q6, k6, k6, o6, l6.view(Shape{1, 6, 2})); });
  EXPECT_NE(msg.find("lse"), std::string::npos) << msg;
  Tensor kc = Tensor::wrap(k6.data_ptr(), k6.shape(), f, Device::cuda(63));
  msg = error_of([&] { ring_attention_forward(cp, o6, l6, q6, kc, k6); });
  EXPECT_NE(msg.find("cuda:63"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on one device"), std::string::npos) << msg;
  // The group still works after the refusals: a collective completes.
  cp.barrier()->wait();
}

// Tokens every rank draws alike (a fixed seed).
Tensor fixed_tokens(int64_t B, int64_t T, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor t = Tensor::empty(Shape{B, T}, DType::i32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int32_t>()[i] = int32_t(rng() % uint64_t(vocab));
  return t;
}

double rel_l2(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < b.numel(); ++i) {
    const double x = test::load_f64(a, i), y = test::load_f64(b, i);
    num += (x - y) * (x - y);
    den += y * y;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// One micro-batch: each rank runs its zigzag rows of the same sequences;
// the ranks' losses and gradients summed equal the whole model's.
TEST(ContextParallel, LossAndGradientsMatchOneProcess) {
  comm::ProcessGroup& cp = comm::world();
  struct Case {
    const char* preset;
    std::vector<std::string> extra;
    const char* fused_qkv = nullptr;  // ZT_FUSED_QKV while the models are built
  };
  const Case cases[] = {
      {"gpt2-tiny", {}},  // learned positions
      {"llama3-tiny", {}},  // RoPE, GQA
      {"llama3-tiny", {"model.n_kv_head=1", "train.recompute=selective"}},
      {"gpt2-tiny", {"train.recompute=full"}},
      // The GPU's packed form (one product, heads read in place) outside the
      // ring; a context-parallel pass takes three products (GPT-2) or the
      // RoPE split (Llama) instead.
      {"gpt2-tiny", {}, "1"},
      {"llama3-tiny", {"train.recompute=selective"}, "1"},
  };
  for (const Case& c : cases) {
    const train::Config cfg = test::fortunes_config(c.preset, c.extra);
    SCOPED_TRACE(std::string(c.preset) + (c.extra.empty() ? "" : " " + c.extra.back()) +
                 (c.fused_qkv ? std::string(" ZT_FUSED_QKV=") + c.fused_qkv : "") + ", cp = " +
                 std::to_string(cp.size()));
    if (c.fused_qkv) ::setenv("ZT_FUSED_QKV", c.fused_qkv, 1);
    Transformer ref(cfg.model, DType::f32), m(cfg.model, DType::f32);
    ::unsetenv("ZT_FUSED_QKV");
    ref.recompute = m.recompute = cfg.recompute();
    m.context_parallel = &cp;
    ref.init_weights(11);
    m.init_weights(11);
    const int64_t B = 2, T = 32;
    const Tensor tokens = fixed_tokens(B, T, cfg.model.vocab_size, 5), targets = fixed_tokens(B, T, cfg.model.vocab_size, 6);
    targets.data<int32_t>()[3] = -1;  // an ignored target (rank 0's rows)
    const float scale = 1.0f / float(B * T);
    ForwardContext cr, cc;
    const double loss_ref = ref.forward(cr, tokens, targets, true, scale);
    ref.backward(cr);
    const ContextShard shard = context_shard(T, cp.size(), cp.rank());
    const double loss_local = m.forward(cc, shard_rows(tokens, shard), shard_rows(targets, shard), true, scale);
    EXPECT_EQ(cc.T, T / cp.size());
    m.backward(cc);
    EXPECT_NEAR(comm::sum_exact(cp, loss_local), loss_ref, 1e-5 * std::fabs(loss_ref)) << "loss";
    for (const ParamSet* set : static_cast<const Transformer&>(ref).param_sets())
      for (size_t i = 0; i < set->size(); ++i) {
        const std::string& name = set->spec(i).name;
        const Tensor g = m.grad(name);
        Tensor sum = Tensor::empty(g.shape(), DType::f32);
        std::memcpy(sum.data_ptr(), g.data_ptr(), g.nbytes());
        cp.all_reduce(sum)->wait();
        EXPECT_LT(rel_l2(sum, ref.grad(name)), 1e-5) << "gradient of " << name;
      }
    // Generation's logits: the whole sequence on every rank, as without cp.
    const int64_t Vp = cfg.model.padded_vocab();
    Tensor lr = Tensor::empty(Shape{B, T, Vp}, DType::f32), lc = Tensor::empty(Shape{B, T, Vp}, DType::f32);
    test::poison(lc);
    ref.logits(lr, tokens);
    m.logits(lc, tokens);
    EXPECT_EQ(std::memcmp(lc.data_ptr(), lr.data_ptr(), lr.nbytes()), 0) << "logits";
  }
}

// A micro-batch that is not a rank's two equal chunks is refused on every rank before any message.
TEST(ContextParallel, OddLocalRowsAreRefused) {
  comm::ProcessGroup& cp = comm::world();
  if (cp.size() == 1) GTEST_SKIP() << "needs 2 or more ranks";
  const train::Config cfg = test::fortunes_config("llama3-tiny");
  Transformer m(cfg.model, DType::f32);
  m.context_parallel = &cp;
  m.init_weights(1);
  ForwardContext ctx;
  const Tensor tokens = fixed_tokens(1, 5, cfg.model.vocab_size, 1);
  const std::string msg = error_of([&] { m.forward(ctx, tokens, tokens, true, 1.0f); });
  EXPECT_NE(msg.find("two equal zigzag chunks"), std::string::npos) << msg;
  cp.barrier()->wait();
}

}  // namespace
}  // namespace zt::nn
