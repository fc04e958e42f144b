// `rvbpfd report`: the thread-state model as one self-contained HTML file, a timeline that opens from disk with no
// network: a lane per Ruby thread, the GVL owner lane (idle drawn explicitly), GC spans, probe and lost-event
// markers, a native-threads view, an inspector card per block and an event list that follows the cursor.
//
// The page is src/report/report_template.h (HTML, CSS and JS, drawn on <canvas>); this module fills its one data
// slot with the model, as packed JSON columns (see report_data.h), inside a <script type="application/json">
// element. Every string that comes from the trace is written there, JSON-escaped with '<', '>' and '&' as \u
// escapes, so no trace content can close the script element; the page only ever puts trace text into the DOM as
// text (textContent), never as markup.
#ifndef RVBPFD_SRC_REPORT_REPORT_H_
#define RVBPFD_SRC_REPORT_REPORT_H_

#include <ostream>
#include <string>

#include "common/error.h"
#include "model/model.h"

namespace rvbpfd {

struct ReportOptions {
  std::string title;  // shown as the page title and heading; usually the trace file's name (trace-controlled text)
};

// Writes the report page of `model` to `out`. Fails with kIo when the stream fails.
Status WriteReportHtml(const Model& model, const ReportOptions& options, std::ostream& out);

// Reads and models `trace_path` (errors are Model::FromFile's) and writes the report to `out_path`. Fails with
// kOutputUnwritable when `out_path` cannot be created and kIo when writing it fails; a partly written file is
// removed so a failed run never leaves a report that looks complete.
Status WriteReport(const std::string& trace_path, const std::string& out_path);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_REPORT_REPORT_H_
