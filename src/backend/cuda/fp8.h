// Per-tensor fp8 on the GPU (contract: ops/fp8.h; arguments validated
// there): quantisation with the CPU backend's bits, and the linear layer's
// products on the fp8 tensor cores (cuBLASLt, matmul.h's fp8_matmul), its
// operands transposed to the K-major layout that takes. Host-callable; no
// CUDA headers.
#pragma once

#include "core/tensor.h"

namespace zt::cuda {

// q <- x * scale in q's format, scale_inv (1) <- 1 / scale, the scale from
// max |x| on the device (no host synchronisation). x f32 or bf16.
void quantize_fp8(const Tensor& q, const Tensor& scale_inv, const Tensor& x);
// out (f32 or bf16) <- q * scale_inv.
void dequantize_fp8(const Tensor& out, const Tensor& q, const Tensor& scale_inv);
// out (cols, rows) <- in (rows, cols)^T for 1-byte elements (fp8 codes).
void transpose_bytes(const Tensor& out, const Tensor& in, int64_t rows, int64_t cols);

// The fp8 linear layer's three products on the tensor cores (ops/fp8.h's
// shapes). Each returns false, having written nothing of its output, where
// cuBLASLt has no fp8 algorithm for it: the caller dequantises.
//   y = [residual +] xq wq^T [+ b]
bool fp8_linear_forward(const Tensor& y, const Tensor& xq, const Tensor& x_scale_inv, const Tensor& wq,
                        const Tensor& w_scale_inv, const Tensor& b, const Tensor& residual);
//   dx = dyq wq (wq transposed to (I, O) in the workspace first)
bool fp8_linear_input_gradient(const Tensor& dx, const Tensor& dyq, const Tensor& dy_scale_inv, const Tensor& wq,
                               const Tensor& w_scale_inv);
//   dw (f32) += dyq^T xq (= when overwrite; dyq and xq transposed to (O, N)
//   and (I, N) in the workspace first)
bool fp8_linear_weight_gradient(const Tensor& dw, const Tensor& dyq, const Tensor& dy_scale_inv, const Tensor& xq,
                                const Tensor& x_scale_inv, bool overwrite);

// The most workspace one fp8 linear layer (weight (out, in), over `rows`
// rows) holds at once in a training step (bytes), as nn/parallel_linear.cpp
// runs it on a GPU: the forward's codes of x and W (and, for an f32 bias,
// the f32 prefill of (rows, out)); the input gradient's codes of dy and W
// with W's transpose (and a (rows, in) scratch of dx_scratch bytes an
// element where the product is made apart: an f32 sum into dx, GPT-2's
// mlp.out before its GeLU backward); the weight gradient's codes of dy (the
// input gradient's, kept) and x with both transposes; each with its scales
// and, while quantising, the amax pass's partials (at most kMaxPartials
// floats: an upper bound by a few KiB). The bias gradient's column sums run
// first, beside dy's codes. Through the backward, `held_codes` tensors of
// other layers' codes, `held_width` bytes a row in all, are alive too. No
// GPU needed.
int64_t fp8_linear_workspace_bytes(int64_t out, int64_t in, int64_t rows, bool bias, DType compute,
                                   int64_t dx_scratch, int64_t held_width = 0, int64_t held_codes = 0);

}  // namespace zt::cuda
