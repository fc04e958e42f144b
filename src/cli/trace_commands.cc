// The commands that read a trace: inspect, stats, report, export.
#include <cstdio>
#include <functional>
#include <iostream>
#include <string>
#include <utility>

#include "cli/commands.h"
#include "common/safe_file.h"
#include "common/text_escape.h"
#include "export/inspect_views.h"
#include "export/perfetto.h"
#include "export/pprof.h"
#include "export/run_summary.h"
#include "export/speedscope.h"
#include "model/model.h"
#include "model/model_summary.h"
#include "report/report.h"
#include "trace/reader.h"

namespace rvbpfd::cli {
namespace {

// Exports are written through a temporary file renamed into place (common/safe_file), so a failed export never
// leaves a partial file behind and a planted symlink is never followed; under sudo the invoking user owns them.
// A file past `max_bytes` is removed too (exit 14, kOutputTooLarge).
Status WriteOutput(const std::string& path, uint64_t max_bytes, const std::function<Status(std::ostream&)>& write) {
  OutputFileOptions options;
  options.owner = SudoInvokerOfProcess();
  options.allow_fifo_or_device = true;
  options.max_bytes = max_bytes;
  return WriteOutputFile(path, options, write);
}

int RunInspect(const TraceCommands& c) {
  Result<TraceFile> trace = TraceReader::ReadFile(c.inspect_file);
  if (!trace) return Fail(trace.error());
  if (trace->MultiProcess()) {
    // Each process's views from its own part (export/inspect_views.h); one process keeps the paths below, which
    // hand the trace to the model without a copy.
    Status st;
    PrintEscaped([&](std::ostream& out) {
      st = c.inspect_events ? PrintInspectEvents(*trace, c.event_filter, out) : PrintInspectSummary(*trace, out);
    });
    return st ? 0 : Fail(st.error());
  }
  if (c.inspect_events) {
    PrintEscaped([&](std::ostream& out) { PrintInspect(*trace, out, c.event_filter); });
    Result<Model> model = Model::FromTrace(std::move(trace.value()));
    if (!model) return Fail(model.error());
    PrintEscaped([&](std::ostream& out) {
      out << "\n";
      PrintModelSummary(*model, out);
    });
    return 0;
  }
  const StackProfile agg = AggregateStacks(*trace);
  Result<Model> model = Model::FromTrace(*trace);
  if (!model) return Fail(model.error());
  PrintEscaped([&](std::ostream& out) { PrintRunSummary(*trace, agg, *model, out); });
  return 0;
}

int RunStats(const TraceCommands& c) {
  Result<TraceFile> trace = TraceReader::ReadFile(c.stats_file);
  if (!trace) return Fail(trace.error());
  if (trace->MultiProcess()) {
    Status st;
    PrintEscaped([&](std::ostream& out) { st = PrintTraceStats(*trace, out); });
    return st ? 0 : Fail(st.error());
  }
  PrintEscaped([&](std::ostream& out) {
    PrintStats(*trace, out);
    PrintBlameTotals(*trace, AggregateStacks(*trace), out);
  });
  Result<Model> model = Model::FromTrace(std::move(trace.value()));
  if (!model) return Fail(model.error());
  PrintEscaped([&](std::ostream& out) { PrintContentionSummary(*model, out); });
  return 0;
}

int RunReport(const TraceCommands& c) {
  std::string report_out = c.report_out;
  if (report_out.empty()) {
    const size_t dot = c.report_file.rfind(".rvtrace");
    report_out =
        (dot != std::string::npos && dot + 8 == c.report_file.size() ? c.report_file.substr(0, dot) : c.report_file) +
        ".html";
  }
  Status st = WriteReport(c.report_file, report_out, c.max_output_bytes, c.report_process);
  if (!st) return Fail(st.error());
  fprintf(stderr, "rvbpfd: wrote %s\n", EscapeControlBytes(report_out).c_str());
  return 0;
}

int RunExport(const TraceCommands& c) {
  if (!c.perfetto && !c.speedscope && !c.pprof && !c.folded) {
    return Fail(Error(ErrorCode::kUsage, "export needs --perfetto, --speedscope, --pprof or --folded"));
  }
  if (c.pprof || c.folded) {
    // Stack-based formats read the trace's frame and stack dictionaries directly (the model has no stacks).
    Result<TraceFile> trace = TraceReader::ReadFile(c.export_file);
    if (!trace) return Fail(trace.error());
    const FoldedWeight weight = c.folded_weight == "gvl_wait"    ? FoldedWeight::kGvlWaitNs
                                : c.folded_weight == "gvl_blame" ? FoldedWeight::kGvlBlameNs
                                : c.folded_weight == "wall"      ? FoldedWeight::kWallNs
                                                                 : FoldedWeight::kCpuSamples;
    Status st = WriteOutput(c.export_out, c.max_output_bytes, [&](std::ostream& out) {
      return c.pprof ? ExportPprof(*trace, out) : ExportFolded(*trace, out, weight);
    });
    return st ? 0 : Fail(st.error());
  }
  Status st = WriteOutput(c.export_out, c.max_output_bytes, [&](std::ostream& out) {
    return c.perfetto ? ExportPerfetto(c.export_file, out) : ExportSpeedscope(c.export_file, out);
  });
  return st ? 0 : Fail(st.error());
}

}  // namespace

void AddTraceCommands(CLI::App& app, TraceCommands* c) {
  CLI::App* inspect = c->inspect = app.add_subcommand(
      "inspect",
      "Summarize a trace on one screen: wall clock by thread and state, GVL contention, the top blockers "
      "(the holders' Ruby method across threads, the C function beneath it), the top blocked stacks by "
      "release reason (idle pool threads apart), lost events (--events: the event table)");
  inspect->add_option("file", c->inspect_file, "The .rvtrace file")->required();
  auto* events_flag =
      inspect->add_flag("--events", c->inspect_events,
                        "Print the event table, per-thread running time and state table instead of the summary");
  inspect->add_option("--thread", c->event_filter.thread, "With --events: only this Ruby thread's events (its id)")
      ->needs(events_flag);
  inspect
      ->add_option("--from", c->event_filter.from_ms, "With --events: only events at or after MS (ms into the trace)")
      ->needs(events_flag);
  inspect->add_option("--to", c->event_filter.to_ms, "With --events: only events at or before MS (ms into the trace)")
      ->needs(events_flag);
  inspect->add_option("--limit", c->event_filter.limit, "With --events: at most N rows")->needs(events_flag);
  CLI::App* stats = c->stats =
      app.add_subcommand("stats", "Print event counts, dropped events and ring high-water of a trace");
  stats->add_option("file", c->stats_file, "The .rvtrace file")->required();
  CLI::App* report = c->report = app.add_subcommand("report", "Write a self-contained HTML timeline of a trace");
  report->add_option("file", c->report_file, "The .rvtrace file")->required();
  report->add_option("-o,--output", c->report_out, "HTML file to write (default: the trace's name with .html)");
  report->add_option("--process", c->report_process,
                     "A trace of several processes: the process to draw (its id in `rvbpfd inspect`; default 1, "
                     "the launched one)");
  c->max_output_bytes = kDefaultMaxOutputBytes;
  const std::string max_output_help =
      "Stop with exit 14 and remove the output once it passes this size (bytes, or with a K/M/G suffix; 0 = no "
      "cap): what a trace holds can make an export far larger than the trace";
  report->add_option("--max-output-bytes", c->max_output_bytes, max_output_help)
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  CLI::App* exp = c->exp = app.add_subcommand("export", "Convert a trace for other viewers");
  exp->add_option("file", c->export_file, "The .rvtrace file")->required();
  exp->add_option("-o,--output", c->export_out, "Output file")->required();
  exp->add_option("--max-output-bytes", c->max_output_bytes, max_output_help)
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  auto* perfetto_flag =
      exp->add_flag("--perfetto", c->perfetto, "Chrome trace event JSON for ui.perfetto.dev and chrome://tracing");
  auto* speedscope_flag =
      exp->add_flag("--speedscope", c->speedscope,
                    "speedscope's file format: thread states per Ruby thread, GVL blame and wall clock by stack")
          ->excludes(perfetto_flag);
  auto* pprof_flag = exp->add_flag("--pprof", c->pprof,
                                   "gzipped pprof profile: CPU samples and GVL wait time by Ruby stack "
                                   "(go tool pprof, Pyroscope, Parca)")
                         ->excludes(perfetto_flag)
                         ->excludes(speedscope_flag);
  auto* folded_flag = exp->add_flag("--folded", c->folded, "collapsed stacks for flame graphs (root first)")
                          ->excludes(perfetto_flag)
                          ->excludes(speedscope_flag)
                          ->excludes(pprof_flag);
  exp->add_option("--weight", c->folded_weight,
                  "With --folded: cpu (samples), gvl_wait (ns waiting for the GVL), gvl_blame (ns others waited, "
                  "at the holder's stack) or wall (every thread's ns by state)")
      ->check(CLI::IsMember({"cpu", "gvl_wait", "gvl_blame", "wall"}))
      ->needs(folded_flag);
}

bool RunTraceCommand(const TraceCommands& c, int* status) {
  if (c.inspect->parsed())
    *status = RunInspect(c);
  else if (c.stats->parsed())
    *status = RunStats(c);
  else if (c.report->parsed())
    *status = RunReport(c);
  else if (c.exp->parsed())
    *status = RunExport(c);
  else
    return false;
  return true;
}

}  // namespace rvbpfd::cli
