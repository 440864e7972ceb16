// The host-staged group (comm/staged_group.h) over the world, on tensors of
// a pretend device: host memory labelled cuda:62, moved by a copy function
// that checks each copy crosses between that device and the host and counts
// them. Every operation must give the host group's result on the device
// tensors, once the caller sees it complete, and not before; host tensors
// must pass through uncopied.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "comm/process_group.h"
#include "comm/staged_group.h"
#include "core/error.h"
#include "test_util.h"

namespace zt::comm {
namespace {

const Device kPretend = Device::cuda(62);

// Pretend-device memory, owned by the test (Tensor::wrap borrows it).
struct PretendTensor {
  std::shared_ptr<std::vector<char>> bytes;
  Tensor t;
};
PretendTensor pretend(const Shape& shape, DType dt) {
  PretendTensor p;
  p.bytes = std::make_shared<std::vector<char>>(size_t(shape.numel()) * dtype_size(dt) + 1);
  std::memset(p.bytes->data(), 0x7F, p.bytes->size());  // poison: f32 3.4e38, i64 huge
  p.t = Tensor::wrap(p.bytes->data(), shape, dt, kPretend);
  return p;
}

std::atomic<int> g_copies{0};
void pretend_copy(const Tensor& dst, const Tensor& src) {
  ASSERT_TRUE((dst.device() == kPretend && src.device().is_cpu()) || (dst.device().is_cpu() && src.device() == kPretend))
      << "a staging copy must cross between the device and the host: " << dst.str() << " <- " << src.str();
  ASSERT_EQ(dst.nbytes(), src.nbytes());
  std::memcpy(dst.data_ptr(), src.data_ptr(), src.nbytes());
  ++g_copies;
}

// Element i of rank r's input (exact in f32 sums).
float value(int r, int64_t i, int salt) { return float(((r + 3) * 7919 + i * 104729 + salt * 31) % 2001 - 1000); }

PretendTensor filled(int64_t n, int r, int salt) {
  PretendTensor p = pretend(Shape{n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) p.t.data<float>()[i] = value(r, i, salt);
  return p;
}

class StagedGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ProcessGroup& w = world();
    group_ = make_host_staged_group(w.split(0, w.rank(), "staged"), pretend_copy);
    g_copies = 0;
  }
  int p() const { return group_->size(); }
  int me() const { return group_->rank(); }
  std::unique_ptr<ProcessGroup> group_;
};

TEST_F(StagedGroupTest, CollectivesOnDeviceTensorsGiveTheHostResultOnceComplete) {
  const int64_t block = 37;
  // all_reduce: the device tensor holds its input until the work completes.
  PretendTensor t = filled(block, me(), 1);
  WorkHandle w = group_->all_reduce(t.t);
  EXPECT_EQ(t.t.data<float>()[5], value(me(), 5, 1)) << "results reach the device only when the work completes";
  w->wait();
  for (int64_t i = 0; i < block; ++i) {
    float want = 0;
    for (int r = 0; r < p(); ++r) want += value(r, i, 1);
    ASSERT_EQ(t.t.data<float>()[i], want) << i;
  }
  EXPECT_EQ(g_copies.load(), 2) << "one copy to the host, one back";

  // reduce_scatter
  PretendTensor in = filled(block * p(), me(), 2), out = pretend(Shape{block}, DType::f32);
  group_->reduce_scatter(out.t, in.t)->wait();
  for (int64_t i = 0; i < block; ++i) {
    float want = 0;
    for (int r = 0; r < p(); ++r) want += value(r, me() * block + i, 2);
    ASSERT_EQ(out.t.data<float>()[i], want) << i;
  }

  // all_gather, in place: `in` is this rank's block of `out`.
  PretendTensor all = pretend(Shape{block * p()}, DType::f32);
  const Tensor mine = all.t.slice(me() * block, (me() + 1) * block);
  for (int64_t i = 0; i < block; ++i) mine.data<float>()[i] = value(me(), i, 3);
  group_->all_gather(all.t, mine)->wait();
  for (int r = 0; r < p(); ++r)
    for (int64_t i = 0; i < block; ++i) ASSERT_EQ(all.t.data<float>()[r * block + i], value(r, i, 3)) << r << " " << i;

  // broadcast from the last rank: its own tensor is not copied back.
  const int root = p() - 1;
  PretendTensor b = filled(block, me(), 4);
  g_copies = 0;
  group_->broadcast(b.t, root)->wait();
  for (int64_t i = 0; i < block; ++i) ASSERT_EQ(b.t.data<float>()[i], value(root, i, 4)) << i;
  EXPECT_EQ(g_copies.load(), me() == root ? 1 : 2);

  // all_to_all and all_to_allv (rank r sends r + 1 + k elements to rank k).
  PretendTensor a_in = filled(block * p(), me(), 5), a_out = pretend(Shape{block * p()}, DType::f32);
  group_->all_to_all(a_out.t, a_in.t)->wait();
  for (int r = 0; r < p(); ++r)
    for (int64_t i = 0; i < block; ++i)
      ASSERT_EQ(a_out.t.data<float>()[r * block + i], value(r, me() * block + i, 5)) << r << " " << i;
  std::vector<int64_t> in_counts, out_counts;
  int64_t n_in = 0, n_out = 0;
  for (int k = 0; k < p(); ++k) {
    in_counts.push_back(me() + 1 + k);
    out_counts.push_back(k + 1 + me());
    n_in += in_counts.back();
    n_out += out_counts.back();
  }
  PretendTensor v_in = filled(n_in, me(), 6), v_out = pretend(Shape{n_out}, DType::f32);
  group_->all_to_allv(v_out.t, out_counts, v_in.t, in_counts)->wait();
  int64_t at = 0;
  for (int r = 0; r < p(); ++r) {
    int64_t offset = 0;  // where rank r's block for me starts in its input
    for (int k = 0; k < me(); ++k) offset += r + 1 + k;
    for (int64_t i = 0; i < out_counts[size_t(r)]; ++i) ASSERT_EQ(v_out.t.data<float>()[at + i], value(r, offset + i, 6));
    at += out_counts[size_t(r)];
  }
}

TEST_F(StagedGroupTest, ReceivesPostedFirstAndOutOfTagOrderMatchTheirSends) {
  if (p() == 1) GTEST_SKIP() << "point-to-point needs two ranks";
  const int next = (me() + 1) % p(), prev = (me() + p() - 1) % p();
  // The pipeline's pattern: receives posted ahead, in another order than the sends.
  constexpr int kMessages = 4;
  const int64_t n = 1000;
  std::vector<PretendTensor> got;
  std::vector<WorkHandle> recvs;
  for (int tag = kMessages - 1; tag >= 0; --tag) {
    got.push_back(pretend(Shape{n + tag}, DType::f32));
    recvs.push_back(group_->recv(got.back().t, prev, tag));
  }
  std::vector<PretendTensor> sent;
  std::vector<WorkHandle> sends;
  for (int tag = 0; tag < kMessages; ++tag) {
    sent.push_back(filled(n + tag, me(), 10 + tag));
    sends.push_back(group_->send(sent.back().t, next, tag));
    std::memset(sent.back().bytes->data(), 0, sent.back().bytes->size());  // the send took its own copy
  }
  for (size_t k = 0; k < recvs.size(); ++k) {
    while (!recvs[k]->test()) std::this_thread::yield();
    EXPECT_TRUE(recvs[k]->test()) << "complete stays complete";
    const int tag = kMessages - 1 - int(k);
    for (int64_t i = 0; i < n + tag; ++i) ASSERT_EQ(got[k].t.data<float>()[i], value(prev, i, 10 + tag)) << tag << " " << i;
  }
  for (auto& s : sends) s->wait();
}

TEST_F(StagedGroupTest, HostTensorsPassThroughAndSplitsStayStaged) {
  Tensor h = Tensor::empty(Shape{3}, DType::i64);
  h.data<int64_t>()[0] = me(), h.data<int64_t>()[1] = 1, h.data<int64_t>()[2] = -me();
  group_->all_reduce(h, ReduceOp::max)->wait();
  EXPECT_EQ(h.data<int64_t>()[0], p() - 1);
  EXPECT_EQ(h.data<int64_t>()[2], 0);
  EXPECT_DOUBLE_EQ(sum_exact(*group_, 0.5), 0.5 * p());
  EXPECT_EQ(g_copies.load(), 0) << "host tensors are not copied";

  // Even and odd ranks: the sub-groups stage device tensors too.
  const std::unique_ptr<ProcessGroup> sub = group_->split(me() % 2, me(), "parity");
  EXPECT_EQ(sub->name(), "parity");
  PretendTensor t = filled(9, me(), 7);
  sub->all_reduce(t.t)->wait();
  for (int64_t i = 0; i < 9; ++i) {
    float want = 0;
    for (int r = me() % 2; r < p(); r += 2) want += value(r, i, 7);
    ASSERT_EQ(t.t.data<float>()[i], want) << i;
  }
  EXPECT_EQ(g_copies.load(), 2);
  // The counters are the host group's: each operation counted once.
  const int64_t before = group_->stats().ops;
  group_->all_reduce(t.t)->wait();
  EXPECT_EQ(group_->stats().ops - before, 1);
}

TEST_F(StagedGroupTest, BadArgumentsGetTheHostGroupsMessage) {
  PretendTensor in = pretend(Shape{5}, DType::f32), out = pretend(Shape{2}, DType::f32);
  const std::string e = test::error_of([&] { group_->reduce_scatter(out.t, in.t); });
  EXPECT_NE(e.find("reduce_scatter on group 'staged'"), std::string::npos) << e;
  PretendTensor half_words = pretend(Shape{4}, DType::u16);
  EXPECT_NE(test::error_of([&] { group_->all_reduce(half_words.t); }).find("cannot reduce u16"), std::string::npos);
}

}  // namespace
}  // namespace zt::comm
