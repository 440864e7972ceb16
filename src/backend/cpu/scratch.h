// Per-thread scratch memory for CPU kernels (tiles, widened bf16 panels).
//
// Kernels must not allocate in their hot loops: each thread keeps one buffer
// that only grows, so after the first step of training every request is
// served from memory already held. The buffers come from the CPU allocator
// under MemCategory::workspace, so the memory profiler sees them.
#pragma once

#include <cstddef>

namespace zt::cpu {

// A buffer of at least `floats` floats for the calling thread, 64-byte
// aligned. `slot` selects one of a few independent buffers (0..kScratchSlots-1)
// so a kernel can hold several at once. Valid until the same thread asks for
// the same slot again with a larger size.
inline constexpr int kScratchSlots = 4;
float* thread_scratch(size_t floats, int slot = 0);

}  // namespace zt::cpu
