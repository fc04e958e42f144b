// The one thread-state model of rvbpfd: what every Ruby thread and the GVL were doing at each moment of a trace,
// with the in-process recorder's rules. `inspect`, `stats`, the exporters and the report all read this model, so they
// can never disagree about a state. Its lanes draw the state of a SpanTracker run with TrackerRules::kTimeline; its
// spans() are those of one run with the streaming rules, which the pprof and folded exports and the fleet agent also
// use. Both are the same state machine and state the same intervals wherever every transition was reported; the
// rules by which they differ where one was not (a 3.2 timeslice, lost events) are TrackerRules' and docs/design.md's
// ("GVL and GC spans"), and tests/model/model_tracker_agreement_test.cc checks the rest.
//
// Every block carries how it is known (Provenance) and, when it is not simply observed, the rule that produced it
// (ModelRule), plus the event that opened and the event that closed it, so a viewer can always answer "how do you
// know?". Where events are missing (events_dropped, tracing_paused) the model says kUnknown instead of guessing.
//
// Times are ns since the trace header's origin_ns (CLOCK_MONOTONIC), like TraceEvent::t_ns.
#ifndef RVBPFD_SRC_MODEL_MODEL_H_
#define RVBPFD_SRC_MODEL_MODEL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "model/span_tracker.h"
#include "trace/event.h"
#include "trace/reader.h"
#include "trace/release_reason.h"

namespace rvbpfd {

// Values index per-state arrays; keep kCount last.
enum class ThreadState : uint8_t {
  kNotStarted,  // before RUBY_INTERNAL_THREAD_EVENT_STARTED
  kRunning,     // holds the GVL
  kWantsGvl,    // asked for the GVL (READY) and does not hold it
  kReleased,    // neither holds nor wants the GVL; see ReleaseReason
  kGc,          // running a GC (holds the GVL)
  kExited,      // after RUBY_INTERNAL_THREAD_EVENT_EXITED
  kUnknown,     // events were lost or tracing was paused: no state is claimed
  kCount,
};
inline constexpr size_t kThreadStateCount = static_cast<size_t>(ThreadState::kCount);

// The documented rule behind a block that is not plainly observed.
enum class ModelRule : uint8_t {
  kNone,                // observed: the thread's own event reported this transition
  kBeforeFirstEvent,    // inferred: the state a thread's first event implies it was in since the trace began
  kSleepProbe,          // derived: a release carrying no reason after a Kernel#sleep entry, before the thread ran again
  kMutexProbe,          // derived: as kSleepProbe, after a Thread::Mutex#lock entry
  kPreemptedByResume,   // derived: another thread's RESUMED closed this thread's ownership (3.2 timeslice)
  kOwnerReplaced,       // derived: as above on 3.3+, where it only happens when a SUSPENDED was lost
  kImplicitResume,      // derived: activity (a probe, a GC) of a thread whose last transition was SUSPENDED
  kGcOnOwner,           // derived: a GC event naming no thread ran on the GVL owner
  kOwnerFromAcquire,    // derived: the GVL owner is the last gvl_acquired not yet followed by a release
  kExitReleases,        // derived: EXITED ends the thread's ownership (3.3+ reports no SUSPENDED at exit)
  kEventsDropped,       // unknown: events were lost here
  kTracingPaused,       // unknown: tracing was paused here
  kStackReason,         // derived: the gvl_released carried a reason the recorder derived from the thread's stack
  kCount,               // keep last: name tables (the report's) are sized from it
};

// An index into Model::events(); nullopt when no event applies (e.g. a block still open at the end of the trace).
using EventRef = std::optional<size_t>;

struct StateBlock {
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  ThreadState state = ThreadState::kUnknown;
  // Meaningful for kReleased and kWantsGvl only (for kPreempted, why it is in kWantsGvl). CRuby never reports a
  // reason; all but kUnknown and kStarting come from a rule and make the block kDerived.
  ReleaseReason reason = ReleaseReason::kUnknown;
  Provenance provenance = Provenance::kObserved;
  ModelRule rule = ModelRule::kNone;
  EventRef opened_by;          // the event at start_ns that caused the block (nullopt for inferred blocks)
  EventRef closed_by;          // the event at end_ns that ended it (nullopt at the end of the trace)
  std::optional<uint32_t> native_tid;  // for kRunning/kGc: the native thread it ran on, from RESUMED/SUSPENDED/EXITED
  uint32_t repeats = 0;        // repeated transitions absorbed without a new block (3.2's double SUSPENDED)
  EventRef ready_while_running;  // 3.2: the READY a running thread reported before it was preempted

