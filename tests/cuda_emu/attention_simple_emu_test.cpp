// The simple exact CUDA attention kernels (attention_simple_kernels.cuh: a
// warp per query or key row, the fallback for every shape and the kernel of
// unmasked key blocks where cuDNN cannot take them) and the ring merge
// (attention_merge_kernels.cuh), run by the warp emulator with attention.cu's
// and attention_merge.cu's launch shapes, against the CPU backend (itself
// checked against float64 in tests/ops/attention_test.cpp). Causal calls and
// unmasked key blocks of fewer and more keys than queries (context
// parallelism's c x 2c and 2c x c blocks, a decoding step's 1 x n), GQA groups of 1, 2 and 3, head
// dims under, at and over a warp's 32 lanes, f32 and bf16. Outputs are
// poisoned first; every element is compared.
#include "cuda_emu/warp_emulator.h"  // first: it defines what the kernel headers emulate

#include "backend/cuda/attention_merge_kernels.cuh"
#include "backend/cuda/attention_simple_kernels.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "backend/cpu/attention.h"
#include "cuda_emu/emu_test_util.h"
#include "test_util.h"

namespace zt::test {
namespace {

namespace sk = cuda::simple_kernels;
using namespace emu_util;

struct Case {
  int64_t B, T, Hq, Hkv, D;
  int64_t Tk;  // 0: causal
};
// The last: a KV cache's decoding step, one query row against 70 cached keys.
constexpr Case kCases[] = {{2, 7, 4, 2, 24, 0},  {1, 33, 2, 1, 64, 0}, {2, 5, 4, 2, 40, 9},
                           {1, 12, 3, 3, 16, 6}, {1, 3, 3, 1, 72, 35}, {2, 8, 2, 2, 32, 16},
                           {1, 1, 8, 2, 64, 70}};

unsigned warp_blocks(int64_t rows) { return unsigned((rows + sk::kWarpsPerBlock - 1) / sk::kWarpsPerBlock); }

template <typename T>
void run_case(const Case& c, std::mt19937_64& rng) {
  const DType dt = dtype_of<T>();
  const bool causal = c.Tk == 0;
  const int64_t Tk = causal ? c.T : c.Tk;
  SCOPED_TRACE(::testing::Message() << "B " << c.B << " T " << c.T << " Tk " << Tk << " Hq " << c.Hq << " Hkv "
                                    << c.Hkv << " D " << c.D << (causal ? " causal " : " unmasked ") << dtype_name(dt));
  const Tensor q = random_tensor(Shape{c.B, c.T, c.Hq, c.D}, dt, rng);
  const Tensor k = random_tensor(Shape{c.B, Tk, c.Hkv, c.D}, dt, rng);
  const Tensor v = random_tensor(Shape{c.B, Tk, c.Hkv, c.D}, dt, rng);
  const Tensor dout = random_tensor(q.shape(), dt, rng);
  const float scale = float(1.0 / std::sqrt(double(c.D)));
  const sk::Dims d{c.B, c.T, c.Hq, c.Hkv, c.D, Tk, causal};
  const int64_t rows = c.B * c.Hq * c.T, kv_rows = c.B * c.Hkv * Tk;
  const int threads = 32 * sk::kWarpsPerBlock;

  // The CPU backend's result first (out and lse for the backward's inputs).
  const Tensor out_cpu = poisoned(q.shape(), dt), lse_cpu = poisoned(Shape{c.B, c.Hq, c.T}, DType::f32);
  cpu::attention_forward(out_cpu, lse_cpu, q, k, v, scale, causal);
  const Tensor dq_cpu = poisoned(q.shape(), dt), dk_cpu = poisoned(k.shape(), dt), dv_cpu = poisoned(k.shape(), dt);
  cpu::attention_backward(dq_cpu, dk_cpu, dv_cpu, dout, q, k, v, out_cpu, lse_cpu, scale, causal);

  const Tensor out = poisoned(q.shape(), dt), lse = poisoned(lse_cpu.shape(), DType::f32);
  emu::launch(dim3(warp_blocks(rows)), threads, 0, sk::attn_fwd_kernel<T>, p<T>(out), p<float>(lse),
              p<const T>(q), p<const T>(k), p<const T>(v), d, scale);
  EXPECT_TRUE(close(out, out_cpu, tol(dt), "out"));
  EXPECT_TRUE(close(lse, lse_cpu, 1e-5, "lse"));

  // The backward from the CPU's forward, as a training step would pair them.
  const Tensor delta = poisoned(lse.shape(), DType::f32);
  emu::launch(dim3(warp_blocks(rows)), threads, 0, sk::attn_delta_kernel<T>, p<float>(delta), p<const T>(dout),
              p<const T>(out_cpu), d);
  const Tensor dq = poisoned(q.shape(), dt), dk = poisoned(k.shape(), dt), dv = poisoned(k.shape(), dt);
  emu::launch(dim3(warp_blocks(rows)), threads, 0, sk::attn_dq_kernel<T>, p<T>(dq), p<const T>(dout), p<const T>(q),
              p<const T>(k), p<const T>(v), p<const float>(lse_cpu), p<const float>(delta), d, scale);
  emu::launch(dim3(warp_blocks(kv_rows)), threads, 0, sk::attn_dkdv_kernel<T>, p<T>(dk), p<T>(dv), p<const T>(dout),
              p<const T>(q), p<const T>(k), p<const T>(v), p<const float>(lse_cpu), p<const float>(delta), d, scale);
  const double grad_tol = dt == DType::f32 ? 1e-4 : 2e-2;
  EXPECT_TRUE(close(dq, dq_cpu, grad_tol, "dq"));
  EXPECT_TRUE(close(dk, dk_cpu, grad_tol, "dk"));
  EXPECT_TRUE(close(dv, dv_cpu, grad_tol, "dv"));
}

TEST(AttentionSimpleKernelsEmu, CausalAndUnmaskedBlocksMatchTheCpu) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(71);
  for (const Case& c : kCases) {
    run_case<float>(c, rng);
    run_case<__nv_bfloat16>(c, rng);
  }
}

// The ring's merge: a running (out, lse) of 10 rows takes blocks at rows
// [0, 4) (its lse -inf: the first block) and [6, 10), as the CPU's merge
// does; rows 4 and 5 keep their bits.
template <typename T>
void run_merge(std::mt19937_64& rng) {
  const DType dt = dtype_of<T>();
  SCOPED_TRACE(dtype_name(dt));
  const int64_t B = 2, T_all = 10, H = 3, D = 40, n = 4;  // D over a warp: lanes loop
  Tensor out = random_tensor(Shape{B, T_all, H, D}, DType::f32, rng);
  Tensor lse = random_tensor(Shape{B, H, T_all}, DType::f32, rng, -3, 3);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = 0; t < n; ++t) lse.data<float>()[bh * T_all + t] = -INFINITY;
  Tensor out_cpu = copy_of(out), lse_cpu = copy_of(lse);
  for (const int64_t row0 : {int64_t(0), T_all - n}) {
    const Tensor part = random_tensor(Shape{B, n, H, D}, dt, rng);
    const Tensor part_lse = random_tensor(Shape{B, H, n}, DType::f32, rng, -3, 3);
    cpu::attention_merge(out_cpu, lse_cpu, part, part_lse, row0);
    const int64_t rows = B * H * n;
    emu::launch(dim3(unsigned((rows + cuda::merge_kernels::kWarps - 1) / cuda::merge_kernels::kWarps)),
                32 * cuda::merge_kernels::kWarps, 0, cuda::merge_kernels::attention_merge_kernel<T>, p<float>(out),
                p<float>(lse), p<const T>(part), p<const float>(part_lse), B, T_all, H, D, n, row0);
  }
  EXPECT_TRUE(close(out, out_cpu, 1e-6, "out"));
  EXPECT_TRUE(close(lse, lse_cpu, 1e-6, "lse"));
  for (int64_t i = 0; i < out.numel(); ++i) {
    const int64_t t = (i / (H * D)) % T_all;
    if (t == 4 || t == 5) {
      ASSERT_EQ(out.data<float>()[i], out_cpu.data<float>()[i]) << "row " << t << " changed";
    }
  }
}

TEST(AttentionSimpleKernelsEmu, RingMergeMatchesTheCpu) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(72);
  run_merge<float>(rng);
  run_merge<__nv_bfloat16>(rng);
}

}  // namespace
}  // namespace zt::test
