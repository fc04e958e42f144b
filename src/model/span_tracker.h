// SpanTracker: the one derivation of thread states and GVL and GC spans from scheduler events, read by the pprof and
// folded exports, the fleet agent's per-process profiles and the thread-state model (its spans, and under
// TrackerRules::kTimeline the states its lanes draw).
//
// Like a kernel-trace thread-state tracker, it keeps only the open state of each thread and of each VM's GVL, and
// emits a Span each time an interval closes; nothing is buffered, so it serves a whole trace file and a continuous
// agent alike. Spans:
//   - kGvlWait: from a thread's wants_gvl to its gvl_acquired. A repeated wants_gvl does not restart it.
//   - kGvlHold: from gvl_acquired to gvl_released; a thread_exited (3.3+ reports no release at exit) or a wants_gvl
//     while holding (a release not seen, as in 3.2's timeslices) also ends it. A repeated gvl_acquired does not
//     restart it.
//   - kBlocked: from gvl_released to the thread's next wants_gvl / gvl_acquired / thread_exited, with the release
//     reason: the one the gvl_released carried (derived once, by the recorder, from the released stack), as it is,
//     "unknown" included; only a release that carried none (no stack was taken: --stacks=off, another recorder)
//     takes a Kernel#sleep or Mutex#lock probe entered since the thread last ran; else unknown. A probe never
//     overrides a carried reason: it has no exit, so it does not say the thread was still inside the call.
//   - kGc: from gc_enter to gc_exit, one at a time per process, on the thread that ran it: the event's thread, else
//     the thread holding the GVL of the default VM (GC runs on the lock owner: derived).
//   - kHolder: who held a VM's GVL (`thread`, or 0 = nobody) over an interval: the thread of the last gvl_acquired not
//     yet followed by its release, exit or a wants_gvl while holding. A later consumer intersects waits with these
//     to say who made each waiter wait. Under RUBY_MN_THREADS=1 several Ruby threads share a native thread; holders
//     are Ruby threads, never native ones, so M:N needs nothing special. Each VM (ractor) has its own GVL: events
//     name their VM (0 when the process has one).
// Each span says how it ended (SpanEnd); a span cut by lost events or a tracing pause, by the thread's exit while
// waiting, by a release while waiting or by the thread's id being restarted has unknown extent: it is emitted with
// `counted == false` (its duration is not a fact) so consumers can say how many were left out. Time not covered by a
// holder span (before the first gvl_acquired, and from a gap to the next gvl_acquired) is unknown.
//
// Stacks are ids chosen by the caller (a trace's stack ids, or the agent's interned ones); 0 means "no stack". Each
// span carries the stack it is attributed to:
//   - wait: the wants_gvl's own stack, else the stack of the gvl_released that began the thread's time off the lock
//     (forgotten once the thread ran again: 3.2 timeslices report READY/RESUMED without a release), else the
//     thread's latest sample's stack when the wait ends (a waiting thread is off CPU, so that is the sample from
//     before the wait, unless none was taken then); else 0.
//   - hold: the gvl_released's stack, else (and when ended otherwise) the latest sample's stack; else 0.
//   - blocked: the gvl_released's stack.
//   - gc: the latest sample stack of the GC's thread when it began, replaced by a stack sampled inside this GC.
//
// Thread keys are the caller's (a trace's ruby_thread + 1, the agent's rb_thread_t pointer); 0 means "no known
// thread": such events only count for GC and samples. After a thread_exited, a gvl_released or thread_exited of
// the key, its probes and its samples are ignored until a gap or the next PruneIdle: 3.2 reports a thread's last
// release after its EXITED, which must not open a blocked span for a dead thread (the model absorbs it the same
// way). Any other event of the key is a new thread there (its thread_started, or one not seen). Events must come
// in time order; an end before its span's start is clamped to the start (a zero-length span).
//
// Provenance: waits, holds and GC times are observed (both ends are the VM's own events); a hold ended by an exit or
// a wants_gvl, a GC's thread taken from the GVL holder, holder intervals and release reasons from a probe are derived.
//
// Not thread-safe. Memory: one small state per live thread and per VM.
#ifndef RVBPFD_SRC_MODEL_SPAN_TRACKER_H_
#define RVBPFD_SRC_MODEL_SPAN_TRACKER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "common/flat_map64.h"
#include "trace/event.h"
#include "trace/release_reason.h"

