// CUDA GQA attention: the dispatcher, the packed calls' head copies, and the
// launches of the simple exact kernels (attention_simple_kernels.cuh).
//
// Layouts: q, out, dq (B, T, Hq, D); k, v, dk, dv (B, Tk, Hkv, D); lse (B, Hq, T).
#include "backend/cuda/attention.h"

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>

#include "backend/cuda/attention_simple_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/runtime.h"

namespace zt::cuda {

namespace {

using namespace simple_kernels;

Dims dims_of(const Tensor& q, const Tensor& k, bool causal) {
  return {q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), k.size(1), causal};
}

unsigned blocks_for(int64_t rows) { return unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

void check_head_dim(const Dims& d) {
  ZT_CHECK(d.D <= 32 * kMaxPerLane, "attention: head dim ", d.D, " is larger than the CUDA kernel's limit ",
           32 * kMaxPerLane, "; use a model with head_dim <= 256");
}

// The kernel ZT_CUDA_ATTENTION asks automatic callers to use (automatic when unset).
AttentionKernel environment_choice() {
  static const AttentionKernel choice = [] {
    const char* env = std::getenv("ZT_CUDA_ATTENTION");
    const std::string_view v = env ? env : "";
    if (v.empty() || v == "auto") return AttentionKernel::automatic;
    if (v == "cudnn") return AttentionKernel::cudnn;
    if (v == "mma") return AttentionKernel::mma;
    if (v == "flash") return AttentionKernel::flash;
    if (v == "gemm") return AttentionKernel::gemm;
    if (v == "simple") return AttentionKernel::simple;
    ZT_FAIL("ZT_CUDA_ATTENTION = '", v, "' is not one of cudnn, mma, flash, gemm, simple; unset it to let Zettatron choose");
  }();
  return choice;
}

const char* name_of(AttentionKernel kernel) {
  switch (kernel) {
    case AttentionKernel::cudnn: return "cudnn";
    case AttentionKernel::mma: return "mma";
    case AttentionKernel::flash: return "flash";
    case AttentionKernel::gemm: return "gemm";
    case AttentionKernel::simple: return "simple";
    default: return "automatic";
  }
}

// The automatic choice, said the first time each kernel runs each direction
// (so a shape cuDNN does not take is reported with cuDNN's reason): which
// kernel runs attention is a large part of a step's time.
void report_choice(AttentionPass pass, AttentionKernel chosen, const std::string& why_not_cudnn) {
  static std::mutex mu;
  static unsigned seen = 0;  // bit (kernel, direction, algorithm)
  const bool backward = pass.backward, atomic = pass.atomic() && chosen == AttentionKernel::cudnn;
  const unsigned bit = 1u << (4 * unsigned(chosen) + 2 * unsigned(backward) + unsigned(atomic));
  std::lock_guard<std::mutex> lock(mu);
  if (seen & bit) return;
  seen |= bit;
  const std::string note = why_not_cudnn.empty() ? "" : " (not cuDNN: " + why_not_cudnn + ")";
  std::fprintf(stderr, "zettatron: attention %s uses the %s kernel%s%s\n", backward ? "backward" : "forward",
               name_of(chosen), atomic ? " with dq summed by atomics (train.deterministic = false)" : "",
               note.c_str());
}

// Why a fused kernel (cudnn, mma, flash) cannot take a shape (empty when it can).
std::string fused_blocker(AttentionKernel kernel, AttentionPass pass, float scale, const AttentionShape& s) {
  switch (kernel) {
    case AttentionKernel::cudnn: return cudnn_attention_unsupported(s, scale, pass);
    case AttentionKernel::mma: return mma_attention_unsupported(s);
    default: return flash_attention_unsupported(s);
  }
}

// The kernel for a call: `kernel`, else ZT_CUDA_ATTENTION, else the first
// fused kernel that takes it, else gemm where its workspace fits, else
// simple (at once for a decoding step's single unmasked query row). The
// fused kernels need 16-byte-aligned tensors (`aligned`).
// `report`: say the automatic choice (calls do; the memory plan's query not).
AttentionKernel choose(AttentionKernel kernel, AttentionPass pass, float scale, const AttentionShape& s, bool aligned,
                       bool report) {
  const std::string misaligned = aligned ? "" : "a tensor is not 16-byte aligned";
  if (kernel == AttentionKernel::automatic) kernel = environment_choice();
  ZT_CHECK(s.causal || kernel != AttentionKernel::gemm, "attention: the gemm kernel cannot take this call: it is "
           "causal only, and this is an unmasked key block (context parallelism); choose cudnn or simple "
           "(ZT_CUDA_ATTENTION), or unset ZT_CUDA_ATTENTION to let Zettatron choose");
  if (kernel == AttentionKernel::gemm || kernel == AttentionKernel::simple) return kernel;
  if (kernel != AttentionKernel::automatic) {
    const std::string blocker = aligned ? fused_blocker(kernel, pass, scale, s) : misaligned;
    ZT_CHECK(blocker.empty(), "attention: the ", name_of(kernel), " kernel cannot take this call: ", blocker,
             "; choose another (ZT_CUDA_ATTENTION), or unset ZT_CUDA_ATTENTION to let Zettatron choose");
    return kernel;
  }
  // A decoding step's one query row against a KV cache (unmasked, one more
  // key each step): cuDNN would build a plan for each key count (about a
  // second each), and a fused kernel's tiles of queries would hold one row.
  // The simple kernel's warp per query row takes it as it comes.
  if (!s.causal && s.T == 1) {
    if (report) report_choice(pass, AttentionKernel::simple, "a single query row, as a KV cache's decoding step");
    return AttentionKernel::simple;
  }
  std::string why_not_cudnn;
  AttentionKernel chosen = AttentionKernel::automatic;
  for (const AttentionKernel fused : {AttentionKernel::cudnn, AttentionKernel::mma, AttentionKernel::flash}) {
    const std::string blocker = aligned ? fused_blocker(fused, pass, scale, s) : misaligned;
    if (blocker.empty()) {
      chosen = fused;
      break;
    }
    if (fused == AttentionKernel::cudnn) why_not_cudnn = blocker;
  }
  if (chosen == AttentionKernel::automatic)
    chosen = s.causal && gemm_attention_fits(s, pass.backward) ? AttentionKernel::gemm : AttentionKernel::simple;
  if (report) report_choice(pass, chosen, why_not_cudnn);
  return chosen;
}

bool all_aligned(std::initializer_list<const Tensor*> all) {
  bool aligned = true;
  for (const Tensor* t : all) aligned = aligned && reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 == 0;
  return aligned;
}

AttentionKernel choose_for_call(AttentionKernel kernel, AttentionPass pass, float scale, const Tensor& q,
                                const Tensor& k, bool causal, std::initializer_list<const Tensor*> all) {
  return choose(kernel, pass, scale, attention_shape(q, k, causal), all_aligned(all), true);
}

// A packed call (q, k, v the heads of one tensor) for the kernel: cuDNN
// reads them in place where the heads start 16-byte aligned; else none.
AttentionKernel choose_for_packed_call(AttentionKernel kernel, AttentionPass pass, float scale,
                                       const AttentionShape& s, std::initializer_list<const Tensor*> all) {
  const int64_t head_bytes = s.D * int64_t(dtype_size(s.dtype));
  const bool heads_aligned = (s.Hq * head_bytes) % 16 == 0 && (s.Hkv * head_bytes) % 16 == 0;
  return choose(kernel, pass, scale, s, all_aligned(all) && heads_aligned, true);
}

// The bytes of q, k and v copied apart for a kernel that cannot read them in place.
int64_t split_bytes(const AttentionShape& s) {
  return s.B * s.T * (s.Hq + 2 * s.Hkv) * s.D * int64_t(dtype_size(s.dtype));
}

// Each token's run of heads [h0, h0 + H) of packed (B, T, Hp, D), copied
// into part (B, T, H, D), or from it when into_packed: one strided copy on
// the compute stream, exact for any D.
void copy_head_run(const Tensor& packed, int64_t h0, const Tensor& part, bool into_packed) {
  const size_t es = dtype_size(packed.dtype()), tokens = size_t(packed.size(0) * packed.size(1));
  const size_t width = size_t(part.size(2) * part.size(3)) * es, pitch = size_t(packed.size(2) * packed.size(3)) * es;
  char* run = static_cast<char*>(packed.data_ptr()) + size_t(h0 * packed.size(3)) * es;
  void* dst = into_packed ? static_cast<void*>(run) : part.data_ptr();
  const void* src = into_packed ? part.data_ptr() : static_cast<const void*>(run);
  copy_bytes_2d(dst, into_packed ? pitch : width, src, into_packed ? width : pitch, width, tokens, part.device());
}

// q, k, v copied out of qkv's heads (workspace: attention_workspace_bytes counts them).
struct SplitHeads {
  Tensor q, k, v;
};
SplitHeads split_heads(const Tensor& qkv, int64_t Hq, int64_t Hkv) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(3);
  auto make = [&](int64_t H) {
    return Tensor::empty(Shape{B, T, H, D}, qkv.dtype(), qkv.device(), MemCategory::workspace);
  };
  SplitHeads h{make(Hq), make(Hkv), make(Hkv)};
  copy_head_run(qkv, 0, h.q, false);
  copy_head_run(qkv, Hq, h.k, false);
  copy_head_run(qkv, Hq + Hkv, h.v, false);
  return h;
}

// dqkv's heads from a split call's gradients.
void join_heads(const Tensor& dqkv, const SplitHeads& g) {
  copy_head_run(dqkv, 0, g.q, true);
  copy_head_run(dqkv, g.q.size(2), g.k, true);
  copy_head_run(dqkv, g.q.size(2) + g.k.size(2), g.v, true);
}

// Empty tensors like h's, for the gradients of a split call.
SplitHeads like(const SplitHeads& h) {
  auto make = [](const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device(), MemCategory::workspace); };
  return {make(h.q), make(h.k), make(h.v)};
}

}  // namespace

