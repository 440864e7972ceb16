// db += the column sums of a (rows x cols) matrix on the GPU, deterministic:
// the summation order of every column depends on the shape alone (kernels
// and the chunking rule: colsum_kernels.cuh). Bias gradients (matmul.cu) and
// the norms' per-block weight-gradient partials (norm.cu) use it.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace zt::cuda {

// dy: (rows, cols) f32, bf16 or f16, contiguous; db: (cols) f32, bf16 or f16,
// on the same GPU; rounded once into db (overwrite: db = the sums, not read).
void colsum_accumulate(const Tensor& db, const Tensor& dy, int64_t rows, int64_t cols, bool overwrite = false);
// The f32 chunk partials colsum_accumulate allocates for these sizes (bytes; 0 with one chunk).
int64_t colsum_workspace_bytes(int64_t rows, int64_t cols);
// db (cols) += the sum over chunks, in chunk order, of partials (chunks, cols)
// f32: a column sum's second stage, rounded once into db (overwrite: =).
void add_chunk_partials(const Tensor& db, const Tensor& partials, int64_t chunks, int64_t cols,
                        bool overwrite = false);

}  // namespace zt::cuda
