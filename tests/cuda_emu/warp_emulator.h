// Runs CUDA kernels written against warp-level primitives on the CPU, so
// their index arithmetic, fragment layouts, masks and synchronisation are
// tested on every machine (CI has no GPU). Include it before a kernel header
// that supports ZT_WARP_EMULATION (backend/cuda/attention_mma_kernels.cuh,
// attention_flash_kernels.cuh).
//
// A block (1-, 2- or 3-D) runs on the launching host thread, each CUDA
// thread a fiber with a stack of its own: a thread runs until it reaches a
// barrier (__syncthreads, __syncwarp, or a warp collective's own), then the
// next one does, in a fixed order: a warp at a time as far as the block's
// barriers let it go, its lanes taking turns between its collectives - the
// last warp and lane first in even blocks, the first in odd ones -, so that
// a value read without the barrier that orders it after its write reads the
// poison (or a stale value) in one of the two orders, the same way on every
// run, and warps drift as far apart as the barriers allow. A
// barrier waits for every thread of its block or warp; one that some thread
// can never reach (every thread left waits) stops the test with a message
// instead of hanging. __shfl_xor_sync is an exchange through the warp's
// slots, and mma (m16n8k16, f32 accumulate) a warp-collective product that
// assembles A and B from every lane's fragment registers exactly as the PTX
// ISA lays them out - an independent statement of the layouts the kernels
// assume; ldmatrix likewise, and cp.async with its copies deferred to the
// wait. Shared memory is filled with NaN bytes before each block, so a
// read of a byte the block did not write shows. Blocks run one at a time.
// Static __shared__ arrays become function-local statics (one block runs at
// a time). Not modelled: memory ordering beyond the barriers, timing, warp
// divergence (every lane must reach every collective, as on the GPU).
//
// Fibers, not a host thread per CUDA thread: a barrier costs two stack
// switches a thread (nanoseconds) instead of waking every thread through the
// OS scheduler (the emulator tests took minutes that way). x86-64 only (the
// stack switch is its assembly), as the project's builds.
#pragma once

// The CUDA headers kernels pull in, first: they name parameters blockDim,
// gridDim, ... which the macros below would otherwise rewrite.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <vector_types.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if !defined(__x86_64__)
#error "the warp emulator switches fiber stacks in x86-64 assembly"
#endif

#define ZT_WARP_EMULATION 1
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

namespace zt::emu {

// Saves the callee-saved registers, the SSE control/status and the x87
// control word on the current stack, stores the stack pointer in *save and
// continues on the stack `load` (saved the same way, or made by
// Fiber::reset), returning where that stack left off (System V x86-64:
// save in rdi, load in rsi).
[[gnu::naked, gnu::noinline]] inline void switch_stack(void** /*save*/, void* /*load*/) {
  asm volatile(
      "pushq %rbp\n\t"
      "pushq %rbx\n\t"
      "pushq %r12\n\t"
      "pushq %r13\n\t"
      "pushq %r14\n\t"
      "pushq %r15\n\t"
      "subq $16, %rsp\n\t"
      "stmxcsr 8(%rsp)\n\t"
      "fnstcw (%rsp)\n\t"
      "movq %rsp, (%rdi)\n\t"
      "movq %rsi, %rsp\n\t"
      "fldcw (%rsp)\n\t"
      "ldmxcsr 8(%rsp)\n\t"
      "addq $16, %rsp\n\t"
      "popq %r15\n\t"
      "popq %r14\n\t"
      "popq %r13\n\t"
      "popq %r12\n\t"
      "popq %rbx\n\t"
      "popq %rbp\n\t"
      "ret\n\t");
}

// Where a new fiber's first switch returns to: calls r13(r12) on a 16-byte
// aligned stack; that function never returns (it switches away for good).
[[gnu::naked, gnu::noinline]] inline void fiber_entry() {
  asm volatile(
      "movq %r12, %rdi\n\t"
      "andq $-16, %rsp\n\t"
      "callq *%r13\n\t"
      "ud2\n\t");
}

struct PendingCopy {  // a cp.async copy, done at its group's wait
  void* dst;
  const void* src;
  bool valid;
};

struct Barrier;

// One CUDA thread of the running block: a stack (mapped once per host
// thread and reused by its launches, with an unmapped guard page below it:
// an overflow faults), where it left off, what it waits for, and its
// cp.async groups.
struct Fiber {
  static constexpr size_t kStackBytes = size_t(1) << 20;  // touched pages only; kernels keep small frames
  Fiber() {
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    void* m = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
      std::fprintf(stderr, "warp emulator: no memory for a fiber stack\n");
      std::abort();
    }
    mprotect(m, page, PROT_NONE);
    map = m;
    map_bytes = kStackBytes + page;
    stack_bottom = static_cast<char*>(m) + page;
  }
  ~Fiber() { munmap(map, map_bytes); }
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  // A fresh start: the first switch to it enters fn(this) on its own stack
  // with these floating-point control words (the launching thread's).
  void reset(void (*fn)(Fiber*), uint32_t mxcsr, uint16_t fpucw) {
#if defined(__SANITIZE_ADDRESS__)
    // The last fiber on this stack ended without unwinding: its frames'
    // redzones are still poisoned in AddressSanitizer's shadow.
    ASAN_UNPOISON_MEMORY_REGION(stack_bottom, kStackBytes);
#endif
    uint64_t* top = reinterpret_cast<uint64_t*>(stack_bottom + kStackBytes) - 10;  // 16-byte aligned frame
    std::memset(top, 0, 10 * sizeof(uint64_t));
    std::memcpy(&top[0], &fpucw, sizeof fpucw);
    std::memcpy(&top[1], &mxcsr, sizeof mxcsr);
    // top[2..7]: r15, r14, r13, r12, rbx, rbp as switch_stack pops them.
    top[4] = reinterpret_cast<uint64_t>(fn);
    top[5] = reinterpret_cast<uint64_t>(this);
    top[8] = reinterpret_cast<uint64_t>(&fiber_entry);
    sp = top;
    waiting = nullptr;
    done = false;
    open_group.clear();
    committed.clear();
  }

