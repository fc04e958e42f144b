// `rvbpfd top --pid PID`: a live view of what every Ruby thread of a process does, refreshed each --interval from the
// probes. It is the recorder's own pipeline (record/recorder.h: probes, ring, reorder window, thread numbering,
// stack symbolization) with a different sink (record/record_sink.h): TopState aggregates each interval, top_render
// draws it. Nothing is written to disk unless -o asks for the trace too.
//
// With a terminal on stdout: the alternate screen, redrawn each interval; q quits (top_terminal.h). Without one: one
// plain-text snapshot per interval on stdout (--json: one JSON object per line). Either way the probes are released
// at the end as by the recorder, and the target runs on.
#ifndef RVBPFD_SRC_TOP_TOP_COMMAND_H_
#define RVBPFD_SRC_TOP_TOP_COMMAND_H_

#include <cstdint>

#include "common/error.h"
#include "record/recorder.h"

namespace rvbpfd {

struct TopOptions {
  RecordOptions record;    // pid, stacks, hz, output (-o: also write the trace), duration...
  double interval_s = 1;   // --interval
  uint64_t iterations = 0; // --iterations: stop after this many snapshots; 0 = until q, a signal or the target's exit
  bool json = false;       // --json (without a terminal)
};

// Runs the view; returns the exit status (0 on q, --iterations, a signal, or the target's exit).
Result<int> RunTop(TopOptions options);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TOP_TOP_COMMAND_H_
