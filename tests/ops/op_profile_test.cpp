// The op profiler (ops/op_profile.h): off, it records nothing; on, every
// public op adds one call under its own name, an op inside another counts
// only in the outer one, each op keeps the most workspace one call held, and
// taking the totals clears them.
#include "ops/op_profile.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "core/allocator.h"
#include "ops/activation.h"
#include "ops/attention.h"
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

// The arithmetic ops report: matrix products 2 M N K (a batch each,
// linear_backward per gradient it computes), attention its causal products
// (forward 2 B Hq T^2 D, backward 2.5 times that), each counted once in the
// outermost op (the CPU's matmul_gelu_backward runs matmul inside), none for
// memory-bound ops.
TEST(OpProfile, ReportsTheArithmeticOfProductsAndAttention) {
  const ProfileOff off;
  auto rng = test::make_rng(4);
  const int64_t M = 5, K = 7, N = 3, batch = 2;
  const Tensor a = test::random_tensor(Shape{batch, M, K}, DType::f32, rng);
  const Tensor b = test::random_tensor(Shape{K, N}, DType::f32, rng);
  const Tensor w = test::random_tensor(Shape{N, K}, DType::f32, rng);
  const Tensor dy = test::random_tensor(Shape{M, N}, DType::f32, rng);
  const Tensor pre = test::random_tensor(Shape{M, K}, DType::f32, rng);
  Tensor out = Tensor::empty(Shape{batch, M, N}, DType::f32), y = Tensor::empty(Shape{M, N}, DType::f32);
  Tensor dx = Tensor::empty(Shape{M, K}, DType::f32), dw = test::random_tensor(Shape{N, K}, DType::f32, rng);
  Tensor g = Tensor::empty(Shape{M, K}, DType::f32);
  const int64_t B = 2, T = 6, Hq = 4, Hkv = 2, D = 8;
  const Tensor q = test::random_tensor(Shape{B, T, Hq, D}, DType::f32, rng);
  const Tensor k = test::random_tensor(Shape{B, T, Hkv, D}, DType::f32, rng);
  const Tensor v = test::random_tensor(Shape{B, T, Hkv, D}, DType::f32, rng);
  const Tensor dout = test::random_tensor(Shape{B, T, Hq, D}, DType::f32, rng);
  Tensor att = Tensor::empty(Shape{B, T, Hq, D}, DType::f32), lse = Tensor::empty(Shape{B, Hq, T}, DType::f32);
  Tensor dq = Tensor::empty(q.shape(), DType::f32), dk = Tensor::empty(k.shape(), DType::f32);
  Tensor dv = Tensor::empty(v.shape(), DType::f32);

  ops::enable_op_profile(true);
  (void)ops::take_op_profile();
  ops::matmul(out, a, b);
  ops::linear_forward(y, a.slice(0, 1).view(Shape{M, K}), w, Tensor());
  ops::linear_backward(dx, dw, Tensor(), dy, pre, w);
  ops::linear_backward(Tensor(), dw, Tensor(), dy, pre, w);
  ops::matmul_gelu_backward(g, dy, w, pre);
  ops::gelu_forward(g, pre);
  ops::attention_forward(att, lse, q, k, v);
  ops::attention_backward(dq, dk, dv, dout, q, k, v, att, lse);
  std::map<std::string, double> flops;
  for (const ops::OpTotal& t : ops::take_op_profile()) flops[t.name] = t.flops;
  const double mnk = 2.0 * M * N * K, causal = 2.0 * B * Hq * T * T * D;
  EXPECT_EQ(flops, (std::map<std::string, double>{{"attention_backward", 2.5 * causal},
                                                  {"attention_forward", causal},
                                                  {"gelu_forward", 0.0},
                                                  {"linear_backward", 3 * mnk},
                                                  {"linear_forward", mnk},
                                                  {"matmul", batch * mnk},
                                                  {"matmul_gelu_backward", mnk}}));
}

// The most workspace one call held above what was live at its start: the
// maximum over calls, nested ops' temporaries counted in the outer op, other
// categories and memory live before the op not counted, the step's peaks
// untouched.
TEST(OpProfile, RecordsTheMostWorkspaceOneCallHeld) {
  const ProfileOff off;
  ops::enable_op_profile(true);
  (void)ops::take_op_profile();
  Allocator& cpu = allocator_for(Device::cpu());
  const Tensor on = Tensor::empty(Shape{1}, DType::f32);
  auto temporaries = [](int64_t floats) {
    return Tensor::empty(Shape{floats}, DType::f32, Device::cpu(), MemCategory::workspace);
  };
  const Tensor held_before = temporaries(5000);
  { const Tensor big = temporaries(100000); }  // before any op: the step's peak holds it
  const int64_t step_peak = cpu.stats().peak(MemCategory::workspace);
  {
    const ops::OpScope op("workspace_op", on);
    { const Tensor a = temporaries(1000); }
    const Tensor b = temporaries(300);
    const Tensor c = temporaries(200);  // b and c together: 500 floats, less than a's 1000
  }
  {
    const ops::OpScope op("workspace_op", on);
    const Tensor a = temporaries(1500);
    const ops::OpScope nested("inner_op", on);
    const Tensor b = temporaries(500);  // with a: 2000 floats at once
    const Tensor not_workspace = Tensor::empty(Shape{9000}, DType::f32, Device::cpu(), MemCategory::activations);
  }
  { const ops::OpScope op("no_workspace_op", on); }
  std::map<std::string, int64_t> peaks;
  for (const ops::OpTotal& t : ops::take_op_profile()) peaks[t.name] = t.workspace_peak_bytes;
  EXPECT_EQ(peaks, (std::map<std::string, int64_t>{{"no_workspace_op", 0}, {"workspace_op", 2000 * 4}}));
  EXPECT_EQ(cpu.stats().peak(MemCategory::workspace), step_peak)
      << "the ops' window resets leave the step's peak (the freed 100000 floats) alone";
}

// Allocations the allocator's cache cannot serve are counted per op (on a
// GPU each is a cudaMalloc, which waits for the device): a block size never
// freed before misses, the same size again is served from the cache, and a
// nested op's misses count in the outer one.
TEST(OpProfile, CountsTheAllocationsTheCacheCouldNotServe) {
  const ProfileOff off;
  ops::enable_op_profile(true);
  (void)ops::take_op_profile();
  const Tensor on = Tensor::empty(Shape{1}, DType::f32);
  allocator_for(Device::cpu()).empty_cache();  // nothing cached that could serve the size below
  const int64_t floats = (int64_t(7) << 20) + 12345;
  auto allocate = [&] { return Tensor::empty(Shape{floats}, DType::f32, Device::cpu(), MemCategory::workspace); };
  {
    const ops::OpScope op("first_op", on);
    const ops::OpScope nested("inner_op", on);
    const Tensor t = allocate();
  }
  { const ops::OpScope op("again_op", on), inner("inner_op", on); const Tensor t = allocate(); }
  { const ops::OpScope op("two_at_once_op", on); const Tensor a = allocate(), b = allocate(); }
  std::map<std::string, int64_t> misses;
  for (const ops::OpTotal& t : ops::take_op_profile()) misses[t.name] = t.cache_misses;
  EXPECT_EQ(misses, (std::map<std::string, int64_t>{{"again_op", 0}, {"first_op", 1}, {"two_at_once_op", 1}}));
}

}  // namespace
}  // namespace zt
