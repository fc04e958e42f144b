// TopState: the per-interval aggregation behind `rvbpfd top`, fed the recorder's own events (in time order, threads
// numbered, stacks interned in `stacks`) and cut into intervals. It derives nothing itself: thread states and GVL
// holders come from the SpanTracker (model/span_tracker.h), who made whom wait from the streaming Attribution
// (model/attribution.h, blame_cut_waits) and the blocker rows from GroupBlockers (model/blockers.h).
//
// Memory: one tracker state per thread, the spans and samples the open waits need (drained every interval), and the
// interval's per-thread and per-stack sums.
#ifndef RVBPFD_SRC_TOP_TOP_STATE_H_
#define RVBPFD_SRC_TOP_TOP_STATE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "model/attribution.h"
#include "model/span_tracker.h"
#include "top/top_snapshot.h"
#include "trace/event.h"
#include "trace/stacks.h"

namespace rvbpfd {

// A stack named for a row: its innermost program method (IsVmLibraryFrame tells the library's frames apart) with the
// library function it was in, "Kernel#sleep in Worker#nap (app.rb:12)", or the leaf's label when it has no program
// frame; "" for an unknown stack. Labels and paths are as the target gave them (the renderer escapes them).
std::string StackWhere(const StackTable& stacks, uint32_t stack);
// The endpoint (model/endpoint.h) of a stack of `stacks`: "-" for none or an unknown stack.
std::string StackEndpoint(const StackTable& stacks, uint32_t stack);

class TopState {
 public:
  // `stacks`: where the events' stack ids are defined; it must outlive this and grow only.
  TopState(int pid, std::string ruby_version, const StackTable* stacks);

  // Starts the first interval at t_ns (nothing before it is shown).
  void Start(uint64_t t_ns);
  bool started() const { return started_; }
  // One event, in time order.
  void OnEvent(const TraceEvent& e);
  // A thread's names, new or changed (the recorder's ThreadInfoTracker); kept until the thread exits.
  void SetThreadInfo(uint32_t ruby_thread, const ThreadInfo& info);
  // Ends the interval at cut_ns (at or after every event fed; clamped to the latest) and returns it; the next one
  // starts there.
  TopSnapshot Cut(uint64_t cut_ns);
  // The latest event time fed.
  uint64_t last_event_ns() const { return last_event_ns_; }

 private:
  struct ThreadSums {
    uint64_t running_ns = 0;  // holds, GC included
    uint64_t gc_ns = 0;
    uint64_t gvl_wait_ns = 0;
    std::map<std::string, uint64_t> blocked_ns;
  };
  struct ThreadSeen {
    std::optional<uint32_t> native_tid;
    uint32_t last_stack = 0;  // its latest stack (sample or release)
    bool exited = false;
  };
  void OnSpan(const Span& s);
  void AddBlockedStack(const std::string& state, uint32_t stack, uint64_t thread, uint64_t ns);
  TopThread ThreadRow(uint64_t key, const ThreadSeen& seen, uint64_t interval_ns) const;
  std::vector<TopBlocker> Blockers(const AttributionResult& blame) const;
  std::vector<TopBlockedStack> BlockedStacks() const;
  bool InGc(uint32_t stack) const;

  int pid_;
  std::string ruby_version_;
  const StackTable* stacks_;
  SpanTracker tracker_;
  Attribution blame_;
  bool started_ = false;
  uint64_t number_ = 0;
  uint64_t interval_start_ns_ = 0;
  uint64_t last_event_ns_ = 0;
  uint64_t events_ = 0;
  uint64_t dropped_ = 0;
  std::map<uint64_t, ThreadSeen> threads_;  // by tracker key
  std::map<uint32_t, ThreadInfo> infos_;    // names by ruby_thread (each bounded where it is read)
  std::map<uint64_t, ThreadSums> sums_;     // this interval, by tracker key
  // This interval's waits and blocked time by (state, stack): ns and the threads.
  std::map<std::pair<std::string, uint32_t>, std::pair<uint64_t, std::map<uint64_t, uint64_t>>> where_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TOP_TOP_STATE_H_
