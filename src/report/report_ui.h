// The report page of `rvbpfd report`: src/report/ui/report.html, report.css and report.js, embedded into the
// binary byte for byte at build time (cmake/embed_files.cmake generates their definitions), so the binary needs no
// data files and the page needs no network (no external script, style, font or image).
//
// report.html is the page; WriteReportHtml writes it with each slot below replaced: the line @@RVBPFD_REPORT_CSS@@
// by report.css, the line @@RVBPFD_REPORT_JS@@ by report.js, and @@RVBPFD_REPORT_DATA@@ by the data object of
// report_data.h. Each slot occurs exactly once. The page:
//   - decodes the packed columns into typed arrays once, then draws on <canvas>, visiting per lane only the blocks
//     in the visible range and at most about one block per pixel column (binary search skips the sub-pixel ones),
//     so a million-event trace pans and zooms as fast as a small one;
//   - puts trace text into the DOM only through textContent (never innerHTML), so a hostile string in a trace is
//     shown, never run;
//   - exposes stable hooks for tests: [data-lane="thread-N" | "gvl-owner" | "gc" | "markers" | "native-TID"] label
//     elements, #range (data-start-ns / data-end-ns of the visible range), #card (data-cruby-event,
//     data-provenance, data-rule, data-lane, data-index, data-stacks, data-release-reason), #card ol.stack (one per
//     stack shown, data-event / data-which), #flame (data-thread, data-zoom, data-total; hidden without samples;
//     it and #blame-flame are copies of one #flame-template, made by the script), #flame-tip, #card's blame (data-blame-waits, data-blame-ns, data-blame-holder, data-blame-frame; .blame-wait,
//     .blame-holder with data-holder / data-ns, .blame-part with data-source / data-frame / data-ns), #blame-flame
//     (as #flame; data-thread is the holder), #blame-top rows (data-frame: the holders' innermost Ruby method, data-holder: the holders' labels,
//     comma-separated, data-threads: how many, data-ns; .blame-call sub-lines with data-call / data-ns: the C
//     function it was in), and
//     window.rvReport (view, lane geometry, drawn rects; .flame and .blameFlame: the flame graphs' drawn frames,
//     state, selfByLabel(); .blameFlame.top(): the top blockers ({frame, holder, ns, holders: [{holder, ns}], calls: [{label, ns}]}); .blameOf(thread, s, e): the blamed waits).
#ifndef RVBPFD_SRC_REPORT_REPORT_UI_H_
#define RVBPFD_SRC_REPORT_REPORT_UI_H_

#include <string_view>

namespace rvbpfd {

// The files' bytes (defined in the generated report_ui.cc of the build directory).
extern const std::string_view kReportHtml;  // src/report/ui/report.html
extern const std::string_view kReportCss;   // src/report/ui/report.css
extern const std::string_view kReportJs;    // src/report/ui/report.js

// The slots of kReportHtml. The CSS and JS slots are whole lines (line break included) and the files end with
// their own line break, so the page has the files' bytes exactly where the slot lines were.
inline constexpr std::string_view kReportCssSlot = "@@RVBPFD_REPORT_CSS@@\n";
inline constexpr std::string_view kReportJsSlot = "@@RVBPFD_REPORT_JS@@\n";
inline constexpr std::string_view kReportDataSlot = "@@RVBPFD_REPORT_DATA@@";

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_REPORT_REPORT_UI_H_
