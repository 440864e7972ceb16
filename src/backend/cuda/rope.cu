// CUDA RoPE: one thread per channel pair (or 16-byte pack of pairs), in
// place allowed (each pair is read before it is written by the same thread);
// the fused qkv product's split and its gradient's join in the same kernel.
// The launches; the kernel and the host-built table are in rope_kernels.cuh.
#include "backend/cuda/rope.h"

#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/rope_kernels.cuh"
#include "backend/cuda/runtime.h"

namespace zt::cuda {

namespace {

using namespace rope_kernels;

// One launch over the visited heads' units of the packed tensor; every
// pointer of the layout decides whether 16-byte packs fit.
template <typename T>
void launch_rope(const HeadLayout<T>& l, const Tensor& packed, const Tensor& table, int64_t T_, int64_t D,
                 int64_t pos_offset, bool inverse, bool to_packed) {
  with_pack_width<T, 2>(packs_of_16_fit<T>(D, l.packed, l.q, l.k, l.v), [&](auto v) {
    constexpr int V = decltype(v)::value;
    const int64_t units = packed.numel() / (l.Hq + 2 * l.Hkv + l.skipped) * (l.Hq + 2 * l.Hkv) / V;
    rope_kernel<T, V><<<grid_for(units, kThreads, packed.device()), kThreads, 0, stream_of(packed)>>>(
        l, table.data<float>(), units, T_, D / 2, pos_offset, inverse ? -1.0f : 1.0f, to_packed);
  });
}

template <typename T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

}  // namespace

void rope_table(const Tensor& table, const double* freqs) {
  const int64_t T_max = table.size(0), half = table.size(1);
  std::vector<float> host(size_t(T_max * half * 2));
  rope_table_host(host.data(), T_max, half, freqs);
  copy_bytes(table.data_ptr(), table.device(), host.data(), Device::cpu(), host.size() * sizeof(float));
}

void rope_rotate(const Tensor& y, const Tensor& x, const Tensor& table, int64_t pos_offset, bool inverse) {
  if (x.numel() == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(x.dtype(), "rope", [&] {
    // k and v null: 16-byte alignment holds for them (0 % 16 == 0).
    launch_rope<T>({ptr<T>(x), ptr<T>(y), nullptr, nullptr, x.size(2), 0}, x, table, x.size(1), x.size(3), pos_offset,
                   inverse, false);
  });
  ZT_CUDA_CHECK_LAUNCH("rope_kernel");
}

void rope_packed_qkv(const Tensor& qkv, int64_t Hq, int64_t Hkv, const Tensor& table, int64_t pos_offset,
                     bool inverse) {
  if (qkv.numel() == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(qkv.dtype(), "rope_packed_qkv", [&] {
    launch_rope<T>({ptr<T>(qkv), ptr<T>(qkv), nullptr, nullptr, Hq + Hkv, 0, Hkv}, qkv, table, qkv.size(1),
                   qkv.size(3), pos_offset, inverse, false);
  });
  ZT_CUDA_CHECK_LAUNCH("rope_kernel (packed qkv in place)");
}

void rope_split_qkv(const Tensor& qkv, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& table,
                    int64_t pos_offset, bool backward) {
  if (qkv.numel() == 0) return;
  ZT_CUDA_DISPATCH_FLOAT(q.dtype(), "rope_split_qkv", [&] {
    launch_rope<T>({ptr<T>(qkv), ptr<T>(q), ptr<T>(k), ptr<T>(v), q.size(2), k.size(2)}, qkv, table, q.size(1),
                   q.size(3), pos_offset, backward, backward);
  });
  ZT_CUDA_CHECK_LAUNCH("rope_kernel (qkv split)");
}

}  // namespace zt::cuda
