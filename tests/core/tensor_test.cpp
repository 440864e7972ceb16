#include <cstdint>
#include <gtest/gtest.h>

#include "core/error.h"
#include "core/tensor.h"

namespace zt {
namespace {

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Shape, Basics) {
  Shape s{2, 3, 4};
  EXPECT_EQ(s.ndim(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s[-1], 4);
  EXPECT_EQ(s.prod(1, 3), 12);
  EXPECT_EQ(s.str(), "(2, 3, 4)");
  EXPECT_EQ(s.with_dim0(5), (Shape{5, 3, 4}));
  EXPECT_EQ(Shape{}.numel(), 1);
  EXPECT_NE(s, (Shape{2, 3}));
  EXPECT_NE(error_of([] { Shape{int64_t(1) << 40, int64_t(1) << 40}.numel(); }).find("overflow"), std::string::npos);
  EXPECT_NE(error_of([] { Shape{2, -1}; }).find("negative dimension"), std::string::npos);
  EXPECT_NE(error_of([] { Shape{1, 1, 1, 1, 1, 1, 1, 1, 1}; }).find("at most 8"), std::string::npos);
  EXPECT_THROW(s[3], InternalError);
}

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_NE(error_of([] { parse_device("tpu"); }).find("unknown device 'tpu'"), std::string::npos);
  EXPECT_THROW(parse_device("cuda:x"), Error);
  EXPECT_THROW(parse_device("cuda:-1"), Error);
}

TEST(Tensor, SliceSelectViewShareStorage) {
  Tensor t = Tensor::empty(Shape{4, 3}, DType::f32);
  float* p = t.data<float>();
  for (int i = 0; i < 12; ++i) p[i] = float(i);
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.data<float>()[0], 3.0f);
  EXPECT_EQ(s.byte_offset(), 12u);
  s.data<float>()[0] = 100;  // writes through
  EXPECT_EQ(p[3], 100.0f);
  Tensor row = t.select(3);
  EXPECT_EQ(row.shape(), (Shape{3}));
  EXPECT_EQ(row.data<float>()[2], 11.0f);
  Tensor v = t.view(Shape{2, 6});
  EXPECT_EQ(v.data<float>()[6], 6.0f);
  Tensor f = t.flat_view(5, Shape{2, 2});
  EXPECT_EQ(f.data<float>()[0], 5.0f);
  EXPECT_TRUE(s.overlaps(t));
  EXPECT_FALSE(t.slice(0, 1).overlaps(t.slice(1, 2)));
  EXPECT_TRUE(t.same_as(t.view(Shape{4, 3})));
  EXPECT_FALSE(t.same_as(v));
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.str(), "f32(4, 3) on cpu");
}

TEST(Tensor, BadViewsAreClearErrors) {
  Tensor t = Tensor::empty(Shape{4, 3}, DType::bf16);
  EXPECT_NE(error_of([&] { t.slice(2, 5); }).find("slice [2, 5) out of range for bf16(4, 3)"), std::string::npos);
  EXPECT_NE(error_of([&] { t.view(Shape{5}); }).find("element counts differ"), std::string::npos);
  EXPECT_NE(error_of([&] { t.data<float>(); }).find("accessed as f32"), std::string::npos);
  EXPECT_NE(error_of([&] { t.flat_view(10, Shape{3}); }).find("out of range"), std::string::npos);
  Tensor undefined;
  EXPECT_FALSE(undefined.defined());
  EXPECT_NE(error_of([&] { undefined.data_ptr(); }).find("undefined"), std::string::npos);
  EXPECT_EQ(undefined.str(), "undefined tensor");
}

TEST(Tensor, ZeroSizedTensorsWork) {
  Tensor t = Tensor::empty(Shape{0, 5}, DType::f32);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_EQ(t.slice(0, 0).numel(), 0);
}

TEST(Errors, TwoTiers) {
  try {
    ZT_CHECK(1 + 1 == 3, "batch size ", 7, " does not divide ", 3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "batch size 7 does not divide 3");
  }
  try {
    ZT_ASSERT(false, "x=", 1);
    FAIL();
  } catch (const InternalError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tensor_test.cpp"), std::string::npos);
    EXPECT_NE(msg.find("x=1"), std::string::npos);
  }
}

}  // namespace
}  // namespace zt
