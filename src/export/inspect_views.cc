#include "export/inspect_views.h"

#include <functional>

#include "export/pprof.h"
#include "export/run_summary.h"
#include "model/model.h"
#include "model/model_summary.h"
#include "trace/processes.h"

namespace rvbpfd {
namespace {

// Runs `view` on the trace itself (one process), or on each traced process's part under its heading.
Status ForEachProcess(const TraceFile& trace, std::ostream& out,
                      const std::function<Status(const TraceFile&)>& view) {
  if (!trace.MultiProcess()) return view(trace);
  for (const ProcessTrace& part : SplitByProcess(trace)) {
    out << "\n== process " << part.info.id << ": " << part.label << " ==\n";
    if (Status st = view(part.trace); !st) return st;
  }
  return Status();
}

}  // namespace

Status PrintInspectSummary(const TraceFile& trace, std::ostream& out) {
  if (trace.MultiProcess()) PrintProcesses(trace, out);
  return ForEachProcess(trace, out, [&](const TraceFile& t) -> Status {
    const StackProfile agg = AggregateStacks(t);
    Result<Model> model = Model::FromTrace(t);
    if (!model) return model.error();
    PrintRunSummary(t, agg, *model, out);
    return Status();
  });
}

Status PrintInspectEvents(const TraceFile& trace, const EventFilter& filter, std::ostream& out) {
  PrintInspect(trace, out, filter);
  if (trace.MultiProcess()) {
    out << '\n';
    PrintProcesses(trace, out);
  }
  return ForEachProcess(trace, out, [&](const TraceFile& t) -> Status {
    Result<Model> model = Model::FromTrace(t);
    if (!model) return model.error();
    out << "\n";
    PrintModelSummary(*model, out);
    return Status();
  });
}

Status PrintTraceStats(const TraceFile& trace, std::ostream& out) {
  PrintStats(trace, out);
  if (trace.MultiProcess()) PrintProcesses(trace, out);
  return ForEachProcess(trace, out, [&](const TraceFile& t) -> Status {
    PrintBlameTotals(t, AggregateStacks(t), out);
    Result<Model> model = Model::FromTrace(t);
    if (!model) return model.error();
    PrintContentionSummary(*model, out);
    return Status();
  });
}

}  // namespace rvbpfd
