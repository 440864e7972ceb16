// The CUDA fp8 kernels (fp8_kernels.cuh), run by the warp emulator with
// fp8.cu's launch sequence, against the CPU backend (itself checked against
// the formats' definitions in tests/ops/fp8_test.cpp), bit for bit:
// quantisation (the amax partials on a small grid so the stride loop runs,
// the scale block, the encode) of f32 and bf16 inputs into E4M3 and E5M2 -
// magnitudes over many binades, amaxes at and around the format's top
// binade, values that saturate or fall to subnormals, a NaN or an inf
// somewhere, zeros -; dequantisation of every code under scales down to
// 2^-127; and the byte transpose on shapes that leave tiles partial, with
// its row tiles striding. Outputs are poisoned first; every byte compared.
#include "cuda_emu/warp_emulator.h"  // first: it defines what the kernel headers emulate

#include "backend/cuda/fp8_kernels.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda_emu/emu_test_util.h"
#include "ops/fp8.h"
#include "test_util.h"

namespace zt::test {
namespace {

namespace fk = cuda::fp8_kernels;
using namespace emu_util;

// The kernels' quantisation of x (f32 or bf16) into `format`, launched as
// fp8.cu launches it (grids capped small so the stride loops run).
template <typename T>
void quantize_emulated(const Tensor& q, const Tensor& scale_inv, const Tensor& x) {
  const int64_t n = x.numel();
  const unsigned parts = stride_grid(n);
  Tensor partials = poisoned(Shape{int64_t(parts)}, DType::f32), scale = poisoned(Shape{1}, DType::f32);
  const bool e4m3 = q.dtype() == DType::f8e4m3;
  emu::launch(dim3(parts), fk::kThreads, 0, fk::abs_max_partials_kernel<T>, p<float>(partials), p<const T>(x), n);
  emu::launch(dim3(1), 1024, 0, e4m3 ? fk::fp8_scale_kernel<true> : fk::fp8_scale_kernel<false>, p<float>(scale),
              p<float>(scale_inv), p<const float>(partials), int(parts));
  if (n == 0) return;
  if (e4m3)
    emu::launch(dim3(stride_grid(n)), fk::kThreads, 0, fk::encode_kernel<T, true>, p<uint8_t>(q), p<const T>(x),
                p<const float>(scale), n);
  else
    emu::launch(dim3(stride_grid(n)), fk::kThreads, 0, fk::encode_kernel<T, false>, p<uint8_t>(q), p<const T>(x),
                p<const float>(scale), n);
}

// Values over 2^-lo_exp .. 2^hi_exp in magnitude, both signs, a few zeros.
std::vector<double> spread_values(int64_t n, int lo_exp, int hi_exp, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> e(lo_exp, hi_exp), u(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (double& x : v) x = u(rng) < 0.03 ? 0.0 : (u(rng) < 0.5 ? -1.0 : 1.0) * std::exp2(e(rng));
  return v;
}

::testing::AssertionResult same_bytes(const Tensor& got, const Tensor& want) {
  if (got.nbytes() != want.nbytes()) return ::testing::AssertionFailure() << "sizes differ";
  const auto* g = static_cast<const uint8_t*>(got.data_ptr());
  const auto* w = static_cast<const uint8_t*>(want.data_ptr());
  for (size_t i = 0; i < got.nbytes(); ++i)
    if (g[i] != w[i])
      return ::testing::AssertionFailure() << "byte " << i << ": got 0x" << std::hex << int(g[i]) << ", want 0x"
                                           << int(w[i]);
  return ::testing::AssertionSuccess();
}

template <typename T>
void check_quantize(const std::vector<double>& values, DType wide, DType format, const char* what) {
  SCOPED_TRACE(zt::detail::concat(what, ", ", dtype_name(wide), " -> ", dtype_name(format), ", n ",
                                  values.size()));
  const int64_t n = int64_t(values.size());
  const Tensor x = tensor_from(values, Shape{n}, wide);
  Tensor want_q = poisoned(Shape{n}, format), want_s = poisoned(Shape{1}, DType::f32);
  ops::quantize_fp8(want_q, want_s, x);
  Tensor q = poisoned(Shape{n}, format), s = poisoned(Shape{1}, DType::f32);
  quantize_emulated<T>(q, s, x);
  EXPECT_TRUE(same_bytes(s, want_s)) << "scale_inv " << s.data<float>()[0] << " against " << want_s.data<float>()[0];
  EXPECT_TRUE(same_bytes(q, want_q));
}

template <typename T>
void quantize_cases(DType wide) {
  auto rng = make_rng(uint64_t(wide) + 17);
  for (DType format : {DType::f8e4m3, DType::f8e5m2}) {
    for (int64_t n : {int64_t(1), int64_t(37), int64_t(256), int64_t(5000)}) {
      check_quantize<T>(spread_values(n, -30, 30, rng), wide, format, "40 binades");
      check_quantize<T>(spread_values(n, -2, 2, rng), wide, format, "4 binades");
    }
    // amax at the format's max times powers of two, and just either side of
    // its top binade's edges (the scale's floor): mantissas 1.75 and above.
    const double max = format == DType::f8e4m3 ? 448.0 : 57344.0;
    for (double m : {1.0, 0.999, 1.001, 0.5, 0.5001, 0.875, 0.9375})
      for (int k : {-40, -3, 0, 5, 60}) {
        std::vector<double> v = spread_values(300, -12, 0, rng);
        v[size_t(k & 127) % v.size()] = -m * max * std::exp2(k);
        check_quantize<T>(v, wide, format, "amax at a binade edge");
      }
    // A non-finite element: scale 1, its code NaN, the others saturating.
    for (double bad : {double(NAN), double(INFINITY), -double(INFINITY)}) {
      std::vector<double> v = spread_values(700, -5, 20, rng);
      v[413] = bad;
      check_quantize<T>(v, wide, format, "a non-finite element");
    }
    check_quantize<T>(std::vector<double>(300, 0.0), wide, format, "all zeros");
    check_quantize<T>({}, wide, format, "empty");
  }
}

TEST(Fp8KernelsEmu, QuantizeMatchesTheCpuBitForBit) {
  ZT_TEST_TRACE_SEED();
  quantize_cases<float>(DType::f32);
  quantize_cases<__nv_bfloat16>(DType::bf16);
}

template <typename T>
void check_dequantize(DType format, DType wide, float scale_inv) {
  SCOPED_TRACE(zt::detail::concat(dtype_name(format), " -> ", dtype_name(wide), ", scale_inv ", scale_inv));
  const int64_t n = 256 * 3 + 29;  // every code, three times over, on a striding grid
  Tensor q = Tensor::empty(Shape{n}, format);
  for (int64_t i = 0; i < n; ++i) static_cast<uint8_t*>(q.data_ptr())[i] = uint8_t((i * 7) & 255);
  Tensor s = Tensor::empty(Shape{1}, DType::f32);
  s.data<float>()[0] = scale_inv;
  Tensor want = poisoned(Shape{n}, wide), got = poisoned(Shape{n}, wide);
  ops::dequantize_fp8(want, q, s);
  if (format == DType::f8e4m3)
    emu::launch(dim3(stride_grid(n)), fk::kThreads, 0, fk::dequantize_kernel<T, true>, p<T>(got), p<const uint8_t>(q),
                p<const float>(s), n);
  else
    emu::launch(dim3(stride_grid(n)), fk::kThreads, 0, fk::dequantize_kernel<T, false>, p<T>(got),
                p<const uint8_t>(q), p<const float>(s), n);
  // NaN codes decode to NaN on both sides; every other element to the same bits.
  for (int64_t i = 0; i < n; ++i) {
    const double g = load_f64(got, i), w = load_f64(want, i);
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(g)) << "code 0x" << std::hex << ((i * 7) & 255);
      continue;
    }
    ASSERT_EQ(std::memcmp(static_cast<const char*>(got.data_ptr()) + i * dtype_size(wide),
                          static_cast<const char*>(want.data_ptr()) + i * dtype_size(wide), dtype_size(wide)),
              0)
        << "code 0x" << std::hex << ((i * 7) & 255) << std::dec << ": got " << g << ", want " << w;
  }
}

TEST(Fp8KernelsEmu, DequantizeMatchesTheCpuBitForBit) {
  for (DType format : {DType::f8e4m3, DType::f8e5m2})
    for (float scale_inv : {1.0f, 0x1p-7f, 0x1p20f, 0x1p-127f, 0x1p126f}) {
      check_dequantize<float>(format, DType::f32, scale_inv);
      check_dequantize<__nv_bfloat16>(format, DType::bf16, scale_inv);
    }
}

TEST(Fp8KernelsEmu, TransposeBytesEveryShape) {
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(3);
  struct Case {
    int64_t rows, cols;
    unsigned row_blocks;  // gridDim.y: fewer than the row tiles makes the stride loop run
  };
  for (const Case c : {Case{1, 1, 1}, Case{33, 70, 1}, Case{100, 31, 2}, Case{64, 64, 2}, Case{96, 40, 3},
                       Case{5, 129, 1}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " x " + std::to_string(c.cols));
    Tensor in = Tensor::empty(Shape{c.rows, c.cols}, DType::f8e4m3);
    for (int64_t i = 0; i < in.numel(); ++i) static_cast<uint8_t*>(in.data_ptr())[i] = uint8_t(rng());
    Tensor out = poisoned(Shape{c.cols, c.rows}, DType::f8e4m3);
    const unsigned col_tiles = unsigned((c.cols + fk::kTile - 1) / fk::kTile);
    emu::launch(dim3(col_tiles, c.row_blocks), dim3(fk::kTile, fk::kTileRows), 0, fk::transpose_kernel<uint8_t>,
                p<uint8_t>(out), p<const uint8_t>(in), c.rows, c.cols);
    const auto* src = static_cast<const uint8_t*>(in.data_ptr());
    const auto* dst = static_cast<const uint8_t*>(out.data_ptr());
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t col = 0; col < c.cols; ++col)
        ASSERT_EQ(int(dst[col * c.rows + r]), int(src[r * c.cols + col])) << "element (" << r << ", " << col << ")";
  }
}

}  // namespace
}  // namespace zt::test
