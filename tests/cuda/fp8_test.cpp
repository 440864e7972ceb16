// fp8 on the GPU (backend/cuda/fp8.cu) against the CPU backend, itself
// checked against the formats' definitions and float64 in tests/ops/fp8_test.cpp:
// - quantisation: the same codes and scale, bit for bit, for f32 and bf16
//   inputs into E4M3 and E5M2, on tensors large enough that the amax pass
//   runs its full grid of partials, and with a NaN inside; dequantisation
//   to f32 and bf16 the same bits;
// - the linear layer's three products on the fp8 tensor cores (cuBLASLt;
//   fp8_matmul_launches counts them, so a silent fallback to the
//   dequantised path fails), at GPT-2's and Llama's shapes, bf16 and f32
//   outputs, with the bias (bf16: the epilogue; f32: the prefill) and the
//   residual, dW accumulated and overwritten: within f32 accumulation of the
//   CPU's products of the same codes (1e-3 of the largest element; 1e-2 where
//   the output is bf16); a shape with no fp8 algorithm (40 columns) falls
//   back to the dequantised products and matches too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "backend/cuda/matmul.h"
#include "cuda/cuda_test_util.h"
#include "ops/fp8.h"

namespace zt::test {
namespace {

// A host tensor uniform in [-1, 1) times `scale`, rounded to dtype.
Tensor scaled_random(const Shape& shape, DType dtype, double scale, std::mt19937_64& rng) {
  return random_tensor(shape, dtype, rng, -scale, scale);
}

struct Quantized {
  Tensor q, scale_inv;
};
Quantized quantize_on_cpu(const Tensor& x, DType format) {
  Quantized o{Tensor::empty(x.shape(), format), Tensor::empty(Shape{1}, DType::f32)};
  ops::quantize_fp8(o.q, o.scale_inv, x);
  return o;
}

::testing::AssertionResult same_bytes(const Tensor& got_dev, const Tensor& want) {
  const Tensor got = to_host(got_dev);
  if (got.nbytes() != want.nbytes()) return ::testing::AssertionFailure() << "sizes differ";
  const auto* g = static_cast<const uint8_t*>(got.data_ptr());
  const auto* w = static_cast<const uint8_t*>(want.data_ptr());
  for (size_t i = 0; i < got.nbytes(); ++i)
    if (g[i] != w[i])
      return ::testing::AssertionFailure() << "byte " << i << " of " << got.nbytes() << ": got 0x" << std::hex
                                           << int(g[i]) << ", want 0x" << int(w[i]);
  return ::testing::AssertionSuccess();
}

TEST(CudaFp8, QuantizeAndDequantizeMatchTheCpuBitForBit) {
  ZT_REQUIRE_GPU();
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(11);
  for (DType wide : {DType::f32, DType::bf16})
    for (DType format : {DType::f8e4m3, DType::f8e5m2})
      for (int64_t n : {int64_t(1), int64_t(4099), int64_t(3) << 22})
        for (bool with_nan : {false, true}) {
          SCOPED_TRACE(zt::detail::concat(dtype_name(wide), " -> ", dtype_name(format), ", n ", n,
                                          with_nan ? ", a NaN inside" : ""));
          Tensor x = scaled_random(Shape{n}, wide, 37.0, rng);
          if (with_nan) store_f64(x, n / 2, NAN);
          const Quantized want = quantize_on_cpu(x, format);
          const Tensor q = gpu_poisoned(Shape{n}, format), s = gpu_poisoned(Shape{1}, DType::f32);
          ops::quantize_fp8(q, s, to_gpu(x));
          EXPECT_TRUE(same_bytes(s, want.scale_inv));
          EXPECT_TRUE(same_bytes(q, want.q));
          for (DType out : {DType::f32, DType::bf16}) {
            Tensor want_x = Tensor::empty(Shape{n}, out);
            ops::dequantize_fp8(want_x, want.q, want.scale_inv);
            const Tensor got_x = gpu_poisoned(Shape{n}, out);
            ops::dequantize_fp8(got_x, to_gpu(want.q), to_gpu(want.scale_inv));
            const Tensor host = to_host(got_x);
            for (int64_t i = 0; i < n; ++i) {
              const double g = load_f64(host, i), w = load_f64(want_x, i);
              if (std::isnan(w) ? !std::isnan(g) : g != w) {
                ADD_FAILURE() << "dequantised to " << dtype_name(out) << ", element " << i << ": got " << g
                              << ", want " << w;
                break;
              }
            }
          }
        }
}

struct LinearCase {
  const char* name;
  int64_t N, I, O;
  bool tensor_cores;  // cuBLASLt has an fp8 algorithm (every dimension a multiple of 16)
};

TEST(CudaFp8, LinearProductsRunOnTheTensorCoresAndMatchTheCpu) {
  ZT_REQUIRE_GPU();
  ZT_TEST_TRACE_SEED();
  auto rng = make_rng(12);
  for (const LinearCase& c : {LinearCase{"gpt2 qkv", 256, 768, 2304, true},
                              LinearCase{"llama k/v", 128, 2048, 512, true},
                              LinearCase{"gpt2 mlp.out", 64, 3072, 768, true},
                              LinearCase{"40 columns", 48, 40, 32, false}})
    for (DType out : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(zt::detail::concat(c.name, ", ", dtype_name(out), " out"));
      const double tol = out == DType::f32 ? 1e-3 : 1e-2;
      const int64_t runs = c.tensor_cores ? 1 : 0;
      const Quantized x = quantize_on_cpu(scaled_random(Shape{c.N, c.I}, out, 3.0, rng), DType::f8e4m3);
      const Quantized w = quantize_on_cpu(scaled_random(Shape{c.O, c.I}, out, 0.05, rng), DType::f8e4m3);
      const Quantized dy = quantize_on_cpu(scaled_random(Shape{c.N, c.O}, out, 1e-3, rng), DType::f8e5m2);
      // A bf16 bias goes into the product's epilogue; an f32 one is prefilled.
      const Tensor b = scaled_random(Shape{c.O}, out, 0.5, rng), residual = scaled_random(Shape{c.N, c.O}, out, 2.0, rng);
      const Tensor dw0 = scaled_random(Shape{c.O, c.I}, DType::f32, 1e-2, rng);

      Tensor y = Tensor::empty(Shape{c.N, c.O}, out), dx = Tensor::empty(Shape{c.N, c.I}, out);
      Tensor dw_acc = ops::to_device(dw0, Device::cpu()), dw_new = Tensor::empty(Shape{c.O, c.I}, DType::f32);
      ops::fp8_linear_forward(y, x.q, x.scale_inv, w.q, w.scale_inv, b, residual);
      ops::fp8_linear_backward(dx, dw_acc, dy.q, dy.scale_inv, x.q, x.scale_inv, w.q, w.scale_inv);
      ops::fp8_linear_backward(Tensor(), dw_new, dy.q, dy.scale_inv, x.q, x.scale_inv, {}, {},
                               ops::GradWrite::overwrite);

      const Tensor gxq = to_gpu(x.q), gxs = to_gpu(x.scale_inv), gwq = to_gpu(w.q), gws = to_gpu(w.scale_inv);
      const Tensor gdyq = to_gpu(dy.q), gdys = to_gpu(dy.scale_inv);
      const Tensor gy = gpu_poisoned(y.shape(), out), gdx = gpu_poisoned(dx.shape(), out);
      const Tensor gdw_acc = to_gpu(dw0), gdw_new = gpu_poisoned(dw_new.shape(), DType::f32);
      int64_t before = cuda::fp8_matmul_launches();
      ops::fp8_linear_forward(gy, gxq, gxs, gwq, gws, to_gpu(b), to_gpu(residual));
      EXPECT_EQ(cuda::fp8_matmul_launches() - before, runs) << "forward";
      before = cuda::fp8_matmul_launches();
      ops::fp8_linear_backward(gdx, gdw_acc, gdyq, gdys, gxq, gxs, gwq, gws);
      EXPECT_EQ(cuda::fp8_matmul_launches() - before, 2 * runs) << "input and weight gradients";
      ops::fp8_linear_backward(Tensor(), gdw_new, gdyq, gdys, gxq, gxs, {}, {}, ops::GradWrite::overwrite);

      EXPECT_TRUE(rel_error_within(to_host(gy), to_f64(y), tol, "y"));
      EXPECT_TRUE(rel_error_within(to_host(gdx), to_f64(dx), tol, "dx"));
      EXPECT_TRUE(rel_error_within(to_host(gdw_acc), to_f64(dw_acc), 1e-3, "dw accumulated"));
      EXPECT_TRUE(rel_error_within(to_host(gdw_new), to_f64(dw_new), 1e-3, "dw overwritten"));
    }
}

}  // namespace
}  // namespace zt::test
