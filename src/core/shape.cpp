#include "core/shape.h"

#include <cstdint>
#include <sstream>

#include "core/error.h"

namespace zt {

Shape::Shape(std::initializer_list<int64_t> dims) {
  for (int64_t d : dims) push_back(d);
}

void Shape::push_back(int64_t d) {
  ZT_CHECK(ndim_ < kMaxDims, "a tensor has at most ", kMaxDims, " dimensions");
  ZT_CHECK(d >= 0, "negative dimension ", d, " in a shape");
  dims_[ndim_++] = d;
}

int64_t Shape::operator[](int i) const {
  const int j = i < 0 ? i + ndim_ : i;
  ZT_ASSERT(j >= 0 && j < ndim_, "dim ", i, " of shape ", str());
  return dims_[j];
}

int64_t& Shape::operator[](int i) {
  const int j = i < 0 ? i + ndim_ : i;
  ZT_ASSERT(j >= 0 && j < ndim_, "dim ", i, " of shape ", str());
  return dims_[j];
}

int64_t Shape::prod(int begin, int end) const {
  int64_t n = 1;
  for (int i = begin; i < end; ++i) {
    ZT_CHECK(!__builtin_mul_overflow(n, dims_[i], &n), "shape ", str(), " has too many elements (overflow)");
  }
  return n;
}

int64_t Shape::numel() const { return prod(0, ndim_); }

Shape Shape::with_dim0(int64_t d0) const {
  ZT_ASSERT(ndim_ > 0);
  Shape s = *this;
  s.dims_[0] = d0;
  return s;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim_ != o.ndim_) return false;
  for (int i = 0; i < ndim_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < ndim_; ++i) os << (i ? ", " : "") << dims_[i];
  os << ")";
  return os.str();
}

}  // namespace zt
