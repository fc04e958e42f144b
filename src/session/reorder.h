// Restores timestamp order across CPUs. Each CPU's records reach the BPF ring in order, but records of different
// CPUs interleave with small skews (a probe that reserved later can submit earlier), so the consumer holds items for
// a short window and releases them sorted. The recorder holds TraceEvents and releases what is older than the newest
// item minus the window (PopReady); the fleet agent holds its pending records and releases up to "now minus the
// window" of the monotonic clock (PopThrough), so a quiet process's records do not wait for a newer one.
//
// T: default-constructible and movable, with a public `uint64_t t_ns` (event time, ns). Not thread-safe.
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

  // O(1) for an item no older than the last one queued in order (nearly every record: each CPU's arrive in order),
  // O(log n) in the number of held stragglers otherwise.
  void Push(T item) {
    if (released_any_ && item.t_ns < last_released_ns_) ++late_;
    newest_ns_ = std::max(newest_ns_, item.t_ns);
    const uint64_t seq = next_seq_++;
    if (queued_ == 0 || item.t_ns >= queue_back_ns_) {
      queue_back_ns_ = item.t_ns;
      Enqueue(Queued{seq, std::move(item)});
      return;
    }
    uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
      slots_[slot] = std::move(item);
    } else {
      slot = static_cast<uint32_t>(slots_.size());
      slots_.push_back(std::move(item));
    }
    heap_.push_back(Key{slots_[slot].t_ns, seq, slot});
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
    while (held() != 0) {
      const bool queued = NextIsQueued();
      if ((queued ? ring_[head_].item.t_ns : heap_.front().t_ns) > last_ns) return;
      release(queued ? PopQueued() : PopStraggler());
    }
  }
  // Appends every held item in order; used at the end of a recording.
  void Drain(std::vector<T>* out) {
    while (held() != 0) out->push_back(NextIsQueued() ? PopQueued() : PopStraggler());
  }

  // Items that arrived older than an item already released. They are still released (never lost), out of order.
  uint64_t late() const { return late_; }
  size_t held() const { return queued_ + heap_.size(); }
  uint64_t window_ns() const { return window_ns_; }

 private:
  // Held items live in two places, merged at release by (t_ns, push order):
  //  - the in-order queue: a FIFO ring of items each no older than the one queued before it (moved in and out once,
  //    in memory order);
  //  - the stragglers: items older than the queue's last one, in slots_, ordered by a min-heap of small keys.
  struct Queued {
    uint64_t seq = 0;  // push order, for stability among equal timestamps
    T item{};
  };
  struct Key {
    uint64_t t_ns;
    uint64_t seq;
    uint32_t slot;  // index into slots_
  };
  // std::push_heap builds a max-heap; "after" puts the oldest (then first-pushed) key on top.
  struct KeyAfter {
    bool operator()(const Key& a, const Key& b) const { return a.t_ns != b.t_ns ? a.t_ns > b.t_ns : a.seq > b.seq; }
  };

  void Enqueue(Queued q) {
    if (queued_ == ring_.size()) {
      // Double the ring (a power of two, so positions wrap with a mask), unrolled from head_ to index 0.
      std::vector<Queued> bigger(std::max<size_t>(64, 2 * ring_.size()));
      for (size_t i = 0; i < queued_; ++i) bigger[i] = std::move(ring_[(head_ + i) & (ring_.size() - 1)]);
      ring_ = std::move(bigger);
      head_ = 0;
    }
    ring_[(head_ + queued_) & (ring_.size() - 1)] = std::move(q);
    ++queued_;
  }
  // Whether the next item to release is the queue's first (else the top straggler); held() must be > 0.
  bool NextIsQueued() const {
    if (heap_.empty()) return true;
    if (queued_ == 0) return false;
    const Queued& q = ring_[head_];
    const Key& k = heap_.front();
    return q.item.t_ns != k.t_ns ? q.item.t_ns < k.t_ns : q.seq < k.seq;
  }
  T PopQueued() {
    T out = std::move(ring_[head_].item);
    head_ = (head_ + 1) & (ring_.size() - 1);
    --queued_;
    NoteReleased(out.t_ns);
    return out;
  }
  T PopStraggler() {
    std::pop_heap(heap_.begin(), heap_.end(), KeyAfter());
    const Key key = heap_.back();
    heap_.pop_back();
    free_slots_.push_back(key.slot);
    NoteReleased(key.t_ns);
    return std::move(slots_[key.slot]);
  }
  void NoteReleased(uint64_t t_ns) {
    if (!released_any_ || t_ns > last_released_ns_) last_released_ns_ = t_ns;
    released_any_ = true;
  }

  uint64_t window_ns_;
  uint64_t newest_ns_ = 0;
  uint64_t next_seq_ = 0;
  uint64_t late_ = 0;
  bool released_any_ = false;
  uint64_t last_released_ns_ = 0;
  std::vector<Queued> ring_;  // the in-order queue's storage: capacity ring_.size() (0 or a power of two)
  size_t head_ = 0;           // index of the queue's first item
  size_t queued_ = 0;         // items in the queue
  uint64_t queue_back_ns_ = 0;  // t_ns of the queue's last item (valid while queued_ > 0)
  std::vector<Key> heap_;     // the stragglers' min-heap on (t_ns, seq)
  std::vector<T> slots_;
  std::vector<uint32_t> free_slots_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SESSION_REORDER_H_
