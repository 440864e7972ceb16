// CUDA mixture-of-experts kernels' launches (the kernels: moe_kernels.cuh).
#include "backend/cuda/moe.h"

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/moe_kernels.cuh"

namespace zt::cuda {

namespace {

using namespace moe_kernels;

unsigned route_blocks(int64_t N) { return unsigned((N + kRouteWarps - 1) / kRouteWarps); }

// out (N, C) = base + the (weighted, or plain when weight is undefined) sum
// of each token's kept rows: weighted_sum_kernel.
void weighted_sum(const Tensor& out, const Tensor& rows, const Tensor& weight, const Tensor& where, const Tensor& base,
                  int64_t k, const char* op) {
  const int64_t N = out.size(0), C = out.size(1);
  if (N * C == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(out.dtype(), op, [&] {
    T* o = elements<T>(out);
    const T *r = elements<const T>(rows), *b = elements<const T>(base);
    with_pack_width<T>(packs_of_16_fit<T>(C, o, r, b), [&](auto v) {
      constexpr int V = decltype(v)::value;
      weighted_sum_kernel<T, V><<<grid_for(N * C / V, kThreads, out.device()), kThreads, 0, stream_of(out)>>>(
          o, r, elements<const float>(weight), elements<const int32_t>(where), b, N, k, C);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("weighted_sum_kernel");
}

}  // namespace

void moe_route(const Tensor& probs, const Tensor& choice, const Tensor& weight, const Tensor& logits,
               bool normalize, const Tensor& lse, const Tensor& bias) {
  const int64_t N = logits.size(0);
  if (N == 0) return;
  auto launch = [&](auto kernel) {
    kernel<<<route_blocks(N), kRouteWarps * 32, 0, stream_of(logits)>>>(
        elements<float>(probs), elements<int32_t>(choice), elements<float>(weight), elements<float>(lse),
        elements<const float>(logits), elements<const float>(bias), N, int(logits.size(1)), int(choice.size(1)));
  };
  normalize ? launch(route_kernel<true>) : launch(route_kernel<false>);
  ZT_CUDA_CHECK_LAUNCH("route_kernel");
}

void moe_route_backward(const Tensor& dlogits, const Tensor& dweight, const Tensor& probs, const Tensor& choice,
                        const Tensor& weight, bool normalize, const Tensor& aux_dprob, const Tensor& dlse) {
  const int64_t N = probs.size(0);
  if (N == 0) return;
  auto launch = [&](auto kernel) {
    kernel<<<route_blocks(N), kRouteWarps * 32, 0, stream_of(probs)>>>(
        elements<float>(dlogits), elements<const float>(dweight), elements<const float>(probs),
        elements<const int32_t>(choice), elements<const float>(weight), elements<const float>(aux_dprob),
        elements<const float>(dlse), N, int(probs.size(1)), int(choice.size(1)));
  };
  normalize ? launch(route_backward_kernel<true>) : launch(route_backward_kernel<false>);
  ZT_CUDA_CHECK_LAUNCH("route_backward_kernel");
}

void moe_gather(const Tensor& xs, const Tensor& x, const Tensor& order, int64_t k) {
  const int64_t R = xs.size(0), C = xs.size(1);
  if (R * C == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "moe_gather", [&] {
    T* out = elements<T>(xs);
    const T* in = elements<const T>(x);
    with_pack_width<T>(packs_of_16_fit<T>(C, out, in), [&](auto v) {
      constexpr int V = decltype(v)::value;
      gather_kernel<T, V><<<grid_for(R * C / V, kThreads, x.device()), kThreads, 0, stream_of(x)>>>(
          out, in, elements<const int32_t>(order), R, k, C);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("gather_kernel");
}

void moe_gather_backward(const Tensor& dx, const Tensor& dxs, const Tensor& where, int64_t k, bool accumulate) {
  weighted_sum(dx, dxs, Tensor(), where, accumulate ? dx : Tensor(), k, "moe_gather_backward");
}

void moe_combine(const Tensor& out, const Tensor& ys, const Tensor& weight, const Tensor& where,
                 const Tensor& residual) {
  weighted_sum(out, ys, weight, where, residual, weight.size(1), "moe_combine");
}

void moe_combine_backward(const Tensor& dys, const Tensor& dweight, const Tensor& dout, const Tensor& ys,
                          const Tensor& weight, const Tensor& where) {
  const int64_t N = dout.size(0), C = dout.size(1), k = weight.size(1);
  if (N == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(dout.dtype(), "moe_combine_backward", [&] {
    T* dy = elements<T>(dys);
    const T *g = elements<const T>(dout), *y = elements<const T>(ys);
    with_pack_width<T>(packs_of_16_fit<T>(C, dy, g, y), [&](auto v) {
      constexpr int V = decltype(v)::value;
      combine_backward_kernel<T, V><<<unsigned(N), kCombineThreads, 0, stream_of(dout)>>>(
          dy, elements<float>(dweight), g, y, elements<const float>(weight), elements<const int32_t>(where), N, k, C);
    });
  });
  ZT_CUDA_CHECK_LAUNCH("combine_backward_kernel");
}

}  // namespace zt::cuda
