// The op profiler (ops/op_profile.h): off, it records nothing; on, every
// public op adds one call under its own name, an op inside another counts
// only in the outer one, and taking the totals clears them.
#include "ops/op_profile.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "ops/activation.h"
#include "ops/matmul.h"
#include "test_util.h"

namespace zt {
namespace {

std::map<std::string, int64_t> calls_of(const std::vector<ops::OpTotal>& totals) {
  std::map<std::string, int64_t> calls;
  for (const ops::OpTotal& t : totals) {
    EXPECT_GE(t.seconds, 0.0) << t.name;
    calls[t.name] += t.calls;
  }
  return calls;
}

struct ProfileOff {
  ~ProfileOff() { ops::enable_op_profile(false); }
};

TEST(OpProfile, CountsEachPublicOpOnceUnderItsName) {
  const ProfileOff off;
  auto rng = test::make_rng(3);
  const Tensor x = test::random_tensor(Shape{4, 8}, DType::f32, rng);
  const Tensor w = test::random_tensor(Shape{6, 8}, DType::f32, rng);
  Tensor y = Tensor::empty(Shape{4, 6}, DType::f32), g = Tensor::empty(Shape{4, 6}, DType::f32);

  ops::enable_op_profile(false);
  (void)ops::take_op_profile();
  ops::linear_forward(y, x, w, Tensor());
  EXPECT_TRUE(ops::take_op_profile().empty()) << "off records nothing";

  ops::enable_op_profile(true);
  ops::linear_forward(y, x, w, Tensor());
  ops::linear_forward(y, x, w, Tensor());
  ops::gelu_forward(g, y);
  ops::matmul(g, x, w, false, true);
  const std::vector<ops::OpTotal> totals = ops::take_op_profile();
  EXPECT_EQ(calls_of(totals), (std::map<std::string, int64_t>{{"gelu_forward", 1}, {"linear_forward", 2},
                                                              {"matmul", 1}}));
  for (size_t i = 1; i < totals.size(); ++i) EXPECT_GE(totals[i - 1].seconds, totals[i].seconds) << "largest first";
  EXPECT_TRUE(ops::take_op_profile().empty()) << "taking clears the totals";
}

TEST(OpProfile, AnOpInsideAnotherCountsInTheOuterOnly) {
  const ProfileOff off;
  ops::enable_op_profile(true);
  (void)ops::take_op_profile();
  const Tensor t = Tensor::empty(Shape{1}, DType::f32);
  {
    const ops::OpScope outer("outer_op", t);
    const ops::OpScope inner("inner_op", t);
    { const ops::OpScope innermost("innermost_op", Tensor()); }
  }
  { const ops::OpScope after("inner_op", t); }  // the depth was restored: a later op counts again
  EXPECT_EQ(calls_of(ops::take_op_profile()), (std::map<std::string, int64_t>{{"inner_op", 1}, {"outer_op", 1}}));
}

}  // namespace
}  // namespace zt
