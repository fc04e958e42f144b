// FlatMap64: a map from uint64_t keys to values, for the small per-thread tables looked up on every record (a
// process has a few to a few thousand threads).
//
// Values live in one dense vector of (key, value) entries, which iteration walks: in insertion order until an erase
// moves the last entry into the erased one's place. An index of (key, position) slots, open-addressed with linear
// probing and at most half full, finds an entry in one or two adjacent slots: no per-entry allocation, no modulo
// by a prime, no pointer chase through bucket lists. Erase shifts the rest of the probe run back, so no tombstones
// accumulate. Any uint64_t is a valid key.
//
// Insertion (try_emplace, operator[]) and erase invalidate pointers and references to values and iterators (the
// vector may move or be reordered). Not thread-safe.
#ifndef RVBPFD_SRC_COMMON_FLAT_MAP64_H_
#define RVBPFD_SRC_COMMON_FLAT_MAP64_H_

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "common/heap_estimate.h"

namespace rvbpfd {

template <typename V>
class FlatMap64 {
 public:
  struct Entry {
    uint64_t key;
    V value;
  };
  using iterator = typename std::vector<Entry>::iterator;
  using const_iterator = typename std::vector<Entry>::const_iterator;

  FlatMap64() = default;

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  iterator begin() { return entries_.begin(); }
  iterator end() { return entries_.end(); }
  const_iterator begin() const { return entries_.begin(); }
  const_iterator end() const { return entries_.end(); }

  // The value of `key`, or null.
  V* find(uint64_t key) {
    const size_t s = FindSlot(key);
    return s == kNone ? nullptr : &entries_[slots_[s].pos].value;
  }
  const V* find(uint64_t key) const {
    const size_t s = FindSlot(key);
    return s == kNone ? nullptr : &entries_[slots_[s].pos].value;
  }
  bool contains(uint64_t key) const { return FindSlot(key) != kNone; }

  // The value of `key`, value-initialized first when new (second: true).
  std::pair<V*, bool> try_emplace(uint64_t key) {
    if (slots_.empty() || 2 * (entries_.size() + 1) > slots_.size()) Rehash(2 * (entries_.size() + 1));
    size_t s = Home(key);
    while (slots_[s].pos != kEmpty) {
      if (slots_[s].key == key) return {&entries_[slots_[s].pos].value, false};
      s = (s + 1) & mask_;
    }
    slots_[s] = Slot{key, static_cast<uint32_t>(entries_.size())};
    entries_.push_back(Entry{key, V{}});
    return {&entries_.back().value, true};
  }
  V& operator[](uint64_t key) { return *try_emplace(key).first; }

  // Removes `key`; false when absent. The last entry takes the erased one's place in iteration order.
  bool erase(uint64_t key) {
    const size_t s = FindSlot(key);
    if (s == kNone) return false;
    const uint32_t pos = slots_[s].pos;
    EraseSlot(s);
    const uint32_t last = static_cast<uint32_t>(entries_.size() - 1);
    if (pos != last) {
      entries_[pos] = std::move(entries_[last]);
      slots_[FindSlot(entries_[pos].key)].pos = pos;
    }
    entries_.pop_back();
    return true;
  }

  // Calls pred(key, value) once for every entry (it may modify the value) and removes those it returns true for.
  // Returns how many were removed.
  template <typename Pred>
  size_t erase_if(Pred pred) {
    size_t removed = 0;
    for (size_t p = 0; p < entries_.size();) {
      if (pred(entries_[p].key, entries_[p].value)) {
        erase(entries_[p].key);  // the last entry, not seen yet, moves to p
        ++removed;
      } else {
        ++p;
      }
    }
    return removed;
  }

  void clear() {
    entries_.clear();
    for (Slot& s : slots_) s.pos = kEmpty;
  }

  // Gives memory back after a burst: when the index has more than 64 slots and four times those the entries need
  // (it is kept at most half full), it and the entries' vector are resized to fit.
  void shrink_if_sparse() {
    if (slots_.size() > 64 && slots_.size() > 8 * entries_.size()) {
      Rehash(2 * entries_.size());
      entries_.shrink_to_fit();
    }
  }

  // Slots in the index (a power of two, 0 before the first insertion), and the slot a key's probe starts at in an
  // index of that many slots: for tests that build collisions.
  size_t slot_count() const { return slots_.size(); }
  static size_t home_slot(uint64_t key, size_t slot_count) {
    return static_cast<size_t>((key * kGolden) >> (64 - std::countr_zero(slot_count)));
  }
  // Heap bytes of the entries and the index (values' own heap memory not included).
  size_t approx_memory_bytes() const {
    return HeapChunk(entries_.capacity() * sizeof(Entry)) + HeapChunk(slots_.capacity() * sizeof(Slot));
  }

 private:
  static constexpr uint32_t kEmpty = UINT32_MAX;
  static constexpr size_t kNone = SIZE_MAX;
  struct Slot {
    uint64_t key = 0;
    uint32_t pos = kEmpty;  // index into entries_; kEmpty: a free slot
  };

  // Fibonacci hashing: the top bits of key * 2^64/phi, so keys differing only in high or low bits (thread pointers
  // 0x100 apart, serials 1, 2, 3) spread over the index.
  static constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
  size_t Home(uint64_t key) const { return static_cast<size_t>((key * kGolden) >> shift_); }

  size_t FindSlot(uint64_t key) const {
    if (slots_.empty()) return kNone;
    for (size_t s = Home(key);; s = (s + 1) & mask_) {
      if (slots_[s].pos == kEmpty) return kNone;
      if (slots_[s].key == key) return s;
    }
  }

  // Frees slot `hole` and moves later slots of its probe run back, so each stays reachable from its home slot.
  void EraseSlot(size_t hole) {
    for (size_t s = (hole + 1) & mask_; slots_[s].pos != kEmpty; s = (s + 1) & mask_) {
      const size_t home = Home(slots_[s].key);
      // The slot may fill the hole when its home is not cyclically within (hole, s].
      const bool stays = hole < s ? (home > hole && home <= s) : (home > hole || home <= s);
      if (stays) continue;
      slots_[hole] = slots_[s];
      hole = s;
    }
    slots_[hole].pos = kEmpty;
  }

  // An index of at least `want` (and 8) slots, rebuilt from the entries.
  void Rehash(size_t want) {
    const size_t n = std::bit_ceil(std::max<size_t>(want, 8));
    std::vector<Slot>(n).swap(slots_);  // not assign(): that keeps a larger old capacity
    mask_ = n - 1;
    shift_ = 64 - static_cast<unsigned>(std::countr_zero(n));
    for (size_t p = 0; p < entries_.size(); ++p) {
      size_t s = Home(entries_[p].key);
      while (slots_[s].pos != kEmpty) s = (s + 1) & mask_;
      slots_[s] = Slot{entries_[p].key, static_cast<uint32_t>(p)};
    }
  }

  std::vector<Entry> entries_;
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  unsigned shift_ = 64;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_FLAT_MAP64_H_
