// CUDA embedding: gather forward; backward without atomics (positions grouped
// by token id, each group summed in position order by one block, f32 sums
// added to the gradient with one rounding).
#include "backend/cuda/embedding.h"

#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/runtime.h"

namespace zt::cuda {

namespace {

constexpr int kThreads = 256;

// out[p, c] = wte[tok[p], c] (+ wpe[p % T + pos_offset, c]); grid-stride over (B*T*C).
template <typename T>
__global__ void embed_fwd_kernel(T* out, const int32_t* tok, const T* wte, const T* wpe, int64_t N, int64_t T_,
                                 int64_t C, int64_t pos_offset) {
  const int64_t n = N * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t p = i / C, c = i - p * C;
    float v = to_f32(wte[int64_t(tok[p]) * C + c]);
    if (wpe != nullptr) v += to_f32(wpe[(p % T_ + pos_offset) * C + c]);
    out[i] = from_f32<T>(v);
  }
}

// Block (g, cb): token group g (positions order[begin[g] .. begin[g+1])),
// channels cb*kThreads + threadIdx.x.
template <typename T, typename G>
__global__ void embed_bwd_wte_kernel(G* dwte, const T* dout, const int32_t* order, const int32_t* begin,
                                     const int32_t* group_token, int64_t C) {
  const int64_t c = blockIdx.y * int64_t(kThreads) + threadIdx.x;
  if (c >= C) return;
  const int g = blockIdx.x;
  float s = 0.0f;
  for (int32_t j = begin[g]; j < begin[g + 1]; ++j) s += to_f32(dout[int64_t(order[j]) * C + c]);
  G* row = dwte + int64_t(group_token[g]) * C;
  row[c] = from_f32<G>(to_f32(row[c]) + s);
}

// dwpe[t + pos_offset, c] += sum_b dout[b, t, c], b in order.
template <typename T, typename G>
__global__ void embed_bwd_wpe_kernel(G* dwpe, const T* dout, int64_t B, int64_t T_, int64_t C, int64_t pos_offset) {
  const int64_t n = T_ * C;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t b = 0; b < B; ++b) s += to_f32(dout[b * n + i]);
    G* p = dwpe + pos_offset * C + i;
    *p = from_f32<G>(to_f32(*p) + s);
  }
}

template <typename T>
const T* cptr(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data_ptr()) : nullptr;
}

}  // namespace

void embedding_forward(const Tensor& out, const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                       int64_t pos_offset) {
  const int64_t T_ = tokens.size(1), N = tokens.numel(), C = wte.size(1);
  if (N * C == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(wte.dtype(), "embedding_forward", [&] {
    embed_fwd_kernel<T><<<grid_for(N * C, kThreads, out.device()), kThreads, 0, stream_of(out)>>>(
        static_cast<T*>(out.data_ptr()), tokens.data<int32_t>(), cptr<T>(wte), cptr<T>(wpe), N, T_, C, pos_offset);
  });
  ZT_CUDA_CHECK_LAUNCH("embed_fwd_kernel");
}

void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout, const Tensor& host_tokens,
                        int64_t pos_offset) {
  const int64_t B = dout.size(0), T_ = dout.size(1), C = dout.size(2), N = B * T_;
  if (N * C == 0) return;
  cudaStream_t s = stream_of(dout);
  if (dwte.defined()) {
    // Counting sort of positions by token id (stable: position order within a group).
    const int32_t* tok = host_tokens.data<int32_t>();
    const int64_t V = dwte.size(0);
    std::vector<int32_t> count(size_t(V) + 1, 0);
    for (int64_t p = 0; p < N; ++p) ++count[size_t(tok[p]) + 1];
    for (int64_t v = 0; v < V; ++v) count[size_t(v) + 1] += count[size_t(v)];
    std::vector<int32_t> order(static_cast<size_t>(N));
    std::vector<int32_t> group_begin, group_token;
    {
      std::vector<int32_t> next(count.begin(), count.end() - 1);
      for (int64_t p = 0; p < N; ++p) order[size_t(next[size_t(tok[p])]++)] = int32_t(p);
    }
    for (int64_t v = 0; v < V; ++v)
      if (count[size_t(v) + 1] > count[size_t(v)]) {
        group_begin.push_back(count[size_t(v)]);
        group_token.push_back(int32_t(v));
      }
    group_begin.push_back(int32_t(N));
    const int64_t groups = int64_t(group_token.size());
    // One device buffer: order | begin | token.
    Tensor meta = Tensor::empty(Shape{N + 2 * groups + 1}, DType::i32, dout.device(), MemCategory::workspace);
    int32_t* d = meta.data<int32_t>();
    copy_bytes(d, dout.device(), order.data(), Device::cpu(), size_t(N) * 4);
    copy_bytes(d + N, dout.device(), group_begin.data(), Device::cpu(), size_t(groups + 1) * 4);
    copy_bytes(d + N + groups + 1, dout.device(), group_token.data(), Device::cpu(), size_t(groups) * 4);
    const dim3 grid(unsigned(groups), unsigned((C + kThreads - 1) / kThreads));
    ZT_CUDA_DISPATCH_FLOAT(dout.dtype(), "embedding_backward", [&] {
      using TD = T;
      ZT_CUDA_DISPATCH_FLOAT(dwte.dtype(), "embedding_backward", [&] {
        embed_bwd_wte_kernel<TD, T><<<grid, kThreads, 0, s>>>(static_cast<T*>(dwte.data_ptr()),
                                                             static_cast<const TD*>(dout.data_ptr()), d, d + N,
                                                             d + N + groups + 1, C);
      });
    });
    ZT_CUDA_CHECK_LAUNCH("embed_bwd_wte_kernel");
  }
  if (dwpe.defined()) {
    ZT_CUDA_DISPATCH_FLOAT(dout.dtype(), "embedding_backward", [&] {
      using TD = T;
      ZT_CUDA_DISPATCH_FLOAT(dwpe.dtype(), "embedding_backward", [&] {
        embed_bwd_wpe_kernel<TD, T><<<grid_for(T_ * C, kThreads, dout.device()), kThreads, 0, s>>>(
            static_cast<T*>(dwpe.data_ptr()), static_cast<const TD*>(dout.data_ptr()), B, T_, C, pos_offset);
      });
    });
    ZT_CUDA_CHECK_LAUNCH("embed_bwd_wpe_kernel");
  }
}

}  // namespace zt::cuda
