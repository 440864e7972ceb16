// Every ProcessGroup operation on the world (whatever its size under
// mpirun) and on sub-groups, for each dtype, against results each rank
// computes locally from the same formula of (rank, index): random-looking
// values, outputs poisoned first, 0-sized and odd sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "comm/mpi_group.h"
#include "comm/process_group.h"
#include "core/error.h"
#include "test_util.h"

namespace zt::comm {
namespace {

ProcessGroup& W() { return world(); }

// Value of element i on rank r: integers (so f32 sums are exact) that differ
// per rank and element, with a per-test salt.
double value(int r, int64_t i, int salt) { return double(((r + 1) * 7919 + i * 104729 + salt * 31) % 2001 - 1000); }

// value() as stored in dtype d (bf16 rounds integers above 256; f16 holds
// them all).
double stored(DType d, int r, int64_t i, int salt) {
  Tensor t = Tensor::empty(Shape{1}, d);
  test::store_f64(t, 0, value(r, i, salt));
  return test::load_f64(t, 0);
}

Tensor filled(DType d, int64_t n, int r, int salt) {
  Tensor t = Tensor::empty(Shape{n}, d);
  for (int64_t i = 0; i < n; ++i) test::store_f64(t, i, value(r, i, salt));
  return t;
}

void poison(const Tensor& t) {
  if (t.nbytes()) std::memset(t.data_ptr(), 0xA5, t.nbytes());
}

const std::vector<int64_t> kSizes = {0, 1, 7, 64, 1000, 4099};

TEST(Comm, AllReduceSumMaxMinEveryDtype) {
  const int p = W().size(), me = W().rank();
  for (DType d : {DType::f32, DType::i32, DType::i64, DType::bf16, DType::f16})
    for (int64_t n : kSizes)
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
        Tensor t = filled(d, n, me, 1);
        W().all_reduce(t, op)->wait();
        for (int64_t i = 0; i < n; ++i) {
          double want = op == ReduceOp::sum ? 0 : stored(d, 0, i, 1), magnitude = 0;
          for (int r = 0; r < p; ++r) {
            const double v = stored(d, r, i, 1);
            magnitude += std::fabs(v);
            want = op == ReduceOp::sum ? want + v : op == ReduceOp::max ? std::max(want, v) : std::min(want, v);
          }
          if ((d == DType::bf16 || d == DType::f16) && op == ReduceOp::sum) {
            // Each partial sum rounds to the 16-bit type (unit roundoff 2^-8 for bf16's
            // 8 significant bits, 2^-11 for f16's 11; at most the sum of magnitudes),
            // p - 1 times.
            const double roundoff = d == DType::bf16 ? 1.0 / 256.0 : 1.0 / 2048.0;
            ASSERT_NEAR(test::load_f64(t, i), want, double(p) * magnitude * roundoff)
                << dtype_name(d) << " n " << n << " i " << i;
          } else {
            ASSERT_EQ(test::load_f64(t, i), want) << dtype_name(d) << " n " << n << " i " << i;
          }
        }
      }
}

TEST(Comm, ReduceScatterAllGatherBroadcast) {
  const int p = W().size(), me = W().rank();
  for (int64_t block : {int64_t(0), int64_t(1), int64_t(5), int64_t(300)}) {
    Tensor in = filled(DType::f32, block * p, me, 2), out = Tensor::empty(Shape{block}, DType::f32);
    poison(out);
    W().reduce_scatter(out, in)->wait();
    for (int64_t i = 0; i < block; ++i) {
      double want = 0;
      for (int r = 0; r < p; ++r) want += value(r, me * block + i, 2);
      ASSERT_EQ(out.data<float>()[i], want);
    }
    for (DType d : {DType::f32, DType::bf16, DType::i64, DType::u16}) {
      Tensor mine = filled(d, block, me, 3), all = Tensor::empty(Shape{block * p}, d);
      poison(all);
      W().all_gather(all, mine)->wait();
      for (int r = 0; r < p; ++r)
        for (int64_t i = 0; i < block; ++i)
          ASSERT_EQ(test::load_f64(all, r * block + i), test::load_f64(filled(d, block, r, 3), i));
    }
    // In place: this rank's input is its own block of the output.
    Tensor all = Tensor::empty(Shape{block * p}, DType::f32);
    poison(all);
    const Tensor own = all.flat_view(me * block, Shape{block});
    const Tensor mine = filled(DType::f32, block, me, 6);
    if (block) std::memcpy(own.data_ptr(), mine.data_ptr(), mine.nbytes());
    W().all_gather(all, own)->wait();
    for (int r = 0; r < p; ++r)
      for (int64_t i = 0; i < block; ++i) ASSERT_EQ(all.data<float>()[r * block + i], value(r, i, 6));
  }
  for (int root = 0; root < p; ++root) {
    Tensor t = me == root ? filled(DType::i32, 77, root, 4) : Tensor::empty(Shape{77}, DType::i32);
    if (me != root) poison(t);
    W().broadcast(t, root)->wait();
    for (int64_t i = 0; i < 77; ++i) ASSERT_EQ(t.data<int32_t>()[i], value(root, i, 4));
  }
}

// Point-to-point is non-blocking: every rank sends a large message (past
// the eager limit: the send cannot finish before the peer receives) to the
// next rank BEFORE receiving from the previous one - a ring that deadlocks
// with blocking sends - with receives for later messages posted early and a
// collective of the same group in between, as pipeline schedules do.
TEST(Comm, LargeRingExchangeWithSendsFirstDoesNotDeadlock) {
  const int p = W().size(), me = W().rank();
  if (p == 1) GTEST_SKIP() << "needs 2 or more ranks";
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  const int64_t n = 1 << 21;  // 8 MiB of f32 per message
  std::vector<Tensor> in, out;
  std::vector<WorkHandle> recvs, sends;
  for (int k = 0; k < 3; ++k) {
    out.push_back(filled(DType::f32, n, me, 20 + k));
    in.push_back(Tensor::empty(Shape{n}, DType::f32));
    poison(in.back());
  }
  sends.push_back(W().send(out[0], next, 1));
  for (int k = 0; k < 3; ++k) recvs.push_back(W().recv(in[size_t(k)], prev, 1));  // posted early, matched in order
  Tensor x = filled(DType::f32, 5, me, 3);
  W().all_reduce(x)->wait();  // the group's collectives are not queued behind the transfers
  sends.push_back(W().send(out[1], next, 1));
  sends.push_back(W().send(out[2], next, 1));
  for (auto& r : recvs) r->wait();
  for (auto& s : sends) s->wait();
  for (int k = 0; k < 3; ++k)
    for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(in[size_t(k)].data<float>()[i], value(prev, i, 20 + k)) << k;
  EXPECT_TRUE(recvs[0]->test());
}

TEST(Comm, SendRecvRingAndAllToAll) {
  const int p = W().size(), me = W().rank();
  if (p > 1) {
    Tensor out = filled(DType::f32, 513, me, 5), in = Tensor::empty(Shape{513}, DType::f32);
    poison(in);
    const int next = (me + 1) % p, prev = (me + p - 1) % p;
    auto s = W().send(out, next, 9);
    auto r = W().recv(in, prev, 9);
    r->wait();
    s->wait();
    for (int64_t i = 0; i < 513; ++i) ASSERT_EQ(in.data<float>()[i], value(prev, i, 5));
  }
  // all_to_all: block b of rank r's input is element (r, b); rank me receives (r, me) from each r.
  const int64_t block = 3;
  Tensor in = Tensor::empty(Shape{block * p}, DType::i64), out = Tensor::empty(Shape{block * p}, DType::i64);
  for (int b = 0; b < p; ++b)
    for (int64_t i = 0; i < block; ++i) in.data<int64_t>()[b * block + i] = me * 1000 + b * 10 + i;
  poison(out);
  W().all_to_all(out, in)->wait();
  for (int r = 0; r < p; ++r)
    for (int64_t i = 0; i < block; ++i) ASSERT_EQ(out.data<int64_t>()[r * block + i], r * 1000 + me * 10 + i);
  // all_to_allv: rank r sends (r + b) % 3 elements to rank b (zeros included).
  std::vector<int64_t> sc(static_cast<size_t>(p)), rc(static_cast<size_t>(p));
  for (int b = 0; b < p; ++b) {
    sc[size_t(b)] = (me + b) % 3;
    rc[size_t(b)] = (b + me) % 3;
  }
  const int64_t ns = std::accumulate(sc.begin(), sc.end(), int64_t(0)), nr = std::accumulate(rc.begin(), rc.end(), int64_t(0));
  Tensor vin = Tensor::empty(Shape{ns}, DType::f32), vout = Tensor::empty(Shape{nr}, DType::f32);
  int64_t k = 0;
  for (int b = 0; b < p; ++b)
    for (int64_t i = 0; i < sc[size_t(b)]; ++i) vin.data<float>()[k++] = float(me * 100 + b * 10 + i);
  poison(vout);
  W().all_to_allv(vout, rc, vin, sc)->wait();
  k = 0;
  for (int r = 0; r < p; ++r)
    for (int64_t i = 0; i < rc[size_t(r)]; ++i) ASSERT_EQ(vout.data<float>()[k++], float(r * 100 + me * 10 + i));
  W().barrier()->wait();
}

// send_recv as context parallelism's ring uses it: P - 1 steps, each rank
// passing on what it received at the step before (large messages, so a
// blocking send would deadlock), two tags in flight at once, two alternating
// buffers; after step s every rank holds rank (me - s)'s data.
TEST(Comm, SendRecvPassesBlocksRoundTheRing) {
  const int p = W().size(), me = W().rank();
  if (p == 1) GTEST_SKIP() << "a ring of several ranks";
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  const int64_t n = int64_t(1) << 20;  // 4 MiB of f32
  const Tensor own_a = filled(DType::f32, n, me, 3), own_b = filled(DType::bf16, 999, me, 4);
  Tensor a[2] = {Tensor::empty(Shape{n}, DType::f32), Tensor::empty(Shape{n}, DType::f32)};
  Tensor b[2] = {Tensor::empty(Shape{999}, DType::bf16), Tensor::empty(Shape{999}, DType::bf16)};
  for (int i = 0; i < 2; ++i) {
    poison(a[i]);
    poison(b[i]);
  }
  std::vector<comm::WorkHandle> pending = {W().send_recv(own_a, next, a[0], prev, 21),
                                           W().send_recv(own_b, next, b[0], prev, 22)};
  for (int s = 1; s < p; ++s) {
    const int cur = (s - 1) % 2, nxt = s % 2;
    for (auto& w : pending) w->wait();
    pending.clear();
    if (s < p - 1)
      pending = {W().send_recv(a[cur], next, a[nxt], prev, 21), W().send_recv(b[cur], next, b[nxt], prev, 22)};
    const int from = (me - s + p) % p;
    for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(a[cur].data<float>()[i], value(from, i, 3)) << "step " << s;
    ASSERT_EQ(a[cur].data<float>()[n - 1], value(from, n - 1, 3)) << "step " << s;
    const Tensor want_b = filled(DType::bf16, 999, from, 4);
    ASSERT_EQ(std::memcmp(b[cur].data_ptr(), want_b.data_ptr(), want_b.nbytes()), 0) << "step " << s;
  }
  for (auto& w : pending) w->wait();
  W().barrier()->wait();
}

TEST(Comm, SplitGroupsAndManyOpsInFlight) {
  const int p = W().size(), me = W().rank();
  // Even and odd ranks, ordered in reverse.
  auto g = W().split(me % 2, -me, "parity");
  const int members = (p + 1 - me % 2) / 2;
  EXPECT_EQ(g->size(), members);
  EXPECT_EQ(g->world_ranks()[size_t(g->rank())], me);
  for (size_t i = 1; i < g->world_ranks().size(); ++i) EXPECT_GT(g->world_ranks()[i - 1], g->world_ranks()[i]);
  Tensor s = Tensor::empty(Shape{1}, DType::i64);
  s.data<int64_t>()[0] = me;
  g->all_reduce(s)->wait();
  int64_t want = 0;
  for (int r = me % 2; r < p; r += 2) want += r;
  EXPECT_EQ(s.data<int64_t>()[0], want);
  // 20 all-reduces in flight, waited in reverse: each result right.
  std::vector<Tensor> ts;
  std::vector<WorkHandle> ws;
  for (int k = 0; k < 20; ++k) {
    ts.push_back(filled(DType::f32, 100 + k, me, 10 + k));
    ws.push_back(W().all_reduce(ts.back()));
  }
  for (int k = 19; k >= 0; --k) {
    ws[size_t(k)]->wait();
    EXPECT_TRUE(ws[size_t(k)]->test());
    for (int64_t i = 0; i < 100 + k; ++i) {
      double want2 = 0;
      for (int r = 0; r < p; ++r) want2 += value(r, i, 10 + k);
      ASSERT_EQ(ts[size_t(k)].data<float>()[i], want2);
    }
  }
}

TEST(Comm, LongMessagesAreSplitAndStatsCountRingBytes) {
  const int p = W().size(), me = W().rank();
  if (world_info().backend == "mpi") set_max_message_elements(7);
  Tensor t = filled(DType::f32, 100, me, 20);
  const CommStats before = W().stats();
  W().all_reduce(t)->wait();
  set_max_message_elements(0);
  for (int64_t i = 0; i < 100; ++i) {
    double want = 0;
    for (int r = 0; r < p; ++r) want += value(r, i, 20);
    ASSERT_EQ(t.data<float>()[i], want);
  }
  const CommStats after = W().stats();
  EXPECT_EQ(after.ops - before.ops, 1);
  EXPECT_EQ(after.bytes_sent - before.bytes_sent, 2 * 400 * (p - 1) / p);
  // The MPI backend times the operation on its comm thread; solo has none.
  if (world_info().backend == "mpi") {
    EXPECT_GT(after.busy_seconds, before.busy_seconds);
  }
}

TEST(Comm, BadArgumentsNameTheOperationAndGroup) {
  const int p = W().size();
  Tensor a = Tensor::empty(Shape{5}, DType::f32), b = Tensor::empty(Shape{5 * p + 1}, DType::f32);
  try {
    W().reduce_scatter(a, b);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("comm: reduce_scatter on group 'world'"), std::string::npos) << e.what();
  }
  Tensor u = Tensor::empty(Shape{4}, DType::u16);
  EXPECT_THROW(W().all_reduce(u), Error);  // not reducible
  Tensor c = Tensor::empty(Shape{5 * p}, DType::i32);
  EXPECT_THROW(W().all_gather(c, a), Error);  // dtype mismatch
  EXPECT_THROW(W().broadcast(a, p), Error);   // root outside
  EXPECT_THROW(W().send(a, W().rank()), Error);  // to itself
  std::vector<int64_t> bad(size_t(p) + 1, 0);
  EXPECT_THROW(W().all_to_allv(a, bad, a, bad), Error);
}

TEST(CommSolo, CollectivesOfOneProcess) {
  auto g = make_solo_group("solo");
  Tensor t = filled(DType::f32, 9, 0, 30), out = Tensor::empty(Shape{9}, DType::f32);
  g->all_reduce(t)->wait();
  EXPECT_EQ(t.data<float>()[3], value(0, 3, 30));
  poison(out);
  g->all_gather(out, t)->wait();
  EXPECT_EQ(out.data<float>()[8], value(0, 8, 30));
  poison(out);
  g->reduce_scatter(out, t)->wait();
  EXPECT_EQ(out.data<float>()[0], value(0, 0, 30));
  EXPECT_THROW(g->send(t, 0), Error);
  EXPECT_EQ(g->split(0, 0, "x")->size(), 1);
  EXPECT_TRUE(g->barrier()->test());
}

}  // namespace
}  // namespace zt::comm
