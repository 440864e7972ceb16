// CUDA elementwise kernels: grid-stride loops in f32 (one rounding to the
// output dtype), deterministic f64 reductions, Philox fills identical in
// stream layout to the CPU (core/rng.h is shared host/device code).
#include "backend/cuda/elementwise.h"

#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/elementwise_kernels.cuh"
#include "backend/cuda/runtime.h"
#include "core/rng.h"

namespace zt::cuda {

namespace {

using namespace elementwise_kernels;

template <typename T>
__global__ void fill_kernel(T* out, int64_t n, T v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = v;
}

template <typename To, typename From>
__global__ void cast_kernel(To* out, const From* in, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<To>(to_f32(in[i]));
}

// Block b sums x^2 over its fixed chunk [b*chunk, (b+1)*chunk) in f64; the
// tree inside the block has a fixed shape, so the result is reproducible.
template <typename T>
__global__ void sum_squares_kernel(const T* x, int64_t n, int64_t chunk, double* partials) {
  __shared__ double s[kThreads];
  const int64_t begin = blockIdx.x * chunk, end = min(n, begin + chunk);
  double acc = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double v = to_f32(x[i]);
    acc += v * v;
  }
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (int(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}

template <typename T>
__global__ void normal_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, float mean, float std) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(mean + std * philox_normal_at(seed, offset, uint64_t(i)));
}

template <typename T>
__global__ void uniform_kernel(T* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = from_f32<T>(lo + (hi - lo) * philox_uniform_at(seed, offset, uint64_t(i)));
}

bool is_float3(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// Chunk of the sum_squares partials: depends only on n (deterministic).
int64_t ss_chunk(int64_t n) { return std::max<int64_t>(int64_t(1) << 16, (n + 4095) / 4096); }

// Queues the partials of x into `partials` (device, at least ss_blocks(n)).
int64_t ss_blocks(int64_t n) { return n == 0 ? 0 : (n + ss_chunk(n) - 1) / ss_chunk(n); }
void queue_sum_squares(const Tensor& x, double* partials) {
  const int64_t n = x.numel(), blocks = ss_blocks(n);
  if (blocks == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "sum_squares", [&] {
    sum_squares_kernel<T><<<unsigned(blocks), kThreads, 0, stream_of(x)>>>(static_cast<const T*>(x.data_ptr()), n,
                                                                         ss_chunk(n), partials);
  });
  ZT_CUDA_CHECK_LAUNCH("sum_squares_kernel");
}

}  // namespace

void cast(const Tensor& out, const Tensor& in) {
  const int64_t n = in.numel();
  if (n == 0) return;
  if (out.dtype() == in.dtype()) {
    if (!out.same_as(in)) copy_bytes(out.data_ptr(), out.device(), in.data_ptr(), in.device(), in.nbytes());
    return;
  }
  ZT_CHECK(is_float3(out.dtype()) && is_float3(in.dtype()), "cast: no CUDA kernel from ", dtype_name(in.dtype()),
           " to ", dtype_name(out.dtype()), " (CUDA casts cover f32, bf16 and f16); cast on the CPU instead");
  const unsigned grid = grid_for(n, kThreads, out.device());
  ZT_CUDA_DISPATCH_FLOAT(out.dtype(), "cast", [&] {
    using To = T;
    ZT_CUDA_DISPATCH_FLOAT(in.dtype(), "cast", [&] {
      cast_kernel<To, T><<<grid, kThreads, 0, stream_of(out)>>>(static_cast<To*>(out.data_ptr()),
                                                               static_cast<const T*>(in.data_ptr()), n);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("cast_kernel");
}

void add(const Tensor& out, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  if (n == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(out.dtype(), "add", [&] {
    T* op = static_cast<T*>(out.data_ptr());
    const T *ap = static_cast<const T*>(a.data_ptr()), *bp = static_cast<const T*>(b.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(n, op, ap, bp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      add_kernel<T, V><<<grid_for(n / V, kThreads, out.device()), kThreads, 0, stream_of(out)>>>(op, ap, bp, n);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("add_kernel");
}

void scale(const Tensor& out, const Tensor& x, float alpha) {
  const int64_t n = out.numel();
  if (n == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(out.dtype(), "scale", [&] {
    T* op = static_cast<T*>(out.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(n, op, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      scale_kernel<T, V><<<grid_for(n / V, kThreads, out.device()), kThreads, 0, stream_of(out)>>>(op, xp, alpha, n);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("scale_kernel");
}

void axpy(const Tensor& y, float alpha, const Tensor& x) {
  const int64_t n = y.numel();
  if (n == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(y.dtype(), "axpy", [&] {
    using TY = T;
    ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "axpy", [&] {
      axpy_kernel<TY, T><<<grid_for(n, kThreads, y.device()), kThreads, 0, stream_of(y)>>>(
          static_cast<TY*>(y.data_ptr()), alpha, static_cast<const T*>(x.data_ptr()), n);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("axpy_kernel");
}

void fill(const Tensor& out, double value) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const unsigned grid = grid_for(n, kThreads, out.device());
  cudaStream_t s = stream_of(out);
  switch (out.dtype()) {
    case DType::f32: fill_kernel<float><<<grid, kThreads, 0, s>>>(static_cast<float*>(out.data_ptr()), n, float(value)); break;
    case DType::bf16:
      // Through f32 is exact for bf16 except on double-rounding ties; the
      // values filled in practice (0, 1, small integers) are exact.
      fill_kernel<__nv_bfloat16><<<grid, kThreads, 0, s>>>(static_cast<__nv_bfloat16*>(out.data_ptr()), n,
                                                           __float2bfloat16_rn(float(value)));
      break;
    case DType::f16:
      fill_kernel<__half><<<grid, kThreads, 0, s>>>(static_cast<__half*>(out.data_ptr()), n, __float2half_rn(float(value)));
      break;
    case DType::i32: fill_kernel<int32_t><<<grid, kThreads, 0, s>>>(static_cast<int32_t*>(out.data_ptr()), n, int32_t(value)); break;
    case DType::i64: fill_kernel<int64_t><<<grid, kThreads, 0, s>>>(static_cast<int64_t*>(out.data_ptr()), n, int64_t(value)); break;
    default: ZT_FAIL("fill: no CUDA kernel for dtype ", dtype_name(out.dtype()));
  }
  ZT_CUDA_CHECK_LAUNCH("fill_kernel");
}

double sum_squares_all(std::span<const Tensor> tensors) {
  if (tensors.empty()) return 0.0;
  const Device dev = tensors[0].device();
  std::vector<int64_t> first(tensors.size() + 1, 0);
  for (size_t i = 0; i < tensors.size(); ++i) first[i + 1] = first[i] + ss_blocks(tensors[i].numel());
  if (first.back() == 0) return 0.0;
  // f64 partials (no f64 dtype: 8-byte i64 storage reinterpreted).
  Tensor partials = Tensor::empty(Shape{first.back()}, DType::i64, dev, MemCategory::workspace);
  double* parts = static_cast<double*>(partials.data_ptr());
  for (size_t i = 0; i < tensors.size(); ++i) queue_sum_squares(tensors[i], parts + first[i]);
  std::vector<double> host(size_t(first.back()));
  copy_bytes(host.data(), Device::cpu(), partials.data_ptr(), dev, host.size() * sizeof(double));
  double total = 0;
  for (double p : host) total += p;  // fixed order
  return total;
}

double sum_squares(const Tensor& x) { return sum_squares_all(std::span<const Tensor>(&x, 1)); }

void fill_normal(const Tensor& out, uint64_t seed, uint64_t offset, float mean, float std) {
  const int64_t n = out.numel();
  if (n == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(out.dtype(), "fill_normal", [&] {
    normal_kernel<T><<<grid_for(n, kThreads, out.device()), kThreads, 0, stream_of(out)>>>(
        static_cast<T*>(out.data_ptr()), n, seed, offset, mean, std);
  });
  ZT_CUDA_CHECK_LAUNCH("normal_kernel");
}

void fill_uniform(const Tensor& out, uint64_t seed, uint64_t offset, float lo, float hi) {
  const int64_t n = out.numel();
  if (n == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(out.dtype(), "fill_uniform", [&] {
    uniform_kernel<T><<<grid_for(n, kThreads, out.device()), kThreads, 0, stream_of(out)>>>(
        static_cast<T*>(out.data_ptr()), n, seed, offset, lo, hi);
  });
  ZT_CUDA_CHECK_LAUNCH("uniform_kernel");
}

}  // namespace zt::cuda
