// `rvbpfd export --folded`: collapsed stacks for flame graph tools (flamegraph.pl, inferno, speedscope's import):
// one line per distinct stack, frames root first joined by ';', a space, then the weight:
//   <main>;Foo.run;Integer#times;block in Foo.run;Foo#hot 812
// Lines are sorted, so equal traces give byte-identical files. Stacks and weights are those of the pprof export
// (export/pprof.h, AggregateStacks), summed over threads. A trace of several processes (docs/rvtrace.md, "Process
// lines") aggregates each process apart and starts its lines with a frame naming it:
//   pid 4242 (ruby app.rb);<main>;Foo#hot 12
#ifndef RVBPFD_SRC_EXPORT_FOLDED_H_
#define RVBPFD_SRC_EXPORT_FOLDED_H_

#include <ostream>
#include <string>

#include "common/error.h"
#include "trace/reader.h"

namespace rvbpfd {

enum class FoldedWeight {
  kCpuSamples,  // number of CPU samples (the default: what a CPU flame graph shows)
  kGvlWaitNs,   // ns spent waiting for the GVL
  kGvlBlameNs,  // ns others waited for the GVL, at the holder's stack (model/attribution.h); a holder's GC ends in
                // a "[GC]" frame, time nobody held the lock is "[GVL not held]", an unknown holder "[holder unknown]"
  kWallNs,      // every thread's wall-clock ns, at its stack, with the state as the leaf frame: "[running]",
                // "[gc]", "[gvl_wait]", "[blocked: sleeping]", "[unknown]"
};

// A frame's name in a folded line: its label, with ';' (the frame separator) replaced by ':' and line breaks by
// spaces so a line always splits back into the same frames.
std::string FoldedFrameName(const std::string& label);

// Stacks with zero weight are left out. Fails with kIo when the stream fails.
Status ExportFolded(const TraceFile& trace, std::ostream& out, FoldedWeight weight = FoldedWeight::kCpuSamples);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_EXPORT_FOLDED_H_
