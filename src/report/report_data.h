// The data the report page draws: the model as one JSON object of packed columns, small enough that a trace of a
// million events loads in a browser in a few seconds (a JSON object per block would be several times larger and
// slower to parse).
//
// Layout (version 3; the page's decoder in ui/report.js is the other half of this contract):
//   {"v":4,"meta":{...,"samples","sample_hz","stacks"},"names":{...},"tids":[native tids],
//    "threads":[{"id","label","main","tids":[..],"totals":{..},"blocks":{columns}}],
//    "owner":{columns},"gc":{columns},"unknown":{columns},"native":[{"tid","threads","spans":{columns}}],
//    "markers":{columns},"events":{columns},"extra":[[event index,{"count","reason","overhead_pct"}]],
//    "blame":{"total_ns","waits":{columns},"segs":{columns},"parts":{columns},"flame":{columns},"blockers":[..]},
//    "reasons":[release reasons],"paths":[frame paths],"frames":{columns},"stacks":{"n":[..],"e":[..],"f":[..]},
//    "endpoints":[names],"endpoint_rules":[rule names]}
// A column is an array with one value per row. Columns of times and event references are delta-encoded (each
// value is the difference to the previous row's; the first is absolute) because consecutive values are close and
// short numbers parse faster. Times are ns since the trace's origin_ns. Optional values are stored as value + 1
// with 0 for "none": event references ("o", "c", "rw", "ev"), Ruby threads ("th", "ow"), native tids ("nt",
// "pt", as index + 1 into "tids"), an event's stack ("sk", index + 1 into "stacks") and a gvl_released's release
// reason ("rr", index + 1 into "reasons", with its provenance in "rp"). Enums are indexes into the "names" tables.
//
// Stacks are a dictionary, like the trace's: only the stacks some event uses are embedded, each once, renumbered
// densely in order of first use, with only their frames. Stack k is frames "f"[sum of "n"[0..k) ...] (leaf first);
// frame j is "frames"."l"[j] (label), "paths"["frames"."p"[j]], "frames"."ln"[j] (0: none) and
// names.frame_kind["frames"."k"[j]]. The "sk", "rr" and "rp" columns are absent when no event needs them.
// Stack k's endpoint (model/endpoint.h: the Rails action, job class or Sinatra route it is in; derived) is
// "endpoints"["stacks"."e"[k]], named by the rule "endpoint_rules"["stacks"."e"[k]]; "endpoints"[0] is "-" (none).
//
// "blame" is model/attribution.h's GVL blame of every counted wait (AttributeTrace over the model's spans; the page
// only draws it). total_ns: all counted waits' ns; estimated_ns: the GVL wait estimated from the samples' GVL
// readings while --max-overhead had the scheduler probes paused (inferred; in "flame" only). "waits" (sorted by
// waiter, then start): "th" the waiter (Ruby thread + 1), "s"/"d" the wait, "ns" its number of segments; "segs",
// the waits' segments in order ("ns" of them per wait): "h" the holder (Ruby thread + 1; 0 = nobody / not known,
// see the parts' source), "s"/"d" the part of the wait it held,
// "rs" the stack of the gvl_released that ended its hold there (stack index + 1, 0 = none), "rt" that release's time
// (delta-encoded; 0 = the hold did not end by a release: no release ever happens at time 0 inside a wait), "np" its
// number of parts; "parts", the segments' parts in order: "sk" the stack blamed (index + 1, 0 = none), "src" the
// names.blame_source index, "gc" 1 while the holder ran a GC, "ns" the ns, "n" the holder's samples behind it (for
// "sampled"). The parts of a wait sum to its "d". "flame": ns by ("h", "sk", "gc", "src", "inf") over all waiters,
// for the blame flame graph, "inf" 1 for estimated blame; its "ns" sum to total_ns + estimated_ns. "blockers": the
// top blockers of model/blockers.h (the first 20), heaviest first, each {"m": the holders' innermost Ruby method (or
// stand-in frame), "ns", "h": [[holder (Ruby thread + 1, 0 = nobody / not known), ns], ...] heaviest first, "c":
// [[C function it was in, ns], ...] (the first 5, heaviest first)}.
#ifndef RVBPFD_SRC_REPORT_REPORT_DATA_H_
#define RVBPFD_SRC_REPORT_REPORT_DATA_H_

#include <string>
#include <string_view>

#include "model/model.h"
#include "report/report.h"

namespace rvbpfd {

inline constexpr int kReportDataVersion = 4;

// Appends `s` as a JSON string that is also safe as raw text of an HTML <script> element: '<', '>' and '&' become
// \u003c, \u003e and \u0026 (so "</script>" and "<!--" cannot appear), besides AppendJsonString's escaping.
void AppendScriptSafeJsonString(std::string* out, std::string_view s);

// Appends the data object described above.
void AppendReportData(const Model& model, const ReportOptions& options, std::string* out);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_REPORT_REPORT_DATA_H_
