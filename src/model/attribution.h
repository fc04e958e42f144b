// Attribution: who made each thread wait for the GVL, and where every thread's wall-clock time went, computed from
// the SpanTracker's spans (model/span_tracker.h) and the on-CPU samples. It keeps no thread state of its own: every
// interval it attributes is a span the tracker emitted.
//
// GVL blame. Each counted GVL wait [s, e) of a waiter on VM v is split over the GVL holder spans (kHolder) of v that
// overlap it:
//   - a holder h (another thread) over an overlap O: O is attributed to h. What h was running: its on-CPU samples
//     inside O, |O| / k ns to each of the k samples (source kSampled); with none, the stack of h's GVL hold that
//     covers O: the stack of the gvl_released that ended it (kReleaseStack) or, for a hold ended otherwise (exit,
//     a lost release), the stack of h's latest sample (kLastSample); else no stack (kNoStack). The part of O in which
//     h ran a GC is attributed with `gc` set (GC runs on the lock holder and keeps every other thread waiting).
//   - nobody held the GVL (holder thread 0): the hand-off between a release and the waiter's acquisition, or the
//     time the scheduler took to wake the waiter: holder kNoThread, source kGvlFree.
//   - no holder span covers it (the holder is not known, e.g. one that held the GVL since before tracing began):
//     holder kNoThread, source kHolderUnknown. Never attributed to a guessed thread.
// The waiter's own wait is an observed fact (both ends are the VM's events); who held the lock is derived from the
// last gvl_acquired (holder spans); the holder's stack is sampled or the release's, as `source` says.
//
// Wall clock. Each thread's life, from its first event (thread_started, or the first event of a thread that was
// already running when tracing began) to its thread_exited (or the end of the trace), is attributed to a state and a
// stack: kRunning (GVL holds minus the GCs the thread ran: split over the samples inside, |hold| / k each, else the
// hold's own stack), kGc (the GC's stack), kGvlWait (the wait's stack), kBlocked with the release reason (the
// release's stack), and kUnknown for time no counted span covers (lost events, tracing paused, a thread starting
// before its first READY). The states of a thread sum to its lifetime exactly.
//
// Times are ns. Threads are the tracker's keys (a trace's ruby_thread + 1, 0 = none). Not thread-safe. Memory: every
// span and sample of the input is kept until Compute(): use one Attribution per trace (or per agent interval).
#ifndef RVBPFD_SRC_MODEL_ATTRIBUTION_H_
#define RVBPFD_SRC_MODEL_ATTRIBUTION_H_

#include <cstdint>
#include <map>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

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
  kCount,
};
// "sampled", "release_stack", "last_sample", "no_stack", "gvl_free", "holder_unknown".
std::string_view BlameSourceName(BlameSource source);

enum class WallState : uint8_t { kRunning, kGc, kGvlWait, kBlocked, kUnknown, kCount };
// "running", "gc", "gvl_wait", "blocked", "unknown".
std::string_view WallStateName(WallState state);

struct BlameKey {
  uint64_t waiter = 0;  // tracker key
  uint64_t holder = 0;  // tracker key; 0 for kGvlFree / kHolderUnknown
  uint32_t stack = 0;   // the holder's stack; 0 = none
  bool gc = false;      // the holder was running a GC
  BlameSource source = BlameSource::kNoStack;
  auto operator<=>(const BlameKey&) const = default;
};

struct WallKey {
  uint64_t thread = 0;
  WallState state = WallState::kUnknown;
  ReleaseReason reason = ReleaseReason::kUnknown;  // kBlocked only
  uint32_t stack = 0;
  auto operator<=>(const WallKey&) const = default;
};

struct AttributionResult {
  std::map<BlameKey, uint64_t> blame_ns;  // sums to total_gvl_wait_ns
  std::map<WallKey, uint64_t> wall_ns;    // per thread, sums to that thread's lifetime
  uint64_t total_gvl_wait_ns = 0;         // counted waits only
  uint64_t waits = 0;
  std::map<uint64_t, uint64_t> lifetime_ns;  // per thread key
};

class Attribution {
 public:
  // Feed in time order, every span the tracker emits, every event's thread and time (for lifetimes) and every
  // sample (with the time it was taken).
  void OnSpan(const Span& s);
  void OnThreadEvent(uint64_t t_ns, uint64_t thread, bool exited);
  void OnSample(uint64_t t_ns, uint64_t thread, uint32_t stack, bool in_gc);
  // end_ns: the end of the trace (threads still alive live until then).
  AttributionResult Compute(uint64_t end_ns) const;

 private:
  struct Sample {
    uint64_t t_ns;
    uint32_t stack;
    bool in_gc;
  };
  struct Life {
    uint64_t first_ns = 0;
    uint64_t exit_ns = 0;
    bool exited = false;
  };
  void AttributeHolder(AttributionResult& r, const Span& wait, uint64_t holder, uint64_t from, uint64_t to) const;
  void AttributeRunning(AttributionResult& r, uint64_t thread, const Span& hold) const;
  // The samples of `thread` with from <= t < to.
  std::pair<const Sample*, const Sample*> SamplesIn(uint64_t thread, uint64_t from, uint64_t to) const;
  // ns of [from, to) inside a GC that `thread` ran.
  uint64_t GcOverlap(uint64_t thread, uint64_t from, uint64_t to) const;

  std::vector<Span> waits_, holders_, holds_, blocked_, gcs_;
  std::unordered_map<uint64_t, std::vector<Sample>> samples_;
  std::map<uint64_t, Life> lives_;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_MODEL_ATTRIBUTION_H_