namespace rvbpfd {

enum class SpanKind : uint8_t { kGvlWait, kGvlHold, kBlocked, kGc, kHolder };

// How the tracker fills in a transition CRuby did not report. Both keep the same state per thread and per VM; they
// differ only where a transition is missing.
enum class TrackerRules : uint8_t {
  // The rules above, for streams (the pprof and folded exports, the fleet agent, Model::spans()): nothing is assumed
  // about a thread before its first event, a gap forgets everything open.
  kStreaming,
  // The in-process recorder's timeline (the model's lanes; docs/design.md, "GVL and GC spans"), which names every
  // state of every thread from its first event on:
  //   - a wants_gvl while holding (a 3.2 timeslice) leaves the hold open, marked ready; the next gvl_acquired of
  //     another thread of the VM ends it (SpanEnd::kPreempted) and the thread waits. A gvl_acquired while another
  //     thread holds the lock, not marked ready (its release was lost), ends that hold the same way, the thread then
  //     blocked. Its pending probe reason is forgotten.
  //   - a probe or a gc_enter about a thread that does not hold the lock: it holds from there (implicit resume), and
  //     is the VM's holder when no thread is known to be.
  //   - a thread whose first event is one only a holder reports (gvl_released, thread_exited, gc_enter/exit, a probe)
  //     held the lock before it.
  //   - once a GVL event was seen, a gvl_released or thread_exited while the holder is unknown (after a gap) leaves
  //     nobody holding; before, so does one of a thread holding by the rule above.
  //   - a probe reason is given only to a release by a thread holding the lock.
  //   - thread_exited is final: later events of the key (across gaps too) change nothing; a thread_started of a
  //     thread with an open state is a repeat.
  //   - tracing_resumed is no gap (the tracing_paused before it was).
  kTimeline,
};

// What a thread is doing now, as the tracker knows it.
enum class ThreadPhase : uint8_t {
  kUnseen,   // no event of the key yet (or its state was pruned)
  kUnknown,  // seen, but a gap ended what it was doing and no event since said what it does
  kBlocked,  // off the lock, not asking for it (released, or started and not yet ready)
  kWaiting,  // asked for the lock
  kHolding,  // holds the lock
  kGc,       // holds the lock and runs the open GC (kTimeline: and has not given the lock up since it began)
  kExited,   // its thread_exited was seen
};

enum class SpanEnd : uint8_t {
  kAcquired,   // the thread's gvl_acquired (waits, blocked; holder spans: another thread's)
  kReleased,   // the thread's gvl_released (holds; a wait: the acquisition was not seen; holder spans)
  kWantsGvl,   // the thread's wants_gvl (blocked; a hold or holder span: a release not seen)
  kExited,     // the thread's thread_exited
  kRestarted,  // a thread_started for a key already live: the old thread's exit was not seen
  kGcExit,     // gc_exit
  kGap,        // events_dropped, tracing_paused or tracing_resumed
  kCut,        // Cut(): the span continues from the cut in the next interval
  kPreempted,  // kTimeline: another thread's gvl_acquired (holds)
  kImplicit,   // kTimeline: the thread was found holding the lock by a probe or GC (waits, blocked)
};

struct Span {
  SpanKind kind = SpanKind::kGvlWait;
  SpanEnd end = SpanEnd::kAcquired;
  bool counted = true;  // false: the span's end is unknown (see above); its times are not a fact
  Provenance provenance = Provenance::kObserved;
  uint64_t thread = 0;  // the thread (kHolder: the holder, 0 = nobody held the GVL; kGc: 0 = not known)
  uint32_t vm = 0;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint32_t stack = 0;  // see above; 0 = none known
  // kGvlHold: `stack` is the gvl_released's own, not the thread's latest sample's (the release carried none, or the
  // hold ended otherwise).
  bool release_stack = false;
  ReleaseReason reason = ReleaseReason::kUnknown;  // kBlocked
  Provenance reason_provenance = Provenance::kObserved;  // kBlocked with a reason other than kUnknown: kDerived