  void* map = nullptr;
  size_t map_bytes = 0;
  char* stack_bottom = nullptr;
  void* sp = nullptr;  // saved while switched out
  dim3 thread;
  int linear = 0;  // the thread's index in its block, x fastest (as CUDA forms warps)
  Barrier* waiting = nullptr;  // the barrier it waits at (nothing: it may run)
  uint64_t wait_phase = 0;     // that barrier's phase when it arrived
  bool done = false;
  std::vector<PendingCopy> open_group;
  std::vector<std::vector<PendingCopy>> committed;
};

// The launch running on this host thread: its kernel call, the fiber
// running now and where the launching thread left off.
struct Scheduler {
  std::function<void()> body;  // kernel(args...)
  Fiber* running = nullptr;
  void* sp = nullptr;
  std::exception_ptr error;
#if defined(__SANITIZE_ADDRESS__)
  const void* stack_bottom = nullptr;  // the launching thread's stack, for AddressSanitizer's switches
  size_t stack_bytes = 0;
#endif
};
inline thread_local Scheduler* t_scheduler = nullptr;

// The running fiber back to the launching thread; `finished`: for good.
inline void yield_to_launcher(bool finished) {
  Scheduler& s = *t_scheduler;
  Fiber& f = *s.running;
#if defined(__SANITIZE_ADDRESS__)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(finished ? nullptr : &fake, s.stack_bottom, s.stack_bytes);
  switch_stack(&f.sp, s.sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  (void)finished;
  switch_stack(&f.sp, s.sp);
#endif
}

// Runs f until it waits at a barrier or ends.
inline void resume(Fiber& f) {
  Scheduler& s = *t_scheduler;
  s.running = &f;
#if defined(__SANITIZE_ADDRESS__)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack_bottom, Fiber::kStackBytes);
  switch_stack(&s.sp, f.sp);
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  switch_stack(&s.sp, f.sp);
#endif
  s.running = nullptr;
}

inline void fiber_main(Fiber* f) {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(nullptr, &t_scheduler->stack_bottom, &t_scheduler->stack_bytes);
#endif
  try {
    t_scheduler->body();
  } catch (...) {
    if (!t_scheduler->error) t_scheduler->error = std::current_exception();
  }
  f->done = true;
  yield_to_launcher(true);
  std::abort();  // never resumed
}

// A barrier of `expected` threads (a block's, or a warp's lanes). Every
// arrival gives the other threads their turn; the last of a phase releases
// it, and the others run on once the launcher reaches them again.
struct Barrier {
  explicit Barrier(int n) : expected(n) {}
  void arrive_and_wait() {
    Fiber& me = *t_scheduler->running;
    if (++arrived == expected) {  // it runs on (the launcher cleared `waiting` before resuming it)
      arrived = 0;
      ++phase;
    } else {
      me.waiting = this;
      me.wait_phase = phase;
    }
    yield_to_launcher(false);
  }
  int expected;
  int arrived = 0;
  uint64_t phase = 0;
};

struct Warp {
  explicit Warp(int lanes) : sync(lanes) {}
  Barrier sync;
  std::array<float, 32> value{};                   // shuffles
  std::array<std::array<uint32_t, 4>, 32> a{};     // mma operands, per lane
  std::array<std::array<uint32_t, 2>, 32> b{};
  std::array<std::array<float, 4>, 32> c{};
  std::array<const void*, 32> row{};              // ldmatrix row addresses
};

struct Block {
  Block(int threads, size_t shared_bytes) : sync(threads), shared(shared_bytes + 16, 0xFF) {
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<Warp>(std::min(32, threads - 32 * w)));
  }
  Barrier sync;
  std::vector<unsigned char> shared;  // NaN bytes until written
  std::vector<std::unique_ptr<Warp>> warps;
  unsigned char* shared_memory() {    // 16-byte aligned, as the kernels' tiles need
    const uintptr_t p = reinterpret_cast<uintptr_t>(shared.data());
    return shared.data() + ((16 - p % 16) % 16);
  }
};