  uint64_t duration_ns() const { return end_ns - start_ns; }
};

enum class OwnerKind : uint8_t {
  kOwned,    // `owner` holds the GVL
  kIdle,     // nobody holds it (drawn explicitly)
  kUnknown,  // not known (before the first GVL event, after lost events)
};

// How an ownership ended.
enum class OwnerEnd : uint8_t {
  kTraceEnd,   // still open when the trace ended
  kReleased,   // the owner's SUSPENDED
  kPreempted,  // another thread's RESUMED (3.2 timeslice, or a lost SUSPENDED on 3.3+)
  kExited,     // the owner's EXITED
  kAcquired,   // (idle / unknown blocks) a thread's RESUMED
  kGap,        // events dropped or tracing paused
};

struct OwnerBlock {
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  OwnerKind kind = OwnerKind::kUnknown;
  std::optional<uint32_t> owner;  // Ruby thread serial, for kOwned
  Provenance provenance = Provenance::kDerived;
  ModelRule rule = ModelRule::kOwnerFromAcquire;
  OwnerEnd end = OwnerEnd::kTraceEnd;
  EventRef opened_by;
  EventRef closed_by;

  uint64_t duration_ns() const { return end_ns - start_ns; }
};

struct GcSpan {
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  std::optional<uint32_t> ruby_thread;  // the thread that ran it (named by the event, or the GVL owner: derived)
  Provenance thread_provenance = Provenance::kObserved;
  EventRef opened_by;
  EventRef closed_by;  // gc_exit; or the events_dropped / tracing_paused that cut it; nullopt at trace end
  bool complete = false;  // true when gc_exit closed it
};

// A span whose states are unknown: [start_ns, end_ns] lost events or had tracing paused.
struct UnknownWindow {
  uint64_t start_ns = 0;  // events_dropped: the previous event; tracing_paused: the pause
  uint64_t end_ns = 0;    // events_dropped: the record; tracing_paused: tracing_resumed (or the end of the trace)
  ModelRule cause = ModelRule::kEventsDropped;
  EventRef event;         // the events_dropped or tracing_paused event
  uint64_t dropped = 0;   // events_dropped count
};

// One Ruby thread ran on one native thread over [start_ns, end_ns].
struct NativeSpan {
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint32_t ruby_thread = 0;
  Provenance provenance = Provenance::kObserved;
};

struct NativeThread {
  uint32_t native_tid = 0;
  std::vector<NativeSpan> spans;  // in time order; consecutive running/GC blocks of one Ruby thread are merged
  std::vector<uint32_t> ruby_threads;  // distinct, in order of first appearance (several under RUBY_MN_THREADS=1)
};

struct ReasonTotal {
  ReleaseReason reason = ReleaseReason::kUnknown;
  uint64_t ns = 0;
  uint32_t count = 0;  // released blocks with this reason
};

struct ThreadTotals {
  std::array<uint64_t, kThreadStateCount> ns_by_state{};  // indexed by ThreadState
  // GVL contention: time in kWantsGvl. A wait is one kWantsGvl block (from READY, or from being preempted, to the
  // RESUMED that ends it, or to the end/gap that cuts it).
  uint64_t wait_total_ns = 0;
  uint64_t wait_longest_ns = 0;
  uint32_t waits = 0;            // kWantsGvl blocks
  uint32_t acquisitions = 0;     // running blocks opened by the thread's RESUMED
  std::vector<ReasonTotal> release_reasons;  // reasons seen, by time descending (ties: by count, then enum order)

