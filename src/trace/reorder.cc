#include "trace/reorder.h"

#include <algorithm>
#include <utility>

namespace rvbpfd {
namespace {

// std::push_heap builds a max-heap; "greater" puts the oldest (then first-pushed) key on top.
struct KeyAfter {
  template <typename K>
  bool operator()(const K& a, const K& b) const {
    return a.t_ns != b.t_ns ? a.t_ns > b.t_ns : a.seq > b.seq;
  }
};

}  // namespace

void Reorderer::Push(TraceEvent event) {
  if (released_any_ && event.t_ns < last_released_ns_) ++late_;
  newest_ns_ = std::max(newest_ns_, event.t_ns);
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = std::move(event);
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.push_back(std::move(event));
  }
  heap_.push_back(Key{slots_[slot].t_ns, next_seq_++, slot});
  std::push_heap(heap_.begin(), heap_.end(), KeyAfter());
}

void Reorderer::PopOne(std::vector<TraceEvent>* out) {
  std::pop_heap(heap_.begin(), heap_.end(), KeyAfter());
  const Key key = heap_.back();
  heap_.pop_back();
  out->push_back(std::move(slots_[key.slot]));
  free_slots_.push_back(key.slot);
  if (!released_any_ || key.t_ns > last_released_ns_) last_released_ns_ = key.t_ns;
  released_any_ = true;
}

void Reorderer::PopReady(std::vector<TraceEvent>* out) {
  if (newest_ns_ < window_ns_) return;  // nothing can be older than (newest - window) yet
  const uint64_t horizon = newest_ns_ - window_ns_;
  while (!heap_.empty() && heap_.front().t_ns < horizon) PopOne(out);
}

void Reorderer::Drain(std::vector<TraceEvent>* out) {
  while (!heap_.empty()) PopOne(out);
}

}  // namespace rvbpfd
