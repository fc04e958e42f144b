// Attribution: who made each thread wait for the GVL, and where every thread's wall-clock time went, computed from
// the SpanTracker's spans (model/span_tracker.h) and the on-CPU samples. It keeps no thread state of its own: every
// interval it attributes is a span the tracker emitted.
//
// GVL blame. Each counted GVL wait [s, e) of a waiter on VM v is split over the GVL holder spans (kHolder) of v that
// overlap it:
//   - a holder h (another thread) over an overlap O: O is attributed to h. What h was running is read off the
//     observations of h inside O, each for the time it stands for:
//       - contention observations (OnContention): the stack of h that a READY found it running when a thread began
//         to wait for the GVL h held (the waiter's own, or another waiter's in the same hold; the recorder walks it
//         from h's control frames: rv_config.holder_stacks). One at c covers [c, the next observation of h): h's
//         first on-CPU sample after c, else the next contention observation, else the end of O (source kContention).
//         So the stack of the release that ends the hold covers only what follows the last other observation, which
//         is nothing once h was observed in O. The part of O before its first contention observation (a waiter
//         queued before h took the lock, its wait observed by a later READY): h's samples there as below, else that
//         first observation (the nearest one: the release comes after it).
//       - the rest (no contention observation, or the time from a sample on): h's on-CPU samples inside it, its length
//         / k ns to each of the k samples (source kSampled); with none, the stack of h's GVL hold that covers it: the
//         stack of the gvl_released that ended it (kReleaseStack) or, for a hold ended otherwise (exit, a lost
//         release, a cut) or by a release that carried no stack, the stack of h's latest sample (kLastSample); else
//         no stack (kNoStack).
//     At --hz 19 most holds get no sample, and the release stack names where h gave the lock up (an IO wait, after
//     its CPU work): the contention observation is what names the work itself, whatever the sampling rate. The part
//     of O in which h ran a GC is attributed with `gc` set (GC runs on the lock holder and keeps every other thread
//     waiting).
//   - nobody held the GVL (holder thread 0): the hand-off between a release and the waiter's acquisition, or the
//     time the scheduler took to wake the waiter: holder kNoThread, source kGvlFree.
//   - no holder span covers it (the holder is not known, e.g. one that held the GVL since before tracing began):
//     holder kNoThread, source kHolderUnknown. Never attributed to a guessed thread.
// The waiter's own wait is an observed fact (both ends are the VM's events); who held the lock is derived from the
// last gvl_acquired (holder spans); the holder's stack is observed at a READY, sampled or the release's, as `source`
// says (a contention observation of a thread other than the span's holder, e.g. one handed the GVL that has not
// resumed yet, is never used for it).
//
// Estimated GVL waits while the scheduler probes were paused (--max-overhead; AttributionOptions::estimate_paused).
// Between tracing_paused and tracing_resumed no wait is observed (its wants_gvl / gvl_acquired sites are detached),
// but each on-CPU sample still reads its VM's GVL (trace/event.h GvlReading): the holder and the queued threads. A
// thread's membership of the queue is known at each reading and interpolated between them: queued at two consecutive
// readings, it waited all the time between; at one of them only, half of it next to that reading (it joined or left
// the queue in between), at most kMaxReadingPeriods sample periods. Only while the thread's own state is unobserved,
// and only from the readings taken then: from the pause, or from its wants_gvl when it was waiting at the pause (that
// wait is not counted: SpanTracker; its start is then exact), to its first scheduler event after the resume (the
// gvl_acquired that ends such a wait exactly) or its exit; for the queued threads the trace does not name (counted,
// not listed), the pauses themselves. Each estimated ns is blamed on the holder of the reading it lies next to: the
// stack of the sample that took the reading when the holder took it itself (kSampled, `gc` when that sample was in
// GC), else the holder's latest sample (kLastSample) or none (kNoStack); nobody holding is kGvlFree, a holder the
// trace does not name kHolderUnknown. These keys carry provenance kInferred and are summed apart
// (estimated_gvl_wait_ns): never presented as observed. The estimated wait itself (estimated_wait_ns) is placed at
// the stack the thread waited with: its latest sample at or before the first reading that lists it in the stretch.
// A recording without pauses gets no estimate at all, and its observed blame is the same with or without readings.
//
// Wall clock. Each thread's life, from its first event (thread_started, or the first event of a thread that was
// already running when tracing began) to its thread_exited (or the end of the trace), is attributed to a state and a
// stack: kRunning (GVL holds minus the GCs the thread ran: split over the samples inside, |hold| / k each, else the
// hold's own stack), kGc (the GC's stack), kGvlWait (the wait's stack), kBlocked with the release reason (the
// release's stack), and kUnknown for time no counted span covers (lost events, tracing paused, a thread starting
// before its first READY). With estimate_paused, a thread's estimated GVL wait (at the stack it waited with) is
// kGvlWait with provenance kInferred, taken out of its unknown time (the estimate only covers time no counted span
// does). The states of a thread sum to its lifetime exactly.
//
// Per wait (AttributionOptions::per_wait, for the report's view of one wait): the wait's segments, one per holder
// span (or stretch no holder span covers) it overlaps, each with the stack of the gvl_released that ended the
// holder's hold there, and the parts of the segment's time by (stack, gc, source), with the samples behind each.
//
// Streaming (the fleet agent): with DrainBlame() the waits fed so far are blamed and forgotten, with every span and
// sample no later wait can need, so memory stays bounded by what the open waits need. With estimate_paused,
// DrainEstimate(now) first estimates what the readings taken before `now` tell: a stretch still open is estimated up
// to its latest such reading and goes on from there in the next drain, so the drains' estimates sum to Compute()'s
// over the same input (one exception: a thread the input names in a reading before its first scheduler event is
// estimated over the pauses up to that event, where Compute(), which knows the event is coming, leaves it out).
// Readings are kept only while a stretch is open or a wait that a pause could cut is. Waits cut by
// SpanTracker::Cut are blamed per part (AttributionOptions::blame_cut_waits): the tracker cuts the holder spans with
// them, so the blame of consecutive intervals sums to the whole wait's, per waiter and holder. (Within a holder's
// part the split over its samples is per interval: a cut changes which samples share which nanoseconds.)
//
// Times are ns. Threads are the tracker's keys (a trace's ruby_thread + 1, 0 = none). Not thread-safe. Memory: every
// span and sample of the input is kept until Compute() or DrainBlame(): use one Attribution per trace, or drain.
#ifndef RVBPFD_SRC_MODEL_ATTRIBUTION_H_
#define RVBPFD_SRC_MODEL_ATTRIBUTION_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/flat_map64.h"
#include "model/span_tracker.h"
#include "trace/release_reason.h"

