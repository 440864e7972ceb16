// The keys and values of the positions a model has run, kept per block for
// incremental decoding (Transformer::last_logits with a cache): a new token
// attends to them instead of the whole sequence running again, so sampling
// n tokens costs n one-row passes rather than n passes over the window.
//
// Per block: k, v (B, capacity, Hkv, D) in the model's compute dtype on its
// device - Hkv its kv heads (this rank's under tensor parallelism), k after
// RoPE. Positions [0, length()) of each of the B sequences are filled; all
// sequences advance together. Memory: 2 n_blocks B capacity Hkv D elements
// (GPT-2 124M, 1024 positions, f32: 75 MB a sequence).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace zt::nn {

class KvCache {
 public:
  KvCache() = default;
  // Empty (length 0) room for `capacity` positions of `batch` sequences.
  KvCache(int64_t blocks, int64_t batch, int64_t capacity, int64_t kv_heads, int64_t head_dim, DType dtype,
          Device device);

  int64_t blocks() const { return int64_t(k_.size()); }
  int64_t batch() const { return batch_; }
  int64_t capacity() const { return capacity_; }
  int64_t length() const { return length_; }
  int64_t kv_heads() const { return kv_heads_; }
  int64_t head_dim() const { return head_dim_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int64_t nbytes() const;
  // Forgets every position (the memory stays for the next sequence).
  void clear() { length_ = 0; }

  // Block `block`'s keys or values of sequence b at positions [0, end):
  // (1, end, Hkv, D), a view of the cache.
  Tensor keys(int64_t block, int64_t b, int64_t end) const;
  Tensor values(int64_t block, int64_t b, int64_t end) const;
  // Writes block `block`'s positions [length(), length() + T): k, v
  // (B, T, Hkv, D) in the cache's dtype.
  void store(int64_t block, const Tensor& k, const Tensor& v);
  // The same from a fused qkv product's output (B, T, Hq + 2 Hkv, D): its
  // key heads (after the query heads) and value heads.
  void store_packed(int64_t block, const Tensor& qkv, int64_t q_heads);
  // Marks T more positions filled, once every block has stored them.
  void advance(int64_t T);

 private:
  // Sequence b's positions [0, end) of block `block` of kv (k_ or v_).
  Tensor positions(const std::vector<Tensor>& kv, int64_t block, int64_t b, int64_t end) const;
  // Checks that T new positions fit and block is one of the cache's.
  void check_room(const char* op, int64_t block, int64_t T) const;

  std::vector<Tensor> k_, v_;  // per block (B, capacity, Hkv, D)
  int64_t batch_ = 0, capacity_ = 0, length_ = 0, kv_heads_ = 0, head_dim_ = 0;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu();
};

}  // namespace zt::nn
