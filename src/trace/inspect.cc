#include "trace/inspect.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "trace/json_format.h"

namespace rvbpfd {
namespace {

// Why a trace read shorter than what was recorded: the end of the file was cut while being written.
void PrintCutNotes(const TraceFile& trace, std::ostream& out) {
  if (trace.truncated_frame) {
    out << "note: the compressed file ends inside a zstd frame (cut while being written); its incomplete end was "
           "skipped\n";
  }
  if (trace.truncated_last_line) out << "note: the last line was cut while being written and was skipped\n";
}

// The CRuby column: the hook constant, or for the two Ruby-level probes the method they sit on (no CRuby event
// exists for those; the JSON field stays null).
std::string_view CrubyLabel(EventName event) {
  switch (event) {
    case EventName::kSleepEnter: return "Kernel#sleep";
    case EventName::kMutexLockEnter: return "Thread::Mutex#lock";
    default: break;
  }
  const std::string_view constant = CrubyEventConstant(event);
  return constant.empty() ? std::string_view("-") : constant;
}

std::string FormatMs(double ms) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f ms", ms);
  return buf;
}

std::string NsToMs(uint64_t ns) { return FormatMs(static_cast<double>(ns) / 1e6); }

std::string OptionalNumber(std::optional<uint32_t> v) { return v ? std::to_string(*v) : "-"; }

uint64_t LastEventNs(const TraceFile& trace) {
  uint64_t last = 0;
  for (const TraceEvent& e : trace.events) last = std::max(last, e.t_ns);
  return last;
}

// The pid of the process an event is about, for the event table of a multi-process trace; "-" for the recording's
// own events (about no thread), "?" when the process has no pid.
std::string EventPid(const TraceFile& trace, const TraceEvent& e) {
  if (!e.ruby_thread && e.source == kSourceDaemon) return "-";
  const ProcessInfo* p = trace.FindProcess(e.process);
  return p != nullptr && p->pid != 0 ? std::to_string(p->pid) : "?";
}

}  // namespace

std::string Pad(std::string_view s, size_t width) {
  std::string out(s);
  if (out.size() < width) out.append(width - out.size(), ' ');
  return out;
}

std::string PadLeft(std::string_view s, size_t width) {
  std::string out;
  if (s.size() < width) out.append(width - s.size(), ' ');
  out.append(s);
  return out;
}

// A name as a JSON string ("..." with escapes): it is the target's choice.
static std::string Quoted(std::string_view s) {
  std::string out;
  AppendJsonString(&out, s);
  return out;
}

std::string RubyThreadLabel(const TraceFile& trace, std::optional<uint32_t> ruby_thread) {
  if (!ruby_thread) return "-";
  return ThreadLabelWithName(*ruby_thread, trace.IsMain(ruby_thread), trace.ThreadName(*ruby_thread));
}

namespace {

// "12.345 ms-45.600 ms (exit 0)", "(exit by signal 9)": when a process appeared and how it ended (ms since the
// origin).
std::string ProcessLifetime(const TraceFile& trace, const ProcessInfo& p) {
  std::string out = NsToMs(p.t_ns) + "-";
  const ProcessEnd* end = trace.FindProcessEnd(p.id);
  if (end == nullptr) return out + "? (no end recorded)";
  out += NsToMs(end->t_ns) + " (" + (end->how.empty() ? std::string("ended") : end->how);
  if (end->exit_code) out += " " + std::to_string(*end->exit_code);
  if (end->signal) out += " by signal " + std::to_string(*end->signal);
  return out + ")";
}

size_t ThreadCount(const TraceFile& trace, uint32_t process) {
  return std::count_if(trace.threads.begin(), trace.threads.end(),
                       [&](const ThreadLine& t) { return t.process == process; });
}

// The per-thread rows of `PrintInspect` for the threads of `process` (all of them when nullopt).
void PrintThreadRows(const TraceFile& trace, const std::vector<ThreadSummary>& summaries,
                     std::optional<uint32_t> process, std::ostream& out) {
  for (const ThreadSummary& t : summaries) {
    if (process && trace.ProcessOf(t.ruby_thread) != *process) continue;
    std::string natives;
    for (uint32_t tid : t.native_tids) {
      if (!natives.empty()) natives += ',';
      natives += std::to_string(tid);
    }
    out << "  " << ThreadLabelWithName(t.ruby_thread, t.main, trace.ThreadName(t.ruby_thread))
        << " id=" << t.ruby_thread << " native=" << (natives.empty() ? "-" : natives);
    if (const ThreadInfo* info = trace.FindThreadInfo(t.ruby_thread); info != nullptr) {
      if (info->ns_tid) out << " ns_tid=" << *info->ns_tid;
      if (info->name) out << " name=" << Quoted(*info->name);
      if (info->native_name) out << " native_name=" << Quoted(*info->native_name);
    }
    out << " running=" << FormatMs(t.running_ms) << '\n';
  }
}

}  // namespace