  uint64_t duration_ns() const { return end_ns - start_ns; }
};

// One event as the tracker needs it. `event` is one of the scheduler, GC, probe and gap events (kSample goes to
// OnSample); others are ignored.
struct TrackerEvent {
  uint64_t t_ns = 0;
  EventName event = EventName::kTracingStarted;
  uint64_t thread = 0;  // 0: not known
  uint32_t vm = 0;
  uint32_t stack = 0;   // the stack the event carried, 0 = none
  ReleaseReason reason = ReleaseReason::kUnknown;  // gvl_released: the reason it carried
  bool reason_carried = false;  // gvl_released: it carried a reason (`reason`, "unknown" included); probes then stay out
};

// The tracker key of a trace's Ruby thread: ruby_thread + 1 (serial 0 is 3.2's main thread), 0 for none.
inline uint64_t TraceThreadKey(std::optional<uint32_t> ruby_thread) {
  return ruby_thread ? uint64_t{*ruby_thread} + 1 : 0;
}
// The inverse: the Ruby thread of a span of a trace's tracker; nullopt for key 0 (no thread, or nobody held the GVL).
inline std::optional<uint32_t> TraceRubyThread(uint64_t key) {
  if (key == 0) return std::nullopt;
  return static_cast<uint32_t>(key - 1);
}

// A trace event as the tracker takes it: `key` is the caller's key for its thread (0: none), `stack` the event's
// stack as the caller numbers stacks (0: none); the gvl_released reason is read from the trace's vocabulary.
TrackerEvent TrackerEventOf(const TraceEvent& e, uint64_t key, uint32_t stack);

class SpanTracker {
 public:
  // Called for every span as it closes; it must not call back into the tracker.
  using Sink = std::function<void(const Span&)>;
  explicit SpanTracker(Sink sink, TrackerRules rules = TrackerRules::kStreaming)
      : sink_(std::move(sink)), timeline_(rules == TrackerRules::kTimeline) {}

  void OnEvent(const TrackerEvent& e);
  // An on-CPU sample of `thread` (0: none known) on `stack` (0: none); in_gc: taken while a GC ran.
  void OnSample(uint64_t thread, uint32_t stack, bool in_gc);
  // Emits the parts before cut_ns of every open wait, hold, blocked, GC and holder span (end kCut, counted) and
  // continues them from cut_ns. A hold is attributed to its thread's latest sample (the release is still to come).
  // The holder's part is emitted with the waits' so that each interval holds every span its waits' blame needs (the
  // blame of consecutive intervals then sums to that of the whole wait).
  void Cut(uint64_t cut_ns);
  // Emits every open span as ending at end_ns (end kCut), e.g. at the end of a trace.
  void Finish(uint64_t end_ns) { Cut(end_ns); }

  // True while `thread` waits for the GVL (a wants_gvl now would be a repeat, whose stack is not used).
  bool waiting(uint64_t thread) const;
  // What `thread` is doing now.
  ThreadPhase phase(uint64_t thread) const;
  // kTimeline: whether `thread` holds the lock marked ready (it reported wants_gvl while holding it).
  bool ready_while_holding(uint64_t thread) const;
  // The reason of `thread`'s open blocked span (kUnknown when none is open).
  ReleaseReason blocked_reason(uint64_t thread) const;
  // The thread of the open GC: its event's, else the VM's holder when it began; 0 when none is open or not known.
  uint64_t gc_thread() const { return gc_open_ ? gc_thread_ : 0; }
  // What a thread was doing before its first event `first`, as the event implies (kTimeline holds a thread to it):
  // kHolding for the events only a thread holding the lock reports (gvl_released, thread_exited, gc_enter, the
  // probes), kGc for gc_exit, kWaiting for gvl_acquired (it ends a wait), kBlocked for wants_gvl, and kUnseen for
  // thread_started (the thread did not exist) and events about no thread.
  static ThreadPhase PhaseBeforeFirst(EventName first);
  // The thread a gc_exit naming `key` (0: none) ends the GC of: the open GC's thread while it lives, else `key`.
  uint64_t GcExitThread(uint64_t key) const;
  // kTimeline: whether a GVL event of `vm`, or a gap, was seen (before, the holder is unknown since the trace began).
  bool holder_seen(uint32_t vm = 0) const;
  // The start of the earliest wait still open (since the last Cut, for a wait open across one), or `otherwise` when
  // no thread waits: no wait emitted later can begin before it.
  uint64_t oldest_open_wait_ns(uint64_t otherwise) const;
  // Which thread holds `vm`'s GVL now: 0 when nobody does or it is not known (known_holder tells them apart).
  uint64_t holder(uint32_t vm = 0) const;
  bool holder_known(uint32_t vm = 0) const;

