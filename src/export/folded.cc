#include "export/folded.h"

#include <map>

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
  // Sum over threads per stack, then render; std::map keeps the output order stable.
  std::map<uint32_t, uint64_t> per_stack;
  for (const auto& [key, w] : agg.weights) {
    const uint64_t v = weight == FoldedWeight::kCpuSamples ? w.samples : w.gvl_wait_ns;
    if (v > 0) per_stack[key.first] += v;
  }
  std::map<std::string, uint64_t> lines;  // rendered stacks can coincide (same labels, other lines): merge them
  for (const auto& [stack_id, v] : per_stack) {
    std::string line;
    const std::vector<uint32_t>* frames = stack_id != 0 ? trace.Stack(stack_id) : nullptr;
    if (frames == nullptr || frames->empty()) {
      line = std::string(kNoStackFrame);
    } else {
      for (auto it = frames->rbegin(); it != frames->rend(); ++it) {  // stored leaf first; folded is root first
        if (!line.empty()) line.push_back(';');
        const FrameInfo* f = trace.Frame(*it);
        line += FoldedFrameName(f != nullptr ? f->label : "<unresolved frame " + std::to_string(*it) + ">");
      }
    }
    lines[line] += v;
  }
  for (const auto& [line, v] : lines) out << line << ' ' << v << '\n';
  out.flush();
  if (!out) return Error(ErrorCode::kIo, "writing the folded export failed");
  return Status::Ok();
}

}  // namespace rvbpfd
