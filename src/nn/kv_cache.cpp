#include "nn/kv_cache.h"

#include "core/error.h"
#include "ops/device.h"

namespace zt::nn {

KvCache::KvCache(int64_t blocks, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim, DType dtype,
                 Device device)
    : batch_(batch), capacity_(capacity), kv_heads_(kv_heads), head_dim_(head_dim), dtype_(dtype), device_(device) {
  ZT_CHECK(blocks >= 0 && batch > 0 && capacity > 0 && kv_heads > 0 && head_dim > 0,
           "KV cache: blocks = ", blocks, ", batch = ", batch, ", capacity = ", capacity, ", kv heads = ", kv_heads,
           ", head dim = ", head_dim, "; each but blocks must be positive");
  const Shape shape{batch, capacity, kv_heads, head_dim};
  for (int64_t i = 0; i < blocks; ++i) {
    k_.push_back(Tensor::empty(shape, dtype, device, MemCategory::activations));
    v_.push_back(Tensor::empty(shape, dtype, device, MemCategory::activations));
  }
}

int64_t KvCache::nbytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < k_.size(); ++i) n += int64_t(k_[i].nbytes() + v_[i].nbytes());
  return n;
}

void KvCache::check_room(const char* op, int64_t block, int64_t T) const {
  ZT_CHECK(block >= 0 && block < blocks(), "KV cache ", op, ": block ", block, " is not one of its ", blocks());
  ZT_CHECK(T >= 1 && length_ + T <= capacity_, "KV cache ", op, ": ", T, " new positions do not fit: it holds ",
           length_, " of its ", capacity_, "; clear() it and run the last ", capacity_, " tokens again");
}

Tensor KvCache::positions(const std::vector<Tensor>& kv, int64_t block, int64_t b, int64_t end) const {
  ZT_ASSERT(block >= 0 && block < blocks() && b >= 0 && b < batch_ && end >= 1 && end <= capacity_,
            "KV cache positions out of range");
  return kv[size_t(block)].select(b).slice(0, end).view(Shape{1, end, kv_heads_, head_dim_});
}

Tensor KvCache::keys(int64_t block, int64_t b, int64_t end) const { return positions(k_, block, b, end); }
Tensor KvCache::values(int64_t block, int64_t b, int64_t end) const { return positions(v_, block, b, end); }

void KvCache::store(int64_t block, const Tensor& k, const Tensor& v) {
  const int64_t T = k.ndim() == 4 ? k.size(1) : 0;
  check_room("store", block, T);
  const Shape want{batch_, T, kv_heads_, head_dim_};
  ZT_CHECK(k.shape() == want && v.shape() == want, "KV cache store: k ", k.str(), " and v ", v.str(), " must be ",
           want.str(), " (B, T, Hkv, D)");
  // Each sequence's T rows land at its positions [length, length + T).
  const int64_t row = kv_heads_ * head_dim_;
  ops::copy_columns(k_[size_t(block)], length_ * row, k, 0, T * row, batch_);
  ops::copy_columns(v_[size_t(block)], length_ * row, v, 0, T * row, batch_);
}

void KvCache::store_packed(int64_t block, const Tensor& qkv, int64_t q_heads) {
  const int64_t T = qkv.ndim() == 4 ? qkv.size(1) : 0;
  check_room("store_packed", block, T);
  const Shape want{batch_, T, q_heads + 2 * kv_heads_, head_dim_};
  ZT_CHECK(qkv.shape() == want, "KV cache store_packed: qkv ", qkv.str(), " must be ", want.str(),
           " (B, T, Hq + 2 Hkv, D)");
  const int64_t D = head_dim_, row = kv_heads_ * D;
  for (int64_t b = 0; b < batch_; ++b) {
    const Tensor heads = qkv.select(b);  // (T, Hq + 2 Hkv, D)
    ops::copy_columns(k_[size_t(block)].select(b).slice(length_, length_ + T), 0, heads, q_heads * D, row, T);
    ops::copy_columns(v_[size_t(block)].select(b).slice(length_, length_ + T), 0, heads, q_heads * D + row, row, T);
  }
}

void KvCache::advance(int64_t T) {
  ZT_ASSERT(T >= 1 && length_ + T <= capacity_, "KV cache advanced past its capacity");
  length_ += T;
}

}  // namespace zt::nn