  // Thread state kept between calls: ages it (per call) and drops states idle for more than `max_idle` calls with
  // no open wait or hold (their release and sample stacks are forgotten). Returns how many were dropped.
  size_t PruneIdle(uint32_t max_idle);
  // Replaces every stack id the tracker holds (the caller renumbered its stacks); `map` is never given 0.
  void RemapStacks(const std::function<uint32_t(uint32_t)>& map);
  // Live threads: those seen and not exited (an exited thread's marker is not counted).
  size_t thread_count() const { return threads_.size() - exited_; }
  size_t approx_memory_bytes() const;

 private:
  struct Thread {
    uint32_t vm = 0;
    uint32_t idle = 0;          // PruneIdle calls since the thread's last scheduler event or sample
    bool exited = false;        // its thread_exited was seen: a marker (see "After a thread_exited" above)
    bool waiting = false;
    bool holding = false;
    bool blocked = false;
    bool ready = false;  // kTimeline: a wants_gvl while holding, not yet followed by the end of the hold
    uint64_t wait_start_ns = 0;
    uint64_t hold_start_ns = 0;
    uint64_t blocked_start_ns = 0;
    uint32_t wait_stack = 0;     // chosen at the wants_gvl; 0: the latest sample's, when the wait ends
    uint32_t release_stack = 0;  // of the release that began the current time off the GVL; 0 once it ran again
    uint32_t last_sample_stack = 0;
    ReleaseReason blocked_reason = ReleaseReason::kUnknown;
    Provenance blocked_reason_provenance = Provenance::kObserved;
    ReleaseReason probe_reason = ReleaseReason::kUnknown;  // a sleep/mutex probe entered since the thread last ran
  };
  struct Holder {
    uint32_t vm = 0;
    bool known = false;
    bool seen = false;  // kTimeline: a GVL event of the VM was seen (a gap counts as one)
    uint64_t thread = 0;
    uint64_t since_ns = 0;
  };

  Thread& Touch(uint64_t key);
  Thread* Find(uint64_t key);
  Holder& HolderOf(uint32_t vm);
  void SetHolder(uint32_t vm, uint64_t thread, uint64_t t, SpanEnd end);
  void LoseHolders(uint64_t t);
  void EndWait(uint64_t key, Thread& t, uint64_t end_ns, SpanEnd end, bool counted);
  void EndHold(uint64_t key, Thread& t, uint64_t end_ns, SpanEnd end, uint32_t stack, Provenance provenance,
               bool counted, bool release_stack = false);
  void EndBlocked(uint64_t key, Thread& t, uint64_t end_ns, SpanEnd end, bool counted);
  void EndGc(uint64_t end_ns, SpanEnd end, bool counted);
  void DiscardOpen(uint64_t t);
  // kTimeline: the thread of a probe or GC event, which only a thread holding the lock reports: one not seen before
  // held it before (its hold's start is unknown: 0).
  Thread& ThreadOfHolderEvent(uint64_t key, uint32_t vm);
  // kTimeline: the thread was found holding the lock at `ts` (a probe or a GC of a thread not holding it).
  void ResumeImplicitly(uint64_t key, Thread& t, uint64_t ts);
  // kTimeline: `holder`'s hold ends at another thread's gvl_acquired.
  void Preempt(uint64_t holder, uint64_t ts);
  void ForgetExited();
  uint32_t WaitStack(const Thread& t) const;
  void Emit(const Span& s) { sink_(s); }

  Sink sink_;
  bool timeline_;  // TrackerRules::kTimeline
  // By thread key. A flat table: consecutive events alternate between threads, so each is a lookup. A Thread& is
  // valid until the next insertion or erase (no Emit inserts: the sink must not call back).
  FlatMap64<Thread> threads_;
  size_t exited_ = 0;  // entries of threads_ with `exited` set
  std::vector<Holder> holders_;  // one per VM seen, few
  bool gap_seen_ = false;        // kTimeline: a gap was seen (see holder_seen)
  bool gc_open_ = false;
  bool gc_thread_left_ = false;  // the GC's thread gave the lock up since the GC began (phase: kTimeline only)
  uint64_t gc_start_ns_ = 0;
  uint64_t gc_thread_ = 0;
  bool gc_thread_derived_ = false;
  uint32_t gc_stack_ = 0;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_MODEL_SPAN_TRACKER_H_
