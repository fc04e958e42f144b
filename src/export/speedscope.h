// `rvbpfd export --speedscope`: the model in speedscope's file format
// (https://www.speedscope.app/file-format-schema.json), one "evented" profile per Ruby thread, then, from the trace's
// stacks, two "sampled" profiles.
//
// Evented: the frames are the thread states themselves ("running", "wants_gvl", "released: sleeping", "gc",
// "unknown", ...): each state block is one open/close ("O"/"C") pair, and speedscope's left-heavy view then reads as
// "where did this thread's time go". Blocks before a thread started and after it exited are left out (the thread did
// not exist). Values are nanoseconds since the trace origin.
// Sampled (model/attribution.h via AggregateStacks), weights in nanoseconds, stacks root first:
//   "GVL blame": root frame "holder: <thread>", then the holder's Ruby stack (leaf "[GC]" for a GC it ran; a
//     stand-in frame such as "[GVL not held]" when no stack is known), weighted by the ns others waited;
//   "wall clock": root frame the thread, then its stack, then the state as leaf ("[running]", "[blocked: io]"),
//     weighted by the ns the thread spent so; per thread the weights sum to its lifetime.
#ifndef RVBPFD_SRC_EXPORT_SPEEDSCOPE_H_
#define RVBPFD_SRC_EXPORT_SPEEDSCOPE_H_

#include <ostream>
#include <string>
#include <string_view>

#include "common/error.h"
#include "model/model.h"
#include "trace/reader.h"

namespace rvbpfd {

inline constexpr std::string_view kSpeedscopeSchema = "https://www.speedscope.app/file-format-schema.json";

// The evented profiles only. Fails with kIo when the stream fails.
Status ExportSpeedscope(const Model& model, std::ostream& out);
// The evented profiles of `model` and the sampled ones of `trace` (the trace `model` was built from).
Status ExportSpeedscope(const Model& model, const TraceFile& trace, std::ostream& out);
// Models the trace first. A trace of several processes (docs/rvtrace.md, "Process lines") gets one model per process
// (trace/processes.h): every profile's name starts with the process's label ("pid 4242 (ruby app.rb): main",
// "pid 4242 (ruby app.rb): GVL blame (...)"), its evented profiles first, process by process, then its sampled ones.
// Errors are also those of Model::FromTrace.
Status ExportSpeedscope(const TraceFile& trace, std::ostream& out);
// Reads the trace, then as above; errors are also those of TraceReader::ReadFile.
Status ExportSpeedscope(const std::string& trace_path, std::ostream& out);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_EXPORT_SPEEDSCOPE_H_