inline thread_local dim3 t_block, t_block_dim, t_grid_dim;
inline thread_local Block* t_current = nullptr;

inline Fiber& this_thread() { return *t_scheduler->running; }
inline Warp& this_warp() { return *t_current->warps[size_t(this_thread().linear / 32)]; }
inline int this_lane() { return this_thread().linear % 32; }

// Runs kernel(args...) over grid x block_dim threads with shared_bytes of
// dynamic shared memory, block after block (x fastest), each block's
// threads as fibers on this host thread; between blocks the shared memory is
// poisoned again. Rethrows the first exception a thread threw (the block's
// other threads are left where they were; the next launch starts them anew).
template <typename Kernel, typename... Args>
void launch(dim3 grid, dim3 block_dim, size_t shared_bytes, Kernel kernel, Args... args) {
  const unsigned blocks = grid.x * grid.y * grid.z;
  const int threads = int(block_dim.x * block_dim.y * block_dim.z);
  Block block(threads, shared_bytes);
  // Thread t is fibers[t]; the stacks stay mapped for this host thread's
  // later launches.
  static thread_local std::vector<std::unique_ptr<Fiber>> fibers;
  while (fibers.size() < size_t(threads)) fibers.push_back(std::make_unique<Fiber>());
  for (int t = 0; t < threads; ++t) {
    Fiber& f = *fibers[size_t(t)];
    f.linear = t;
    f.thread = dim3(unsigned(t) % block_dim.x, (unsigned(t) / block_dim.x) % block_dim.y,
                    unsigned(t) / (block_dim.x * block_dim.y));
  }
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  Scheduler scheduler;
  scheduler.body = [&] { kernel(args...); };
  Scheduler* const outer = t_scheduler;
  t_scheduler = &scheduler;
  t_block_dim = block_dim;
  t_grid_dim = grid;
  t_current = &block;
  for (unsigned i = 0; i < blocks && !scheduler.error; ++i) {
    t_block = dim3(i % grid.x, (i / grid.x) % grid.y, i / (grid.x * grid.y));
    std::fill(block.shared.begin(), block.shared.end(), 0xFF);
    for (int t = 0; t < threads; ++t) fibers[size_t(t)]->reset(&fiber_main, mxcsr, fpucw);
    // A warp at a time, as far as it can go (until each of its lanes waits
    // at a block barrier or ends), its lanes taking turns at its
    // collectives: warps drift as far apart as the block's barriers let
    // them, so a buffer refilled while another warp still reads it shows.
    const bool backwards = i % 2 == 0;
    const int warps = (threads + 31) / 32;
    for (int left = threads; left > 0 && !scheduler.error;) {
      bool ran = false;
      for (int wk = 0; wk < warps && !scheduler.error; ++wk) {
        const int w = backwards ? warps - 1 - wk : wk, lanes = std::min(32, threads - 32 * w);
        for (bool more = true; more && !scheduler.error;) {
          more = false;
          for (int lk = 0; lk < lanes && !scheduler.error; ++lk) {
            Fiber& f = *fibers[size_t(32 * w + (backwards ? lanes - 1 - lk : lk))];
            if (f.done || (f.waiting != nullptr && f.waiting->phase == f.wait_phase)) continue;
            f.waiting = nullptr;
            resume(f);
            ran = more = true;
            if (f.done) --left;
          }
        }
      }
      if (!ran && !scheduler.error) {
        std::fprintf(stderr,
                     "warp emulator: block %u: %d thread(s) wait at barriers that the others never reach (a thread "
                     "skipped, or returned before, a __syncthreads, __syncwarp or warp collective that its block "
                     "or warp reaches)\n",
                     i, left);
        std::abort();
      }
    }
  }
  t_scheduler = outer;
  t_current = nullptr;
  if (scheduler.error) std::rethrow_exception(scheduler.error);
}

