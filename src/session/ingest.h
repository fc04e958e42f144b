// The per-process bookkeeping between the ring and the consumers that the single-target recorder and the fleet agent
// share: the stack resolver's GC epoch, the filter that keeps samples from naming exited threads, and the bounded
// drain of the ring before the daemon stamps an event of its own. Both push what they keep through a Reorderer
// (session/reorder.h).
//
// Not thread-safe: one instance per traced process, used from the daemon's loop and the ring callbacks it runs.
#ifndef RVBPFD_SRC_SESSION_INGEST_H_
#define RVBPFD_SRC_SESSION_INGEST_H_

#include <cstddef>
#include <cstdint>
#include <unordered_set>

#include "rvbpfd/abi.h"

namespace rvbpfd {

// The generation of a process's stack-resolver cache (StackResolver::set_epoch): Ruby objects move or die only inside
// GC, so cached frames are revalidated once a GC may have run. It advances at every GC_ENTER record as it comes out
// of the ring (a stack it carries was taken before the GC ran, so it is resolved first), at every lost record
// (OnLoss: it may have been a GC_ENTER), at every stack resolved while the overhead budget has the GC sites detached
// (GCs go unseen then) and when they are attached again.
class GcEpoch {
 public:
  // A record of `kind` came out of the ring (for a record with a stack: once the stack is resolved).
  void OnRecord(uint32_t kind) {
    if (kind == RV_EV_GC_ENTER) ++value_;
  }
  // The epoch to resolve a stack with; gc_sites_detached: the budget has the GC sites detached now.
  uint64_t ForStack(bool gc_sites_detached) {
    if (gc_sites_detached) ++value_;
    return value_;
  }
  // Records were lost (events_dropped).
  void OnLoss() { ++value_; }
  // The GC sites were attached again: a GC may have run between the last stack resolved and the reattach.
  void OnGcSitesReattached() { ++value_; }
  uint64_t value() const { return value_; }

 private:
  uint64_t value_ = 0;
};

// A native thread keeps its last th in BPF's current_th after that Ruby thread exited (until it runs another), so a
// sample can name a dead thread; such samples are dropped rather than reviving its id. Fed every item in time order.
class ExitedThreads {
 public:
  // th: the item's thread (0: none known); sample: an on-CPU sample; exited: a thread_exited event. Returns whether
  // the item is kept. Any other event of that th makes it live again (a freed rb_thread_t's memory can hold a later
  // thread).
  bool Keep(uint64_t th, bool sample, bool exited) {
    if (th == 0) return true;
    if (sample) return exited_.count(th) == 0;
    if (exited) {
      exited_.insert(th);
    } else {
      exited_.erase(th);
    }
    return true;
  }
  size_t size() const { return exited_.size(); }

 private:
  std::unordered_set<uint64_t> exited_;
};

// Drains what the ring holds now: `poll` (a Poll(0), returning the records it consumed, or < 0 on error) is called
// until it finds nothing, at most kMaxRounds times so that a flood cannot pin the daemon here.
template <typename PollFn>
void DrainRing(PollFn&& poll) {
  constexpr int kMaxRounds = 64;
  for (int i = 0; i < kMaxRounds; ++i) {
    if (poll() <= 0) break;
  }
}

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SESSION_INGEST_H_
