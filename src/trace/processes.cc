#include "trace/processes.h"

#include <cstdint>
#include <unordered_set>

namespace rvbpfd {
namespace {

// The daemon's records about the recording itself: every process's part keeps them.
bool ConcernsEveryProcess(const TraceEvent& e) {
  if (e.ruby_thread) return false;
  switch (e.event) {
    case EventName::kTracingStarted:
    case EventName::kTracingStopped:
    case EventName::kEventsDropped:
    case EventName::kTracingPaused:
    case EventName::kTracingResumed:
      return true;
    default:
      return false;
  }
}

TraceHeader ProcessHeader(const TraceHeader& whole, const ProcessInfo& p) {
  if (p.id == kRootProcessId) return whole;
  TraceHeader h = whole;
  h.pid = p.pid;
  h.ruby_version = p.ruby_version;
  h.command = p.command;
  h.build_id = p.build_id;
  h.main_thread.reset();  // the process's thread lines say which of its threads is main
  return h;
}

TraceFile ProcessPart(const TraceFile& whole, const ProcessInfo& p, const std::unordered_set<uint32_t>& threads) {
  TraceFile part;
  part.header = ProcessHeader(whole.header, p);
  for (const ThreadLine& t : whole.threads) {
    if (t.process == p.id) part.threads.push_back(t);
  }
  // The recording's own events concern the process only while it existed: an ended process's part ends with its
  // last event, not at the end of the recording.
  const ProcessEnd* end = whole.FindProcessEnd(p.id);
  const uint64_t from = p.id == kRootProcessId ? 0 : p.t_ns;
  const uint64_t until = end != nullptr ? end->t_ns : UINT64_MAX;
  for (const TraceEvent& e : whole.events) {
    const bool recording = ConcernsEveryProcess(e);
    if ((!recording && e.process == p.id) || (recording && e.t_ns >= from && e.t_ns <= until)) {
      part.events.push_back(e);
    }
  }
  part.frames = whole.frames;
  part.stacks = whole.stacks;
  part.summary = whole.summary;
  if (part.summary) {
    std::erase_if(part.summary->threads, [&](const ThreadSummary& t) { return !threads.contains(t.ruby_thread); });
  }
  part.summary_has_threads = whole.summary_has_threads;
  part.truncated_last_line = whole.truncated_last_line;
  part.truncated_frame = whole.truncated_frame;
  part.lines = whole.lines;
  part.unknown_event_lines = whole.unknown_event_lines;
  part.unknown_lines = whole.unknown_lines;
  part.out_of_order_events = whole.out_of_order_events;
  return part;
}

}  // namespace

std::vector<ProcessTrace> SplitByProcess(const TraceFile& trace) {
  std::vector<ProcessTrace> parts;
  if (!trace.MultiProcess()) {
    ProcessInfo root = trace.processes.empty() ? ProcessInfo{} : trace.processes.front();
    if (trace.processes.empty() && trace.header.pid > 0 && trace.header.pid <= UINT32_MAX) {
      root.pid = static_cast<uint32_t>(trace.header.pid);
    }
    parts.push_back({.info = root, .label = trace.ProcessLabel(kRootProcessId), .trace = trace});
    return parts;
  }
  for (const ProcessInfo& p : trace.processes) {
    std::unordered_set<uint32_t> threads;
    for (const ThreadLine& t : trace.threads) {
      if (t.process == p.id) threads.insert(t.ruby_thread);
    }
    if (threads.empty()) continue;
    parts.push_back({.info = p, .label = trace.ProcessLabel(p.id), .trace = ProcessPart(trace, p, threads)});
  }
  return parts;
}

std::string ProcessThreadLabel(const std::string& process_label, const std::string& thread_label) {
  return process_label + ": " + thread_label;
}

}  // namespace rvbpfd
