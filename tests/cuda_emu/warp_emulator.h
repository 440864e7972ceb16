// Runs CUDA kernels written against warp-level primitives on the CPU, so
// their index arithmetic, fragment layouts, masks and synchronisation are
// tested on every machine (CI has no GPU). Include it before a kernel header
// that supports ZT_WARP_EMULATION (backend/cuda/attention_mma_kernels.cuh,
// attention_flash_kernels.cuh).
//
// A block (1-, 2- or 3-D) runs as one host thread per CUDA thread; __syncthreads and
// __syncwarp are barriers, __shfl_xor_sync an exchange through the warp's
// slots, and mma (m16n8k16, f32 accumulate) a warp-collective product that
// assembles A and B from every lane's fragment registers exactly as the PTX
// ISA lays them out - an independent statement of the layouts the kernels
// assume; ldmatrix likewise, and cp.async with its copies deferred to the
// wait. Shared memory is filled with NaN bytes before each block, so a
// read of a byte the block did not write shows. Blocks run one at a time.
// Static __shared__ arrays become function-local statics (one block runs at
// a time). Not modelled: memory ordering beyond the barriers, timing, warp
// divergence (every lane must reach every collective, as on the GPU).
#pragma once

// The CUDA headers kernels pull in, first: they name parameters blockDim,
// gridDim, ... which the macros below would otherwise rewrite.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <vector_types.h>

#include <algorithm>
#include <array>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#define ZT_WARP_EMULATION 1
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

namespace zt::emu {

struct Warp {
  Warp() : sync(32) {}
  std::barrier<> sync;
  std::array<float, 32> value{};                   // shuffles
  std::array<std::array<uint32_t, 4>, 32> a{};     // mma operands, per lane
  std::array<std::array<uint32_t, 2>, 32> b{};
  std::array<std::array<float, 4>, 32> c{};
  std::array<const void*, 32> row{};              // ldmatrix row addresses
};

struct Block {
  Block(int threads, size_t shared_bytes) : sync(threads), shared(shared_bytes + 16, 0xFF) {
    for (int w = 0; w < (threads + 31) / 32; ++w) warps.push_back(std::make_unique<Warp>());
  }
  std::barrier<> sync;
  std::vector<unsigned char> shared;  // NaN bytes until written
  std::vector<std::unique_ptr<Warp>> warps;
  unsigned char* shared_memory() {    // 16-byte aligned, as the kernels' tiles need
    const uintptr_t p = reinterpret_cast<uintptr_t>(shared.data());
    return shared.data() + ((16 - p % 16) % 16);
  }
};

inline thread_local dim3 t_thread, t_block, t_block_dim, t_grid_dim;
inline thread_local int t_linear = 0;  // the thread's index in its block, x fastest (as CUDA forms warps)
inline thread_local Block* t_current = nullptr;

inline Warp& this_warp() { return *t_current->warps[size_t(t_linear / 32)]; }
inline int this_lane() { return t_linear % 32; }

// Runs kernel(args...) over grid x block_dim threads with shared_bytes of
// dynamic shared memory, block after block (x fastest), on one pool of host
// threads; between blocks the shared memory is poisoned again.
template <typename Kernel, typename... Args>
void launch(dim3 grid, dim3 block_dim, size_t shared_bytes, Kernel kernel, Args... args) {
  const unsigned blocks = grid.x * grid.y * grid.z;
  const int threads = int(block_dim.x * block_dim.y * block_dim.z);
  Block block(threads, shared_bytes);
  std::barrier next_block(threads, [&]() noexcept { std::fill(block.shared.begin(), block.shared.end(), 0xFF); });
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      t_linear = t;
      t_thread = dim3(unsigned(t) % block_dim.x, (unsigned(t) / block_dim.x) % block_dim.y,
                      unsigned(t) / (block_dim.x * block_dim.y));
      t_block_dim = block_dim;
      t_grid_dim = grid;
      t_current = &block;
      for (unsigned i = 0; i < blocks; ++i) {
        t_block = dim3(i % grid.x, (i / grid.x) % grid.y, i / (grid.x * grid.y));
        kernel(args...);
        next_block.arrive_and_wait();
      }
    });
  for (std::thread& th : pool) th.join();
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
// the copies of a thread happen when it waits for their group, so reading a
// tile before the wait sees the poison (or the previous tile), as a missing
// wait would on the GPU.
struct PendingCopy {
  void* dst;
  const void* src;
  bool valid;
};
inline thread_local std::vector<PendingCopy> t_open_group;
inline thread_local std::vector<std::vector<PendingCopy>> t_committed;

inline void cp_async16(void* dst, const void* src, bool valid) { t_open_group.push_back({dst, src, valid}); }
inline void cp_async_commit() {
  t_committed.push_back(std::move(t_open_group));
  t_open_group.clear();
}
template <int kPending>
void cp_async_wait() {
  while (t_committed.size() > size_t(kPending)) {
    for (const PendingCopy& c : t_committed.front()) {
      if (c.valid) std::memcpy(c.dst, c.src, 16);
      else std::memset(c.dst, 0, 16);
    }
    t_committed.erase(t_committed.begin());
  }
}

}  // namespace zt::emu

#define threadIdx (::zt::emu::t_thread)
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
