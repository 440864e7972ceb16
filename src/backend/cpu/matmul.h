// CPU kernels for matrix multiplication and the linear layer (validated
// arguments only; the checks live in src/ops/matmul.cpp).
//
// Math, for every batch entry i:
//   out_i = alpha * op(a_i) @ op(b_i) + beta * out_i + bias      (bias broadcast over rows)
// f32 operands go straight to OpenBLAS cblas_sgemm. bf16 operands are widened
// to f32 (exactly: a bf16 is the top half of a float) into per-thread scratch,
// each element once, and multiplied by sgemm with f32 accumulation; a bf16 out
// is accumulated in an f32 scratch tile and rounded to nearest-even once.
//
// Linear backward (y = x W^T + b):
//   dx  = dy @ W        dW += dy^T @ x        db += sum over rows of dy
// db is summed in an order fixed by the shape alone (row chunks, then chunk
// partials in order), so it is the same for every thread count.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace zt::cpu {

struct GemmDesc {
  int64_t batch = 1;        // independent products
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false;     // a_i stored (K, M) instead of (M, K)
  bool trans_b = false;     // b_i stored (N, K) instead of (K, N)
  bool b_shared = false;    // b is one 2-D matrix used by every batch entry
  float alpha = 1.0f, beta = 0.0f;
};

// a: batch x (M, K) or (K, M); b: [batch x] (K, N) or (N, K); out: batch x (M, N);
// bias: (N) or undefined. a, b f32 or bf16 (same); out f32 or a's dtype; bias f32 or out's.
// beta = 0 never reads out. c (out's shape and dtype, disjoint from out) or
// undefined: beta scales c instead of out (linear_forward's residual), read
// by the prefill pass that a bias or a bf16 out has anyway.
void matmul(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& bias, const GemmDesc& d,
            const Tensor& c = {});

// dy: (N, OC), x: (N, C), w: (OC, C), same dtype (f32 or bf16).
// dx: (N, C) overwritten; dw: (OC, C) +=; db: (OC) += (=, not read, when
// overwrite); each may be undefined.
void linear_backward(const Tensor& dx, const Tensor& dw, const Tensor& db, const Tensor& dy, const Tensor& x,
                     const Tensor& w, bool overwrite = false);

// --- tuning knobs and introspection (tests use them to reach every path) ---

// Whether a batched product runs one single-threaded sgemm per batch entry on
// `threads` OpenMP threads (true) or one threaded sgemm per entry in turn.
bool matmul_batch_parallel(const GemmDesc& d, bool widens, int threads);

// Floats of f32 scratch one matmul may hold for widened bf16 operands and the
// f32 tile of a bf16 out (default 16 Mi floats = 64 MiB). Larger problems are
// cut into panels (along M, N or K, whichever allows the widest panel); every
// element is still widened exactly once. Returns the previous value.
size_t set_matmul_scratch_budget(size_t floats);
size_t matmul_scratch_budget();

}  // namespace zt::cpu
