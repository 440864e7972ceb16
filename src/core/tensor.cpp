#include <cstdint>

#include "core/tensor.h"

namespace zt {

Storage::Storage(size_t bytes, Device device, MemCategory category)
    : bytes_(bytes), device_(device), category_(category), allocator_(&allocator_for(device)) {
  data_ = allocator_->allocate(bytes, category);
}

Storage::Storage(void* external, size_t bytes, Device device) : data_(external), bytes_(bytes), device_(device) {}

Storage::~Storage() {
  if (allocator_) allocator_->deallocate(data_, bytes_, category_);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemCategory category) {
  Tensor t;
  const int64_t n = shape.numel();
  t.storage_ = std::make_shared<Storage>(size_t(n) * dtype_size(dtype), device, category);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(data, size_t(shape.numel()) * dtype_size(dtype), device);
  t.shape_ = shape;
  t.dtype_ = dtype;
  return t;
}

Device Tensor::device() const {
  ZT_ASSERT(defined(), "device() of an undefined tensor");
  return storage_->device();
}

MemCategory Tensor::category() const {
  ZT_ASSERT(defined(), "category() of an undefined tensor");
  return storage_->category();
}

void* Tensor::data_ptr() const {
  ZT_CHECK(defined(), "use of an undefined (empty) tensor");
  return static_cast<char*>(storage_->data()) + offset_;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  ZT_CHECK(defined() && ndim() >= 1, "slice of ", str(), ": needs a tensor with at least one dimension");
  ZT_CHECK(0 <= begin && begin <= end && end <= shape_[0], "slice [", begin, ", ", end, ") out of range for ", str());
  Tensor t = *this;
  t.offset_ += size_t(begin) * size_t(shape_.prod(1, ndim())) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::select(int64_t i) const {
  Tensor t = slice(i, i + 1);
  Shape s(t.shape_.begin() + 1, t.shape_.end());
  t.shape_ = s;
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  ZT_CHECK(defined(), "view of an undefined tensor");
  ZT_CHECK(shape.numel() == numel(), "view of ", str(), " as ", shape.str(), ": element counts differ");
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::flat_view(int64_t first, const Shape& shape) const {
  ZT_CHECK(defined(), "flat_view of an undefined tensor");
  ZT_CHECK(first >= 0 && first + shape.numel() <= numel(), "flat_view of ", shape.str(), " at element ", first,
           " is out of range for ", str());
  Tensor t = *this;
  t.offset_ += size_t(first) * dtype_size(dtype_);
  t.shape_ = shape;
  return t;
}

bool Tensor::overlaps(const Tensor& o) const {
  if (!defined() || !o.defined() || storage_ != o.storage_) return false;
  const size_t a0 = offset_, a1 = offset_ + nbytes(), b0 = o.offset_, b1 = o.offset_ + o.nbytes();
  return a0 < b1 && b0 < a1;
}

bool Tensor::same_as(const Tensor& o) const {
  return storage_ == o.storage_ && offset_ == o.offset_ && shape_ == o.shape_ && dtype_ == o.dtype_;
}

std::string Tensor::str() const {
  if (!defined()) return "undefined tensor";
  return std::string(dtype_name(dtype_)) + shape_.str() + " on " + device().str();
}

}  // namespace zt
