// The in-memory form of one .rvtrace event line (docs/rvtrace.md), the name tables between it and the file format,
// and the conversion from the BPF ring buffer record (include/rvbpfd/abi.h).
//
// TraceEvent is copied through the reorder window and the writer at over a million events per second, so its
// strings are views of static (or process-lifetime interned) text, never owned per event; only the rare
// tracing_paused / tracing_resumed reason is an owned std::string.
#ifndef RVBPFD_SRC_TRACE_EVENT_H_
#define RVBPFD_SRC_TRACE_EVENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rvbpfd/abi.h"

namespace rvbpfd {

// Values index the name tables in event.cc; keep kCount last.
enum class EventName : uint8_t {
  kTracingStarted,
  kThreadStarted,   // RUBY_INTERNAL_THREAD_EVENT_STARTED
  kWantsGvl,        // RUBY_INTERNAL_THREAD_EVENT_READY
  kGvlAcquired,     // RUBY_INTERNAL_THREAD_EVENT_RESUMED
  kGvlReleased,     // RUBY_INTERNAL_THREAD_EVENT_SUSPENDED
  kThreadExited,    // RUBY_INTERNAL_THREAD_EVENT_EXITED
  kGcEnter,         // RUBY_INTERNAL_EVENT_GC_ENTER
  kGcExit,          // RUBY_INTERNAL_EVENT_GC_EXIT
  kSleepEnter,      // Kernel#sleep entry probe
  kMutexLockEnter,  // Thread::Mutex#lock entry probe
  kEventsDropped,
  kTracingStopped,
  kTracingPaused,
  kTracingResumed,
  kSample,          // on-CPU stack sample (perf_event), or a GC pseudo-sample; no CRuby constant
  kCount,
};
inline constexpr size_t kEventNameCount = static_cast<size_t>(EventName::kCount);

// How a fact was obtained (docs/rvtrace.md, "Provenance").
enum class Provenance : uint8_t {
  kObserved,  // reported by the VM (or the daemon itself) at the moment it happened
  kDerived,   // computed from observed events by a documented rule
  kInferred,  // a guess about something no event reports
};

// Source channels. Events carry views of these constants (or of InternSource()), so they are cheap to copy.
inline constexpr std::string_view kSourceThreadHookSite = "thread_hook_site";
inline constexpr std::string_view kSourceGcHookSite = "gc_hook_site";
inline constexpr std::string_view kSourceProbe = "probe";
inline constexpr std::string_view kSourceDaemon = "daemon";
inline constexpr std::string_view kSourcePerfEvent = "perf_event";  // timer-driven CPU samples

// A sample's reading of its VM's GVL (docs/rvtrace.md, "GVL readings"): who held the lock and who was queued for it
// when the sample was taken, read by the sampler from the VM's scheduler state in memory, without any probe. A
// snapshot, not a transition: consumers that turn readings into waiting time mark the result inferred.
// What is known of a Ruby thread beside its events (docs/rvtrace.md, "Thread line"): each part is optional, and a
// recording learns and updates them as it goes (a thread is named after it starts, and may be renamed).
struct ThreadInfo {
  // Names are the target's choice: cut to kMaxLabelBytes (common/label_bound.h) where they are read and made.
  std::optional<std::string> name;         // Thread#name, read from the VM (rb_thread_t.name)
  std::optional<std::string> native_name;  // the native thread's name (/proc/PID/task/TID/comm)
  std::optional<uint32_t> ns_tid;          // the native thread's tid in the target's own pid namespace
  bool operator==(const ThreadInfo&) const = default;
  bool empty() const { return !name && !native_name && !ns_tid; }
  // What a thread is called: Thread#name when set, else the native name when it is not `process_comm` (the name
  // every unnamed thread inherits from the process); empty when neither.
  std::string DisplayName(const std::optional<std::string>& process_comm) const;
};

// One process of a recording (docs/rvtrace.md, "Process lines"). A trace holds one process (the header's) unless the
// recorder followed the target's process tree: then each process the tree became or spawned gets an id, in order of
// appearance, and its threads say which one they belong to. A pid can hold several processes in turn (exec replaces
// the image: a new process id, the old one ends).
inline constexpr uint32_t kRootProcessId = 1;  // the header's process (header.pid, ruby_version, command)

struct ProcessInfo {
  uint32_t id = kRootProcessId;
  uint32_t pid = 0;                 // host pid
  std::optional<uint32_t> parent;   // id of the process it was forked from, or that it replaced by exec
  std::string cause;                // "fork" (a new process), "exec" (a new image in the same pid); "" for the root
  uint64_t t_ns = 0;                // when it appeared (ns since origin_ns): the fork, or the exec
  std::vector<std::string> command; // its argv as /proc/PID/cmdline said when it was first seen; empty: not read
  std::string ruby_version;         // RUBY_VERSION of its VM; empty when it is not traced
  std::string build_id;             // hex GNU build-id of its VM binary; empty when not known
  // Non-empty: the process was not traced, and why ("not Ruby: /bin/sh", "another Ruby binary: ..."). It has no
  // threads in the trace. Never dropped silently.
  std::string skipped;
  bool operator==(const ProcessInfo&) const = default;
};

// The end of a process (docs/rvtrace.md, "Process lines"): its exit, or its image replaced by exec.
struct ProcessEnd {
  uint32_t id = kRootProcessId;
  uint64_t t_ns = 0;                // ns since origin_ns
  std::string how;                  // "exit" or "exec"
  std::optional<int32_t> exit_code; // exit status when known (exit only)
  std::optional<int32_t> signal;    // the signal that ended it, when known (exit only; then no exit_code)
  bool operator==(const ProcessEnd&) const = default;
};
// Sets exit_code or signal of *end from a wait status (the kernel's exit_code: code << 8, or the signal number, with
// 0x80 for a core dump). A status that is neither (a stop) sets nothing.
void SetExitStatus(ProcessEnd* end, int wait_status);

struct GvlReading {
  bool held = false;               // somebody held the GVL
  std::optional<uint32_t> holder;  // the holder's ruby_thread, when held by a thread the trace names
  uint32_t waiting = 0;            // threads queued for the GVL (the VM's count)
  std::vector<uint32_t> queued;    // ruby_threads of the queued threads the trace names, next to run first; at most
                                   // `waiting` of them (the queue is listed up to RV_GVL_MAX_QUEUED)
  // The recorder's rb_thread_t pointers, until ThreadIds names them (0 / empty in traces read from a file).
  uint64_t holder_th = 0;
  std::vector<uint64_t> queued_th;
};

struct TraceEvent {
  uint64_t t_ns = 0;                     // ns since the header's origin_ns (CLOCK_MONOTONIC)
  std::optional<uint32_t> ruby_thread;   // VM thread serial; nullopt when not known or not about a thread
  std::optional<uint32_t> native_tid;    // native tid of the thread the event is about; nullopt when not known
  std::optional<uint32_t> probe_tid;     // tid that ran the probe (differs for READY from a waker, STARTED on creator)
  uint64_t th = 0;                       // the VM's rb_thread_t * (0: unknown); ThreadIds turns it into ruby_thread
  EventName event = EventName::kTracingStarted;
  Provenance provenance = Provenance::kObserved;
  // The process (ProcessInfo::id) the event's thread belongs to: the writer puts it on the thread's line (events do
  // not repeat it; ruby_thread numbers are unique across a trace's processes). kRootProcessId for one-process traces.
  uint32_t process = kRootProcessId;
  std::string_view source = kSourceDaemon;  // channel; must outlive the event (static or InternSource())
  uint64_t count = 0;                    // events_dropped only: events lost since the previous events_dropped
  // tracing_paused / tracing_resumed / tracing_stopped, and gvl_released (the release-reason vocabulary in
  // docs/rvtrace.md: "sleep", "io", ...). Empty = absent. Every release reason fits the small-string buffer except
  // "condition_variable", so the per-event cost stays a copy, not an allocation, in the common case.
  std::string reason;
  Provenance reason_provenance = Provenance::kObserved;  // gvl_released only: how `reason` was obtained
  std::optional<uint32_t> stack;         // id of a stack dictionary line (trace/stacks.h) written before this event
  double overhead_pct = -1;              // tracing_paused / tracing_resumed only; negative = absent (percent)
  // sample: the GVL reading taken with it; wants_gvl: the GVL holder its READY found (held, holder / holder_th only;
  // docs/rvtrace.md `holder`), whose stack is holder_stack; null for every other event, for samples without a reading
  // and for waits that began uncontended (a pointer, so the events that have none, nearly all, copy 16 bytes more and
  // allocate nothing).
  std::shared_ptr<GvlReading> gvl;
  // wants_gvl only: id of the stack line of the GVL holder's Ruby stack when the wait began (with `gvl`).
  std::optional<uint32_t> holder_stack;
};

// "gvl_acquired" etc. The result is a static string.
std::string_view EventNameString(EventName event);
// Inverse of EventNameString; nullopt for names this version does not know.
std::optional<EventName> ParseEventName(std::string_view name);
// "RUBY_INTERNAL_THREAD_EVENT_RESUMED" etc., or an empty view for events with no CRuby constant (written as null).
std::string_view CrubyEventConstant(EventName event);
std::string_view ProvenanceString(Provenance provenance);
std::optional<Provenance> ParseProvenance(std::string_view name);

// Returns a view with process lifetime that equals `source`: the static constant for the known channels, otherwise
// a copy kept for the life of the process (readers of foreign traces meet few distinct channel names).
std::string_view InternSource(std::string_view source);

// True for the rv_event_kind values FromRecord decodes.
bool IsKnownRecordKind(uint16_t kind);

// Converts one ring buffer record. Timestamps before origin_ns (a record from a CPU whose clock read raced the
// origin) clamp to 0. A record with an unknown kind, which only an ABI mismatch between the BPF object and the
// daemon can produce, becomes an events_dropped with count 1 from the daemon: the trace says an event was lost
// instead of inventing one.
TraceEvent FromRecord(const rv_record& record, uint64_t origin_ns);

// A sample's GVL reading as it came from BPF, with the VM's pointers (ThreadIds names them). The count is taken as at
// least the number of threads listed (the two are read a moment apart, without the VM's lock).
std::shared_ptr<GvlReading> GvlReadingFromRecord(const rv_gvl_reading& reading);
// The GVL holder a contended READY found (RV_REC_HAS_HOLDER), as a wants_gvl's `gvl`: held by holder_th.
std::shared_ptr<GvlReading> HolderFromRecord(uint64_t holder_th);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_EVENT_H_