namespace rvbpfd {

enum class BlameSource : uint8_t {
  kSampled,        // the holder's on-CPU samples inside the overlap
  kReleaseStack,   // no sample: the stack of the gvl_released that ended the holder's hold
  kLastSample,     // no sample, no release: the holder's latest sample before the hold ended
  kNoStack,        // the holder is known, what it ran is not
  kGvlFree,        // nobody held the GVL: hand-off / wake-up latency
  kHolderUnknown,  // no holder span covers this part of the wait
  kContention,     // the holder's stack a READY found it running, up to the holder's next sample (above)
  kCount,
};
// "sampled", "release_stack", "last_sample", "no_stack", "gvl_free", "holder_unknown", "contention".
std::string_view BlameSourceName(BlameSource source);

// The label of the frame standing in for a weight whose thread had no known stack.
inline constexpr std::string_view kNoStackFrame = "[no stack]";
// Frames standing in for blame that no holder's stack carries, and the leaf frame of a holder's GC (the pprof export
// and the top blockers name them so).
inline constexpr std::string_view kGvlFreeFrame = "[GVL not held]";
inline constexpr std::string_view kHolderUnknownFrame = "[holder unknown]";
inline constexpr std::string_view kGcFrame = "[GC]";
// The frame that stands in for a blame key's stack when it has none: kGvlFreeFrame, kHolderUnknownFrame or
// kNoStackFrame by its source.
inline std::string_view BlameStandInFrame(BlameSource source) {
  return source == BlameSource::kGvlFree         ? kGvlFreeFrame
         : source == BlameSource::kHolderUnknown ? kHolderUnknownFrame
                                                 : kNoStackFrame;
}

enum class WallState : uint8_t { kRunning, kGc, kGvlWait, kBlocked, kUnknown, kCount };
// "running", "gc", "gvl_wait", "blocked", "unknown".
std::string_view WallStateName(WallState state);

struct BlameKey {
  uint64_t waiter = 0;  // tracker key; 0 for an estimated wait of a queued thread the trace does not name
  uint64_t holder = 0;  // tracker key; 0 for kGvlFree / kHolderUnknown
  uint32_t stack = 0;   // the holder's stack; 0 = none
  bool gc = false;      // the holder was running a GC
  BlameSource source = BlameSource::kNoStack;
  // kDerived: an observed wait, its holder derived from the holder spans; kInferred: estimated from GVL readings
  // while paused (above).
  Provenance provenance = Provenance::kDerived;
  auto operator<=>(const BlameKey&) const = default;
};

// An estimated wait of one thread, at the stack it waited with (its latest sample's before it; 0 = none).
struct WaitKey {
  uint64_t thread = 0;  // tracker key; 0: a queued thread the trace does not name
  uint32_t stack = 0;
  auto operator<=>(const WaitKey&) const = default;
};

// A sample's GVL reading with tracker keys (trace/event.h GvlReading).
struct GvlSample {
  uint64_t t_ns = 0;
  uint64_t sampled = 0;  // the sample's thread (0: none known)
  uint32_t stack = 0;    // the sample's stack
  bool in_gc = false;    // the sample was taken while its thread ran a GC
  bool held = false;     // somebody held the GVL
  uint64_t holder = 0;   // its key, 0 when not held or not a thread the trace names
  uint32_t waiting = 0;  // threads queued, named or not
  std::vector<uint64_t> queued;  // keys of the named queued threads (at most `waiting`)
};

struct WallKey {
  uint64_t thread = 0;
  WallState state = WallState::kUnknown;
  ReleaseReason reason = ReleaseReason::kUnknown;  // kBlocked only
  uint32_t stack = 0;
  // kInferred: a kGvlWait estimated from GVL readings while the probes were paused (estimate_paused), taken out of
  // the thread's unknown time; kObserved otherwise.
  Provenance provenance = Provenance::kObserved;
  auto operator<=>(const WallKey&) const = default;
};

struct AttributionOptions {
  // Blame waits cut by SpanTracker::Cut (end kCut) as well as acquired ones: in the agent's intervals the part of an
  // open wait before a cut is that interval's (as in its gvl_wait profile). Off for a whole trace, where a wait still
  // open at the end has no known end (and is not GVL wait either).
  bool blame_cut_waits = false;
  // Keep each wait's segments and parts (AttributionResult::wait_blame), for the report.
  bool per_wait = false;
  // Attribute wall-clock time (keeps every blocked span and each thread's life); off where only blame is wanted.
  bool wall = true;
  // Estimate the GVL waits the paused windows hid from the samples' GVL readings (above; Compute() only: keeps every
  // reading and each thread's scheduler state). sample_period_ns: the time one sample stands for (1e9 / sample_hz).
  bool estimate_paused = false;
  uint64_t sample_period_ns = 1'000'000'000 / 99;
};

// What one part of a wait's segment was blamed on (the waiter and holder are the wait's and the segment's).
struct BlamePart {
  uint32_t stack = 0;
  bool gc = false;
  BlameSource source = BlameSource::kNoStack;
  uint64_t ns = 0;
  uint32_t samples = 0;  // kSampled: the holder's on-CPU samples the ns were split over
};

// One holder span (or a stretch no holder span covers) over part of one wait: [from_ns, to_ns).
struct BlameSegment {
  uint64_t holder = 0;  // tracker key; 0: nobody held the GVL (kGvlFree) or who did is not known (kHolderUnknown)
  uint64_t from_ns = 0;
  uint64_t to_ns = 0;
  // The holder's hold covering the end of the segment ended by its gvl_released at release_ns (0: the hold did not
  // end by a release, e.g. it was still open at a cut), which carried this stack (0: the release carried none).
  uint32_t release_stack = 0;
  uint64_t release_ns = 0;
  uint32_t first_part = 0;  // parts [first_part, first_part + parts) of AttributionResult::wait_parts
  uint32_t parts = 0;
};

// One blamed wait: the waiter's span and its segments, in time order.
struct WaitBlame {
  uint64_t waiter = 0;
  uint32_t vm = 0;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  uint32_t first_segment = 0;  // segments [first_segment, first_segment + segments) of wait_segments
  uint32_t segments = 0;
};

struct AttributionResult {
  std::map<BlameKey, uint64_t> blame_ns;  // sums to total_gvl_wait_ns + estimated_gvl_wait_ns
  std::map<WallKey, uint64_t> wall_ns;    // per thread, sums to that thread's lifetime
  uint64_t total_gvl_wait_ns = 0;         // counted waits only
  uint64_t waits = 0;
  std::map<uint64_t, uint64_t> lifetime_ns;  // per thread key
  // AttributionOptions::per_wait only: every blamed wait, in the order the waits ended; the parts of a wait's
  // segments sum to its duration.
  std::vector<WaitBlame> wait_blame;
  std::vector<BlameSegment> wait_segments;
  std::vector<BlamePart> wait_parts;
  // AttributionOptions::estimate_paused only: estimated from GVL readings while the scheduler probes were paused
  // (inferred; none without pauses).
  std::map<WaitKey, uint64_t> estimated_wait_ns;  // sums to estimated_gvl_wait_ns
  uint64_t estimated_gvl_wait_ns = 0;
  uint64_t estimate_readings = 0;  // readings that listed a thread queued while its state was unobserved
  uint64_t paused_ns = 0;          // total length of the paused windows
};

class Attribution {
 public:
  // A thread queued at only one of two readings is taken to wait for half the gap, at most this many sample periods.
  static constexpr uint64_t kMaxReadingPeriods = 4;
  // DrainEstimate: readings kept at most (a wait open for long without a pause, e.g. after lost events, would keep
  // every reading since its wants_gvl; past this the oldest go, and such a wait's estimate starts later), and how long
  // an exited thread is remembered (a reading that lists it meanwhile is stale), ns.
  static constexpr size_t kMaxKeptReadings = 8192;
  static constexpr uint64_t kForgetExitedNs = 1'000'000'000;

