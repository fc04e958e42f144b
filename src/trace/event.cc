#include "trace/event.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <set>
#include <string>

namespace rvbpfd {
namespace {

struct EventNameRow {
  EventName event;
  std::string_view name;
  std::string_view cruby;  // empty: no CRuby constant
};

// Indexed by EventName; the static_assert below keeps the order honest.
constexpr std::array<EventNameRow, kEventNameCount> kEventNames = {{
    {EventName::kTracingStarted, "tracing_started", ""},
    {EventName::kThreadStarted, "thread_started", "RUBY_INTERNAL_THREAD_EVENT_STARTED"},
    {EventName::kWantsGvl, "wants_gvl", "RUBY_INTERNAL_THREAD_EVENT_READY"},
    {EventName::kGvlAcquired, "gvl_acquired", "RUBY_INTERNAL_THREAD_EVENT_RESUMED"},
    {EventName::kGvlReleased, "gvl_released", "RUBY_INTERNAL_THREAD_EVENT_SUSPENDED"},
    {EventName::kThreadExited, "thread_exited", "RUBY_INTERNAL_THREAD_EVENT_EXITED"},
    {EventName::kGcEnter, "gc_enter", "RUBY_INTERNAL_EVENT_GC_ENTER"},
    {EventName::kGcExit, "gc_exit", "RUBY_INTERNAL_EVENT_GC_EXIT"},
    {EventName::kSleepEnter, "sleep_enter", ""},
    {EventName::kMutexLockEnter, "mutex_lock_enter", ""},
    {EventName::kEventsDropped, "events_dropped", ""},
    {EventName::kTracingStopped, "tracing_stopped", ""},
    {EventName::kTracingPaused, "tracing_paused", ""},
    {EventName::kTracingResumed, "tracing_resumed", ""},
    {EventName::kSample, "sample", ""},
}};

constexpr bool TableInOrder() {
  for (size_t i = 0; i < kEventNames.size(); ++i) {
    if (static_cast<size_t>(kEventNames[i].event) != i) return false;
  }
  return true;
}
static_assert(TableInOrder(), "kEventNames must be indexed by EventName");

}  // namespace

std::string_view EventNameString(EventName event) {
  const auto i = static_cast<size_t>(event);
  return i < kEventNames.size() ? kEventNames[i].name : std::string_view("unknown");
}

std::optional<EventName> ParseEventName(std::string_view name) {
  for (const EventNameRow& row : kEventNames) {
    if (row.name == name) return row.event;
  }
  return std::nullopt;
}

std::string_view CrubyEventConstant(EventName event) {
  const auto i = static_cast<size_t>(event);
  return i < kEventNames.size() ? kEventNames[i].cruby : std::string_view();
}

std::string_view ProvenanceString(Provenance provenance) {
  switch (provenance) {
    case Provenance::kObserved: return "observed";
    case Provenance::kDerived: return "derived";
    case Provenance::kInferred: return "inferred";
  }
  return "observed";
}

std::optional<Provenance> ParseProvenance(std::string_view name) {
  if (name == "observed") return Provenance::kObserved;
  if (name == "derived") return Provenance::kDerived;
  if (name == "inferred") return Provenance::kInferred;
  return std::nullopt;
}

std::string_view InternSource(std::string_view source) {
  for (std::string_view known :
       {kSourceThreadHookSite, kSourceGcHookSite, kSourceProbe, kSourceDaemon, kSourcePerfEvent}) {
    if (source == known) return known;
  }
  // Leaked on purpose: events anywhere in the process may hold views into it. std::set nodes never move.
  static auto* interned = new std::set<std::string, std::less<>>();
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto it = interned->find(source);
  if (it == interned->end()) it = interned->emplace(source).first;
  return *it;
}

bool IsKnownRecordKind(uint16_t kind) { return kind >= RV_EV_THREAD_STARTED && kind < RV_EV_KIND_COUNT; }

TraceEvent FromRecord(const rv_record& record, uint64_t origin_ns) {
  TraceEvent event;
  event.t_ns = record.ts_ns >= origin_ns ? record.ts_ns - origin_ns : 0;
  event.provenance = Provenance::kObserved;
  switch (record.kind) {
    case RV_EV_THREAD_STARTED: event.event = EventName::kThreadStarted; break;
    case RV_EV_THREAD_READY: event.event = EventName::kWantsGvl; break;
    case RV_EV_THREAD_RESUMED: event.event = EventName::kGvlAcquired; break;
    case RV_EV_THREAD_SUSPENDED: event.event = EventName::kGvlReleased; break;
    case RV_EV_THREAD_EXITED: event.event = EventName::kThreadExited; break;
    case RV_EV_GC_ENTER: event.event = EventName::kGcEnter; break;
    case RV_EV_GC_EXIT: event.event = EventName::kGcExit; break;
    case RV_EV_SLEEP_ENTER: event.event = EventName::kSleepEnter; break;
    case RV_EV_MUTEX_LOCK_ENTER: event.event = EventName::kMutexLockEnter; break;
    default:
      event.event = EventName::kEventsDropped;
      event.source = kSourceDaemon;
      event.count = 1;
      return event;
  }
  switch (event.event) {
    case EventName::kGcEnter:
    case EventName::kGcExit: event.source = kSourceGcHookSite; break;
    case EventName::kSleepEnter:
    case EventName::kMutexLockEnter: event.source = kSourceProbe; break;
    default: event.source = kSourceThreadHookSite; break;
  }
  // ruby_thread is assigned later by ThreadIds from th, in timestamp order (release builds have no VM serial).
  if ((record.flags & RV_REC_TH_UNKNOWN) == 0) event.th = record.th;
  // BPF sets RV_REC_TID_UNKNOWN whenever the subject's tid is not known (th->nt NULL, or no th for an event that can
  // fire on another thread); events that run on their own thread carry the tid even when th is unknown.
  if ((record.flags & RV_REC_TID_UNKNOWN) == 0 && record.tid != 0) event.native_tid = record.tid;
  // tid 0 is the idle task, never a thread of the target: the probe did not record it.
  if (record.probe_tid != 0) event.probe_tid = record.probe_tid;
  return event;
}

std::shared_ptr<GvlReading> GvlReadingFromRecord(const rv_gvl_reading& reading) {
  auto g = std::make_shared<GvlReading>();
  g->held = reading.holder != 0;
  g->holder_th = reading.holder;
  const uint32_t listed = reading.nqueued < RV_GVL_MAX_QUEUED ? reading.nqueued : RV_GVL_MAX_QUEUED;
  g->queued_th.reserve(listed);
  for (uint32_t i = 0; i < listed; ++i) {
    const uint64_t th = reading.queued[i];
    // A queue relinked under the walk can show a thread twice: it waits once.
    if (th != 0 && std::find(g->queued_th.begin(), g->queued_th.end(), th) == g->queued_th.end()) {
      g->queued_th.push_back(th);
    }
  }
  g->waiting = reading.waiting > listed ? reading.waiting : listed;
  return g;
}

std::string ThreadInfo::DisplayName(const std::optional<std::string>& process_comm) const {
  if (name && !name->empty()) return *name;
  if (native_name && !native_name->empty() && native_name != process_comm) return *native_name;
  return "";
}

std::shared_ptr<GvlReading> HolderFromRecord(uint64_t holder_th) {
  auto g = std::make_shared<GvlReading>();
  g->held = true;
  g->holder_th = holder_th;
  return g;
}

void SetExitStatus(ProcessEnd* end, int wait_status) {
  const int sig = wait_status & 0x7f;
  if (sig == 0) {
    end->exit_code = (wait_status >> 8) & 0xff;
  } else if (sig != 0x7f) {  // 0x7f: a stopped child's status, not an end
    end->signal = sig;
  }
}

}  // namespace rvbpfd
