// CUDA GeLU (tanh approximation) and SwiGLU: grid-stride pointwise kernels in
// f32 with one rounding per output, over 16-byte packs where they fit. The
// launches, whose shape - packs a thread an iteration, grid capped or not -
// training races per shape of call (kernel_race.h: every shape writes the
// same bits); the kernels are in activation_kernels.cuh.
#include "backend/cuda/activation.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "backend/cuda/activation_kernels.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernel_race.h"

namespace zt::cuda {

namespace {

using namespace activation_kernels;

// A launch shape: U packs a thread an iteration; a grid of at most 32 blocks
// an SM (the threads then stride), or of every block the packs need (each
// thread takes U packs once).
struct LaunchShape {
  int packs_per_thread;
  bool capped;
};
// The race's candidates, the first preferred on a tie: the shape before the
// race (a pack a thread, capped), one without the stride, and 4 packs' loads
// in flight a thread.
constexpr LaunchShape kShapes[] = {{1, true}, {1, false}, {4, true}};

unsigned grid_of(int64_t packs, LaunchShape shape, Device device) {
  const int64_t threads = (packs + shape.packs_per_thread - 1) / shape.packs_per_thread;  // U packs each
  if (shape.capped) return grid_for(threads, kThreads, device);
  return unsigned(std::clamp<int64_t>((threads + kThreads - 1) / kThreads, 1, 0x7fffffff));
}

enum class Op { gelu_forward, gelu_backward, swiglu_forward, swiglu_backward };

struct RaceKey {
  int device;
  Op op;
  DType dtype;
  int64_t packs;
  int pack;  // elements a pack
  bool in_place;
  bool operator==(const RaceKey&) const = default;
};

RaceBook<RaceKey>& races() {
  static auto* book = new RaceBook<RaceKey>(
      "pointwise", {"1 pack a thread, capped grid", "1 pack a thread, full grid", "4 packs a thread, capped grid"},
      [](const RaceKey& k) {
        static const char* const ops[] = {"gelu_forward", "gelu_backward", "swiglu_forward", "swiglu_backward"};
        return std::string(ops[int(k.op)]) + " " + std::to_string(k.packs) + " packs of " + std::to_string(k.pack) +
               " " + std::string(dtype_name(k.dtype)) + (k.in_place ? ", in place" : "") + ", " +
               Device::cuda(k.device).str();
      });  // never freed (kernel_race_lines reads it)
  return *book;
}

// Runs launch(shape_tag, grid) for the race's shape of this call, where
// shape_tag is std::integral_constant<int, U>.
template <typename Launch>
void race_launch(Op op, const Tensor& out, int64_t packs, int pack, bool in_place, Launch&& launch) {
  const Device device = out.device();
  const RaceKey key{device.index, op, out.dtype(), packs, pack, in_place};
  races().run(key, device, [&](int c) {
    const LaunchShape shape = kShapes[c];
    const unsigned grid = grid_of(packs, shape, device);
    if (shape.packs_per_thread == 4) launch(std::integral_constant<int, 4>{}, grid);
    else launch(std::integral_constant<int, 1>{}, grid);
    return true;
  });
}

}  // namespace

void gelu_forward(const Tensor& y, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "gelu_forward", [&] {
    T* yp = static_cast<T*>(y.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(n, yp, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      race_launch(Op::gelu_forward, y, n / V, V, yp == xp, [&](auto u, unsigned grid) {
        gelu_fwd_kernel<T, V, decltype(u)::value><<<grid, kThreads, 0, stream_of(y)>>>(yp, xp, n);
      });
    });
  });
  ZT_CUDA_CHECK_LAUNCH("gelu_fwd_kernel");
}

void gelu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "gelu_backward", [&] {
    T* dxp = static_cast<T*>(dx.data_ptr());
    const T *dyp = static_cast<const T*>(dy.data_ptr()), *xp = static_cast<const T*>(x.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(n, dxp, dyp, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      race_launch(Op::gelu_backward, dx, n / V, V, dxp == dyp || dxp == xp, [&](auto u, unsigned grid) {
        gelu_bwd_kernel<T, V, decltype(u)::value><<<grid, kThreads, 0, stream_of(dx)>>>(dxp, dyp, xp, n);
      });
    });
  });
  ZT_CUDA_CHECK_LAUNCH("gelu_bwd_kernel");
}

// The packs tile a row of H (x's gate and up halves start at multiples of H).
void swiglu_forward(const Tensor& y, const Tensor& x) {
  const int64_t H = y.size(-1), rows = y.numel() / std::max<int64_t>(1, H);
  if (y.numel() == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "swiglu_forward", [&] {
    T* yp = static_cast<T*>(y.data_ptr());
    const T* xp = static_cast<const T*>(x.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(H, yp, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      race_launch(Op::swiglu_forward, y, rows * H / V, V, false, [&](auto u, unsigned grid) {
        swiglu_fwd_kernel<T, V, decltype(u)::value><<<grid, kThreads, 0, stream_of(y)>>>(yp, xp, rows, H);
      });
    });
  });
  ZT_CUDA_CHECK_LAUNCH("swiglu_fwd_kernel");
}

void swiglu_backward(const Tensor& dx, const Tensor& dy, const Tensor& x) {
  const int64_t H = dy.size(-1), rows = dy.numel() / std::max<int64_t>(1, H);
  if (dy.numel() == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "swiglu_backward", [&] {
    T* dxp = static_cast<T*>(dx.data_ptr());
    const T *dyp = static_cast<const T*>(dy.data_ptr()), *xp = static_cast<const T*>(x.data_ptr());
    with_pack_width<T>(packs_of_16_fit<T>(H, dxp, dyp, xp), [&](auto v) {
      constexpr int V = decltype(v)::value;
      race_launch(Op::swiglu_backward, dx, rows * H / V, V, dxp == xp, [&](auto u, unsigned grid) {
        swiglu_bwd_kernel<T, V, decltype(u)::value><<<grid, kThreads, 0, stream_of(dx)>>>(dxp, dyp, xp, rows, H);
      });
    });
  });
  ZT_CUDA_CHECK_LAUNCH("swiglu_bwd_kernel");
}

}  // namespace zt::cuda