  Attribution() = default;
  explicit Attribution(AttributionOptions options) : options_(options) {}

  // Feed in time order, every span the tracker emits, every event's time, thread and name (for lifetimes, and for
  // which thread states a pause leaves unobserved), every sample (with the time it was taken), the pauses and
  // resumes of the scheduler probes, and every sample's GVL reading (the last three matter with estimate_paused).
  void OnSpan(const Span& s);
  void OnThreadEvent(uint64_t t_ns, uint64_t thread, EventName event);
  void OnSample(uint64_t t_ns, uint64_t thread, uint32_t stack, bool in_gc);
  // A READY at t_ns found `holder` holding the GVL, running `stack` (a wants_gvl's holder / holder_stack): a
  // contention observation (above). Fed in time order with the samples; stack 0 is ignored.
  void OnContention(uint64_t t_ns, uint64_t holder, uint32_t stack);
  void OnPause(uint64_t t_ns);
  void OnResume(uint64_t t_ns);
  void OnGvlReading(GvlSample reading);
  // end_ns: the end of the trace (threads still alive live until then).
  AttributionResult Compute(uint64_t end_ns) const;

  // Streaming (options.wall off): adds the blame of every wait fed so far to `into` (blame_ns, total_gvl_wait_ns,
  // waits; wait_blame with per_wait), forgets those waits, then every span and sample ending before keep_from_ns,
  // which must be at or before the start of every wait still to come (SpanTracker::oldest_open_wait_ns(now)).
  void DrainBlame(uint64_t keep_from_ns, AttributionResult* into);
  // Streaming with estimate_paused (above; call before DrainBlame, which then keeps the samples the estimate still
  // needs): adds to `into` the estimate (blame_ns, estimated_wait_ns, estimated_gvl_wait_ns, estimate_readings,
  // paused_ns up to now_ns) from the readings taken before now_ns, and forgets what no later estimate needs. Every
  // event and reading before now_ns must have been fed.
  void DrainEstimate(uint64_t now_ns, AttributionResult* into);
  // Replaces every stack id kept (the caller renumbered its stacks); `map` is never given 0.
  void RemapStacks(const std::function<uint32_t(uint32_t)>& map);
  // Spans and samples kept, and their heap bytes (estimated), for a caller that bounds its memory.
  size_t kept() const { return kept_; }
  size_t approx_memory_bytes() const;

