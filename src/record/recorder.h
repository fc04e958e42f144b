// The recording pipeline: target -> probe sites -> BPF session -> reorder window -> .rvtrace writer.
//
// Threading: everything runs on the calling thread (but for the zstd worker that compresses the trace, which takes
// no signals: trace/compressed.h). The main loop polls the BPF ring buffer every 20 ms (5 ms with
// --max-overhead), so the ring is drained continuously and the drop counter, the target's liveness, signals, the
// duration and the overhead budget are checked at that period.
#ifndef RVBPFD_SRC_RECORD_RECORDER_H_
#define RVBPFD_SRC_RECORD_RECORDER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "record/record_sink.h"
#include "session/overhead_budget.h"
#include "trace/compressed.h"

namespace rvbpfd {

struct RecordOptions {
  int pid = 0;                        // attach mode when > 0
  std::vector<std::string> command;   // launch mode when non-empty
  // Launch mode's --user: the command's user (name or uid). "": the sudo invoker under sudo, else rvbpfd's own
  // identity (record/launch DecideLaunchIdentity).
  std::string user;
  // Follow the target's process tree (record/process_tree.h): launch mode's default (--no-follow turns it off),
  // attach mode's --follow. Off: the trace of one process, as before.
  bool follow = false;
  std::string output;                 // empty: rvbpfd-<pid>-<time>.rvtrace in the current directory
  TraceFormat trace_format = TraceFormat::kZstd;  // --trace-format: zstd-compressed or plain JSON Lines
  double duration_s = 0;              // 0: until the target exits or a signal
  uint32_t ring_buffer_kb = 4096;     // BPF ring buffer size (KiB)
  double max_overhead_pct = 0;        // 0: never pause probes (recordings are complete by default)
  double warn_overhead_pct = 10;      // status-line warning threshold when not pausing
  // What one uprobe hit costs the target (us), for the overhead estimate (OverheadBudget TrapCosts, measured on a
  // VM by benchmarks/uprobe_cost.cc and trap_gap_cost.cc): a probe on an emulated instruction (rvbpfd's probes), a
  // single-stepped one, and the extra of a cold hit (OverheadBudget::kColdGapNs after the previous one on its CPU).
  double probe_cost_us = 1.5;
  double stepped_probe_cost_us = 10.5;
  double cold_probe_extra_us = 3;
  double cycle_cost_us = kCycleTargetUs;  // the target's cost of one pause + resume
  std::string cache_dir = "/var/cache/rvbpfd/sites";
  bool status_line = false;           // live status on stderr (when it is a terminal)
  bool force_single_links = false;    // one uprobe link per site even when multi links exist
  bool quiet = false;
  std::string stacks = "release";     // --stacks: "release", "release,ready" or "off"
  int hz = 99;                        // --hz: perf_event samples per second of CPU time; 0 = no sampling
  // --holder-stacks: a wants_gvl that finds another thread holding the GVL carries the holder and its stack (where
  // the binary's GVL layout is known and stacks are on); what GVL blame names the holder's work by (attribution.h).
  bool holder_stacks = true;
  // --hold: trace the target's main thread with ptrace and hold it for the few ms the daemon needs to name pending
  // stacks at its exit, its VM's teardown and a GC that would come before the daemon read a stack with new frames
  // (record/exit_hold.h). Launch mode's command and attach mode's target alike; off: frames of the last
  // milliseconds and of iseqs freed early may stay unnamed, and a debugger can attach meanwhile.
  bool hold = true;
  // --gc-probes (diagnostic): "auto" = the GC hook-check sites, entry/return of the GC functions only where a binary
  // has none; "fallback" = the function-level GC probes always (src/sites UseGcFunctionProbes).
  std::string gc_probes = "auto";
};

// Runs one recording to completion. Returns the process exit status (0 on a complete recording); errors were printed.
// make_sink: where the events go (record_sink.h); null: the .rvtrace file of options.output (its default name when
// empty). options.output and trace_format are the factory's to read otherwise.
Result<int> Record(const RecordOptions& options, RecordSinkFactory make_sink = nullptr);

// Signals that end a recording cleanly (set from the signal handler installed by Record).
void RequestStop();

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_RECORD_RECORDER_H_
