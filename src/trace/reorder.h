// Restores timestamp order across CPUs. Each CPU's records reach the BPF ring in order, but records of different
// CPUs interleave with small skews (a probe that reserved later can submit earlier), so the consumer holds events
// for a short window and releases them sorted.
#ifndef RVBPFD_SRC_TRACE_REORDER_H_
#define RVBPFD_SRC_TRACE_REORDER_H_

#include <cstdint>
#include <vector>

#include "trace/event.h"

namespace rvbpfd {

class Reorderer {
 public:
  // window_ns: how long (in event time, ns) an event is held for older events from other CPUs to catch up.
  explicit Reorderer(uint64_t window_ns) : window_ns_(window_ns) {}

  // O(log n) in the number of held events.
  void Push(TraceEvent event);
  // Appends to *out, in timestamp order (stable for equal timestamps: push order), every held event older than
  // (newest timestamp pushed - window).
  void PopReady(std::vector<TraceEvent>* out);
  // Appends every held event in order; used at the end of a recording.
  void Drain(std::vector<TraceEvent>* out);

  // Events that arrived older than an event already released. They are still released (never lost), out of order.
  uint64_t late() const { return late_; }
  size_t held() const { return heap_.size(); }
  uint64_t window_ns() const { return window_ns_; }

 private:
  // The heap orders small trivially copyable keys; the events themselves stay put in slots_ until released.
  struct Key {
    uint64_t t_ns;
    uint64_t seq;   // push order, for stability among equal timestamps
    uint32_t slot;  // index into slots_
  };
  void PopOne(std::vector<TraceEvent>* out);

  uint64_t window_ns_;
  uint64_t newest_ns_ = 0;
  uint64_t next_seq_ = 0;
  uint64_t late_ = 0;
  bool released_any_ = false;
  uint64_t last_released_ns_ = 0;
  std::vector<Key> heap_;  // min-heap on (t_ns, seq)
  std::vector<TraceEvent> slots_;
  std::vector<uint32_t> free_slots_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_REORDER_H_