void read_attention_environment() {
  (void)environment_choice();
  cudnn_read_environment();
}

AttentionShape attention_shape(const Tensor& q, const Tensor& k, bool causal) {
  return {q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), q.dtype(), q.device(), 0, causal, k.size(1)};
}

AttentionShape packed_attention_shape(const Tensor& qkv, int64_t Hq, int64_t Hkv) {
  return {qkv.size(0), qkv.size(1), Hq, Hkv, qkv.size(3), qkv.dtype(), qkv.device(), qkv.size(2) * qkv.size(3)};
}

int64_t attention_workspace_bytes(const AttentionShape& s, float scale, AttentionPass pass) {
  const int64_t rows = s.B * s.Hq * s.T;
  const AttentionKernel kernel = choose(AttentionKernel::automatic, pass, scale, s, true, false);
  if (kernel == AttentionKernel::cudnn) return cudnn_attention_workspace_bytes(s, scale, pass);
  // The other kernels read separate tensors: a packed call's copies of q, k,
  // v (and the backward's dq, dk, dv) are its workspace too.
  AttentionShape separate = s;
  separate.qkv_row = 0;
  const int64_t copies = s.qkv_row == 0 ? 0 : (pass.backward ? 2 : 1) * split_bytes(s);
  switch (kernel) {
    case AttentionKernel::gemm: return copies + gemm_attention_workspace_bytes(separate, pass.backward);
    default: return copies + (pass.backward ? 4 * rows : 0);  // mma, flash, simple: the backward's f32 delta
  }
}

