// The byte-pair merge loop shared by every tokenizer flavour (internal to
// data/; exposed for tests).
//
// A vocabulary is reduced to a table of mergeable adjacent pairs:
//   (left id, right id) -> (rank, merged id)
// For GPT-2's files the rank of a pair is its line in vocab.bpe; for a
// tiktoken rank file, every split of a token t into two tokens (x, y) is the
// pair (x, y) with rank = rank(t), which is exactly tiktoken's rule ("merge
// the adjacent pair whose concatenation has the lowest rank").
//
// The merge: start from one token per byte; repeatedly merge the adjacent
// pair of lowest rank, the leftmost on ties, until no adjacent pair is in the
// table. (GPT-2's reference merges every occurrence of the best pair in one
// left-to-right pass; because a merge only creates pairs of higher rank in a
// trained vocabulary, that is the same sequence of merges.)
// Two implementations give identical results: a scan (O(n^2), fastest for
// the short pieces of ordinary text) and a binary heap over a linked list
// (O(n log n), for long pieces such as runs of white space or digits).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zt::data::detail {

inline constexpr uint32_t kNoRank = 0xFFFFFFFFu;

class PairTable {
 public:
  struct Entry {
    uint64_t key;  // (left << 32) | right; kEmpty when unused
    uint32_t rank;
    uint32_t merged;
  };
  static constexpr uint64_t kEmpty = ~uint64_t(0);

  void reserve(size_t pairs);
  // False (and no change) if the pair is already present.
  bool insert(uint32_t left, uint32_t right, uint32_t rank, uint32_t merged);
  // The entry of the pair, or null.
  const Entry* find(uint32_t left, uint32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = (uint64_t(left) << 32) | right;
    for (uint64_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Entry& e = slots_[i];
      if (e.key == key) return &e;
      if (e.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }
  const std::vector<Entry>& slots() const { return slots_; }

 private:
  uint64_t slot_of(uint64_t key) const { return ((key * 0x9e3779b97f4a7c15ull) >> shift_) & mask_; }
  void grow();
  std::vector<Entry> slots_;
  uint64_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

// Scratch reused across pieces by one thread.
struct MergeWorkspace {
  std::vector<uint32_t> ranks, merged;
  struct Node {
    uint32_t id;
    int32_t prev, next;
  };
  std::vector<Node> nodes;
  struct Item {
    uint32_t rank;
    uint32_t pos;  // the left node (nodes keep their original index)
    uint32_t left_id, right_id;
  };
  std::vector<Item> heap;
};

// Merges `ids` (initially one token per byte) in place.
void bpe_merge_scan(const PairTable& pairs, std::vector<uint32_t>& ids, MergeWorkspace& ws);
void bpe_merge_heap(const PairTable& pairs, std::vector<uint32_t>& ids, MergeWorkspace& ws);
// The scan for short pieces, the heap for long ones.
inline constexpr size_t kHeapMergeThreshold = 48;
inline void bpe_merge(const PairTable& pairs, std::vector<uint32_t>& ids, MergeWorkspace& ws) {
  if (ids.size() <= kHeapMergeThreshold) {
    bpe_merge_scan(pairs, ids, ws);
  } else {
    bpe_merge_heap(pairs, ids, ws);
  }
}

}  // namespace zt::data::detail
