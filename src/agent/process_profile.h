// ProcessProfile: the fleet agent's aggregation of one Ruby process's samples and scheduler/GC events into the five
// continuous profiles it uploads every --interval: cpu, gvl_wait, gvl_held, gc and gvl_blame, each a gzipped pprof.
//
// Events are aggregated as they arrive and never stored: per interval the memory is one weight record per distinct
// stack, plus one small state per live Ruby thread and the interned stack table (which has a cap, below).
//
// Weights (all ns are event-time differences, CLOCK_MONOTONIC):
//   - cpu: each sample counts 1 and sample_period_ns of CPU time, on its stack. A sample taken during GC (in_gc) gets
//     the "(garbage collection)" pseudo-frame on top, as `rvbpfd record` writes it (src/record/recorder.cc).
//   - gvl_wait, gvl_held, gc: the SpanTracker's (model/span_tracker.h) wait, hold and GC spans, each on the stack the
//     tracker attributes it to ("[no stack]" when none; gc spans with the GC frame on top of it), exactly as
//     `rvbpfd export --pprof` attributes its GVL waits. Spans the tracker leaves uncounted (lost events, pauses, a
//     wait open at its thread's exit) are counted in the profiles' comments instead.
//   - gvl_blame: each counted GVL wait's ns attributed by model/attribution.h (the exports' rules) to the thread(s)
//     that held the GVL meanwhile and what they ran: the holder's samples inside the wait, else the stack of its
//     hold's release (or of its latest sample, for a hold still open at a cut), under the GC frame while it ran a
//     GC; "[GVL not held]" for hand-off time nobody held it, "[holder unknown]" where no holder was seen acquiring.
//     Labelled holder and waiter (thread names, below), blame_source (sampled, release_stack, last_sample,
//     no_stack, gvl_free, holder_unknown) and provenance ("derived": an observed wait), and endpoint: the holder's
//     stack's (below). Its total equals gvl_wait's in every interval.
//   - Paused windows (the budget detached the scheduler sites): the samples' GVL readings (OnSample's `gvl`: who held
//     the lock, who was queued) estimate the waits the pause hid, by model/attribution.h's streaming estimate (the
//     rules of `rvbpfd export --pprof` on a budgeted recording): in gvl_wait at the waiter's stack and in gvl_blame
//     on the holder, both labelled provenance "inferred" (never mixed with the observed samples), with a comment
//     giving the estimated ms. A reading is estimated in the interval of the last drain before it (at most one
//     sample period of an estimate moves to the next interval at a cut).
// th is the tracker's thread key; th 0 means "unknown thread": such samples count in cpu only and such events are
// ignored. Events must come in time order (the agent's reorder window).
//
// Interval cuts: Cut(cut_ns, ...) counts the parts of open spans before cut_ns in this interval and keeps them open
// from cut_ns for the next. A hold split by a cut is attributed, for its part before the cut, to the thread's latest
// sample stack (its release stack is not known yet). The GVL holder's span is cut with the waits, so a wait's blame
// in consecutive intervals sums to the whole wait's, per waiter and holder.
//
// Lost events (OnEventsLost) and tracing pauses (OnTracingPaused / OnTracingResumed) discard every span open at that
// point, waits, holds and GC alike (the tracker's rule): their ends may belong to different spans. Samples are
// unaffected.
//
// Every sample of every profile is labelled `endpoint`: its stack's (model/endpoint.h; the Rails action, job class or
// Sinatra route, "-" for none), derived once per stack and interval. An application has a bounded set of actions and
// jobs, so the label's cardinality is bounded by the application, and by kMaxEndpoints per interval (past it,
// "(other endpoints)"). Profiles other than gvl_blame carry no other pprof labels: the process labels (host, pid,
// ...) travel with the upload (src/sink), and a per-thread label would multiply both the profile size and, in
// Pyroscope which turns sample labels into series labels, the series cardinality by the thread count. Per-thread
// views are what `rvbpfd record` is for. gvl_blame's question is which thread starves which, so it names them:
// "main" (the thread the agent saw on the process's initial native thread, SetMainThread) or "Thread #N", N numbered
// per process from 2 in the order threads first appear in a gvl_blame profile, kept while the thread lives (a
// thread_started at a reused thread pointer gets a new number; more than kMaxThreadNames numbered threads start the
// numbering over). Its series are at most (threads that held) x (threads that waited) x sources per process.
//
// Bounded memory: stacks and frames are interned in a per-process table capped by ProcessProfileLimits (distinct
// stacks and estimated bytes). Once full, a new stack is attributed to a "[stack table full]" frame (counted in
// stats().stacks_over_cap). At each Cut the table is rebuilt from the few stacks live thread state still refers to
// when it is above reset_above_bytes, and thread states idle for idle_cuts_before_prune cuts are dropped (a thread
// blocked longer than that loses its release stack: its next wait goes to its wants_gvl or a later sample's stack).
// The blame attribution keeps the spans and samples of the interval until they are blamed: it is drained whenever
// it keeps more than kBlameDrainMin of them (or twice what the open waits still needed at the last drain), so it
// holds only what the waits open now can need.
//
// Threading: not thread-safe; one instance per process, used from the agent's main loop only.
#ifndef RVBPFD_SRC_AGENT_PROCESS_PROFILE_H_
#define RVBPFD_SRC_AGENT_PROCESS_PROFILE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/flat_map64.h"
#include "model/attribution.h"
#include "model/span_tracker.h"
#include "rvbpfd/abi.h"
#include "session/stack_resolver.h"
#include "trace/event.h"
#include "trace/stacks.h"