// 1-D blocks of `threads`.
template <typename Kernel, typename... Args>
void launch(dim3 grid, int threads, size_t shared_bytes, Kernel kernel, Args... args) {
  launch(grid, dim3(unsigned(threads), 1, 1), shared_bytes, kernel, args...);
}

// The low (j = 0) or high (j = 1) 16-bit element of a packed pair, as f32.
template <typename T>
float element(uint32_t packed, int j) {
  const uint16_t bits = uint16_t(packed >> (16 * j));
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const uint32_t f = uint32_t(bits) << 16;
    float x;
    std::memcpy(&x, &f, 4);
    return x;
  } else {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
}

// D = A B + C for the warp, m16n8k16 (PTX ISA fragment layouts; lane = 4 g + t):
//   A[g + 8 (i % 2)][2t + j + 8 (i / 2)] = element j of a[i]
//   B[2t + j + 8 i][g]                   = element j of b[i]
//   C[g + 8 (e / 2)][2t + e % 2]         = c[e]
template <typename T>
void mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  Warp& w = this_warp();
  const int lane = this_lane();
  for (int i = 0; i < 4; ++i) w.a[lane][i] = a[i], w.c[lane][i] = c[i];
  for (int i = 0; i < 2; ++i) w.b[lane][i] = b[i];
  w.sync.arrive_and_wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 2; ++j) A[g + 8 * (i % 2)][2 * t + j + 8 * (i / 2)] = element<T>(w.a[l][i], j);
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) B[2 * t + j + 8 * i][g] = element<T>(w.b[l][i], j);
  }
  const int g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
    float acc = w.c[lane][e];
    for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
    c[e] = acc;
  }
  w.sync.arrive_and_wait();  // every lane has read the slots before they are reused
}

// The WMMA API at tile level (m = n = k = 16 only): every lane holds the
// whole tile, loads read it from memory, mma_sync computes it, and only lane
// 0 stores it - so a kernel that reads a stored tile without __syncwarp (or
// __syncthreads) races, as on the GPU. Element access (x[], num_elements) is
// not modelled; the kernels that use this never touch fragment elements.
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulator models 16 x 16 x 16 fragments");
  float v[16][16] = {};  // [row][col] of the tile (A: M x K, B: K x N, C: M x N)
};

template <typename T>
float as_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(x);
  } else {
    return __half2float(x);
  }
}

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>);
  // row_major: element (r, c) at p[r ldm + c]; col_major: at p[c ldm + r].
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c)
      f.v[r][c] = as_float(std::is_same_v<Layout, row_major> ? p[r * ldm + c] : p[c * ldm + r]);
}

template <typename T>
void load_matrix_sync(fragment<accumulator, 16, 16, 16, T>& f, const float* p, unsigned ldm, layout_t layout) {
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.v[r][c] = layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r];
}

template <typename T>
void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, T>& f, unsigned ldm, layout_t layout) {
  if (this_lane() != 0) return;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) (layout == mem_row_major ? p[r * ldm + c] : p[c * ldm + r]) = f.v[r][c];
}

template <typename T>
void fill_fragment(fragment<accumulator, 16, 16, 16, T>& f, float value) {
  for (auto& row : f.v)
    for (float& x : row) x = value;
}

