// CUDA attention with grouped-query heads, causal or over an unmasked key
// block (contract: ops/attention.h).
// Host-callable; no CUDA headers.
#pragma once

#include "core/tensor.h"

#include <cstdint>
#include <string>

namespace zt::cuda {

// Five implementations:
//   cudnn   cuDNN's fused flash attention (SDPA graphs, attention_cudnn.cu):
//           bf16 or f16, head dims multiple of 8 up to 128, where cuDNN has
//           an engine for the shape on this GPU (asked once per shape).
//   mma     FlashAttention-2 on mma.sync tensor-core instructions, scores,
//           probabilities and outputs in registers, O(T) memory
//           (attention_mma.cu): our fast path. bf16 or f16, head dims 16,
//           32, 64, 128, 16-byte aligned tensors.
//   flash   the same schedule through WMMA, S and O staged in shared memory
//           (attention_flash.cu): the same shapes; a second fused kernel.
//   gemm    tensor cores: the (T, T) score and probability matrices of a
//           chunk of heads as cuBLASLt products, causal softmax (and its
//           backward) as row kernels (attention_gemm.cu). Workspace
//           ~12 bytes x heads x T^2 in backward, in head chunks of at most
//           kAttentionWorkspaceBudget. Any dtype and head dim.
//   simple  one warp per query (or key) row on CUDA cores, O(T) memory
//           (attention.cu): the fallback when one head's matrices exceed the
//           budget, and an implementation to test against.
// automatic picks cudnn, else mma, else flash, else gemm when it fits, else
// simple; an unmasked key block (context parallelism's ring: every query sees
// all Tk keys, Tk != T allowed) runs on cudnn, else simple (mma, flash and
// gemm are causal only); forward and backward choose separately (all five write the same
// lse, so any forward pairs with any backward). The environment variable
// ZT_CUDA_ATTENTION = cudnn | mma | flash | gemm | simple overrides automatic
// (to compare, or to route around a kernel; a choice that cannot take the
// call is an error). All five are deterministic by default: cuDNN's backward
// is then built as the variant without an atomic dQ accumulator (the GPU
// test checks that it repeats bit for bit), which keeps every head's score
// gradients in its workspace (B x Hq x T^2 bf16 on an H100) and reads them
// back for dQ. A backward called with deterministic = false lets cuDNN add
// each key tile's share of dQ into an f32 accumulator with atomics instead
// (cudnn_sdpa.h, SdpaBackward::atomic): no (T, T) workspace and no second
// pass over it, but dQ's last bits vary from run to run. Our own kernels
// stay deterministic either way.
enum class AttentionKernel { automatic, cudnn, mma, flash, gemm, simple };
// Reads and checks ZT_CUDA_ATTENTION, ZT_CUDNN_FORWARD_CONFIG and
// ZT_CUDNN_BACKWARD_CONFIG now (each is read once, on first use otherwise).
// No GPU needed.
void read_attention_environment();
constexpr int64_t kAttentionWorkspaceBudget = int64_t(1) << 30;  // bytes

// What the choice of kernel and a call's workspace depend on: q (B, T, Hq, D)
// and k (B, Tk, Hkv, D), their dtype and device, the mask.
struct AttentionShape {
  int64_t B = 0, T = 0, Hq = 0, Hkv = 0, D = 0;
  DType dtype = DType::bf16;
  Device device;
  // 0: q, k, v (and dq, dk, dv) are tensors of their own. Else they are the
  // heads of one (B, T, Hq + 2 Hkv, D) tensor, a fused qkv product's output,
  // and this is its row, (Hq + 2 Hkv) D elements: cuDNN reads and writes
  // them in place; the other kernels run on copies (attention_forward_packed).
  int64_t qkv_row = 0;
  bool causal = true;  // else every query sees all Tk keys
  int64_t Tk = 0;      // keys when not causal (0: T)
  int64_t keys() const { return Tk > 0 ? Tk : T; }
};
AttentionShape attention_shape(const Tensor& q, const Tensor& k, bool causal = true);
// The shape of a call on the heads of qkv (B, T, Hq + 2 Hkv, D).
AttentionShape packed_attention_shape(const Tensor& qkv, int64_t Hq, int64_t Hkv);

// A call's direction and, for a backward, its algorithm (above): what cuDNN's
// plan and a call's workspace depend on besides the shape.
struct AttentionPass {
  bool backward = false;
  bool deterministic = true;  // a backward's; false: cuDNN may sum dQ with atomics
  bool atomic() const { return backward && !deterministic; }
};

// The device memory one call of this shape allocates for itself (bytes,
// MemCategory::workspace, freed when it returns), with the kernel the
// dispatcher picks for 16-byte-aligned tensors: what the memory plan counts.
// The large one is cuDNN's backward: its deterministic engine keeps the
// score gradients of every head, B x Hq x T^2 bf16 on an H100 (3 GiB for
// GPT-2 at B = 128, T = 1024; run in batch chunks within
// kAttentionWorkspaceBudget); the atomic one an f32 dQ accumulator,
// B x T x Hq x D (384 MiB there), plus GQA's per-query-head dK and dV.
// Builds and caches cuDNN's plans for the shape.
int64_t attention_workspace_bytes(const AttentionShape& s, float scale, AttentionPass pass);

// scale is resolved by the ops layer (> 0). causal = false: k, v (B, Tk,
// Hkv, D) an unmasked block (cudnn or simple).
void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       float scale, AttentionKernel kernel = AttentionKernel::automatic, bool causal = true);
void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale,
                        AttentionKernel kernel = AttentionKernel::automatic, bool deterministic = true,
                        bool causal = true);