namespace rvbpfd {

struct BuiltProfile {
  std::string profile_type;  // "cpu", "gvl_wait", "gvl_held", "gc", "gvl_blame"
  std::string pprof_gz;      // the gzipped pprof Profile message
  uint64_t pprof_bytes = 0;  // its size before gzip
  uint64_t total = 0;        // cpu: samples; the others: ns
  std::vector<std::string> sample_label_names;  // the label names its samples carry (gvl_blame's)
};

// The frame standing in for stacks that did not fit in a full stack table.
inline constexpr std::string_view kStackTableFullFrame = "[stack table full]";

struct ProcessProfileLimits {
  // Distinct stacks interned per process before new ones go to "[stack table full]".
  size_t max_stacks = 65536;
  // Estimated bytes of the stack table (frames, their strings, stacks, hash indexes) before the same happens
  // (checked per stack and per new frame, so it is passed by at most one frame and a container's growth). One
  // interval of a busy Rails process needs about 1-2 MB. The agent lowers it to its memory budget's share
  // (Agent::ProfileTableBytes).
  size_t max_table_bytes = 2u << 20;
  // At a Cut, a table above this many estimated bytes is rebuilt with only the stacks still referred to.
  size_t reset_above_bytes = 256u << 10;
  // Cuts without any event or sample after which a thread state with no open span is dropped.
  uint32_t idle_cuts_before_prune = 4;
};

// Cumulative counters, for the agent's metrics.
struct ProcessProfileStats {
  uint64_t samples = 0;          // OnSample calls
  uint64_t events = 0;           // OnEvent calls
  uint64_t spans_discarded = 0;  // open waits/holds/GCs dropped (lost events, pauses, restarted or exited threads)
  uint64_t stacks_over_cap = 0;  // new stacks attributed to "[stack table full]"
  uint64_t table_resets = 0;     // stack table rebuilds at a Cut
  uint64_t threads_pruned = 0;   // idle thread states dropped at a Cut
  uint64_t build_failures = 0;   // profiles not produced because gzip failed
  uint64_t blame_drains = 0;     // times the blame attribution was drained between cuts
};

// Interned frames and stacks of one process, stored once each: frames in a vector, stacks as runs of frame ids in
// one flat vector, both indexed by hash sets of ids (so no key is stored twice). Ids are dense from 1.
class ProfileStackTable {
 public:
  ProfileStackTable(size_t max_stacks, size_t max_bytes);
  ProfileStackTable(const ProfileStackTable&) = delete;  // the hash sets' functors point into this object
  ProfileStackTable& operator=(const ProfileStackTable&) = delete;

  // The id of the stack `frames` (leaf first) with `top`, when not null, as an extra leaf frame; interned if new.
  // 0 when it is new and the table is full (nothing is added then).
  uint32_t Intern(std::span<const FrameInfo> frames, const FrameInfo* top = nullptr);
  // The same for a shared stack (the agent's path, not null): a stack object seen lately is found by its address,
  // and a frame object seen before by its, without hashing strings. Same ids and the same cap decisions as Intern
  // of the frames' values.
  uint32_t Intern(const SharedStack& stack);
  // The id of stack `base` (an id of this table) with `top` as an extra leaf frame; 0 when new and full.
  uint32_t InternOnTop(const FrameInfo& top, uint32_t base);

