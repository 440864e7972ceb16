// The NCCL ProcessGroup on one process and one GPU (the lent machine has
// one; several ranks need several GPUs): every collective on GPU tensors
// gives the one-rank result, ordered after the compute stream's producers
// and before its consumers without a host sync; host tensors go to the host
// group; splits work, sharing the communicator when they keep every member;
// and the errors name the problem.
#include "comm/nccl/nccl_group.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "ops/elementwise.h"

namespace zt::test {
namespace {

std::vector<double> host_values(const Tensor& t) { return values_of(to_host(t)); }

class NcclGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ZT_REQUIRE_GPU();
    if (!comm::nccl_available()) GTEST_SKIP() << "this build has no NCCL";
    group_ = comm::make_nccl_group(comm::make_solo_group("host"), gpu(), "nccl-test");
  }
  std::unique_ptr<comm::ProcessGroup> group_;
};

TEST_F(NcclGroupTest, CollectivesOnGpuTensorsGiveTheOneRankResultInStreamOrder) {
  auto rng = make_rng(21);
  for (const DType dt : {DType::f32, DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor host = random_tensor(Shape{1000}, dt, rng);
    const std::vector<double> want = values_of(host);
    // Produced on the compute stream just before: the collective must see it.
    Tensor t = gpu_poisoned(host.shape(), dt);
    ops::copy(t, to_gpu(host));
    group_->all_reduce(t)->wait();
    // Consumed on the compute stream after wait(): scaled by 2 exactly.
    ops::scale(t, t, 2.0f);
    std::vector<double> got = host_values(t);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 2.0 * want[i]) << i;

    Tensor out = gpu_poisoned(host.shape(), dt);
    group_->all_gather(out, to_gpu(host))->wait();
    EXPECT_EQ(host_values(out), want) << "all_gather";
    out = gpu_poisoned(host.shape(), dt);
    group_->reduce_scatter(out, to_gpu(host), comm::ReduceOp::max)->wait();
    EXPECT_EQ(host_values(out), want) << "reduce_scatter";
    Tensor b = to_gpu(host);
    group_->broadcast(b, 0)->wait();
    EXPECT_EQ(host_values(b), want) << "broadcast";
    out = gpu_poisoned(host.shape(), dt);
    group_->all_to_all(out, to_gpu(host))->wait();
    EXPECT_EQ(host_values(out), want) << "all_to_all";
    out = gpu_poisoned(host.shape(), dt);
    const std::vector<int64_t> counts{1000};
    group_->all_to_allv(out, counts, to_gpu(host), counts)->wait();
    EXPECT_EQ(host_values(out), want) << "all_to_allv";
  }
}

TEST_F(NcclGroupTest, WorkCompletesAndCountsBytes) {
  Tensor t = gpu_poisoned(Shape{256}, DType::f32);
  ops::fill(t, 1.0);
  const comm::WorkHandle w = group_->all_reduce(t);
  cuda::synchronize(gpu());
  EXPECT_TRUE(w->test());
  w->wait();
  EXPECT_EQ(group_->stats().ops, 1);
  EXPECT_EQ(group_->stats().bytes_sent, 0) << "one rank sends nothing (2 n (p - 1) / p)";
  // Busy time is the operations' GPU time, counted once stats() sees them
  // complete: a 64 MiB out-of-place gather (a device copy) takes some.
  const double busy_before = group_->stats().busy_seconds;
  Tensor in = gpu_poisoned(Shape{int64_t(1) << 24}, DType::f32), out = gpu_poisoned(Shape{int64_t(1) << 24}, DType::f32);
  ops::fill(in, 2.0);
  group_->all_gather(out, in)->wait();
  cuda::synchronize(gpu());
  const double busy = group_->stats().busy_seconds - busy_before;
  EXPECT_GT(busy, 0.0);
  EXPECT_LT(busy, 10.0);
  EXPECT_EQ(group_->stats().wait_seconds, 0.0) << "wait() does not block the host";
}

TEST_F(NcclGroupTest, HostTensorsGoToTheHostGroupAndSplitsWork) {
  Tensor h = Tensor::empty(Shape{3}, DType::i64);
  h.data<int64_t>()[0] = 5, h.data<int64_t>()[1] = -2, h.data<int64_t>()[2] = 7;
  group_->all_reduce(h)->wait();
  EXPECT_EQ(h.data<int64_t>()[1], -2);
  EXPECT_DOUBLE_EQ(comm::sum_exact(*group_, 2.5), 2.5);
  const int communicators = comm::nccl_communicators(*group_);
  EXPECT_EQ(communicators, 1);
  std::unique_ptr<comm::ProcessGroup> sub = group_->split(0, 0, "sub");
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->name(), "sub");
  // The same members: the split shares the group's communicator, and so
  // does a split of the split; both work, before and after the other goes.
  std::unique_ptr<comm::ProcessGroup> subsub = sub->split(3, 0, "subsub");
  EXPECT_EQ(comm::nccl_communicators(*group_), communicators) << "a split with the same members made a communicator";
  Tensor t = gpu_poisoned(Shape{3}, DType::i64);
  ops::copy(t, to_gpu(h));
  sub->all_reduce(t, comm::ReduceOp::min)->wait();
  EXPECT_EQ(host_values(t), (std::vector<double>{5, -2, 7}));
  sub.reset();
  subsub->all_reduce(t, comm::ReduceOp::max)->wait();
  group_->all_reduce(t)->wait();
  EXPECT_EQ(host_values(t), (std::vector<double>{5, -2, 7}));
  subsub.reset();
  EXPECT_EQ(comm::nccl_communicators(*group_), communicators);
}

TEST_F(NcclGroupTest, ErrorsNameTheProblem) {
  const Tensor g = gpu_poisoned(Shape{4}, DType::f32);
  // GPU sends go through the host group, whose checks name the problem.
  EXPECT_NE(error_of([&] { group_->send(g, 0, 0); }).find("rank 0 is this rank (no peer to talk to)"),
            std::string::npos);
  const Tensor elsewhere = fake_cuda(Shape{4}, DType::f32);
  EXPECT_NE(error_of([&] { group_->send(elsewhere, 0, 0); }).find("but this group's GPU is"), std::string::npos);
  // A ring step runs on NCCL itself and checks the same before launching.
  const Tensor into = gpu_poisoned(Shape{4}, DType::f32);
  EXPECT_NE(error_of([&] { group_->send_recv(g, 0, into, 0); }).find("rank 0 is this rank (no peer to talk to)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { group_->send_recv(g, 0, elsewhere, 0); }).find("but this group's GPU is"),
            std::string::npos);
  const Tensor u = gpu_poisoned(Shape{4}, DType::u16);
  EXPECT_NE(error_of([&] { group_->all_reduce(u); }).find("cannot reduce u16"), std::string::npos);
  const Tensor small = gpu_poisoned(Shape{3}, DType::f32);
  EXPECT_NE(error_of([&] { group_->all_gather(small, g); }).find("out has 3 elements, expected 4"), std::string::npos);
}

TEST(NcclGroup, NeedsAGpuDevice) {
  if (!comm::nccl_available()) {
    EXPECT_NE(error_of([] { comm::make_nccl_group(comm::make_solo_group("h"), Device::cuda(0), "x"); })
                  .find("no NCCL backend"),
              std::string::npos);
    return;
  }
  EXPECT_NE(error_of([] { comm::make_nccl_group(comm::make_solo_group("h"), Device::cpu(), "x"); })
                .find("an NCCL group needs a GPU"),
            std::string::npos);
}

}  // namespace
}  // namespace zt::test
