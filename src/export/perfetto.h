// `rvbpfd export --perfetto`: the model as Chrome trace event JSON, which ui.perfetto.dev and chrome://tracing open.
//
// Layout. Process 1 ("Ruby threads"): a "GVL owner" track (owner slices named after the owning thread, plus "idle"
// and "unknown"), a "GC" track, and one track per Ruby thread whose slices are the model's state blocks, with
// instant events for the Kernel#sleep and Mutex#lock probes on the thread's track. Process 2 ("native threads"): a
// track per native tid whose slices name the Ruby thread that ran on it. events_dropped, tracing_paused and
// tracing_resumed are global instant events (on a "trace markers" track of their own).
//
// Slices are complete events ("ph":"X" with "dur"): blocks on a track are contiguous, and a complete event cannot
// be mis-nested the way an "E" and a "B" at the same timestamp can. Timestamps are microseconds with three
// decimals (ns precision). Each slice's args carry the block's provenance, the rule that derived it, and the CRuby
// events that opened and closed it; its category ("cat") is the provenance, so derived blocks can be filtered. When
// the trace recorded stacks, an opening/closing event's arg also carries its stack (leaf first, "label (path:line)")
// and, for gvl_released, the derived release reason, and the endpoint of that stack (model/endpoint.h: "endpoint" and,
// when a rule named one, "endpoint_rule"; derived). A thread's slice also carries the endpoint it belongs to: its
// opening event's stack's, else its closing event's, else the thread's latest one before it (a GVL wait: the
// endpoint the thread released the lock in); "-" when none is known.
#ifndef RVBPFD_SRC_EXPORT_PERFETTO_H_
#define RVBPFD_SRC_EXPORT_PERFETTO_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "model/model.h"
#include "trace/stacks.h"

namespace rvbpfd {

// Synthetic pid/tid values of the tracks (the JSON needs numbers; the real pid is in the process name and
// "otherData").
inline constexpr int kPerfettoRubyPid = 1;
inline constexpr int kPerfettoNativePid = 2;
inline constexpr uint64_t kPerfettoOwnerTid = 1;
inline constexpr uint64_t kPerfettoGcTid = 2;
inline constexpr uint64_t kPerfettoMarkerTid = 3;  // global instants: events_dropped, tracing_paused/resumed
inline constexpr uint64_t kPerfettoThreadTidBase = 1000;  // + Ruby thread serial (serials start at 0 on 3.2)

// The trace's stack dictionaries (TraceFile::frames / stacks), for the stack args; absent: no stack args.
struct PerfettoStacks {
  const std::unordered_map<uint32_t, FrameInfo>* frames = nullptr;
  const std::unordered_map<uint32_t, std::vector<uint32_t>>* stacks = nullptr;
};

// Fails with kIo when the stream fails.
Status ExportPerfetto(const Model& model, std::ostream& out, PerfettoStacks stacks = {});

// One process of a trace of several (docs/rvtrace.md, "Process lines"): its label ("pid 4242 (ruby app.rb)") and the
// model of its part (trace/processes.h).
struct PerfettoProcessModel {
  std::string label;
  const Model* model = nullptr;
};
// Each process gets its own two process tracks, named "LABEL: Ruby threads" and "LABEL: native threads" (JSON pids
// 2i+1 and 2i+2, ordered by process_sort_index), holding the layout above; otherData names the first (the root).
// Fails with kBadTrace for an empty list, kIo when the stream fails.
Status ExportPerfetto(const std::vector<PerfettoProcessModel>& processes, std::ostream& out,
                      PerfettoStacks stacks = {});
// Models the trace first (a trace of several processes: one model per process, as above); errors are also those of
// Model::FromTrace.
Status ExportPerfetto(const TraceFile& trace, std::ostream& out);
// Reads the trace, then as above; errors are also those of TraceReader::ReadFile.
Status ExportPerfetto(const std::string& trace_path, std::ostream& out);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_EXPORT_PERFETTO_H_