  // Frame ids of a stack, leaf first (empty for an unknown id), and a frame by id (id must come from this table).
  std::span<const uint32_t> stack(uint32_t id) const;
  const FrameInfo& frame(uint32_t id) const { return frames_[id - 1]; }
  size_t stack_count() const { return stack_offsets_.size() - 1; }
  size_t frame_count() const { return frames_.size(); }
  bool full() const;
  // Heap bytes held: vectors by capacity, strings past the small-string buffer, hash set buckets and nodes. Without
  // the frame-address memo (memo_memory_bytes), so the cap decisions do not depend on which API interned a stack.
  size_t approx_memory_bytes() const;
  size_t memo_memory_bytes() const;
  // Drops the frame-address memo and its references to shared frames (the resolver's cache evicted them: they are
  // freed now rather than at the memo's next clear). Ids and stacks stay.
  void ForgetSharedFrames();

 private:
  struct FrameIdHash {
    using is_transparent = void;
    const ProfileStackTable* t;
    size_t operator()(uint32_t id) const { return (*this)(t->frame(id)); }
    size_t operator()(const FrameInfo& f) const;
  };
  struct FrameIdEq {
    using is_transparent = void;
    const ProfileStackTable* t;
    bool operator()(uint32_t a, uint32_t b) const { return a == b; }
    bool operator()(const FrameInfo& f, uint32_t id) const { return f == t->frame(id); }
    bool operator()(uint32_t id, const FrameInfo& f) const { return f == t->frame(id); }
  };
  struct StackIdHash {
    using is_transparent = void;
    const ProfileStackTable* t;
    size_t operator()(uint32_t id) const { return (*this)(t->stack(id)); }
    size_t operator()(std::span<const uint32_t> ids) const;
  };
  struct StackIdEq {
    using is_transparent = void;
    const ProfileStackTable* t;
    bool operator()(uint32_t a, uint32_t b) const { return a == b; }
    bool operator()(std::span<const uint32_t> s, uint32_t id) const;
    bool operator()(uint32_t id, std::span<const uint32_t> s) const { return (*this)(s, id); }
  };

  // The id of frame f, or 0 when it is new and `may_add` is false.
  uint32_t FrameId(const FrameInfo& f, bool may_add);
  uint32_t InternIds(std::span<const uint32_t> ids);

  size_t max_stacks_;
  size_t max_bytes_;
  // id - 1 -> frame. A deque grows by fixed blocks, so the table never holds a doubled, half-empty array (the
  // vectors below grow by a quarter for the same reason): the byte cap is then passed by little.
  std::deque<FrameInfo> frames_;
  size_t frame_string_bytes_ = 0;         // heap bytes of the frames' strings
  std::vector<uint32_t> stack_frames_;    // all stacks' frame ids, concatenated
  std::vector<uint32_t> stack_offsets_;   // stack id - 1 -> start in stack_frames_; one extra end entry
  std::unordered_set<uint32_t, FrameIdHash, FrameIdEq> frame_index_;
  std::unordered_set<uint32_t, StackIdHash, StackIdEq> stack_index_;
  std::vector<uint32_t> scratch_;         // reused id buffer
  // Shared frame object -> its frame id. The entry holds the object, so its address is not reused while the entry
  // exists (frames are immutable: same address, same value). Cleared when it outgrows kMemoSlack + 2 * frames.
  static constexpr size_t kMemoSlack = 1024;
  std::unordered_map<const FrameInfo*, std::pair<SharedFrame, uint32_t>> memo_;
  // Whole stack objects -> stack id, by address in kStackMemoSlots / 2 sets of two slots (the most recently used
  // first), so two hot stacks whose addresses share a set do not evict each other on every record; each entry holds
  // its stack, so the address is not reused while it is remembered. Cleared with memo_.
  static constexpr size_t kStackMemoSlots = 64;
  struct StackMemo {
    SharedStack stack;  // null: empty slot
    uint32_t id = 0;
  };
  std::vector<StackMemo> stack_memo_;
  void ClearMemo();
  uint32_t InternShared(std::span<const SharedFrame> frames);  // Intern without the stack memo
};

class ProcessProfile {
 public:
  explicit ProcessProfile(uint64_t sample_period_ns);  // CPU ns one sample stands for (1e9 / hz)
  ProcessProfile(uint64_t sample_period_ns, ProcessProfileLimits limits);
  ~ProcessProfile();
  ProcessProfile(const ProcessProfile&) = delete;
  ProcessProfile& operator=(const ProcessProfile&) = delete;