  uint64_t ns(ThreadState state) const { return ns_by_state[static_cast<size_t>(state)]; }
};

struct RubyThread {
  uint32_t ruby_thread = 0;
  bool main = false;
  std::vector<StateBlock> blocks;     // contiguous, in time order, covering [model start, model end]
  std::vector<uint32_t> native_tids;  // distinct, in order of first appearance (RESUMED/SUSPENDED/EXITED only)
  ThreadTotals totals;
};

// What the model needs from the trace header.
struct ModelOptions {
  std::string ruby_version;               // "3.2.5"; empty = unknown (the 3.2-only labels are not applied)
  std::optional<uint32_t> main_thread;    // serial of the main thread (0 on 3.2, 1 on 3.3+)
  std::vector<uint32_t> extra_main;       // thread lines marked main that the header does not name
  int64_t pid = 0;                        // target pid, for labels
  // Names and namespace tids of the thread lines (the latest of each), by ruby_thread; threads without are absent.
  std::unordered_map<uint32_t, ThreadInfo> thread_infos;
};

struct ModelMarker {
  uint64_t t_ns = 0;
  EventName event = EventName::kSleepEnter;  // kSleepEnter, kMutexLockEnter, kEventsDropped, kTracingPaused/Resumed
  std::optional<uint32_t> ruby_thread;
  size_t event_index = 0;
};

class Model {
 public:
  // Builds the model. Events may be in file order: they are stably sorted by t_ns first. Fails with kBadTrace when
  // the trace names a Ruby older than 3.2 (which has no scheduler events, so the trace cannot be genuine).
  static Result<Model> Build(std::vector<TraceEvent> events, const ModelOptions& options);
  // Takes the header fields from a read trace. One model is one process's: its threads share one GVL. A trace of
  // several processes (TraceFile::MultiProcess) is modelled part by part (trace/processes.h, SplitByProcess), as
  // every tool does; modelled whole, its processes' threads would seem to contend for one lock.
  static Result<Model> FromTrace(TraceFile trace);
  // Errors are TraceReader::ReadFile's.
  static Result<Model> FromFile(const std::string& path);

  uint64_t start_ns() const { return start_ns_; }
  uint64_t end_ns() const { return end_ns_; }
  const ModelOptions& options() const { return options_; }
  bool is_ruby_3_2() const { return ruby_3_2_; }
  const std::vector<TraceEvent>& events() const { return events_; }
  const std::vector<RubyThread>& threads() const { return threads_; }  // sorted by ruby_thread
  const RubyThread* FindThread(uint32_t ruby_thread) const;
  const std::vector<OwnerBlock>& owner_lane() const { return owner_lane_; }
  const std::vector<GcSpan>& gc_spans() const { return gc_spans_; }
  const std::vector<UnknownWindow>& unknown_windows() const { return unknown_windows_; }
  const std::vector<NativeThread>& native_threads() const { return native_threads_; }  // sorted by native_tid
  const std::vector<ModelMarker>& markers() const { return markers_; }
  // The SpanTracker's GVL wait, hold, blocked, GC and holder spans over the trace, in the order they closed (spans
  // still open at the end close there with SpanEnd::kCut). Thread keys are TraceThreadKey(ruby_thread); stacks are
  // the trace's stack ids.
  const std::vector<Span>& spans() const { return spans_; }
  // Thread events that named no Ruby thread, or arrived after the thread's EXITED: counted, not modelled.
  uint64_t unattributed_events() const { return unattributed_events_; }

  // "main" or "Thread #N", as `inspect` labels threads, followed by the thread's name in parentheses when it has one
  // (ThreadName): "Thread #2 (puma srv tp 001)".
  std::string ThreadLabel(uint32_t ruby_thread) const;
  // ThreadInfo::DisplayName of the thread: Thread#name, else a native name other than the main thread's (which
  // unnamed threads inherit); "" when none is known.
  std::string ThreadName(uint32_t ruby_thread) const;
  // The thread's names and namespace tid; nullptr when the trace has none.
  const ThreadInfo* FindThreadInfo(uint32_t ruby_thread) const;

 private:
  friend class ModelBuilder;
  Model() = default;

  ModelOptions options_;
  bool ruby_3_2_ = false;
  uint64_t start_ns_ = 0;
  uint64_t end_ns_ = 0;
  std::vector<TraceEvent> events_;
  std::vector<RubyThread> threads_;
  std::vector<OwnerBlock> owner_lane_;
  std::vector<GcSpan> gc_spans_;
  std::vector<UnknownWindow> unknown_windows_;
  std::vector<NativeThread> native_threads_;
  std::vector<ModelMarker> markers_;
  std::vector<Span> spans_;
  uint64_t unattributed_events_ = 0;
};

// Stable lower-case names, used in exports and summaries: "running", "wants_gvl", "released", "gc", ...
std::string_view ThreadStateName(ThreadState state);
std::string_view ModelRuleName(ModelRule rule);            // "" for kNone, else e.g. "sleep_probe"
std::string_view OwnerEndName(OwnerEnd end);
// "running", "released: sleeping", "wants_gvl: preempted": the label a viewer shows for a block.
std::string StateBlockLabel(const StateBlock& block);

// Parses "3.2.5" into (3, 2); nullopt when it does not start with two dot-separated numbers.
std::optional<std::pair<int, int>> ParseRubyMajorMinor(std::string_view version);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_MODEL_MODEL_H_
