// `rvbpfd inspect --events FILE` and `rvbpfd stats FILE`: human-readable views of an .rvtrace (the summary `inspect`
// opens with needs the model: export/run_summary.h).
#ifndef RVBPFD_SRC_TRACE_INSPECT_H_
#define RVBPFD_SRC_TRACE_INSPECT_H_

#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "trace/reader.h"

namespace rvbpfd {

// Which rows of the event table to print: events of one Ruby thread (its ruby_thread id), with from_ms <= t <= to_ms
// (ms since the trace's origin), at most `limit` rows. Events about no thread are kept when a thread is asked for
// only if they are daemon records (drops, pauses, start/stop), which concern every thread.
struct EventFilter {
  std::optional<uint32_t> thread;
  std::optional<double> from_ms;
  std::optional<double> to_ms;
  std::optional<uint64_t> limit;
  bool active() const { return thread || from_ms || to_ms || limit; }
};

// The event table (time in ms with 3 decimals, Ruby thread, native tid, event, CRuby event, source) followed by a
// per-thread summary (id, native tids, running ms). A multi-process trace gets a pid column in the table and its
// thread rows grouped under their process's label. With an active filter, a line after the table says how many of
// the trace's events it showed.
void PrintInspect(const TraceFile& trace, std::ostream& out, const EventFilter& filter = {});
// For a multi-process trace (docs/rvtrace.md, "Process lines"): one line of totals, then one row per process (id,
// pid, parent id, cause, Ruby version, threads, lifetime in ms since the origin and how it ended, command; a skipped
// process with its reason).
void PrintProcesses(const TraceFile& trace, std::ostream& out);
// Counts by event, dropped events (total and number of events_dropped records), ring buffer high-water mark,
// duration, late (reordered) events.
void PrintStats(const TraceFile& trace, std::ostream& out);

// `s` padded with spaces to `width` columns, on the right (Pad) or the left (PadLeft); longer strings are kept whole.
std::string Pad(std::string_view s, size_t width);
std::string PadLeft(std::string_view s, size_t width);

// "main" for the main thread, "Thread #N" for others, "-" when the event is about no known thread.
std::string RubyThreadLabel(const TraceFile& trace, std::optional<uint32_t> ruby_thread);
// The per-thread summary a trace reports: its summary line's, or, for a trace cut before the summary, the same
// accounting the writer does, run over its events up to the last one.
std::vector<ThreadSummary> ThreadSummaries(const TraceFile& trace);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_INSPECT_H_
