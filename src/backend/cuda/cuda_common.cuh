// Shared by the CUDA backend's translation units (never included by host-only
// code): error checking, the current compute stream, dtype load/store and
// warp/block reductions.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"

#ifndef ZT_SHARED_MEMORY
// The block's dynamic shared memory as `unsigned char name[]`, 128-byte
// aligned (WMMA wants 32). The warp emulator defines its own.
#define ZT_SHARED_MEMORY(name) extern __shared__ __align__(128) unsigned char name[]
#endif

// Every CUDA runtime call is checked; the error names the call and where.
#define ZT_CUDA_CHECK(expr)                                                                           \
  do {                                                                                                \
    const cudaError_t zt_err_ = (expr);                                                               \
    if (zt_err_ != cudaSuccess) [[unlikely]]                                                          \
      ::zt::cuda::detail::fail_cuda(zt_err_, #expr, __FILE__, __LINE__);                              \
  } while (0)

// After every kernel launch: launch-configuration errors surface here, named.
#define ZT_CUDA_CHECK_LAUNCH(kernel_name) ::zt::cuda::detail::check_launch(kernel_name, __FILE__, __LINE__)

#define ZT_CUBLAS_CHECK(expr)                                                                         \
  do {                                                                                                \
    const cublasStatus_t zt_st_ = (expr);                                                             \
    if (zt_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                                 \
      ::zt::cuda::detail::fail_cublas(zt_st_, #expr, __FILE__, __LINE__);                             \
  } while (0)

namespace zt::cuda {

namespace detail {
[[noreturn]] void fail_cuda(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void fail_cublas(cublasStatus_t st, const char* expr, const char* file, int line);
void check_launch(const char* kernel, const char* file, int line);
}  // namespace detail

// The compute stream of `device` (initialising the device on first use and
// making it current on this thread).
cudaStream_t compute_stream(Device device);
// The communication stream of `device` (collectives; gradient buckets).
cudaStream_t comm_stream(Device device);
// The device's multiprocessor count (cached).
int num_sms(Device device);
// The L2 cache (bytes; 50 MiB on H100).
int64_t l2_cache_bytes(Device device);
// Shared memory one block may use after opting in (bytes; 227 KiB on H100).
int max_shared_optin(Device device);
// How many blocks of `kernel` (a __global__ function) with `threads` threads
// and `shared_bytes` of dynamic shared memory one multiprocessor of `device`
// holds at once (the occupancy calculator; cached per kernel, shape and
// device). Raises the kernel's dynamic shared memory limit to shared_bytes
// first if it is below (never lowers it), which launches above 48 KiB need.
int resident_blocks_per_sm(const void* kernel, int threads, size_t shared_bytes, Device device);
// cuBLASLt handle of the device, and a workspace of cublaslt_workspace_bytes()
// (runtime.h) on it.
cublasLtHandle_t cublaslt_handle(Device device);
void* cublaslt_workspace(Device device);

// A tensor's stream: the compute stream of its device.
inline cudaStream_t stream_of(const Tensor& t) { return compute_stream(t.device()); }

// A tensor's memory as a kernel's element type (T may be const); null for an
// undefined tensor, the kernels' "no such operand".
template <typename T>
T* elements(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

// Grid size for a grid-stride elementwise kernel over n elements.
inline unsigned grid_for(int64_t n, int threads, Device device) {
  const int64_t blocks = (n + threads - 1) / threads;
  const int64_t cap = int64_t(num_sms(device)) * 32;
  return unsigned(blocks < 1 ? 1 : (blocks < cap ? blocks : cap));
}

// ---- element access in f32 (device side) ----
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// ---- packed access: V consecutive elements in one load or store ----
// 16 bytes (V = 16 / sizeof(T)) is one 128-bit memory instruction, the widest;
// the address must be a multiple of sizeof(T) * V.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <typename T>
inline constexpr int kPack16 = int(16 / sizeof(T));
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
// A 16-byte pack is stored by one st.v4.b32 (generic address: global or
// shared). As a struct copy, NVVM split some into 2-byte stores, 8 store
// instructions for 1 (one of SwiGLU's backward's two, two of the classifier's
// four unrolled ones on sm_90a, CUDA 13.0).
template <typename T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& v) {
#if !ZT_WARP_EMULATION
  if constexpr (sizeof(Pack<T, V>) == 16) {
    uint32_t w[4];
    memcpy(w, &v, 16);
    asm volatile("st.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
                 : "memory");
    return;
  }
#endif
  *reinterpret_cast<Pack<T, V>*>(p) = v;
}
// The pack at p + offset, or zeros when p is null (an optional operand).
template <typename T, int V>
__device__ __forceinline__ Pack<T, V> load_pack_or_zero(const T* p, int64_t offset) {
  Pack<T, V> v{};
  if (p != nullptr) v = load_pack<T, V>(p + offset);
  return v;
}
// Makes the compiler forget what it knows of a pack's registers: the norm
// backward converts the packed values to f32 again where they are used next
// rather than holding the f32 copies of a whole row (twice the registers)
// across the statistics' shuffles; a pack copied out of shared memory is
// read in one 16-byte load (passed on by reference, NVVM read it an element
// at a time, each lane's 2-byte loads 4-way bank conflicted). No code;
// nothing in the emulator.
template <typename T, int V>
__device__ __forceinline__ void keep_packed(Pack<T, V>& p) {
#if !ZT_WARP_EMULATION
  static_assert(sizeof(p) % 4 == 0, "a pack of whole 32-bit registers");
  uint32_t* words = reinterpret_cast<uint32_t*>(&p);
#pragma unroll
  for (int i = 0; i < int(sizeof(p) / 4); ++i) asm volatile("" : "+r"(words[i]));
#else
  (void)p;
#endif
}

// ---- asynchronous copies, global -> shared (cp.async, sm_80 and later) ----
#if ZT_WARP_EMULATION
// The warp emulator's: copies deferred to their wait (a missing wait reads
// the poison).
using ::zt::emu::cp_async16;
using ::zt::emu::cp_async_commit;
using ::zt::emu::cp_async_wait;
__device__ __forceinline__ void compiler_memory_fence() {}
#else
// 16 bytes global -> shared without staging in registers; zeros when !valid
// (src is then not read). Complete after cp_async_wait.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most kPending of this thread's committed groups are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");  // no shared read moves above it
}
// No code: keeps the compiler from moving this thread's earlier memory
// accesses past what follows (cp_async16 has no memory clobber), as when a
// thread refills a shared slot it has just read.
__device__ __forceinline__ void compiler_memory_fence() { asm volatile("" ::: "memory"); }
#endif

// True when every pointer is 16-byte aligned and `len` (the length the packs
// tile: a row, or the whole tensor) is a multiple of V: 16-byte packs fit.
template <typename T, typename... Ptrs>
inline bool packs_of_16_fit(int64_t len, const Ptrs*... ptrs) {
  return len % kPack16<T> == 0 && ((reinterpret_cast<uintptr_t>(ptrs) % 16 == 0) && ...);
}

// Calls launch(std::integral_constant<int, V>{}) with V = kPack16<T> where
// 16-byte packs fit, else V = Fallback (one element per load, or the least a
// kernel's unit holds: RoPE's pair): the kernel is instantiated for both
// widths and the launch picks one at run time.
template <typename T, int Fallback = 1, typename Launch>
void with_pack_width(bool packs_fit, Launch&& launch) {
  if (packs_fit) {
    launch(std::integral_constant<int, kPack16<T>>{});
  } else {
    launch(std::integral_constant<int, Fallback>{});
  }
}

// Calls f(std::integral_constant<int, n>{}) for the n among Values: the
// instances of a kernel compiled for a choice made at run time (packs per
// lane, rows per SM). Throws zt::Error naming `what` and the values for any
// other n.
template <int... Values, typename F>
void with_int_constant(int n, const char* what, F&& f) {
  if (!((n == Values && (f(std::integral_constant<int, Values>{}), true)) || ...))
    ZT_FAIL(what, " = ", n, " is not one of", ((" " + std::to_string(Values)) + ...));
}

// ---- reductions (f32) ----
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets
// the result. `scratch` is __shared__ float[32]. Fixed order: deterministic.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace zt::cuda

// Calls `body` with `using T = <CUDA element type>` for f32 / bf16 / f16
// tensors (else throws naming the op and dtype).
#define ZT_CUDA_DISPATCH_FLOAT(dtype, opname, ...)                                                   \
  [&] {                                                                                              \
    switch (dtype) {                                                                                 \
      case ::zt::DType::f32: { using T = float; return __VA_ARGS__(); }                              \
      case ::zt::DType::bf16: { using T = __nv_bfloat16; return __VA_ARGS__(); }                     \
      case ::zt::DType::f16: { using T = __half; return __VA_ARGS__(); }                             \
      default: ZT_FAIL(opname, ": no CUDA kernel for dtype ", ::zt::dtype_name(dtype));              \
    }                                                                                                \
  }()
