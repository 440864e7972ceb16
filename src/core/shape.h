// Shape: the extents of a contiguous row-major tensor, at most kMaxDims dims.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace zt {

class Shape {
 public:
  static constexpr int kMaxDims = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  template <typename It>
  Shape(It first, It last) {
    for (; first != last; ++first) push_back(int64_t(*first));
  }

  int ndim() const { return ndim_; }
  int64_t operator[](int i) const;  // negative i counts from the end
  int64_t& operator[](int i);
  int64_t numel() const;  // 1 for a 0-d shape; throws on overflow
  void push_back(int64_t d);
  // The product of the dims in [begin, end).
  int64_t prod(int begin, int end) const;
  // Same shape with dim 0 replaced.
  Shape with_dim0(int64_t d0) const;

  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string str() const;  // "(2, 3, 4)"

  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + ndim_; }

 private:
  std::array<int64_t, kMaxDims> dims_{};
  int ndim_ = 0;
};

}  // namespace zt