 private:
  class PartSink;
  struct Sample {
    uint64_t t_ns;
    uint32_t stack;
    bool in_gc;
  };
  // What blame and the wall clock read of a counted GVL hold (its thread is the key it is kept under): half a Span,
  // as one is kept per hold.
  struct Hold {
    uint64_t start_ns;
    uint64_t end_ns;
    uint32_t stack;      // Span::stack
    bool release_stack;  // Span::release_stack
    bool released;       // it ended by its gvl_released (SpanEnd::kReleased)
    uint64_t duration_ns() const { return end_ns - start_ns; }
  };
  // A holder span (SpanKind::kHolder) of one VM (the key it is kept under).
  struct Holder {
    uint64_t start_ns;
    uint64_t end_ns;
    uint64_t thread;  // Span::thread: the holder, 0 = nobody
  };
  struct Life {
    uint64_t first_ns = 0;
    uint64_t exit_ns = 0;
    bool exited = false;
  };
  // A thread's scheduler state as the estimate needs it (estimate_paused).
  struct Seen {
    uint64_t last_event_ns = 0;  // its latest scheduler (non-sample) event
    bool wants = false;          // that event was its wants_gvl: it has waited since
    bool exited = false;
    uint64_t exit_ns = 0;
    bool unobserved = false;     // inside an unobserved stretch (see above), open since unobserved_from
    uint64_t unobserved_from = 0;
    bool unobserved_from_wait = false;  // that stretch began at its wants_gvl
    bool unobserved_at_reading = false;  // it goes on from a drain's last reading (Interval::at_reading)
  };
  struct Interval {
    uint64_t from, to;
    bool exact_from = false;  // began at an observed wants_gvl: a wait started exactly there
    bool exact_to = false;    // ended by the thread's own event (not the end of the trace)
    // Goes on from an earlier drain's last reading (the last one at `from`): everything before it is estimated.
    bool at_reading = false;
  };
  void NoteForEstimate(uint64_t t_ns, uint64_t thread, EventName event);
  void Estimate(AttributionResult& r, uint64_t end_ns) const;
  // The stack an estimated wait of one waiter over one stretch is placed at, once known (see above).
  struct WaiterStack {
    bool known = false;
    uint32_t stack = 0;
  };
  // The estimate of one waiter (0: the unnamed ones) over one unobserved stretch, from the readings before
  // `readings_end`; `count` says how many of it each reading had queued; `used` marks the readings that told of a
  // wait. With `open` (a drain inside a stretch still open) nothing is added after the stretch's last reading, and
  // its time is returned (nullopt: no reading): the stretch goes on from that reading.
  std::optional<uint64_t> EstimateStretch(AttributionResult& r, uint64_t waiter, const Interval& stretch,
                                          size_t readings_end, bool open,
                                          const std::function<uint32_t(const GvlSample&)>& count,
                                          std::vector<bool>& used, WaiterStack& stack) const;
  // The named waiters the readings before `readings_end` list; how many of one waiter (Lists: 0 or 1) and of the
  // unnamed ones (Unnamed) a reading has queued.
  std::set<uint64_t> ListedWaiters(size_t readings_end) const;
  static uint32_t Lists(uint64_t waiter, const GvlSample& g);
  static uint32_t Unnamed(const GvlSample& g);
  // The stretches a listed waiter was unobserved in (its own, or the pauses for one without any scheduler event).
  const std::vector<Interval>& StretchesOf(uint64_t waiter,
                                           const std::unordered_map<uint64_t, std::vector<Interval>>& closed,
                                           const std::vector<Interval>& pauses) const;
  BlameKey EstimateKey(const GvlSample& g) const;
  // The latest sample of `thread` at or before t, or null.
  const Sample* LatestSample(uint64_t thread, uint64_t t) const;
  // Blames every kept wait into r, against its VM's holder spans sorted by start.
  void BlameWaits(AttributionResult& r) const;
  void BlameWait(AttributionResult& r, const Span& w, std::span<const Holder> holders) const;
  void AttributeHolder(PartSink& out, uint64_t holder, uint64_t from, uint64_t to) const;
  // [from, to) of holder by its samples, else its hold's stack (no contention observation there).
  void AttributeSampled(PartSink& out, uint64_t holder, uint64_t from, uint64_t to) const;
  // [from, to) of holder to one observed stack (kContention), but for the GCs it ran there; the GC ns are returned.
  void AttributeObserved(PartSink& out, uint64_t holder, uint64_t from, uint64_t to, uint32_t stack) const;
  // The GCs holder ran inside [from, to), attributed with `gc` set; returns their ns.
  uint64_t AttributeGcs(PartSink& out, uint64_t holder, uint64_t from, uint64_t to) const;
  // The hold of `thread` with start <= t < end, or null.
  const Hold* HoldAt(uint64_t thread, uint64_t t) const;
  void AttributeWall(AttributionResult& r, uint64_t end_ns) const;
  void AttributeRunning(AttributionResult& r, uint64_t thread, const Hold& hold) const;
  // The samples (or contention observations) of `thread` with from <= t < to.
  std::pair<const Sample*, const Sample*> SamplesIn(uint64_t thread, uint64_t from, uint64_t to) const;
  std::pair<const Sample*, const Sample*> ContentionsIn(uint64_t thread, uint64_t from, uint64_t to) const;
  static std::pair<const Sample*, const Sample*> TimesIn(const FlatMap64<std::vector<Sample>>& by_thread,
                                                         uint64_t thread, uint64_t from, uint64_t to);
  // The GCs `thread` ran that overlap [from, to).
  std::span<const Span> GcsIn(uint64_t thread, uint64_t from, uint64_t to) const;
  // ns of [from, to) inside a GC that `thread` ran.
  uint64_t GcOverlap(uint64_t thread, uint64_t from, uint64_t to) const;

