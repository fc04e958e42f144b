// `rvbpfd inspect FILE` and `rvbpfd stats FILE`: human-readable views of an .rvtrace.
#ifndef RVBPFD_SRC_TRACE_INSPECT_H_
#define RVBPFD_SRC_TRACE_INSPECT_H_

#include <optional>
#include <ostream>
#include <string>

#include "trace/reader.h"

namespace rvbpfd {

// The event table (time in ms with 3 decimals, Ruby thread, native tid, event, CRuby event, source) followed by a
// per-thread summary (id, native tids, running ms).
void PrintInspect(const TraceFile& trace, std::ostream& out);
// Counts by event, dropped events (total and number of events_dropped records), ring buffer high-water mark,
// duration, late (reordered) events.
void PrintStats(const TraceFile& trace, std::ostream& out);

// "main" for the main thread, "Thread #N" for others, "-" when the event is about no known thread.
std::string RubyThreadLabel(const TraceFile& trace, std::optional<uint32_t> ruby_thread);
// The per-thread summary a trace reports: its summary line's, or, for a trace cut before the summary, the same
// accounting the writer does, run over its events up to the last one.
std::vector<ThreadSummary> ThreadSummaries(const TraceFile& trace);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_INSPECT_H_
