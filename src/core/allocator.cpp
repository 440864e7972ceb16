#include "core/allocator.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace zt {

std::string_view mem_category_name(MemCategory c) {
  switch (c) {
#define ZT_X(name) \
  case MemCategory::name: \
    return #name;
    ZT_MEM_CATEGORIES(ZT_X)
#undef ZT_X
  }
  return "?";
}

Allocator::Allocator(Device device, size_t alignment) : device_(device), alignment_(alignment) {}

Allocator::~Allocator() = default;

size_t Allocator::rounded_size(size_t bytes) {
  // Small blocks: 512 B granularity. Large ones (> 1 MiB): 2 MiB granularity,
  // so that slightly different large requests share cached blocks.
  constexpr size_t kSmall = 512, kLarge = size_t(2) << 20, kLargeThreshold = size_t(1) << 20;
  if (bytes == 0) return kSmall;
  if (bytes <= kLargeThreshold) return (bytes + kSmall - 1) / kSmall * kSmall;
  return (bytes + kLarge - 1) / kLarge * kLarge;
}

void* Allocator::allocate(size_t bytes, MemCategory category) {
  const size_t rounded = rounded_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* ptr = nullptr;
  size_t block_size = rounded;
  // Best fit among cached blocks, but never a block more than twice the size
  // (a small tensor must not pin a huge block).
  auto it = free_blocks_.lower_bound(rounded);
  if (it != free_blocks_.end() && it->first <= 2 * rounded) {
    ptr = it->second;
    block_size = it->first;
    free_blocks_.erase(it);
  } else {
    ptr = raw_alloc(rounded);
    if (!ptr && !free_blocks_.empty()) {
      // Out of memory: give the cache back to the system and retry once.
      for (auto& [size, p] : free_blocks_) {
        raw_free(p, size);
        stats_.reserved_bytes -= int64_t(size);
      }
      free_blocks_.clear();
      ptr = raw_alloc(rounded);
    }
    ZT_CHECK(ptr != nullptr, "out of memory on ", device_.str(), ": could not allocate ", bytes, " bytes for ",
             mem_category_name(category), " (", stats_.total_current_bytes,
             " bytes in use); reduce the micro-batch size, enable recomputation or shard more (ZeRO)");
    stats_.reserved_bytes += int64_t(rounded);
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
    ++stats_.num_system_allocs;
  }
  live_block_size_[ptr] = block_size;
  ++stats_.num_allocs;
  const size_t c = size_t(category);
  stats_.current_bytes[c] += int64_t(bytes);
  stats_.peak_bytes[c] = std::max(stats_.peak_bytes[c], stats_.current_bytes[c]);
  stats_.window_peak_bytes[c] = std::max(stats_.window_peak_bytes[c], stats_.current_bytes[c]);
  stats_.total_current_bytes += int64_t(bytes);
  stats_.total_peak_bytes = std::max(stats_.total_peak_bytes, stats_.total_current_bytes);
  return ptr;
}

void Allocator::deallocate(void* ptr, size_t bytes, MemCategory category) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_block_size_.find(ptr);
  ZT_ASSERT(it != live_block_size_.end(), "deallocate of a pointer this allocator does not own");
  free_blocks_.emplace(it->second, ptr);
  live_block_size_.erase(it);
  const size_t c = size_t(category);
  stats_.current_bytes[c] -= int64_t(bytes);
  stats_.total_current_bytes -= int64_t(bytes);
  ZT_ASSERT(stats_.current_bytes[c] >= 0, "negative byte count for ", mem_category_name(category));
}

MemStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes = stats_.current_bytes;
  stats_.total_peak_bytes = stats_.total_current_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

void Allocator::reset_window_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.window_peak_bytes = stats_.current_bytes;
}

void Allocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, p] : free_blocks_) {
    raw_free(p, size);
    stats_.reserved_bytes -= int64_t(size);
  }
  free_blocks_.clear();
}

void Allocator::release_all() {
  empty_cache();
  // Live blocks at exit belong to tensors that outlive the allocator (static
  // objects); leave them to the process teardown rather than free under them.
}

// --- CPU ---------------------------------------------------------------------

CpuAllocator::CpuAllocator() : Allocator(Device::cpu(), 64) {}

CpuAllocator::~CpuAllocator() { release_all(); }

void* CpuAllocator::raw_alloc(size_t bytes) {
  // Blocks of 2 MiB or more are aligned to 2 MiB, which lets the kernel back
  // them with huge pages; smaller ones to a cache line.
  const size_t align = bytes >= (size_t(2) << 20) ? (size_t(2) << 20) : alignment();
  return std::aligned_alloc(align, (bytes + align - 1) / align * align);
}

void CpuAllocator::raw_free(void* ptr, size_t) { std::free(ptr); }

// --- registry ----------------------------------------------------------------

namespace {
struct Registry {
  std::mutex mu;
  std::map<std::pair<int, int>, std::unique_ptr<Allocator>> by_device;
};
Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: tensors in statics may outlive main
  return *r;
}
}  // namespace

Allocator& allocator_for(Device device) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto key = std::make_pair(int(device.type), device.index);
  auto it = r.by_device.find(key);
  if (it != r.by_device.end()) return *it->second;
  if (device.is_cpu()) {
    auto [ins, ok] = r.by_device.emplace(key, std::make_unique<CpuAllocator>());
    return *ins->second;
  }
  ZT_FAIL("no allocator for device ", device.str(),
          ": this build has no backend for it (build with CUDA, or use device = \"cpu\")");
}

void register_allocator(Device device, std::unique_ptr<Allocator> alloc) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.by_device[std::make_pair(int(device.type), device.index)] = std::move(alloc);
}

std::string format_mem_stats(const MemStats& s, const std::array<int64_t, kNumMemCategories>* planned) {
  std::ostringstream os;
  char line[160];
  const double MiB = 1024.0 * 1024.0;
  const auto mib = [&](int64_t bytes) {
    char b[32] = "-";
    if (bytes >= 0) std::snprintf(b, sizeof b, "%.2f", double(bytes) / MiB);
    return std::string(b);
  };
  std::snprintf(line, sizeof line, "%-12s %12s %12s%s\n", "category", "current MiB", "peak MiB",
                planned ? "  planned MiB" : "");
  os << line;
  for (int c = 0; c < kNumMemCategories; ++c) {
    std::snprintf(line, sizeof line, "%-12s %12.2f %12.2f", std::string(mem_category_name(MemCategory(c))).c_str(),
                  double(s.current_bytes[size_t(c)]) / MiB, double(s.peak_bytes[size_t(c)]) / MiB);
    os << line;
    if (planned) {
      std::snprintf(line, sizeof line, " %12s", mib((*planned)[size_t(c)]).c_str());
      os << line;
    }
    os << '\n';
  }
  std::snprintf(line, sizeof line, "%-12s %12.2f %12.2f", "total", double(s.total_current_bytes) / MiB,
                double(s.total_peak_bytes) / MiB);
  os << line;
  if (planned) {
    int64_t planned_total = 0;
    for (int64_t b : *planned) planned_total += std::max<int64_t>(b, 0);
    std::snprintf(line, sizeof line, " %12s", mib(planned_total).c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "\n%-12s %12.2f %12.2f\n", "reserved", double(s.reserved_bytes) / MiB,
                double(s.peak_reserved_bytes) / MiB);
  os << line;
  return os.str();
}

}  // namespace zt
