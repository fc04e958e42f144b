// Why a thread does not hold the GVL: the one release-reason vocabulary of rvbpfd. The recorder derives most reasons
// from the released thread's stack (record/release_reason.h) and writes them into the trace; the thread-state model
// and the span tracker also give reasons no stack carries (a new thread starting, a 3.2 preemption).
//
// Each reason has two names, kept exactly as the formats have always spelled them: the trace name, written as the
// gvl_released "reason" (docs/rvtrace.md "Release reasons"; the in-process recorder's traces use the same strings),
// and the display name that inspect, the exporters and the report show ("sleep" is written, "sleeping" shown).
#ifndef RVBPFD_SRC_TRACE_RELEASE_REASON_H_
#define RVBPFD_SRC_TRACE_RELEASE_REASON_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rvbpfd {

// Values index per-reason arrays and the report's name table (in this order); keep kCount last.
enum class ReleaseReason : uint8_t {
  kUnknown,       // IO, Thread.pass, a queue, a timeslice on 3.3+...: the scheduler does not say
  kStarting,      // STARTED seen, READY not yet: the new thread never held the GVL (never written to a trace)
  kSleeping,      // Kernel#sleep: from the released stack, or (no stack) the release fell inside a Kernel#sleep probe
  kWaitingMutex,  // Thread::Mutex#lock: from the released stack, or (no stack) inside a Mutex#lock probe
  kPreempted,     // 3.2 timeslice: another thread's RESUMED while this one had not released (never written)
  kIo,
  kQueue,
  kConditionVariable,
  kJoin,
  kPass,
  kProcessWait,
  kTimeslice,
  kExit,
  kIdle,    // waiting for work in a pool that has none (Puma's thread pool): not contention
  kDbPool,  // waiting in ActiveRecord's connection pool for a connection (or for the pool's lock)
  kCount,
};
inline constexpr size_t kReleaseReasonCount = static_cast<size_t>(ReleaseReason::kCount);

// "unknown", "starting", "sleeping", "waiting_mutex", "preempted", "io", ...: what viewers show.
std::string_view ReleaseReasonName(ReleaseReason reason);
// "sleep", "mutex", "io", ..., "unknown": the gvl_released "reason" string. Reasons a trace never carries
// (kStarting, kPreempted) are written as "unknown".
std::string_view ReleaseReasonTraceName(ReleaseReason reason);
// Inverse of ReleaseReasonTraceName; kUnknown for "unknown", an empty string and names of a newer recorder.
ReleaseReason ParseReleaseReasonTraceName(std::string_view name);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_RELEASE_REASON_H_
