#include "export/folded.h"

#include <map>
#include <string_view>
#include <tuple>

#include "export/pprof.h"

namespace rvbpfd {

std::string FoldedFrameName(const std::string& label) {
  std::string out = label;
  for (char& c : out) {
    if (c == ';') c = ':';
    if (c == '\n' || c == '\r') c = ' ';
  }
  // An empty name would make two separators meet and read as a missing frame.
  return out.empty() ? std::string("?") : out;
}

Status ExportFolded(const TraceFile& trace, std::ostream& out, FoldedWeight weight) {
  const StackProfile agg = AggregateStacks(trace);
  // (stack id, leaf frame to append or "", stand-in frame for no stack) -> weight, summed over threads.
  std::map<std::tuple<uint32_t, std::string, std::string_view>, uint64_t> per_stack;
  switch (weight) {
    case FoldedWeight::kCpuSamples:
    case FoldedWeight::kGvlWaitNs:
      for (const auto& [key, w] : agg.weights) {
        const uint64_t v = weight == FoldedWeight::kCpuSamples ? w.samples : w.gvl_wait_ns;
        if (v > 0) per_stack[{key.first, "", kNoStackFrame}] += v;
      }
      // GVL wait estimated while tracing was paused (pprof labels it inferred; folded has no labels).
      if (weight == FoldedWeight::kGvlWaitNs) {
        for (const auto& [key, ns] : agg.estimated_gvl_wait_ns) {
          if (ns > 0) per_stack[{key.first, "", kNoStackFrame}] += ns;
        }
      }
      break;
    case FoldedWeight::kGvlBlameNs:
      for (const auto& [key, ns] : agg.attribution.blame_ns) {
        const std::string_view stand_in = BlameStandInFrame(key.source);
        if (ns > 0) per_stack[{key.stack, key.gc ? std::string(kGcFrame) : std::string(), stand_in}] += ns;
      }
      break;
    case FoldedWeight::kWallNs:
      for (const auto& [key, ns] : agg.attribution.wall_ns) {
        std::string leaf = "[" + std::string(WallStateName(key.state));
        if (key.state == WallState::kBlocked) leaf += ": " + std::string(ReleaseReasonName(key.reason));
        if (key.provenance == Provenance::kInferred) leaf += " (inferred)";
        leaf += "]";
        if (ns > 0) per_stack[{key.stack, leaf, kNoStackFrame}] += ns;
      }
      break;
  }
  std::map<std::string, uint64_t> lines;  // rendered stacks can coincide (same labels, other lines): merge them
  for (const auto& [k, v] : per_stack) {
    const auto& [stack_id, leaf, stand_in] = k;
    std::string line;
    const std::vector<uint32_t>* frames = stack_id != 0 ? trace.Stack(stack_id) : nullptr;
    if (frames == nullptr || frames->empty()) {
      line = std::string(stand_in);
    } else {
      for (auto it = frames->rbegin(); it != frames->rend(); ++it) {  // stored leaf first; folded is root first
        if (!line.empty()) line.push_back(';');
        const FrameInfo* f = trace.Frame(*it);
        line += FoldedFrameName(f != nullptr ? f->label : "<unresolved frame " + std::to_string(*it) + ">");
      }
    }
    if (!leaf.empty()) line += ";" + leaf;
    lines[line] += v;
  }
  for (const auto& [line, v] : lines) out << line << ' ' << v << '\n';
  out.flush();
  if (!out) return Error(ErrorCode::kIo, "writing the folded export failed");
  return Status::Ok();
}

}  // namespace rvbpfd