template <typename TA, typename LA, typename TB, typename LB, typename TC>
void mma_sync(fragment<accumulator, 16, 16, 16, TC>& d, const fragment<matrix_a, 16, 16, 16, TA, LA>& a,
              const fragment<matrix_b, 16, 16, 16, TB, LB>& b, const fragment<accumulator, 16, 16, 16, TC>& c) {
  fragment<accumulator, 16, 16, 16, TC> out;
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n) {
      float acc = c.v[r][n];
      for (int k = 0; k < 16; ++k) acc += a.v[r][k] * b.v[k][n];
      out.v[r][n] = acc;
    }
  d = out;
}
}  // namespace wmma

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: lane 8 i + j gives row j
// of matrix i; register i of lane 4 g + t is row g, elements 2t, 2t + 1 of
// matrix i - or, transposed, rows 2t and 2t + 1, element g.
template <bool kTrans>
void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  Warp& w = this_warp();
  const int lane = this_lane(), g = lane / 4, t = lane % 4;
  w.row[size_t(lane)] = row;
  w.sync.arrive_and_wait();
  for (int i = 0; i < 4; ++i) {
    uint16_t lo, hi;
    if (kTrans) {
      lo = static_cast<const uint16_t*>(w.row[size_t(8 * i + 2 * t)])[g];
      hi = static_cast<const uint16_t*>(w.row[size_t(8 * i + 2 * t + 1)])[g];
    } else {
      const uint16_t* p = static_cast<const uint16_t*>(w.row[size_t(8 * i + g)]);
      lo = p[2 * t];
      hi = p[2 * t + 1];
    }
    r[i] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  w.sync.arrive_and_wait();
}

// cp.async (16 bytes, zero-fill when !valid), commit_group and wait_group:
// the destination turns to poison (NaN bytes) when the copy is issued and
// takes the source when the thread waits for its group - on the GPU it
// holds either until the copy completes - so a tile read before its wait
// (a missing wait), or a buffer refilled while another thread still reads
// it (a missing barrier before the refill), reads the poison.
inline void cp_async16(void* dst, const void* src, bool valid) {
  std::memset(dst, 0xFF, 16);
  this_thread().open_group.push_back({dst, src, valid});
}
inline void cp_async_commit() {
  Fiber& f = this_thread();
  f.committed.push_back(std::move(f.open_group));
  f.open_group.clear();
}
template <int kPending>
void cp_async_wait() {
  Fiber& f = this_thread();
  while (f.committed.size() > size_t(kPending)) {
    for (const PendingCopy& c : f.committed.front()) {
      if (c.valid) std::memcpy(c.dst, c.src, 16);
      else std::memset(c.dst, 0, 16);
    }
    f.committed.erase(f.committed.begin());
  }
}

}  // namespace zt::emu

#define threadIdx (::zt::emu::this_thread().thread)
#define blockIdx (::zt::emu::t_block)
#define blockDim (::zt::emu::t_block_dim)
#define gridDim (::zt::emu::t_grid_dim)
// A kernel's static __shared__ array is one per block; blocks run one at a
// time, so a function-local static is exactly that.
#undef __shared__
#define __shared__ static
#define ZT_SHARED_MEMORY(name) unsigned char* name = ::zt::emu::t_current->shared_memory()

inline void __syncthreads() { ::zt::emu::t_current->sync.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::zt::emu::this_warp().sync.arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int lane_mask) {
  ::zt::emu::Warp& w = ::zt::emu::this_warp();
  const int lane = ::zt::emu::this_lane();
  w.value[size_t(lane)] = v;
  w.sync.arrive_and_wait();
  const float other = w.value[size_t(lane ^ lane_mask)];
  w.sync.arrive_and_wait();
  return other;
}
// An int through the same exchange, bit for bit.
inline int __shfl_xor_sync(unsigned mask, int v, int lane_mask) {
  float f;
  std::memcpy(&f, &v, sizeof f);
  f = __shfl_xor_sync(mask, f, lane_mask);
  std::memcpy(&v, &f, sizeof v);
  return v;
}
inline float __expf(float x) { return std::exp(x); }
// Rounded operations the device compiler may not contract into FMAs; nor
// may the host compiler here (-march=native has FMA, and GCC contracts
// across inlined calls): each result passes through a volatile, so the
// emulator rounds where nvcc does and two kernels built of the same
// operations give the same bits on both.
namespace zt::emu {
inline float rounded_here(float x) {
  volatile float v = x;
  return v;
}
}  // namespace zt::emu
inline float __fmul_rn(float a, float b) { return ::zt::emu::rounded_here(a * b); }
inline float __fadd_rn(float a, float b) { return ::zt::emu::rounded_here(a + b); }
inline float __fsub_rn(float a, float b) { return ::zt::emu::rounded_here(a - b); }
inline float __fdiv_rn(float a, float b) { return ::zt::emu::rounded_here(a / b); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