void PrintProcesses(const TraceFile& trace, std::ostream& out) {
  size_t skipped = 0;
  for (const ProcessInfo& p : trace.processes) skipped += p.skipped.empty() ? 0 : 1;
  out << "processes: " << trace.processes.size() << " (" << trace.processes.size() - skipped << " traced, "
      << skipped << " skipped), " << trace.threads.size() << " threads, " << trace.events.size() << " events\n";
  out << "  " << PadLeft("id", 4) << "  " << Pad("pid", 8) << Pad("parent", 8) << Pad("cause", 7) << Pad("ruby", 8)
      << PadLeft("threads", 7) << "  " << Pad("lifetime", 36) << "command\n";
  for (const ProcessInfo& p : trace.processes) {
    std::string command;
    for (const std::string& arg : p.command) command += (command.empty() ? "" : " ") + arg;
    out << "  " << PadLeft(std::to_string(p.id), 4) << "  " << Pad(p.pid ? std::to_string(p.pid) : "-", 8)
        << Pad(OptionalNumber(p.parent), 8) << Pad(p.cause.empty() ? "-" : p.cause, 7)
        << Pad(p.ruby_version.empty() ? "-" : p.ruby_version, 8) << PadLeft(std::to_string(ThreadCount(trace, p.id)), 7)
        << "  " << Pad(ProcessLifetime(trace, p), 36) << (command.empty() ? "-" : Quoted(command));
    if (!p.skipped.empty()) out << "  skipped: " << p.skipped;
    out << '\n';
  }
}

std::vector<ThreadSummary> ThreadSummaries(const TraceFile& trace) {
  if (trace.summary && trace.summary_has_threads) return trace.summary->threads;
  ThreadAccounting accounting(trace.header.main_thread);
  for (const ThreadLine& t : trace.threads) {
    if (t.main) accounting.MarkMain(t.ruby_thread);
  }
  for (const TraceEvent& e : trace.events) accounting.Observe(e);
  return accounting.Summarize(LastEventNs(trace));
}

void PrintInspect(const TraceFile& trace, std::ostream& out, const EventFilter& filter) {
  constexpr size_t kTimeWidth = 14, kThreadWidth = 13, kNativeWidth = 9, kEventWidth = 18, kCrubyWidth = 39;
  // Several processes: a pid column says whose thread an event is about (each process has its own "main").
  const bool by_process = trace.MultiProcess();
  constexpr size_t kPidWidth = 9;
  out << PadLeft("time", kTimeWidth) << "  " << (by_process ? Pad("pid", kPidWidth) : "")
      << Pad("ruby_thread", kThreadWidth) << Pad("native", kNativeWidth)
      << Pad("event", kEventWidth) << Pad("cruby event", kCrubyWidth) << "source\n";
  uint64_t shown = 0;
  for (const TraceEvent& e : trace.events) {
    if (filter.thread && e.ruby_thread != filter.thread && (e.ruby_thread || e.source != kSourceDaemon)) continue;
    const double t_ms = static_cast<double>(e.t_ns) / 1e6;
    if ((filter.from_ms && t_ms < *filter.from_ms) || (filter.to_ms && t_ms > *filter.to_ms)) continue;
    if (filter.limit && shown >= *filter.limit) break;
    ++shown;
    out << PadLeft(NsToMs(e.t_ns), kTimeWidth) << "  " << (by_process ? Pad(EventPid(trace, e), kPidWidth) : "")
        << Pad(RubyThreadLabel(trace, e.ruby_thread), kThreadWidth)
        << Pad(OptionalNumber(e.native_tid), kNativeWidth) << Pad(EventNameString(e.event), kEventWidth)
        << Pad(CrubyLabel(e.event), kCrubyWidth) << (e.source.empty() ? std::string_view("-") : e.source);
    if (e.event == EventName::kEventsDropped) out << "  count=" << e.count;
    if (!e.reason.empty()) {
      out << "  reason=" << e.reason;
      if (e.event == EventName::kGvlReleased) out << " (" << ProvenanceString(e.reason_provenance) << ')';
    }
    if (e.stack) {
      // The leaf frame is what a reader scanning the table wants; the full stack is in the dictionary line.
      out << "  stack=" << *e.stack;
      const std::vector<uint32_t>* frames = trace.Stack(*e.stack);
      if (frames != nullptr && !frames->empty()) {
        if (const FrameInfo* leaf = trace.Frame(frames->front()); leaf != nullptr) out << " at " << leaf->label;
      }
    }
    if (e.overhead_pct >= 0) out << "  overhead=" << e.overhead_pct << "%";
    out << '\n';
  }
  if (filter.active()) out << "(" << shown << " of " << trace.events.size() << " events shown)\n";
  out << "threads:";
  if (!trace.summary || !trace.summary_has_threads) out << " (not in the summary: computed from the events)";
  out << '\n';
  const std::vector<ThreadSummary> summaries = ThreadSummaries(trace);
  if (!trace.MultiProcess()) {
    PrintThreadRows(trace, summaries, std::nullopt, out);
  } else {
    for (const ProcessInfo& p : trace.processes) {
      if (ThreadCount(trace, p.id) == 0) continue;
      out << " " << trace.ProcessLabel(p.id) << ":\n";
      PrintThreadRows(trace, summaries, p.id, out);
    }
  }
  PrintCutNotes(trace, out);
}

