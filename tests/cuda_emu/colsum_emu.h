// The deterministic column sum (colsum.h) run by the warp emulator, launched
// as colsum.cu launches it: shared by the tests of the bias gradients and of
// the norms' backward, whose partials it sums.
#pragma once

#include "cuda_emu/warp_emulator.h"  // first: it defines what the kernel headers emulate

#include "backend/cuda/colsum_kernels.cuh"
#include "cuda_emu/emu_test_util.h"

namespace zt::test::emu_util {

// db (cols, f32) += the chunks' partials (chunks, cols) f32 in chunk order,
// as colsum.cu's add_chunk_partials launches it (overwrite: =).
inline void add_chunk_partials_on_emulator(const Tensor& db, const Tensor& partials, int64_t chunks, int64_t cols,
                                           bool overwrite = false) {
  emu::launch(dim3(unsigned((cols + 255) / 256)), 256, 0, cuda::colsum_kernels::colsum_finish_kernel<float>,
              static_cast<const float*>(p<float>(partials)), chunks, cols, p<float>(db), overwrite);
}

// db (cols, f32) += column sums of dy (rows, cols), V columns per lane
// (overwrite: =); returns db.
template <typename T, int V>
Tensor colsum_on_emulator(const Tensor& dy, const Tensor& db0, bool overwrite = false) {
  namespace csk = cuda::colsum_kernels;
  const int64_t rows = dy.size(0), cols = dy.size(1), per_chunk = csk::chunk_rows(rows);
  const int64_t chunks = (rows + per_chunk - 1) / per_chunk;
  Tensor db = copy_of(db0), partial = chunks > 1 ? poisoned(Shape{chunks * cols}, DType::f32) : Tensor();
  const dim3 grid(unsigned((cols / V + csk::kSumCols - 1) / csk::kSumCols), unsigned(chunks));
  emu::launch(grid, dim3(csk::kSumCols, csk::kSumLanes), 0, csk::colsum_chunk_kernel<T, float, V>,
              static_cast<const T*>(p<T>(dy)), rows, cols, per_chunk, p<float>(partial), p<float>(db), overwrite);
  if (chunks > 1) add_chunk_partials_on_emulator(db, partial, chunks, cols, overwrite);
  return db;
}

}  // namespace zt::test::emu_util
