// What `rvbpfd inspect` and `rvbpfd stats` print for a trace of one process or of several (docs/rvtrace.md, "Process
// lines"). A one-process trace prints as it always did; a multi-process trace prints its processes, then each traced
// process's views under a "== process N: LABEL ==" heading, each computed from that process alone (its own GVL).
#ifndef RVBPFD_SRC_EXPORT_INSPECT_VIEWS_H_
#define RVBPFD_SRC_EXPORT_INSPECT_VIEWS_H_

#include <ostream>

#include "common/error.h"
#include "trace/inspect.h"
#include "trace/reader.h"

namespace rvbpfd {

// `rvbpfd inspect FILE`: PrintRunSummary. Errors: Model::Build's (a trace naming a Ruby older than 3.2).
Status PrintInspectSummary(const TraceFile& trace, std::ostream& out);
// `rvbpfd inspect --events FILE`: PrintInspect, then the model's summary (PrintModelSummary).
Status PrintInspectEvents(const TraceFile& trace, const EventFilter& filter, std::ostream& out);
// `rvbpfd stats FILE`: PrintStats (the whole file), the GVL blame by holder and the contention summary.
Status PrintTraceStats(const TraceFile& trace, std::ostream& out);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_EXPORT_INSPECT_VIEWS_H_
