#include "export/folded.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "export/export_util.h"
#include "export/pprof.h"
#include "trace/processes.h"

namespace rvbpfd {
namespace {

// One folded line, "<frames root first, ';'-joined>[;<leaf>]" or "<stand_in>[;<leaf>]", as a sequence of pieces
// (frame names and separators) that is compared and written without being put together.
struct FoldedLine {
  using Names = std::function<std::string_view(uint32_t)>;
  const std::vector<uint32_t>* frames = nullptr;  // leaf first, non-empty; nullptr: the stand-in
  std::string_view leaf;
  std::string_view stand_in;
  uint64_t weight = 0;
  std::string_view root;  // non-empty: a first frame naming the process (a trace of several processes)

  size_t Pieces() const {
    const size_t body = frames != nullptr ? 2 * frames->size() - 1 : 1;
    return (leaf.empty() ? body : body + 2) + RootPieces();
  }
  size_t RootPieces() const { return root.empty() ? 0 : 2; }  // the root, then ';'
  std::string_view Piece(size_t i, const Names& names) const {
    if (i < RootPieces()) return i == 0 ? root : std::string_view(";");
    i -= RootPieces();
    const size_t body = frames != nullptr ? 2 * frames->size() - 1 : 1;
    if (i >= body) return i == body ? std::string_view(";") : leaf;
    if (frames == nullptr) return stand_in;
    if (i % 2 == 1) return ";";
    return names((*frames)[frames->size() - 1 - i / 2]);  // stored leaf first; folded is root first
  }
  // The frame id piece `i` names; nullopt for separators, the stand-in and the leaf.
  std::optional<uint32_t> FrameAt(size_t i) const {
    if (i < RootPieces()) return std::nullopt;
    i -= RootPieces();
    if (frames == nullptr || i >= 2 * frames->size() - 1 || i % 2 == 1) return std::nullopt;
    return (*frames)[frames->size() - 1 - i / 2];
  }
  // The byte order of the joined strings (std::string's operator<: unsigned bytes, a prefix first). Where both are
  // at the start of the same frame, its name is skipped rather than compared (deep recursion repeats one frame).
  int Compare(const FoldedLine& other, const Names& names) const {
    size_t ia = 0, ib = 0;
    std::string_view a, b;
    const size_t na = Pieces(), nb = other.Pieces();
    while (true) {
      if (a.empty() && b.empty() && ia < na && ib < nb) {
        const std::optional<uint32_t> fa = FrameAt(ia);
        if (fa && fa == other.FrameAt(ib)) {
          ++ia;
          ++ib;
          continue;
        }
      }
      while (a.empty() && ia < na) a = Piece(ia++, names);
      while (b.empty() && ib < nb) b = other.Piece(ib++, names);
      if (a.empty() || b.empty()) return a.empty() ? (b.empty() ? 0 : -1) : 1;
      const size_t n = std::min(a.size(), b.size());
      if (const int c = a.substr(0, n).compare(b.substr(0, n)); c != 0) return c;
      a.remove_prefix(n);
      b.remove_prefix(n);
    }
  }
  void Write(ExportSink& sink, const Names& names) const {
    for (size_t i = 0, n = Pieces(); i < n && !sink.failed(); ++i) {
      sink.Append(Piece(i, names));
      sink.MaybeFlush();
    }
  }
};

}  // namespace

std::string FoldedFrameName(const std::string& label) {
  std::string out = label;
  for (char& c : out) {
    if (c == ';') c = ':';
    if (c == '\n' || c == '\r') c = ' ';
  }
  // An empty name would make two separators meet and read as a missing frame.
  return out.empty() ? std::string("?") : out;
}

namespace {

// (stack id, leaf frame to append or "", stand-in frame for no stack) -> weight, summed over threads.
using PerStack = std::map<std::tuple<uint32_t, std::string, std::string_view>, uint64_t>;

PerStack WeightsByStack(const TraceFile& trace, FoldedWeight weight) {
  const StackProfile agg = AggregateStacks(trace);
  PerStack per_stack;
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
  return per_stack;
}

}  // namespace

Status ExportFolded(const TraceFile& trace, std::ostream& out, FoldedWeight weight) {
  // Several processes: each is aggregated apart (its own GVL) and its lines start with a frame naming it.
  std::vector<std::pair<std::string, PerStack>> parts;
  if (!trace.MultiProcess()) {
    parts.emplace_back("", WeightsByStack(trace, weight));
  } else {
    for (const ProcessTrace& part : SplitByProcess(trace)) {
      parts.emplace_back(FoldedFrameName(part.label), WeightsByStack(part.trace, weight));
    }
  }
  // Rendered stacks can coincide (same labels, other lines): they are merged, and lines come out sorted. A line is
  // never built whole (a deep stack of long labels is gigabytes): FoldedLine compares and writes them piece by piece.
  std::unordered_map<uint32_t, std::string> names;  // frame id -> FoldedFrameName, one copy per frame
  std::vector<FoldedLine> lines;
  for (const auto& [root, per_stack] : parts) {
    for (const auto& [k, v] : per_stack) {
      const auto& [stack_id, leaf, stand_in] = k;
      FoldedLine line{.leaf = leaf, .stand_in = stand_in, .weight = v, .root = root};
      const std::vector<uint32_t>* frames = stack_id != 0 ? trace.Stack(stack_id) : nullptr;
      if (frames != nullptr && !frames->empty()) {
        line.frames = frames;
        for (uint32_t id : *frames) {
          if (names.contains(id)) continue;
          const FrameInfo* f = trace.Frame(id);
          names.emplace(id,
                        FoldedFrameName(f != nullptr ? f->label : "<unresolved frame " + std::to_string(id) + ">"));
        }
      }
      lines.push_back(line);
    }
  }
  const FoldedLine::Names name_of = [&names](uint32_t id) -> std::string_view { return names.find(id)->second; };
  std::stable_sort(lines.begin(), lines.end(),
                   [&](const FoldedLine& a, const FoldedLine& b) { return a.Compare(b, name_of) < 0; });
  ExportSink sink(out);
  for (size_t i = 0; i < lines.size() && !sink.failed();) {
    uint64_t v = 0;
    size_t j = i;
    for (; j < lines.size() && lines[j].Compare(lines[i], name_of) == 0; ++j) v += lines[j].weight;
    lines[i].Write(sink, name_of);
    sink.Append(" ");
    AppendUint(sink.buffer(), v);
    sink.Append("\n");
    sink.MaybeFlush();
    i = j;
  }
  return sink.Finish("folded");
}

}  // namespace rvbpfd
