// Per-tensor fp8 on the GPU: the quantisation kernels' launches
// (fp8_kernels.cuh) and the linear layer's products through cuBLASLt's fp8
// GEMM (matmul.cu's fp8_matmul), which reads both operands K-major: the
// input gradient's weights and the weight gradient's two operands are
// transposed (one byte an element) into the workspace first.
#include "backend/cuda/fp8.h"

#include <algorithm>
#include <type_traits>

#include "backend/cuda/colsum.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/fp8_kernels.cuh"
#include "backend/cuda/matmul.h"

namespace zt::cuda {

namespace {

using namespace fp8_kernels;

// Calls f(T{}, E4M3{}) with T the kernel type of an f32 or bf16 tensor and
// E4M3 a std::bool_constant: the fp8 format is E4M3 (else E5M2).
template <typename F>
void with_types(DType wide, DType format, F&& f) {
  auto with_format = [&](auto tag) {
    if (format == DType::f8e4m3) {
      f(tag, std::true_type{});
    } else {
      f(tag, std::false_type{});
    }
  };
  if (wide == DType::bf16) {
    with_format(__nv_bfloat16{});
  } else {
    with_format(float{});
  }
}

}  // namespace

void quantize_fp8(const Tensor& q, const Tensor& scale_inv, const Tensor& x) {
  const Device device = x.device();
  const int64_t n = x.numel();
  cudaStream_t s = stream_of(x);
  const int parts = int(std::min<int64_t>(grid_for(n, kThreads, device), kMaxPartials));
  const Tensor partials = Tensor::empty(Shape{parts}, DType::f32, device, MemCategory::workspace);
  const Tensor scale = Tensor::empty(Shape{1}, DType::f32, device, MemCategory::workspace);
  with_types(x.dtype(), q.dtype(), [&](auto tag, auto format) {
    using T = decltype(tag);
    constexpr bool e4m3 = decltype(format)::value;
    abs_max_partials_kernel<T><<<parts, kThreads, 0, s>>>(elements<float>(partials), elements<const T>(x), n);
    ZT_CUDA_CHECK_LAUNCH("abs_max_partials_kernel");
    fp8_scale_kernel<e4m3><<<1, 1024, 0, s>>>(elements<float>(scale), elements<float>(scale_inv),
                                                elements<const float>(partials), parts);
    ZT_CUDA_CHECK_LAUNCH("fp8_scale_kernel");
    if (n == 0) return;
    encode_kernel<T, e4m3><<<grid_for(n, kThreads, device), kThreads, 0, s>>>(
        elements<uint8_t>(q), elements<const T>(x), elements<const float>(scale), n);
    ZT_CUDA_CHECK_LAUNCH("encode_kernel");
  });
}

void dequantize_fp8(const Tensor& out, const Tensor& q, const Tensor& scale_inv) {
  const int64_t n = q.numel();
  if (n == 0) return;
  cudaStream_t s = stream_of(q);
  const unsigned grid = grid_for(n, kThreads, q.device());
  with_types(out.dtype(), q.dtype(), [&](auto tag, auto format) {
    using T = decltype(tag);
    constexpr bool e4m3 = decltype(format)::value;
    dequantize_kernel<T, e4m3><<<grid, kThreads, 0, s>>>(elements<T>(out), elements<const uint8_t>(q),
                                                           elements<const float>(scale_inv), n);
    ZT_CUDA_CHECK_LAUNCH("dequantize_kernel");
  });
}

void transpose_bytes(const Tensor& out, const Tensor& in, int64_t rows, int64_t cols) {
  if (rows == 0 || cols == 0) return;
  const int64_t col_tiles = (cols + kTile - 1) / kTile, row_tiles = (rows + kTile - 1) / kTile;
  ZT_CHECK(col_tiles <= int64_t(INT32_MAX), "transpose_bytes: ", cols, " columns are more than a grid's tiles");
  const dim3 grid(unsigned(col_tiles), unsigned(std::min<int64_t>(row_tiles, 65535)));
  transpose_kernel<uint8_t><<<grid, dim3(kTile, kTileRows), 0, stream_of(in)>>>(
      elements<uint8_t>(out), elements<const uint8_t>(in), rows, cols);
  ZT_CUDA_CHECK_LAUNCH("transpose_kernel");
}

bool fp8_linear_forward(const Tensor& y, const Tensor& xq, const Tensor& x_scale_inv, const Tensor& wq,
                        const Tensor& w_scale_inv, const Tensor& b, const Tensor& residual) {
  // y (N, O) = xq (N, I) @ wq (O, I)^T: both K-major as they are.
  return fp8_matmul(y, xq, x_scale_inv, wq, w_scale_inv, b, residual, residual.defined() ? 1.0f : 0.0f);
}

bool fp8_linear_input_gradient(const Tensor& dx, const Tensor& dyq, const Tensor& dy_scale_inv, const Tensor& wq,
                               const Tensor& w_scale_inv) {
  const int64_t O = wq.size(0), I = wq.size(1);
  if (O % 16 != 0 || I % 16 != 0) return false;  // no fp8 algorithm: skip the transpose
  // dx (N, I) = dyq (N, O) @ wT (I, O)^T.
  const Tensor wt = Tensor::empty(Shape{I, O}, wq.dtype(), wq.device(), MemCategory::workspace);
  transpose_bytes(wt, wq, O, I);
  return fp8_matmul(dx, dyq, dy_scale_inv, wt, w_scale_inv, Tensor(), Tensor(), 0.0f);
}

bool fp8_linear_weight_gradient(const Tensor& dw, const Tensor& dyq, const Tensor& dy_scale_inv, const Tensor& xq,
                                const Tensor& x_scale_inv, bool overwrite) {
  const int64_t O = dyq.size(-1), I = xq.size(-1), N = O > 0 ? dyq.numel() / O : 0;
  if (N % 16 != 0 || O % 16 != 0 || I % 16 != 0 || N == 0) return false;
  // dw (O, I) += dyT (O, N) @ xT (I, N)^T: the reduction over tokens made
  // K-major by transposing both.
  const Tensor dyt = Tensor::empty(Shape{O, N}, dyq.dtype(), dyq.device(), MemCategory::workspace);
  const Tensor xt = Tensor::empty(Shape{I, N}, xq.dtype(), xq.device(), MemCategory::workspace);
  transpose_bytes(dyt, dyq, N, O);
  transpose_bytes(xt, xq, N, I);
  return fp8_matmul(dw, dyt, dy_scale_inv, xt, x_scale_inv, Tensor(), Tensor(), overwrite ? 0.0f : 1.0f);
}

int64_t fp8_linear_workspace_bytes(int64_t out, int64_t in, int64_t rows, bool bias, DType compute,
                                   int64_t dx_scratch, int64_t held_width, int64_t held_codes) {
  constexpr int64_t kScale = 4, kQuantizing = 4 * kMaxPartials + kScale;  // a scale_inv; the amax pass's own
  // The f32 prefill where the bias cannot go into the epilogue (matmul.h's fp8_matmul).
  const int64_t prefill = bias && compute != DType::bf16 ? 4 * rows * out : 0;
  const int64_t forward = rows * in + out * in + 2 * kScale + std::max(kQuantizing, prefill);
  const int64_t held = rows * held_width + held_codes * kScale;  // other layers' codes, through the backward
  const int64_t input_gradient =
      held + rows * out + 2 * out * in + 2 * kScale + dx_scratch * rows * in + kQuantizing;
  const int64_t dy_codes = rows * out + kScale;
  const int64_t weight_gradient = held + dy_codes + rows * (out + 2 * in) + kScale + kQuantizing;
  const int64_t bias_gradient = bias ? held + dy_codes + colsum_workspace_bytes(rows, out) : 0;
  return std::max({forward, input_gradient, weight_gradient, bias_gradient});
}

}  // namespace zt::cuda
