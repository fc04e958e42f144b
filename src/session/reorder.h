// Restores timestamp order across CPUs. Each CPU's records reach the BPF ring in order, but records of different
// CPUs interleave with small skews (a probe that reserved later can submit earlier), so the consumer holds items for
// a short window and releases them sorted. The recorder holds TraceEvents and releases what is older than the newest
// item minus the window (PopReady); the fleet agent holds its pending records and releases up to "now minus the
// window" of the monotonic clock (PopThrough), so a quiet process's records do not wait for a newer one.
//
// T: movable, with a public `uint64_t t_ns` (event time, ns). Not thread-safe.
#ifndef RVBPFD_SRC_SESSION_REORDER_H_
#define RVBPFD_SRC_SESSION_REORDER_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace rvbpfd {

template <typename T>
class Reorderer {
 public:
  // window_ns: how long (in event time, ns) an item is held for older items from other CPUs to catch up.
  explicit Reorderer(uint64_t window_ns) : window_ns_(window_ns) {}

  // O(log n) in the number of held items.
  void Push(T item) {
    if (released_any_ && item.t_ns < last_released_ns_) ++late_;
    newest_ns_ = std::max(newest_ns_, item.t_ns);
    uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
      slots_[slot] = std::move(item);
    } else {
      slot = static_cast<uint32_t>(slots_.size());
      slots_.push_back(std::move(item));
    }
    heap_.push_back(Key{slots_[slot].t_ns, next_seq_++, slot});
    std::push_heap(heap_.begin(), heap_.end(), KeyAfter());
  }
  // Appends to *out, in timestamp order (stable for equal timestamps: push order), every held item older than
  // (newest timestamp pushed - window).
  void PopReady(std::vector<T>* out) {
    if (newest_ns_ <= window_ns_) return;  // nothing can be older than (newest - window) yet
    PopThrough(newest_ns_ - window_ns_ - 1, [out](T&& item) { out->push_back(std::move(item)); });
  }
  // Calls release(T&&) in timestamp order (stable: push order) for every held item with t_ns <= last_ns.
  template <typename F>
  void PopThrough(uint64_t last_ns, F&& release) {
    while (!heap_.empty() && heap_.front().t_ns <= last_ns) release(PopOne());
  }
  // Appends every held item in order; used at the end of a recording.
  void Drain(std::vector<T>* out) {
    while (!heap_.empty()) out->push_back(PopOne());
  }

  // Items that arrived older than an item already released. They are still released (never lost), out of order.
  uint64_t late() const { return late_; }
  size_t held() const { return heap_.size(); }
  uint64_t window_ns() const { return window_ns_; }

 private:
  // The heap orders small trivially copyable keys; the items themselves stay put in slots_ until released.
  struct Key {
    uint64_t t_ns;
    uint64_t seq;   // push order, for stability among equal timestamps
    uint32_t slot;  // index into slots_
  };
  // std::push_heap builds a max-heap; "after" puts the oldest (then first-pushed) key on top.
  struct KeyAfter {
    bool operator()(const Key& a, const Key& b) const { return a.t_ns != b.t_ns ? a.t_ns > b.t_ns : a.seq > b.seq; }
  };
  T PopOne() {
    std::pop_heap(heap_.begin(), heap_.end(), KeyAfter());
    const Key key = heap_.back();
    heap_.pop_back();
    free_slots_.push_back(key.slot);
    if (!released_any_ || key.t_ns > last_released_ns_) last_released_ns_ = key.t_ns;
    released_any_ = true;
    return std::move(slots_[key.slot]);
  }

  uint64_t window_ns_;
  uint64_t newest_ns_ = 0;
  uint64_t next_seq_ = 0;
  uint64_t late_ = 0;
  bool released_any_ = false;
  uint64_t last_released_ns_ = 0;
  std::vector<Key> heap_;  // min-heap on (t_ns, seq)
  std::vector<T> slots_;
  std::vector<uint32_t> free_slots_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SESSION_REORDER_H_