void PrintStats(const TraceFile& trace, std::ostream& out) {
  const TraceHeader& h = trace.header;
  out << "recorder: " << h.recorder << ' ' << h.recorder_version << " (pid " << h.pid << ", ruby "
      << (h.ruby_version.empty() ? "?" : h.ruby_version) << ")\n";
  const double duration_ms =
      trace.summary ? trace.summary->duration_ms : static_cast<double>(LastEventNs(trace)) / 1e6;
  out << "duration: " << FormatMs(duration_ms) << '\n';

  // Counted from the lines present, so a trace cut before its summary still gets exact counts.
  std::array<uint64_t, kEventNameCount> counts{};
  uint64_t dropped = 0, drop_records = 0;
  for (const TraceEvent& e : trace.events) {
    counts[static_cast<size_t>(e.event)]++;
    if (e.event == EventName::kEventsDropped) {
      dropped += e.count;
      ++drop_records;
    }
  }
  out << "events: " << trace.events.size() << '\n';
  for (size_t i = 0; i < kEventNameCount; ++i) {
    if (counts[i] == 0) continue;
    out << "  " << Pad(EventNameString(static_cast<EventName>(i)), 18) << counts[i] << '\n';
  }
  uint64_t with_stack = 0;
  for (const TraceEvent& e : trace.events) with_stack += e.stack ? 1 : 0;
  out << "samples: " << counts[static_cast<size_t>(EventName::kSample)] << '\n';
  out << "stacks: " << trace.stacks.size() << " distinct (" << trace.frames.size() << " frames), on "
      << with_stack << " events\n";
  out << "events dropped: " << dropped << " (in " << drop_records << " events_dropped records)\n";
  if (trace.summary) {
    out << "ring buffer high-water mark: " << trace.summary->ring_high_water_bytes << " bytes\n";
    out << "late (reordered) events: " << trace.summary->late_events << '\n';
    if (trace.summary->probe_hits) {
      // Every hit is one trap the target paid for; discarded ones wrote nothing (see docs/rvtrace.md).
      out << "probe hits (traps): " << *trace.summary->probe_hits << ", of which not events: "
          << trace.summary->hits_discarded.value_or(0);
      if (trace.summary->cold_hits) out << ", cold: " << *trace.summary->cold_hits;
      if (trace.summary->stepped_hits) out << ", single-stepped: " << *trace.summary->stepped_hits;
      out << '\n';
    }
    if (const std::optional<SampleEcRoutes>& r = trace.summary->sample_ec_routes) {
      // How each sample found its thread's EC (docs/design.md, "How a sample finds its EC").
      out << "sample EC routes:";
      const char* sep = " ";
#define RV_ROUTE_SHOW(field, fold, label, key) \
  out << sep << label << ' ' << r->key;        \
  sep = ", ";
      RV_EC_ROUTE_COUNTERS(RV_ROUTE_SHOW)
#undef RV_ROUTE_SHOW
      out << '\n';
    }
  } else {
    out << "ring buffer high-water mark: unknown (no summary line: the recording did not finish)\n";
    out << "late (reordered) events: unknown (no summary line: the recording did not finish)\n";
  }
  out << "out-of-order events in the file: " << trace.out_of_order_events << '\n';
  if (trace.unknown_event_lines > 0) out << "events of unknown type (skipped): " << trace.unknown_event_lines << '\n';
  PrintCutNotes(trace, out);
}

}  // namespace rvbpfd
