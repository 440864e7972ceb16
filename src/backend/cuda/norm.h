// CUDA LayerNorm / RMSNorm (same contracts as backend/cpu/norm.h; see
// ops/norm.h). Host-callable; no CUDA headers.
#pragma once

#include "core/tensor.h"

namespace zt::cuda {

void norm_forward(bool rms, const Tensor& y, const Tensor& mean, const Tensor& rstd, const Tensor& x,
                  const Tensor& w, const Tensor& b, float eps);
void residual_norm_forward(bool rms, const Tensor& r_out, const Tensor& y, const Tensor& mean, const Tensor& rstd,
                           const Tensor& r_in, const Tensor& x, const Tensor& w, const Tensor& b, float eps);
// Which backward runs: the one-pass kernel where a row fits its lanes'
// registers (automatic; ZT_CUDA_NORM_BACKWARD=two_pass in the environment
// turns it off), or two passes always (the kernel bench's A/B row).
enum class NormBackwardKernel { automatic, two_pass };

// dw/db accumulate deterministically: fixed runs of rows (the one pass's
// blocks, the two passes' chunks) write f32 partials, a second kernel sums
// them in order and adds with one rounding (or, overwrite, writes them: dw
// and db not read). The bits repeat on one GPU; the one pass's block count
// follows the GPU's SMs, so another model may round differently.
void norm_backward(bool rms, const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy,
                   const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd, const Tensor& dx_add,
                   bool overwrite = false, NormBackwardKernel kernel = NormBackwardKernel::automatic);

}  // namespace zt::cuda
