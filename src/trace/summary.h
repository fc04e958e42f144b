// The trace summary (the last line of a finished .rvtrace) and the per-thread accounting that produces it. The
// writer feeds every event it writes through ThreadAccounting; `rvbpfd inspect` runs the same accounting over the
// events of a trace that has no summary (cut by a crash), so both report the same numbers.
#ifndef RVBPFD_SRC_TRACE_SUMMARY_H_
#define RVBPFD_SRC_TRACE_SUMMARY_H_

#include <array>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

#include "rvbpfd/counters.h"
#include "trace/event.h"

namespace rvbpfd {

struct ThreadSummary {
  uint32_t ruby_thread = 0;
  bool main = false;
  std::vector<uint32_t> native_tids;  // distinct, in order of first appearance
  double running_ms = 0;              // total time holding the GVL, milliseconds
};

// On-CPU samples by the route that found their execution context (rvbpfd's BPF counters; docs/design.md, "How a
// sample finds its EC"). Counted when the sample is taken, so a sample later lost to a full ring still counts.
// One member per route of RV_EC_ROUTE_COUNTERS (include/rvbpfd/counters.h), named by its key there: tls, ractor,
// current_th, none.
struct SampleEcRoutes {
#define RV_ROUTE_MEMBER(field, fold, label, key) uint64_t key = 0;
  RV_EC_ROUTE_COUNTERS(RV_ROUTE_MEMBER)
#undef RV_ROUTE_MEMBER
};

struct TraceSummary {
  std::array<uint64_t, kEventNameCount> event_counts{};  // lines written per event name, indexed by EventName
  uint64_t events_dropped = 0;          // sum of the events_dropped counts: events lost
  uint64_t drop_records = 0;            // number of events_dropped lines
  uint64_t ring_high_water_bytes = 0;   // max unconsumed bytes seen in the BPF ring buffer
  std::vector<ThreadSummary> threads;   // sorted by ruby_thread
  double duration_ms = 0;               // origin to tracing_stopped, milliseconds
  uint64_t late_events = 0;             // events that reached the reorder window after newer ones were written
  uint64_t frames = 0;                  // frame dictionary lines written (0 in traces without stacks)
  uint64_t stacks = 0;                  // stack dictionary lines written
  // Uprobe traps of the target (rvbpfd's BPF counters; absent in other recorders' traces): every probe hit, and the
  // hits that are not events (e.g. rb_mutex_lock entered from rb_mutex_synchronize, excluded by caller), the cold hits
  // (no trap on their CPU in the 50 us before them) and the hits of single-stepped sites.
  // One member per RV_TRAP_COUNTERS entry: probe_hits, hits_discarded, cold_hits, stepped_hits.
#define RV_TRAP_MEMBER(field, fold, label) std::optional<uint64_t> field;
  RV_TRAP_COUNTERS(RV_TRAP_MEMBER)
  // Samples that carried a GVL reading, and readings whose queue was listed in part (RV_GVL_COUNTERS: gvl_readings,
  // gvl_queue_truncated); present when the recording read the GVL at samples.
  RV_GVL_COUNTERS(RV_TRAP_MEMBER)
#undef RV_TRAP_MEMBER
  std::optional<SampleEcRoutes> sample_ec_routes;  // present when the recording sampled

  uint64_t count(EventName event) const { return event_counts[static_cast<size_t>(event)]; }
};

// Per-Ruby-thread running time and native tids, from a stream of events in file order.
//
// Running time is the sum of gvl_acquired -> gvl_released intervals. A repeated gvl_acquired does not restart the
// open interval (3.2 and attach races can report one twice); thread_exited also closes it (a thread cannot run after
// it exited); an interval still open at the end runs to the end time. A gvl_released with no open interval (the
// thread already held the GVL when tracing began) adds nothing: that time was not observed.
//
// Native tids are taken only from events that run on the thread's own native thread (gvl_acquired, gvl_released,
// thread_exited, sleep_enter, mutex_lock_enter): STARTED runs on the creator and READY on the waker, so their
// native tid can be another thread's in an in-process trace.
class ThreadAccounting {
 public:
  explicit ThreadAccounting(std::optional<uint32_t> main_thread) : main_thread_(main_thread) {}

  // Returns true when `event` is the first one seen for its Ruby thread (the writer then emits a thread line).
  bool Observe(const TraceEvent& event);
  // Marks a thread as main (a thread line said so) even when the header names no main thread.
  void MarkMain(uint32_t ruby_thread);
  // Closes open intervals at end_t_ns (ns since origin) and returns the threads sorted by ruby_thread.
  std::vector<ThreadSummary> Summarize(uint64_t end_t_ns) const;
  bool IsMain(uint32_t ruby_thread) const;

 private:
  struct State {
    uint32_t ruby_thread = 0;
    bool marked_main = false;
    std::optional<uint64_t> acquired_at;  // ns since origin
    uint64_t running_ns = 0;
    std::vector<uint32_t> native_tids;
  };
  State& Lookup(uint32_t ruby_thread, bool* created);

  std::optional<uint32_t> main_thread_;
  std::unordered_map<uint32_t, size_t> index_;  // ruby_thread -> threads_ index
  std::vector<State> threads_;
  size_t last_ = SIZE_MAX;  // index of the last thread looked up: consecutive events are often the same thread
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_SUMMARY_H_