// The same with q, k, v as the heads of qkv (B, T, Hq + 2 Hkv, D), and the
// backward's dq, dk, dv written into dqkv of that shape: a fused qkv
// product's output and its input gradient. cuDNN takes them in place; any
// other kernel runs on copies split off before the call and joined after it
// (a strided copy per run of heads; workspace: attention_workspace_bytes of
// packed_attention_shape counts them).
void attention_forward_packed(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t Hq, int64_t Hkv,
                              float scale, AttentionKernel kernel = AttentionKernel::automatic);
void attention_backward_packed(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                               const Tensor& lse, int64_t Hq, int64_t Hkv, float scale,
                               AttentionKernel kernel = AttentionKernel::automatic, bool deterministic = true);

// The gemm implementation (attention_gemm.cu), and whether a shape's score
// matrices for one kv head's group fit the workspace budget (bytes; tests
// pass a small one to exercise the head chunks).
bool gemm_attention_fits(const AttentionShape& s, bool backward, int64_t budget = kAttentionWorkspaceBudget);
// Its workspace for a shape that fits (bytes): one head chunk's score matrices
// (and in bf16/f16 backward the f32 dK, dV sums).
int64_t gemm_attention_workspace_bytes(const AttentionShape& s, bool backward,
                                       int64_t budget = kAttentionWorkspaceBudget);
void gemm_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                            float scale, int64_t budget = kAttentionWorkspaceBudget);
void gemm_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                             const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse, float scale,
                             int64_t budget = kAttentionWorkspaceBudget);

// The fused implementations (attention_mma.cu, attention_flash.cu), and why
// each cannot take a shape (empty when it can).
std::string mma_attention_unsupported(const AttentionShape& s);
void mma_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                           float scale);
void mma_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                            const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                            float scale);
std::string flash_attention_unsupported(const AttentionShape& s);
void flash_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             float scale);
void flash_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              float scale);

// cuDNN's fused attention (attention_cudnn.cu), why it cannot take a call
// (empty when it can; builds and caches the plan for the shape on first use),
// and the most workspace a call allocates (bytes: a plan's, the backward's
// row sums and the atomic backward's dQ accumulator). A batch whose workspace
// exceeds `budget` (the deterministic backward keeps B x Hq x T^2 bf16 on an
// H100: 3 GiB for GPT-2 at B = 128) runs in equal chunks of sequences that
// fit it; a single sequence over it is a reason cuDNN cannot take the call
// (the mma kernel's memory is O(T)).
std::string cudnn_attention_unsupported(const AttentionShape& s, float scale, AttentionPass pass,
                                        int64_t budget = kAttentionWorkspaceBudget);
// ZT_CUDNN_FORWARD_CONFIG and _BACKWARD_CONFIG read and checked (nothing
// without cuDNN).
void cudnn_read_environment();
int64_t cudnn_attention_workspace_bytes(const AttentionShape& s, float scale, AttentionPass pass,
                                        int64_t budget = kAttentionWorkspaceBudget);
void cudnn_attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                             float scale, int64_t budget = kAttentionWorkspaceBudget, bool causal = true);
void cudnn_attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                              const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                              float scale, int64_t budget = kAttentionWorkspaceBudget, bool deterministic = true,
                              bool causal = true);
void cudnn_attention_forward_packed(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t Hq, int64_t Hkv,
                                    float scale, int64_t budget = kAttentionWorkspaceBudget);
void cudnn_attention_backward_packed(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                     const Tensor& lse, int64_t Hq, int64_t Hkv, float scale,
                                     int64_t budget = kAttentionWorkspaceBudget, bool deterministic = true);

// ops::attention_merge (attention_merge.cu): out (B, T, H, D) f32, lse
// (B, H, T) f32 at rows [row0, row0 + n) merged with part (B, n, H, D) and
// part_lse (B, H, n) f32; a warp per row.
void attention_merge(const Tensor& out, const Tensor& lse, const Tensor& part, const Tensor& part_lse, int64_t row0);

// delta[b, h, t] = dout[b, t, h, :] . out[b, t, h, :] in f32, (B, Hq, T): the
// softmax-backward row term, shared by the simple and fused backward passes.
void attention_delta(const Tensor& delta, const Tensor& dout, const Tensor& out);

}  // namespace zt::cuda
