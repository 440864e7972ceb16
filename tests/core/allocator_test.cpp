// The memory profiler's numbers must be exact: a scripted sequence of
// allocations and frees is checked byte for byte.
#include <cstdint>
#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/error.h"
#include "core/tensor.h"

namespace zt {
namespace {

TEST(Allocator, ScriptedSequenceIsCountedExactly) {
  CpuAllocator a;  // a private instance: no other test's tensors in its counts
  void* p1 = a.allocate(1000, MemCategory::params);
  void* g1 = a.allocate(3000, MemCategory::grads);
  void* x1 = a.allocate(5000, MemCategory::activations);
  MemStats s = a.stats();
  EXPECT_EQ(s.current(MemCategory::params), 1000);
  EXPECT_EQ(s.current(MemCategory::grads), 3000);
  EXPECT_EQ(s.current(MemCategory::activations), 5000);
  EXPECT_EQ(s.current(MemCategory::optimizer), 0);
  EXPECT_EQ(s.total_current_bytes, 9000);
  EXPECT_EQ(s.total_peak_bytes, 9000);

  a.deallocate(x1, 5000, MemCategory::activations);
  void* x2 = a.allocate(2000, MemCategory::activations);
  void* o1 = a.allocate(4000, MemCategory::optimizer);
  s = a.stats();
  EXPECT_EQ(s.current(MemCategory::activations), 2000);
  EXPECT_EQ(s.peak(MemCategory::activations), 5000);
  EXPECT_EQ(s.current(MemCategory::optimizer), 4000);
  EXPECT_EQ(s.total_current_bytes, 10000);
  EXPECT_EQ(s.total_peak_bytes, 10000);  // peak of the sum, not the sum of peaks (which would be 13000)

  a.reset_peak();
  s = a.stats();
  EXPECT_EQ(s.peak(MemCategory::activations), 2000);
  EXPECT_EQ(s.total_peak_bytes, 10000);

  a.deallocate(x2, 2000, MemCategory::activations);
  a.deallocate(o1, 4000, MemCategory::optimizer);
  a.deallocate(g1, 3000, MemCategory::grads);
  a.deallocate(p1, 1000, MemCategory::params);
  s = a.stats();
  for (int c = 0; c < kNumMemCategories; ++c) EXPECT_EQ(s.current_bytes[size_t(c)], 0);
  EXPECT_EQ(s.total_current_bytes, 0);
  EXPECT_EQ(s.total_peak_bytes, 10000);
  EXPECT_EQ(s.num_allocs, 5);
}

TEST(Allocator, CachedBlocksAreReused) {
  CpuAllocator a;
  void* p = a.allocate(1 << 20, MemCategory::workspace);
  a.deallocate(p, 1 << 20, MemCategory::workspace);
  const int64_t system_before = a.stats().num_system_allocs;
  const int64_t reserved = a.stats().reserved_bytes;
  void* q = a.allocate((1 << 20) - 100, MemCategory::activations);  // same size class
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().num_system_allocs, system_before);
  EXPECT_EQ(a.stats().reserved_bytes, reserved);
  EXPECT_EQ(a.stats().current(MemCategory::activations), (1 << 20) - 100);
  a.deallocate(q, (1 << 20) - 100, MemCategory::activations);
  // A small request must not take the large cached block.
  void* small = a.allocate(100, MemCategory::activations);
  EXPECT_NE(small, p);
  a.deallocate(small, 100, MemCategory::activations);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0);
}

TEST(Allocator, BlocksAreAlignedAndWritable) {
  CpuAllocator a;
  for (size_t bytes : {size_t(0), size_t(1), size_t(63), size_t(4096), size_t(3) << 20}) {
    auto* p = static_cast<unsigned char*>(a.allocate(bytes, MemCategory::workspace));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
    for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i);
    a.deallocate(p, bytes, MemCategory::workspace);
  }
}

TEST(Allocator, OutOfMemoryIsAClearError) {
  CpuAllocator a;
  try {
    a.allocate(size_t(1) << 62, MemCategory::params);
    FAIL() << "allocating 4 EiB succeeded";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on cpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find("params"), std::string::npos) << msg;
  }
  EXPECT_EQ(a.stats().total_current_bytes, 0);
}

TEST(Allocator, TensorsAreAccountedUnderTheirCategory) {
  Allocator& a = allocator_for(Device::cpu());
  const MemStats before = a.stats();
  {
    Tensor w = Tensor::empty(Shape{10, 20}, DType::f32, Device::cpu(), MemCategory::params);
    Tensor g = Tensor::empty(Shape{10, 20}, DType::bf16, Device::cpu(), MemCategory::grads);
    Tensor view = w.slice(2, 5);  // views own nothing new
    const MemStats during = a.stats();
    EXPECT_EQ(during.current(MemCategory::params) - before.current(MemCategory::params), 800);
    EXPECT_EQ(during.current(MemCategory::grads) - before.current(MemCategory::grads), 400);
    // Borrowed memory is not counted.
    float external[4];
    Tensor borrowed = Tensor::wrap(external, Shape{4}, DType::f32);
    EXPECT_EQ(a.stats().total_current_bytes, during.total_current_bytes);
  }
  const MemStats after = a.stats();
  EXPECT_EQ(after.current(MemCategory::params), before.current(MemCategory::params));
  EXPECT_EQ(after.current(MemCategory::grads), before.current(MemCategory::grads));
}

TEST(Allocator, UnknownDeviceIsAClearError) {
  try {
    allocator_for(Device::cuda(7));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:7"), std::string::npos);
  }
}

TEST(Allocator, FormatsStats) {
  CpuAllocator a;
  void* p = a.allocate(3 << 20, MemCategory::optimizer);
  const std::string table = format_mem_stats(a.stats());
  EXPECT_NE(table.find("optimizer"), std::string::npos);
  EXPECT_NE(table.find("3.00"), std::string::npos);
  a.deallocate(p, 3 << 20, MemCategory::optimizer);
}

}  // namespace
}  // namespace zt
