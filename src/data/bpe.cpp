#include "data/bpe.h"

#include <algorithm>
#include <bit>
#include <cstdint>

#include "core/error.h"

namespace zt::data::detail {

void PairTable::reserve(size_t pairs) {
  size_t cap = 16;
  while (cap < pairs * 2) cap *= 2;
  if (cap <= slots_.size()) return;
  std::vector<Entry> old;
  old.swap(slots_);
  slots_.assign(cap, Entry{kEmpty, 0, 0});
  mask_ = cap - 1;
  shift_ = 64 - std::countr_zero(cap);
  size_ = 0;
  for (const Entry& e : old)
    if (e.key != kEmpty) insert(uint32_t(e.key >> 32), uint32_t(e.key), e.rank, e.merged);
}

void PairTable::grow() { reserve(std::max<size_t>(size_ + 1, slots_.size())); }

bool PairTable::insert(uint32_t left, uint32_t right, uint32_t rank, uint32_t merged) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = (uint64_t(left) << 32) | right;
  ZT_ASSERT(key != kEmpty, "pair key collides with the empty marker");
  for (uint64_t i = slot_of(key);; i = (i + 1) & mask_) {
    Entry& e = slots_[i];
    if (e.key == key) return false;
    if (e.key == kEmpty) {
      e = Entry{key, rank, merged};
      ++size_;
      return true;
    }
  }
}

void bpe_merge_scan(const PairTable& pairs, std::vector<uint32_t>& ids, MergeWorkspace& ws) {
  size_t n = ids.size();
  if (n < 2) return;
  auto& ranks = ws.ranks;
  auto& merged = ws.merged;
  ranks.resize(n);
  merged.resize(n);
  auto set = [&](size_t i) {  // pair (i, i + 1); i + 1 < n
    const PairTable::Entry* e = pairs.find(ids[i], ids[i + 1]);
    ranks[i] = e ? e->rank : kNoRank;
    merged[i] = e ? e->merged : 0;
  };
  for (size_t i = 0; i + 1 < n; ++i) set(i);
  ranks[n - 1] = kNoRank;
  while (n > 1) {
    uint32_t best = kNoRank;
    size_t m = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      if (ranks[i] < best) {
        best = ranks[i];
        m = i;
      }
    }
    if (best == kNoRank) break;
    ids[m] = merged[m];
    // Drop element m + 1 of ids, ranks and merged.
    for (size_t i = m + 1; i + 1 < n; ++i) {
      ids[i] = ids[i + 1];
      ranks[i] = ranks[i + 1];
      merged[i] = merged[i + 1];
    }
    --n;
    ranks[n - 1] = kNoRank;
    if (m + 1 < n) set(m);
    if (m > 0) set(m - 1);
  }
  ids.resize(n);
}

void bpe_merge_heap(const PairTable& pairs, std::vector<uint32_t>& ids, MergeWorkspace& ws) {
  const size_t n = ids.size();
  if (n < 2) return;
  ZT_ASSERT(n < (size_t(1) << 31), "piece too long for the merge heap");
  auto& nodes = ws.nodes;
  auto& heap = ws.heap;
  nodes.resize(n);
  heap.clear();
  // Min-heap on (rank, position).
  const auto after = [](const MergeWorkspace::Item& a, const MergeWorkspace::Item& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  const auto push = [&](int32_t left) {
    const int32_t right = nodes[size_t(left)].next;
    if (right < 0) return;
    const PairTable::Entry* e = pairs.find(nodes[size_t(left)].id, nodes[size_t(right)].id);
    if (!e) return;
    heap.push_back({e->rank, uint32_t(left), nodes[size_t(left)].id, nodes[size_t(right)].id});
    std::push_heap(heap.begin(), heap.end(), after);
  };
  for (size_t i = 0; i < n; ++i)
    nodes[i] = {ids[i], int32_t(i) - 1, i + 1 < n ? int32_t(i + 1) : -1};
  for (size_t i = 0; i + 1 < n; ++i) push(int32_t(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), after);
    const MergeWorkspace::Item it = heap.back();
    heap.pop_back();
    auto& left = nodes[it.pos];
    // Stale if either side has merged since (ids only ever change by merging,
    // and a removed node is unlinked, so checking the link and both ids is enough).
    if (left.id != it.left_id || left.next < 0 || nodes[size_t(left.next)].id != it.right_id) continue;
    const int32_t right = left.next;
    left.id = pairs.find(it.left_id, it.right_id)->merged;
    left.next = nodes[size_t(right)].next;
    if (left.next >= 0) nodes[size_t(left.next)].prev = int32_t(it.pos);
    nodes[size_t(right)].id = kNoRank;  // removed
    if (left.prev >= 0) push(left.prev);
    push(int32_t(it.pos));
  }
  size_t k = 0;
  for (int32_t i = 0; i >= 0; i = nodes[size_t(i)].next) ids[k++] = nodes[size_t(i)].id;
  ids.resize(k);
}

}  // namespace zt::data::detail
