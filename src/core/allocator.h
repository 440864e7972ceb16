// Caching allocator with exact per-category accounting: the memory profiler.
//
// Every byte a tensor owns is allocated here under one MemCategory. The
// allocator counts, per category and in total, the bytes currently handed out
// (exactly the requested sizes) and their peak since the last reset_peak();
// it also counts the bytes reserved from the system (live + cached blocks).
// Freed blocks are kept in a size-keyed cache and reused, so steady-state
// training steps do not touch the system allocator.
//
// The device-specific part is two hooks (raw_alloc/raw_free): the CPU one is
// here; backend/cuda registers its own for cuda:N. core/ knows nothing of CUDA.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "core/device.h"

namespace zt {

#define ZT_MEM_CATEGORIES(X) \
  X(params)                  \
  X(grads)                   \
  X(optimizer)               \
  X(activations)             \
  X(comm)                    \
  X(workspace)               \
  X(checkpoint)             /* host copies of the training state for a background checkpoint write */ \
  X(offload)  // host memory holding what offloading moved off the device: optimizer state, kept activations

enum class MemCategory : uint8_t {
#define ZT_X(name) name,
  ZT_MEM_CATEGORIES(ZT_X)
#undef ZT_X
};
inline constexpr int kNumMemCategories = 0
#define ZT_X(name) +1
    ZT_MEM_CATEGORIES(ZT_X)
#undef ZT_X
    ;
std::string_view mem_category_name(MemCategory c);

struct MemStats {
  std::array<int64_t, kNumMemCategories> current_bytes{};  // live, requested sizes
  std::array<int64_t, kNumMemCategories> peak_bytes{};     // max of current_bytes[c] since reset
  int64_t total_current_bytes = 0;                         // sum over categories
  int64_t total_peak_bytes = 0;                            // max of the sum (not the sum of maxima)
  int64_t reserved_bytes = 0;                              // held from the system: live + cached
  int64_t peak_reserved_bytes = 0;
  // max of current_bytes[c] since reset_window_peak(): a second peak for short
  // windows (the op profiler's per-op high-water) that leaves the step's alone.
  std::array<int64_t, kNumMemCategories> window_peak_bytes{};
  int64_t num_allocs = 0;       // allocate() calls since construction
  int64_t num_system_allocs = 0;  // of those, the ones that missed the cache

  int64_t current(MemCategory c) const { return current_bytes[size_t(c)]; }
  int64_t peak(MemCategory c) const { return peak_bytes[size_t(c)]; }
  int64_t window_peak(MemCategory c) const { return window_peak_bytes[size_t(c)]; }
};

class Allocator {
 public:
  explicit Allocator(Device device, size_t alignment);
  virtual ~Allocator();
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // A block of at least `bytes` bytes (bytes may be 0), aligned to alignment().
  void* allocate(size_t bytes, MemCategory category);
  // Returns a block to the cache. `bytes` and `category` must be those of allocate().
  void deallocate(void* ptr, size_t bytes, MemCategory category);

  MemStats stats() const;
  // Peaks restart from the current values (e.g. per training step).
  void reset_peak();
  // The window peaks restart from the current values; the others go on.
  void reset_window_peak();
  // Releases every cached (free) block to the system.
  void empty_cache();

  Device device() const { return device_; }
  size_t alignment() const { return alignment_; }
  // Block sizes are rounded up to this granularity (bytes) before caching.
  static size_t rounded_size(size_t bytes);

 protected:
  virtual void* raw_alloc(size_t bytes) = 0;  // nullptr when out of memory
  virtual void raw_free(void* ptr, size_t bytes) = 0;
  // Subclasses call this in their destructor (virtual hooks are gone in ours).
  void release_all();

 private:
  Device device_;
  size_t alignment_;
  mutable std::mutex mu_;
  MemStats stats_;
  std::multimap<size_t, void*> free_blocks_;    // rounded size -> block
  std::map<void*, size_t> live_block_size_;     // block -> rounded size
};

class CpuAllocator final : public Allocator {
 public:
  CpuAllocator();
  ~CpuAllocator() override;

 protected:
  void* raw_alloc(size_t bytes) override;
  void raw_free(void* ptr, size_t bytes) override;
};

// The allocator of a device. The CPU one always exists; a backend registers
// its devices' allocators when it initialises (backend/cuda does for cuda:N).
Allocator& allocator_for(Device device);
void register_allocator(Device device, std::unique_ptr<Allocator> alloc);

// Human-readable table of a MemStats (MiB per category, current and peak),
// with a third column when `planned` is given: an estimate of each
// category's peak in bytes (-1: not estimated), and their sum.
std::string format_mem_stats(const MemStats& s, const std::array<int64_t, kNumMemCategories>* planned = nullptr);

}  // namespace zt