  // Frames are leaf first (as StackResolver::Resolve produces them), without the GC frame (in_gc adds it). `gvl`:
  // the GVL reading the sample carried (trace/event.h; its holder_th / queued_th are th keys), null when none.
  void OnSample(uint64_t ts_ns, uint64_t th, bool in_gc, std::span<const FrameInfo> frames,
                const GvlReading* gvl = nullptr);
  // Whether OnEvent reads records of this kind (rv_event_kind): thread and GC events. Kernel#sleep / Mutex#lock entry
  // records carry nothing these profiles count, so the agent attaches no site of theirs.
  static constexpr bool ReadsEvent(uint32_t kind) {
    return (kind >= RV_EV_THREAD_STARTED && kind <= RV_EV_THREAD_EXITED) || kind == RV_EV_GC_ENTER ||
           kind == RV_EV_GC_EXIT;
  }
  // Scheduler/GC events of this process (kind = rv_event_kind). `frames` is the stack the event carried (gvl_released
  // with --stacks=release), empty when none. Kinds ReadsEvent refuses are ignored.
  void OnEvent(uint64_t ts_ns, uint64_t th, uint32_t kind, std::span<const FrameInfo> frames);
  // The same with a shared stack (StackResolver::ResolveStack's; null: none): identical results, cheaper for
  // repeated stacks.
  void OnSample(uint64_t ts_ns, uint64_t th, bool in_gc, const SharedStack& stack, const GvlReading* gvl = nullptr);
  void OnEvent(uint64_t ts_ns, uint64_t th, uint32_t kind, const SharedStack& stack);
  // A READY at ts_ns found thread `holder` holding the GVL, running `stack` (null: none): GVL blame's contention
  // observation (model/attribution.h). After that READY's OnEvent.
  void OnContention(uint64_t ts_ns, uint64_t holder, const SharedStack& stack);
  void OnEventsLost();  // events were dropped: spans open now are not counted (their ends are unknown)
  // `th` runs on the process's initial native thread (tid == pid): the main thread, so named in gvl_blame.
  void SetMainThread(uint64_t th) { main_th_ = th; }
  // What is now known of thread `th` (session/thread_info.h): its labels become "Thread #N (NAME)"
  // (ThreadLabelWithName, trace/reader.h). Parts not set are kept.
  void SetThreadInfo(uint64_t th, const ThreadInfo& info);
  // Budget pauses: spans open at either point are not counted; the waits in between are estimated (above).
  void OnTracingPaused(uint64_t ts_ns);
  void OnTracingResumed(uint64_t ts_ns);
  // Ends the interval at cut_ns: the parts of open spans before the cut count now, the rest in the next interval.
  // Returns the non-empty profiles among cpu (samples+cpu ns), gvl_wait (ns), gvl_held (ns), gc (ns) and gvl_blame
  // (ns), in that order, each with time_nanos = interval_start_unix_ns and duration_nanos = duration_ns; then starts
  // a new interval.
  std::vector<BuiltProfile> Cut(uint64_t cut_ns, int64_t interval_start_unix_ns, int64_t duration_ns);
  size_t approx_memory_bytes() const;  // for the agent's memory bound
  // The shared frames this profile refers to besides its own copies (see ProfileStackTable::ForgetSharedFrames).
  void ForgetSharedFrames() { table_->ForgetSharedFrames(); }

  const ProcessProfileStats& stats() const { return stats_; }
  size_t thread_count() const { return tracker_.thread_count(); }
  const ProfileStackTable& stack_table() const { return *table_; }
  uint64_t sample_period_ns() const { return sample_period_ns_; }

  // Spans + samples the blame attribution keeps before a drain. Small, so that what a process keeps (~15 KB) stays
  // in cache between its records.
  static constexpr size_t kBlameDrainMin = 256;
  static constexpr size_t kMaxThreadNames = 4096;  // numbered threads before the numbering starts over
  // Distinct endpoints named per interval (a bound on the `endpoint` label's series per process); the rest are
  // labelled kOtherEndpoints.
  static constexpr size_t kMaxEndpoints = 256;
  static constexpr std::string_view kOtherEndpoints = "(other endpoints)";

