// The memory the backend takes for itself (MemCategory::workspace) during a
// training step, as the memory plan counts it. On a GPU that is cuBLASLt's
// workspace, held from the device's initialisation, plus the largest one a
// call allocates for its own use and frees when it returns: attention's
// backward, whose deterministic cuDNN engine keeps the score gradients of
// every head (B x Hq x T^2 bf16 on an H100: 3 GiB for GPT-2 at B = 128,
// T = 1024, run in batch chunks of at most 1 GiB; when not deterministic,
// an f32 dq accumulator instead: 384 MiB there), or a weight gradient's row-chunk
// partials (backend/cuda/matmul.h). The other calls' own are not counted:
// the norm backward's partial sums (up to 2048 x C f32 each for dw and db:
// 12 MiB for GPT-2, 16 MiB for Llama 1B), token copies, and the embedding
// backward's segment sums of frequent tokens (up to positions / 32 rows of
// f32: 12 MiB for GPT-2 at B = 128), under the counted ones at these sizes.
#pragma once

#include <cstdint>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"

namespace zt::ops {

// One attention call: q (B, T, Hq, D), k and v (B, keys(), Hkv, D) in `dtype`.
struct AttentionDims {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, D = 0;
  DType dtype = DType::f32;
  bool deterministic = true;  // the backward's algorithm (core/determinism.h)
  bool packed = false;        // q, k, v the heads of one tensor (attention_forward_packed)
  bool causal = true;         // else every query sees all keys (the ring's remote blocks)
  int64_t Tk = 0;             // keys when not causal (0: T)
  int64_t keys() const { return Tk > 0 ? Tk : T; }
};

// One linear layer: its weight (out, in), whether it has a bias, and under
// fp8 the bytes an element of a (rows, in) workspace its input gradient is
// made in before it is used: 4 where it is summed into another's (k's and
// v's into q's, an f32 product), the compute dtype's size for GPT-2's
// mlp.out (the GeLU's backward reads the product), else 0; and the codes
// of other layers' output gradients alive through its backward (their
// widths summed, and how many tensors: q, k and v as three products keep
// each one's from its input gradient to its weight gradient).
struct LinearDims {
  int64_t out = 0, in = 0;
  bool bias = false;
  int64_t fp8_dx_scratch = 0;
  int64_t fp8_held_width = 0, fp8_held_codes = 0;
};

// The workspace peak of a step whose attention calls have these dims (one
// entry a kind of call; none without blocks) and
// whose linear layers these, over `rows` rows each, on `device` (bytes) -
// in `compute` dtype, or on fp8 (train.fp8: their operands' codes and
// transposes, backend/cuda/fp8.h) -, with
// the kernels the backend picks for them (on a GPU this builds and caches
// cuDNN's plans for the shape). -1 where it is not planned: on the CPU (each
// thread's grow-only scratch, sized by the kernels' tiling: 0.8 MiB for the
// demo, 133 MiB for GPT-2 124M at micro-batch 1 x 256 on 2 threads, 5.6% of
// its peak), and for a GPU this machine lacks.
int64_t step_workspace_bytes(Device device, const std::vector<AttentionDims>& attention, int64_t rows,
                             const std::vector<LinearDims>& linears, bool fp8 = false,
                             DType compute = DType::bf16);

}  // namespace zt::ops
