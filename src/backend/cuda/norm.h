// CUDA LayerNorm / RMSNorm (same contracts as backend/cpu/norm.h; see
// ops/norm.h). Host-callable; no CUDA headers.
#pragma once

#include "core/tensor.h"

namespace zt::cuda {

void norm_forward(bool rms, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                  const Tensor& w, const Tensor& b, float eps);
void residual_norm_forward(bool rms, const Tensor& r_out, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                           const Tensor& r_in, const Tensor& x, const Tensor& w, const Tensor& b, float eps);
// Which backward runs where a row fits its lanes' registers: the one-pass
// kernel, or two passes on its blocks (the same bits); automatic: the
// fastest of the two for the call's shape, raced on its first calls
// (kernel_race.h), unless ZT_CUDA_NORM_BACKWARD = one_pass or two_pass in the
// environment pins one. Other calls take two passes over row chunks.
enum class NormBackwardKernel { automatic, one_pass, two_pass };
// ZT_CUDA_NORM_BACKWARD's pin (automatic when unset), read once; a value
// that names no kernel throws zt::Error.
NormBackwardKernel pinned_norm_backward();

// dw/db accumulate deterministically: fixed runs of rows (the one pass's
// blocks, or the two passes' chunks where it cannot run) write f32
// partials, a second kernel sums them in order and adds with one rounding
// (or, overwrite, writes them: dw and db not read). The bits repeat on one GPU; the one pass's block count
// follows the GPU's SMs, so another model may round differently.
void norm_backward(bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add,
                   bool overwrite = false, NormBackwardKernel kernel = NormBackwardKernel::automatic);

}  // namespace zt::cuda
