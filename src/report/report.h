// `rvbpfd report`: the thread-state model as one self-contained HTML file, a timeline that opens from disk with no
// network: a lane per Ruby thread, the GVL owner lane (idle drawn explicitly), GC spans, probe and lost-event
// markers, a native-threads view, an inspector card per block (with the stacks of its events and the release reason
// when the trace recorded them, and for a GVL wait who held the lock meanwhile and what they ran: the GVL blame of
// model/attribution.h, each part with how it is known), an event list that follows the cursor, a flame graph of the
// CPU samples when the trace has any, and beside it a flame graph of the GVL blame (the ns others waited, by the
// holder's stack) with the top blockers.
//
// The page is src/report/ui/ (report.html, report.css, report.js; drawn on <canvas>), embedded at build time
// (report_ui.h); this module fills its data slot with the model, as packed JSON columns (see report_data.h), inside
// a <script type="application/json"> element. Every string that comes from the trace is written there, JSON-escaped
// with '<', '>' and '&' as \u escapes, so no trace content can close the script element; the page only ever puts
// trace text into the DOM as text (textContent), never as markup.
#ifndef RVBPFD_SRC_REPORT_REPORT_H_
#define RVBPFD_SRC_REPORT_REPORT_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/error.h"
#include "common/safe_file.h"
#include "model/model.h"
#include "trace/stacks.h"

namespace rvbpfd {

struct ReportOptions {
  std::string title;  // shown as the page title and heading; usually the trace file's name (trace-controlled text)
  // The trace's frame and stack dictionaries (TraceFile::frames / stacks), which the events' `stack` ids index.
  // Only the stacks some event uses, and their frames, are embedded. Null: no stacks are shown (an event's stack id
  // that is not in the dictionary is treated the same way).
  const std::unordered_map<uint32_t, FrameInfo>* frames = nullptr;
  const std::unordered_map<uint32_t, std::vector<uint32_t>>* stacks = nullptr;
  std::optional<uint32_t> sample_hz;  // the header's sample_hz: the flame graph shows CPU time next to counts
};

// Writes the report page of `model` to `out`. Fails with kIo when the stream fails.
Status WriteReportHtml(const Model& model, const ReportOptions& options, std::ostream& out);

// Reads and models `trace_path` (errors are Model::FromFile's), with its frames, stacks and samples, and writes
// the report to `out_path`. Fails with kOutputUnwritable when `out_path` cannot be created and kIo when writing it
// fails; a partly written file is removed so a failed run never leaves a report that looks complete. A page past
// `max_output_bytes` is removed too, with kOutputTooLarge (common/safe_file.h).
//
// A trace of several processes (docs/rvtrace.md, "Process lines") is reported one process at a time: `process` (a
// ProcessInfo::id; default the root) selects it, and the page's title names it ("run.rvtrace · pid 4243 (ruby
// app.rb), process 2 of 3"). A `process` that is not a traced process of the trace is kUsage, naming those that are.
Status WriteReport(const std::string& trace_path, const std::string& out_path,
                   uint64_t max_output_bytes = kDefaultMaxOutputBytes, std::optional<uint32_t> process = std::nullopt);

// The part of `trace` a report of `process` draws (see WriteReport) and the title suffix naming it (empty for a trace
// of one process). Errors: kUsage as above.
struct ReportPart {
  TraceFile trace;
  std::string title_suffix;
};
Result<ReportPart> SelectReportProcess(TraceFile trace, std::optional<uint32_t> process);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_REPORT_REPORT_H_
