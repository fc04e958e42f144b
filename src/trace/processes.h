// A multi-process trace (docs/rvtrace.md, "Process lines") seen as one single-process trace per traced process, so
// every per-process view (the thread-state model, whose GVL is one process's, the summaries, the exports) runs
// unchanged on each part and the tools only add the process around it.
#ifndef RVBPFD_SRC_TRACE_PROCESSES_H_
#define RVBPFD_SRC_TRACE_PROCESSES_H_

#include <string>
#include <vector>

#include "trace/reader.h"

namespace rvbpfd {

struct ProcessTrace {
  ProcessInfo info;
  std::string label;  // TraceFile::ProcessLabel: "pid 4242 (ruby app.rb)"
  // A one-process trace: the header describes this process (pid, ruby_version, command, build_id; main_thread only
  // for the root, other processes' thread lines say which is main); its threads and events are those of the process
  // plus the recording's own events (tracing_started/stopped/paused/resumed, events_dropped) from when the process
  // appeared (the root: from the start) to its process_end, if any; the dictionaries are the whole trace's; the summary keeps the whole trace's figures and only this
  // process's threads.
  TraceFile trace;
};

// One part per process that has threads in the trace, in the order of `trace.processes` (skipped processes, and
// processes that ended before any thread line, have none). A trace of one process gives one part: the trace itself.
std::vector<ProcessTrace> SplitByProcess(const TraceFile& trace);

// "pid 4242 (ruby app.rb): main": the thread label tools use where a trace has several processes.
std::string ProcessThreadLabel(const std::string& process_label, const std::string& thread_label);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TRACE_PROCESSES_H_
