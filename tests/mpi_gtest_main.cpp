// main() for test binaries that run under mpirun (and alone): initialises
// the world group, prints GoogleTest's output on rank 0 only, and fails the
// process on every rank if any rank failed (so mpirun's status is honest).
#include <gtest/gtest.h>

#include <cstdio>

#include "comm/process_group.h"
#include "core/tensor.h"

// On ranks other than 0: failures only, each line tagged with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                   r.line_number(), r.summary());
  }

 private:
  int rank_;
};

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  zt::comm::ProcessGroup& world = zt::comm::world();
  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(world.rank()));
  }
  const int local = RUN_ALL_TESTS();
  zt::Tensor failed = zt::Tensor::empty(zt::Shape{1}, zt::DType::i32);
  failed.data<int32_t>()[0] = local != 0 ? 1 : 0;
  world.all_reduce(failed, zt::comm::ReduceOp::max)->wait();
  if (world.rank() == 0 && failed.data<int32_t>()[0] && local == 0)
    std::fprintf(stderr, "a test failed on another rank (run that rank's output with --output-on-failure)\n");
  return failed.data<int32_t>()[0];
}
