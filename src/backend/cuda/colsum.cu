// The launches of colsum.h: one pass of (kSumCols, kSumLanes) blocks over the
// chunks of rows, then, when there are several chunks, their f32 partials
// added in chunk order with one rounding into db (add_chunk_partials, also
// the second stage of the norms' weight gradients).
#include "backend/cuda/colsum.h"

#include "backend/cuda/colsum_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"

namespace zt::cuda {

int64_t colsum_workspace_bytes(int64_t rows, int64_t cols) {
  if (rows == 0) return 0;
  const int64_t per_chunk = colsum_kernels::chunk_rows(rows);
  const int64_t chunks = (rows + per_chunk - 1) / per_chunk;
  return chunks > 1 ? 4 * chunks * cols : 0;
}

void colsum_accumulate(const Tensor& db, const Tensor& dy, int64_t rows, int64_t cols, bool overwrite) {
  if (rows == 0 || cols == 0) return;  // an overwrite of no rows: the ops layer has written the zeros
  const Device device = db.device();
  cudaStream_t s = stream_of(db);
  using namespace colsum_kernels;
  const int64_t per_chunk = chunk_rows(rows);
  const int64_t chunks = (rows + per_chunk - 1) / per_chunk;
  Tensor partial;
  if (chunks > 1) partial = Tensor::empty(Shape{chunks * cols}, DType::f32, device, MemCategory::workspace);
  float* part = chunks > 1 ? partial.data<float>() : nullptr;
  const dim3 block(kSumCols, kSumLanes);
  ZT_CUDA_DISPATCH_FLOAT(dy.dtype(), "colsum_accumulate", [&] {
    using TDy = T;
    const TDy* dyp = static_cast<const TDy*>(dy.data_ptr());
    ZT_CUDA_DISPATCH_FLOAT(db.dtype(), "colsum_accumulate", [&] {
      using TDb = T;
      with_pack_width<TDy>(packs_of_16_fit<TDy>(cols, dyp), [&](auto v) {
        constexpr int V = decltype(v)::value;
        const dim3 grid(unsigned((cols / V + kSumCols - 1) / kSumCols), unsigned(chunks));
        colsum_chunk_kernel<TDy, TDb, V><<<grid, block, 0, s>>>(dyp, rows, cols, per_chunk, part,
                                                               static_cast<TDb*>(db.data_ptr()), overwrite);
      });
    });
  });
  ZT_CUDA_CHECK_LAUNCH("colsum_chunk_kernel");
  if (part) add_chunk_partials(db, partial, chunks, cols, overwrite);
}

void add_chunk_partials(const Tensor& db, const Tensor& partials, int64_t chunks, int64_t cols, bool overwrite) {
  if (chunks == 0 || cols == 0) return;
  constexpr int kThreads = 256;
  ZT_CUDA_DISPATCH_FLOAT(db.dtype(), "add_chunk_partials", [&] {
    colsum_kernels::colsum_finish_kernel<T><<<unsigned((cols + kThreads - 1) / kThreads), kThreads, 0, stream_of(db)>>>(
        partials.data<float>(), chunks, cols, static_cast<T*>(db.data_ptr()), overwrite);
  });
  ZT_CUDA_CHECK_LAUNCH("colsum_finish_kernel");
}

}  // namespace zt::cuda