void attention_forward_packed(const Tensor& out, const Tensor& lse, const Tensor& qkv, int64_t Hq, int64_t Hkv,
                              float scale, AttentionKernel kernel) {
  const AttentionShape s = packed_attention_shape(qkv, Hq, Hkv);
  const AttentionKernel chosen = choose_for_packed_call(kernel, AttentionPass{}, scale, s, {&out, &lse, &qkv});
  if (chosen == AttentionKernel::cudnn) return cudnn_attention_forward_packed(out, lse, qkv, Hq, Hkv, scale);
  // The kernel chosen for the packed call (what attention_workspace_bytes counts), on copies.
  const SplitHeads h = split_heads(qkv, Hq, Hkv);
  attention_forward(out, lse, h.q, h.k, h.v, scale, chosen);
}

void attention_backward_packed(const Tensor& dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                               const Tensor& lse, int64_t Hq, int64_t Hkv, float scale, AttentionKernel kernel,
                               bool deterministic) {
  const AttentionShape s = packed_attention_shape(qkv, Hq, Hkv);
  const AttentionKernel chosen = choose_for_packed_call(kernel, AttentionPass{true, deterministic}, scale, s,
                                                        {&dqkv, &dout, &qkv, &out, &lse});
  if (chosen == AttentionKernel::cudnn)
    return cudnn_attention_backward_packed(dqkv, dout, qkv, out, lse, Hq, Hkv, scale, kAttentionWorkspaceBudget,
                                           deterministic);
  const SplitHeads h = split_heads(qkv, Hq, Hkv), g = like(h);
  attention_backward(g.q, g.k, g.v, dout, h.q, h.k, h.v, out, lse, scale, chosen, deterministic);
  join_heads(dqkv, g);
}

