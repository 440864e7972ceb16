// CUDA kernels for matrix multiplication and the linear layer (validated
// arguments only; the checks live in src/ops/matmul.cpp). Host-only header.
//
// Same math as backend/cpu/matmul.h, for every batch entry i:
//   out_i = alpha * op(a_i) @ op(b_i) + beta * out_i + bias      (bias broadcast over rows)
// through cuBLASLt with f32 accumulation (CUBLAS_COMPUTE_32F: true fp32 for
// f32 operands, never TF32; bf16 operands on tensor cores, accumulated in f32).
//
// Linear backward (y = x W^T + b):
//   dx  = dy @ W        dW += dy^T @ x        db += sum over rows of dy
// db is summed in an order fixed by the shape alone (deterministic bits).
#pragma once

#include <string>

#include "backend/cpu/matmul.h"  // GemmDesc: a plain struct shared by both backends
#include "backend/cuda/matmul_plans.h"  // kMatmulCandidates
#include "core/tensor.h"

namespace zt::cuda {

// The CPU backend's descriptor (so ops/ fills one for both). Argument-dependent
// lookup also finds cpu::matmul for it: call this one as cuda::matmul.
using GemmDesc = cpu::GemmDesc;

// a: batch x (M, K) or (K, M); b: [batch x] (K, N) or (N, K); out: batch x (M, N);
// bias: (N) or undefined. a, b f32 or bf16 (same); out f32 or a's dtype; bias f32 or out's.
// beta = 0 never reads out. All on one GPU; runs on its compute stream.
// c (out's shape and dtype, disjoint from out) or undefined: beta scales c
// instead of out - cuBLASLt's C apart from its D (out = x W^T + b + residual
// in one product: linear_forward's residual); cuBLAS's own GEMM, which has
// no D apart from C, is then not a candidate.
void matmul(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmDesc& d,
            const Tensor& c = {});

// One strided-batched product over explicit row-major layouts (the per-head
// matrices inside (B, T, H, D) tensors): for i < batch,
//   C_i = alpha * op(A_i) @ op(B_i) + beta * C_i
// A_i starts at a + i * stride_a elements, its rows lda elements apart
// (stored (M, K), or (K, M) when trans_a); likewise B_i ((K, N) or (N, K))
// and C_i ((M, N)). stride_b = 0 shares B. a, b f32 or bf16 (ab); out f32 or
// ab. beta = 0 never reads C. On the device's compute stream; plans cached.
struct StridedGemm {
  int64_t M = 0, N = 0, K = 0, batch = 1;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.0f, beta = 0.0f;
};
void strided_gemm(const StridedGemm& g, DType ab, const void* a, const void* b, DType out_type, void* out,
                  Device device);

// out (M, N) = gelu'(pre) * (a @ b), a (M, K), b (K, N), pre (M, N), one dtype:
// one cuBLASLt product with the DGELU epilogue (the f32 accumulator times
// gelu'(pre), rounded once). Returns false, having launched nothing, when
// cuBLASLt has no algorithm for it or N is not a multiple of 8 (the epilogue's
// leading-dimension rule): the caller then runs matmul and gelu_backward.
bool matmul_gelu_backward(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& pre);

// pre (..., OC) = x (..., C) W^T + b and act = gelu(pre) (tanh), w (OC, C),
// b (OC) or undefined, one dtype: one cuBLASLt product with the GELU_AUX
// (_BIAS) epilogue, act its output and pre its auxiliary one (each rounded
// once from the f32 accumulator). Returns false, having launched nothing,
// when cuBLASLt has no algorithm for it or OC is not a multiple of 8: the
// caller then runs linear_forward and gelu_forward. Its bits are cuBLASLt's
// GeLU's, not gelu_forward's.
bool linear_gelu_forward(const Tensor& act, const Tensor& pre, const Tensor& x, const Tensor& w, const Tensor& b);
// Whether ops::linear_gelu_forward takes it: ZT_CUDA_GELU_EPILOGUE=1 (off by
// default until a GPU has measured it).
bool gelu_epilogue_on();

// Reads and checks every ZT_CUDA_* switch of the products now
// (ZT_CUDA_MATMUL_TUNE, _MATMUL_CUBLAS, _MATMUL_PLANS (the file read),
// _GELU_EPILOGUE, _BGRAD_EPILOGUE, _WGRAD_CHUNKS, _CUBLAS_WORKSPACE_MIB):
// each is read once, on first use otherwise. No GPU needed.
void read_matmul_environment();

// out (M, N) = [beta * c +] (a sa) (M, K) @ ((b sb) (N, K))^T [+ bias (N)]
// on the fp8 tensor cores (Hopper): one cuBLASLt product with the operands'
// scales as its A/B scale pointers. a (..., K) with M = a.numel() / K rows,
// b (N, K), both K-major (the only fp8 layout cuBLASLt takes: transpose an
// operand first, fp8.h), f8e4m3 or f8e5m2 and not both e5m2; a_scale_inv,
// b_scale_inv (1) f32 on the device; out f32 or bf16, rows of N; bias (N)
// or undefined, in the epilogue when bf16 and 16-byte aligned, else added
// from an f32 prefill; c out's layout and dtype, or undefined: beta then
// scales out itself (beta 1: dW's accumulation). f32 accumulation, out
// rounded once. Returns false, out untouched, where cuBLASLt offers or runs
// no fp8 algorithm (an empty product, a dimension that is not a multiple of
// 16, an unaligned operand): the caller dequantises.
bool fp8_matmul(const Tensor& out, const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                const Tensor& b_scale_inv, const Tensor& bias, const Tensor& c, float beta);
int64_t fp8_matmul_launches();  // fp8 products this process ran on the tensor cores

// dy: (N, OC), x: (N, C), w: (OC, C), same dtype (f32 or bf16).
// dx: (N, C) overwritten; dw: (OC, C) +=; db: (OC) += (overwrite: dw and db
// written, not read); each may be undefined. dW runs through
// weight_gradient in wgrad_row_chunks chunks, db through colsum.h; with
// ZT_CUDA_BGRAD_EPILOGUE=1 both through weight_gradient_with_bias where it
// applies (one chunk).
void linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, bool overwrite = false);