 private:
  struct Weights {
    uint64_t samples = 0;
    uint64_t wait_ns = 0;
    uint64_t held_ns = 0;
    uint64_t gc_ns = 0;
    uint64_t estimated_wait_ns = 0;  // gvl_wait estimated in paused windows (provenance inferred)
  };
  struct SpecialStacks {  // ids in the current table, interned first so they always exist
    uint32_t no_stack = 0;
    uint32_t gc_only = 0;
    uint32_t full = 0;
    uint32_t gc_full = 0;
    uint32_t gvl_free = 0;        // blame while nobody held the GVL
    uint32_t holder_unknown = 0;  // blame no holder span covers
  };

  // A stack as either API gave it (`shared` when not null, else `values`); interned only where the event needs it.
  struct StackInput {
    std::span<const FrameInfo> values;
    const SharedStack* shared = nullptr;
    bool empty() const { return shared != nullptr ? *shared == nullptr || (*shared)->empty() : values.empty(); }
  };

  void Sample(uint64_t ts_ns, uint64_t th, bool in_gc, const StackInput& frames, const GvlReading* gvl);
  void Event(uint64_t ts_ns, uint64_t th, uint32_t kind, const StackInput& frames);
  void Gap(EventName event, uint64_t ts_ns);
  void OnSpan(const Span& s);  // the tracker's spans become this interval's weights
  uint32_t InternOrFull(const StackInput& frames);
  uint32_t GcStack(uint32_t base);
  void NewTable();  // a fresh table with the special stacks, remapping every stack id thread state holds
  // `inferred`, when not null: a second, estimated weight of the same type, written as samples of its own labelled
  // provenance=inferred.
  std::string BuildOne(std::string_view type, const std::vector<uint32_t>& stacks, bool cpu,
                       uint64_t Weights::*member, uint64_t Weights::*inferred, int64_t interval_start_unix_ns,
                       int64_t duration_ns, const std::vector<std::string>& comments);
  std::string BuildBlame(int64_t interval_start_unix_ns, int64_t duration_ns, const std::vector<std::string>& comments);
  void DrainBlame(uint64_t now_ns);  // between cuts, when the attribution keeps too much
  // "main", "Thread #N" (numbered on first use), "-" for 0.
  std::string ThreadName(uint64_t th);
  // The endpoint of a stack of table_ (model/endpoint.h), derived on its first use in an interval; past
  // kMaxEndpoints distinct ones in an interval, kOtherEndpoints.
  std::string_view EndpointOf(uint32_t stack);
  void ForgetEndpoints();  // at each cut and new table

  uint64_t sample_period_ns_;
  ProcessProfileLimits limits_;
  std::unique_ptr<ProfileStackTable> table_;
  SpecialStacks special_;
  FlatMap64<Weights> weights_;  // this interval's weights by stack id (looked up for every sample and span)
  SpanTracker tracker_;  // thread keys are th; stack ids are table_'s
  Attribution blame_;    // fed the tracker's spans and the samples; drained into interval_blame_
  AttributionResult interval_blame_;  // this interval's blame so far
  size_t blame_drain_at_ = kBlameDrainMin;
  uint64_t main_th_ = 0;
  std::unordered_map<uint64_t, ThreadInfo> thread_infos_;  // th -> its names; forgotten with its number
  std::unordered_map<uint64_t, uint32_t> thread_numbers_;  // th -> N of "Thread #N"
  uint32_t next_thread_number_ = 2;                         // 1 is main's, as `rvbpfd record` numbers threads
  std::vector<uint64_t> exited_threads_;                    // this interval's thread_exited: numbers retired at the cut
  // This interval's discarded spans per kind and stacks over the cap, for the profiles' comments.
  uint64_t interval_discarded_waits_ = 0;
  uint64_t interval_discarded_holds_ = 0;
  uint64_t interval_discarded_gcs_ = 0;
  uint64_t interval_over_cap_ = 0;
  ProcessProfileStats stats_;
  // EndpointOf's memo: stack id -> endpoint index + 1 (0: not derived yet); the names, [0] is "-"; names -> index.
  static constexpr uint32_t kOtherEndpointsIndex = UINT32_MAX - 1;
  static constexpr size_t kMaxEndpointBytes = 64;  // a typical name's heap, for approx_memory_bytes
  std::vector<uint32_t> endpoint_of_stack_;
  std::vector<std::string> endpoint_names_;
  std::unordered_map<std::string, uint32_t> endpoint_ids_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_AGENT_PROCESS_PROFILE_H_