  AttributionOptions options_;
  // The per-thread tables are flat (common/flat_map64.h): one is looked up for nearly every span, sample and event.
  std::vector<Span> waits_, blocked_;
  FlatMap64<std::vector<Span>> gcs_;               // per thread, in time order
  std::map<uint32_t, std::vector<Holder>> holders_;  // per VM, in time order
  FlatMap64<std::vector<Hold>> holds_;               // per thread, in time order
  size_t kept_ = 0;  // spans and samples in the containers above
  FlatMap64<std::vector<Sample>> samples_;         // per thread, in time order
  FlatMap64<std::vector<Sample>> contentions_;     // per holder thread, in time order (in_gc unused)
  std::map<uint64_t, Life> lives_;
  // estimate_paused:
  FlatMap64<Seen> seen_;
  bool paused_ = false;
  std::vector<Interval> pauses_;  // the paused windows; the last one open while paused_
  std::unordered_map<uint64_t, std::vector<Interval>> unobserved_;  // per thread, closed stretches, in time order
  std::vector<GvlSample> readings_;                                 // in time order
  // DrainEstimate: which kept readings an earlier drain already counted in estimate_readings (parallel to
  // readings_), the stacks of the named waiters' stretches it left open, and up to when it counted paused_ns.
  std::vector<bool> reading_counted_;
  std::unordered_map<uint64_t, WaiterStack> carried_stacks_;
  uint64_t paused_counted_to_ = 0;
};

// A trace sample's GVL reading (TraceEvent::gvl, ruby_threads) with tracker keys: the sample at t_ns of thread `key`
// on `stack`, taken while that thread ran a GC when in_gc.
GvlSample GvlSampleOf(uint64_t t_ns, uint64_t key, uint32_t stack, bool in_gc, const GvlReading& reading);

// Feeds a wants_gvl's contention observation (its `gvl` holder and holder_stack; docs/rvtrace.md) to `a`, when it
// has one that names a thread and a stack; stack_ok: whether the trace's stack id names a non-empty stack (null: any).
void OnTraceContention(Attribution& a, const TraceEvent& e,
                       const std::function<bool(uint32_t stack)>& stack_ok = nullptr);

// A whole trace's attribution from its tracker spans (Model::spans(): the SpanTracker's over these events, stacks
// as event stack ids) and its events in time order (the samples; every event's time and thread for the lifetimes;
// with options.estimate_paused the pauses, resumes and the samples' GVL readings too). end_ns: the end of the trace.
// stack_in_gc: whether a sample's stack says it was taken in GC (the recorder's GC pseudo-frame on top); null: never.
AttributionResult AttributeTrace(std::span<const Span> spans, std::span<const TraceEvent> events, uint64_t end_ns,
                                 AttributionOptions options,
                                 const std::function<bool(uint32_t stack)>& stack_in_gc = nullptr);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_MODEL_ATTRIBUTION_H_