// dw (OC, C) += dy^T x over dy (N, OC) and x (N, C), as `chunks` products
// over equal chunks of rows in one strided batch, into f32 partials added
// into dw in chunk order with one rounding (add_chunk_partials); 1: one
// product (beta 0 when overwriting). Chunks must be wgrad_chunks_usable.
void weight_gradient(const Tensor& dw, const Tensor& dy, const Tensor& x, int64_t chunks, bool overwrite = false);

// dw (OC, C) += dy^T x (= when overwriting) and db (OC) += dy's column sums
// in one cuBLASLt product, its BGRADB epilogue summing dy's columns as the
// product reads them: no pass over dy for db (GPT-2 at micro-batch 128
// reads 1.8 GB of dy a layer for its four biases). dw f32 (the sums take
// out's type); db any float type: the sums straight into an f32 db that is
// overwritten, else into an f32 scratch added once (add_chunk_partials).
// The sums' order is the algorithm's, fixed per plan (the same bits every
// run), not colsum.h's. Returns false, having launched nothing, where it
// does not apply (dw not f32, an empty product, no algorithm with the
// epilogue): the caller then runs weight_gradient and colsum_accumulate.
// Opt-in (ZT_CUDA_BGRAD_EPILOGUE=1) until measured.
bool weight_gradient_with_bias(const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                               bool overwrite = false);

// The row chunks of dW += dy^T x. A dW whose (OC, C) output has fewer
// 128 x 128 tiles than half the GPU's SMs leaves most of it idle over a long
// loop of rows (GPT-2's 768 x 768 weights over 131072 rows: 36 tiles for
// 132 SMs; 37.7% of the GEMM rate measured at 16384 rows). Chunks multiply
// the tiles in flight; their partials cost memory traffic. wgrad_chunks_for
// picks the count of most modelled throughput: tiles x chunks over whole
// waves of SMs, over 1 + the partials' traffic in GEMM time (at
// kGemmFlopsPerCopyByte, an H100's 777 TFLOP/s over 2980 GB/s). From
// kWgradOneProductRows rows on, one product: cuBLASLt splits a reduction that
// long itself (H200, 2026-11-27: 768 x 768 over 131072 rows in one product
// 0.222 ms, 88% of the GEMM rate, against 0.228-0.304 ms in 2 to 64 chunks;
// Llama's 512 x 2048 over 32768 rows the same in 1 or 2). A function of the
// shape and the SM count only: the same bits every run on one GPU model.
// ZT_CUDA_WGRAD_CHUNKS = n forces n where usable, on the products with few
// tiles only (1: never split).
constexpr int64_t kWgradMinChunkRows = 2048, kWgradMaxChunks = 64, kWgradOneProductRows = 32768;
constexpr double kGemmFlopsPerCopyByte = 256.0;
bool wgrad_chunks_usable(int64_t chunks, int64_t rows);  // equal, 8-row aligned, >= kWgradMinChunkRows rows
int64_t wgrad_chunks_for(int64_t OC, int64_t C, int64_t rows, int64_t sms);
int64_t wgrad_row_chunks(int64_t OC, int64_t C, int64_t rows, Device device);
// The workspace one linear_backward of these sizes allocates for itself
// (bytes): the dW partials, the db column sum's, or the bias epilogue's sums
// (ZT_CUDA_BGRAD_EPILOGUE).
int64_t linear_backward_workspace_bytes(int64_t OC, int64_t C, int64_t rows, bool bias, Device device);