void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k, const Tensor& v,
                       float scale, AttentionKernel kernel, bool causal) {
  switch (choose_for_call(kernel, AttentionPass{}, scale, q, k, causal, {&out, &lse, &q, &k, &v})) {
    case AttentionKernel::cudnn:
      return cudnn_attention_forward(out, lse, q, k, v, scale, kAttentionWorkspaceBudget, causal);
    case AttentionKernel::mma: return mma_attention_forward(out, lse, q, k, v, scale);
    case AttentionKernel::flash: return flash_attention_forward(out, lse, q, k, v, scale);
    case AttentionKernel::gemm: return gemm_attention_forward(out, lse, q, k, v, scale);
    default: break;
  }
  const Dims d = dims_of(q, k, causal);
  check_head_dim(d);
  const int64_t rows = d.B * d.Hq * d.T;
  if (rows == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(q.dtype(), "attention_forward", [&] {
    attn_fwd_kernel<T><<<blocks_for(rows), 32 * kWarpsPerBlock, 0, stream_of(out)>>>(
        static_cast<T*>(out.data_ptr()), lse.data<float>(), static_cast<const T*>(q.data_ptr()),
        static_cast<const T*>(k.data_ptr()), static_cast<const T*>(v.data_ptr()), d, scale);
  });
  ZT_CUDA_CHECK_LAUNCH("attn_fwd_kernel");
}

void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout, const Tensor& q,
                        const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, float scale,
                        AttentionKernel kernel, bool deterministic, bool causal) {
  switch (choose_for_call(kernel, AttentionPass{true, deterministic}, scale, q, k, causal,
                          {&dq, &dk, &dv, &dout, &q, &k, &v, &out, &lse})) {
    case AttentionKernel::cudnn:
      return cudnn_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale, kAttentionWorkspaceBudget,
                                      deterministic, causal);
    case AttentionKernel::mma: return mma_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale);
    case AttentionKernel::flash: return flash_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale);
    case AttentionKernel::gemm: return gemm_attention_backward(dq, dk, dv, dout, q, k, v, lse, scale);
    default: break;
  }
  const Dims d = dims_of(q, k, causal);
  check_head_dim(d);
  const int64_t rows = d.B * d.Hq * d.T, kv_rows = d.B * d.Hkv * d.Tk;
  if (rows == 0) return;
  Tensor delta = Tensor::empty(Shape{rows}, DType::f32, q.device(), MemCategory::workspace);
  attention_delta(delta, dout, out);
  cudaStream_t s = stream_of(dq);
  const int threads = 32 * kWarpsPerBlock;
  ZT_CUDA_DISPATCH_FLOAT(q.dtype(), "attention_backward", [&] {
    const T* qp = static_cast<const T*>(q.data_ptr());
    const T* kp = static_cast<const T*>(k.data_ptr());
    const T* vp = static_cast<const T*>(v.data_ptr());
    const T* dop = static_cast<const T*>(dout.data_ptr());
    attn_dq_kernel<T><<<blocks_for(rows), threads, 0, s>>>(static_cast<T*>(dq.data_ptr()), dop, qp, kp, vp,
                                                           lse.data<float>(), delta.data<float>(), d, scale);
    ZT_CUDA_CHECK_LAUNCH("attn_dq_kernel");
    attn_dkdv_kernel<T><<<blocks_for(kv_rows), threads, 0, s>>>(static_cast<T*>(dk.data_ptr()),
                                                                static_cast<T*>(dv.data_ptr()), dop, qp, kp, vp,
                                                                lse.data<float>(), delta.data<float>(), d, scale);
    ZT_CUDA_CHECK_LAUNCH("attn_dkdv_kernel");
  });
}

void attention_delta(const Tensor& delta, const Tensor& dout, const Tensor& out) {
  const Dims d{out.size(0), out.size(1), out.size(2), out.size(2), out.size(3), out.size(1), true};
  const int64_t rows = d.B * d.Hq * d.T;
  if (rows == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(out.dtype(), "attention_delta", [&] {
    attn_delta_kernel<T><<<blocks_for(rows), 32 * kWarpsPerBlock, 0, stream_of(delta)>>>(
        delta.data<float>(), static_cast<const T*>(dout.data_ptr()), static_cast<const T*>(out.data_ptr()), d);
  });
  ZT_CUDA_CHECK_LAUNCH("attn_delta_kernel");
}

}  // namespace zt::cuda
