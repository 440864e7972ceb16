// Tensor: a contiguous row-major view of typed bytes on one device.
//
// A Tensor is a cheap handle (shared ownership of a Storage) plus a byte
// offset, a Shape and a DType. There are no general strides: views are
// slices along dim 0 and reshapes of the same element count, which is all the
// flat-buffer design needs (parameter/gradient buffers are carved into
// per-tensor views; ZeRO shards and DP buckets are views too).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace zt {

// Owns (or, for wrapped memory, borrows) one block of bytes.
class Storage {
 public:
  // Allocates `bytes` from the device's allocator, accounted under `category`.
  Storage(size_t bytes, Device device, MemCategory category);
  // Borrows memory owned elsewhere (an mmap'ed file, a caller's buffer);
  // not accounted and never freed here.
  Storage(void* external, size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  MemCategory category() const { return category_; }
  bool owned() const { return allocator_ != nullptr; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  MemCategory category_ = MemCategory::workspace;
  Allocator* allocator_ = nullptr;  // null for borrowed memory
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() == false

  // Uninitialised tensor from the device's caching allocator.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu(),
                      MemCategory category = MemCategory::activations);
  // Borrowed memory; the caller keeps it alive longer than every view.
  static Tensor wrap(void* data, const Shape& shape, DType dtype, Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const;
  MemCategory category() const;
  int ndim() const { return shape_.ndim(); }
  int64_t size(int dim) const { return shape_[dim]; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype_); }
  size_t byte_offset() const { return offset_; }

  void* data_ptr() const;
  // Typed pointer; throws zt::Error if T does not match dtype().
  template <typename T>
  T* data() const {
    ZT_CHECK(dtype_of<T>() == dtype_, "tensor ", str(), " accessed as ", dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_ptr());
  }

  // Rows [begin, end) along dim 0, sharing storage.
  Tensor slice(int64_t begin, int64_t end) const;
  // Row i along dim 0 with that dim dropped, sharing storage.
  Tensor select(int64_t i) const;
  // The same elements with another shape of equal numel, sharing storage.
  Tensor view(const Shape& shape) const;
  // The whole tensor as 1-D.
  Tensor flatten() const { return view(Shape{numel()}); }
  // A view of `n` elements starting at element `first` of the flattened
  // tensor, with the given shape (n == shape.numel()): carves flat buffers.
  Tensor flat_view(int64_t first, const Shape& shape) const;

  // True if both share storage and their byte ranges overlap.
  bool overlaps(const Tensor& other) const;
  // Same storage, offset, shape and dtype (an exact alias).
  bool same_as(const Tensor& other) const;

  // "f32(2, 3) on cpu"
  std::string str() const;

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes from storage start
  Shape shape_;
  DType dtype_ = DType::f32;
};

}  // namespace zt