// cuBLASLt's heuristic ranks the algorithms it has for a product, and plans
// take its first. While a MatmulCandidateScope lives, the products its
// thread launches take exactly the heuristic's candidate n (from 0; neither
// tuning nor ZT_CUDA_MATMUL_CUBLAS applies), each in a plan of its own, or
// with n = kCublasCandidate cuBLAS's own GEMM
// (cublasGemmEx: its own heuristic over the same kernels, reductions in f32,
// no atomics; products without an epilogue only). The kernel bench times
// every candidate against the first, to say whether choosing algorithms by
// measurement would pay, and a GPU test checks that each computes the
// product. A product with no candidate n (the list ended; cuBLAS's GEMM on a
// product with a bias or GeLU epilogue) throws zt::Error (where a sweep
// ends) instead of launching it (an f32 bias prefill, where the bias needs
// one, may have run).
//
// Why cuBLAS's own GEMM: on an H200 (2026-11-27) PyTorch's products, which
// go through it, beat the fastest of cuBLASLt's first 8 ranked algorithms on
// long reductions into small outputs: Llama's mlp.in input gradient 0.714 ms
// against 0.807, its LM-head input gradient 1.341 against 1.441
// (bench/results/gpu-2026-11-27.md). ZT_CUDA_MATMUL_CUBLAS=1 runs every
// product without an epilogue through it (deterministic too: a fixed
// heuristic's choice), for training A/B runs.
//
// Tuning: a plan times every candidate the heuristic ranks, and cuBLAS's
// GEMM where it applies, on its first call's operands (a few launches each;
// an accumulating product into a scratch of its output's size) and keeps the
// fastest for the process. The clock chooses, so two processes may choose
// differently and compute different bits: a tuned run is not bitwise
// repeatable, and products tune only while bitwise repetition is not asked
// for (deterministic() false, core/determinism.h: train.deterministic =
// false; on an H200 tuning over 8 candidates gave GPT-2 +0.6% and Llama
// +1.1% tokens/s, bench/results/gpu-2026-11-27.md). Tuned and untuned plans
// are cached apart, so a deterministic step never takes an algorithm the
// clock chose in its own process (only one a plans file names, below).
// ZT_CUDA_MATMUL_TUNE in the environment overrides: 1 tunes always, 0 never;
// tuning wins over ZT_CUDA_MATMUL_CUBLAS. The scratch of an accumulating
// product is outside the memory plan (Llama 1B's LM-head dW: 1 GiB of f32,
// once, on the first step).
//
// Tuned and repeatable: with ZT_CUDA_MATMUL_PLANS = a file path, a plan that
// tunes appends its choice to that file (matmul_plans.h: the GPU, the
// cuBLASLt version and the product name it), and an untuned product that
// the file names takes the recorded choice instead of the heuristic's first
// (or of ZT_CUDA_MATMUL_CUBLAS). A deterministic run with a fixed file takes
// the same algorithms every run, so its bits repeat: tune once (a short run
// with train.deterministic = false), then train deterministically with the
// tuned products. A MatmulCandidateScope ignores the file.
constexpr int kCublasCandidate = kMatmulCandidates;  // cuBLAS's own GEMM (cuBLASLt's: 0 .. kMatmulCandidates - 1)
int64_t tuned_matmul_plans();    // plans whose candidates this process has timed
int64_t cublas_matmul_launches();  // products this process ran through cuBLAS's own GEMM
int64_t replayed_matmul_plans();   // products that took a choice the plans file records
// Products whose bias or separate c took the f32 prefill pass (a pass of its
// own over the output) because cuBLASLt offered or ran no algorithm with the
// bias epilogue or C apart from D: a model's products should take none.
int64_t prefilled_matmul_launches();
// The algorithm of the last product this thread launched, for the kernel
// bench: "cublas", or cuBLASLt's configuration ("algo 66 tile 20 stages 35
// splitk 1 reduction 0 swizzle 0 cluster 2 inner 0 custom 0"; the numbers
// are cublasLt.h's enum values); "" before any.
std::string last_matmul_algorithm();
class MatmulCandidateScope {
 public:
  explicit MatmulCandidateScope(int candidate);
  ~MatmulCandidateScope();
  MatmulCandidateScope(const MatmulCandidateScope&) = delete;
  MatmulCandidateScope& operator=(const MatmulCandidateScope&) = delete;

 private:
  int previous_;
};

// While a MatmulWorkspaceScope lives, the products its thread launches ask
// cuBLASLt's heuristic for algorithms that fit `workspace` (a GPU tensor the
// caller owns, not the device's 32 MiB) and run with it, each in a plan of
// its own: the kernel bench's A/B of how much split-K algorithms gain from a
// larger workspace (a long reduction over a small output, as the LM head's
// input gradient, may want more than 32 MiB of f32 partials).
class MatmulWorkspaceScope {
 public:
  explicit MatmulWorkspaceScope(const Tensor& workspace);
  ~MatmulWorkspaceScope();
  MatmulWorkspaceScope(const MatmulWorkspaceScope&) = delete;
  MatmulWorkspaceScope& operator=(const MatmulWorkspaceScope&) = delete;

 private:
  void* previous_;
  uint64_t previous_bytes_;
};

// Measured dense bf16 GEMM throughput of `device` in TFLOP/s: an
// 8192 x 8192 x 8192 product (bf16 in and out, f32 accumulation), median of
// 10 timed runs after warm-up. The MFU denominator on GPUs without a known
// datasheet peak. Synchronises the device; takes ~0.1 s and 384 MiB.
double measure_bf16_gemm_tflops(Device device);

}  // namespace zt::cuda
