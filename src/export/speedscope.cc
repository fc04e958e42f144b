#include "export/speedscope.h"

#include <string>
#include <unordered_map>
#include <vector>

#include "export/export_util.h"
#include "export/pprof.h"
#include "trace/inspect.h"

namespace rvbpfd {
namespace {

bool Exported(const StateBlock& block) {
  return block.state != ThreadState::kNotStarted && block.state != ThreadState::kExited &&
         block.end_ns > block.start_ns;
}

void AppendEvent(std::string* out, char type, uint64_t at, size_t frame, bool* first) {
  out->append(*first ? "{\"type\":\"" : ",{\"type\":\"");
  *first = false;
  out->push_back(type);
  out->append("\",\"at\":");
  AppendUint(out, at);
  out->append(",\"frame\":");
  AppendUint(out, frame);
  out->push_back('}');
}

// The shared frame list: the state labels of the evented profiles, then the frames the sampled profiles name
// (trace frames with their file and line, and named frames: holders, threads, states, stand-ins).
class Frames {
 public:
  size_t Named(const std::string& name) {
    auto [it, fresh] = named_.try_emplace(name, list_.size());
    if (fresh) list_.push_back(Frame{name, "", 0});
    return it->second;
  }
  size_t OfTrace(const TraceFile& trace, uint32_t frame_id) {
    auto [it, fresh] = by_id_.try_emplace(frame_id, list_.size());
    if (fresh) {
      const FrameInfo* f = trace.Frame(frame_id);
      list_.push_back(f != nullptr ? Frame{f->label, f->path, f->line}
                                   : Frame{"<unresolved frame " + std::to_string(frame_id) + ">", "", 0});
    }
    return it->second;
  }
  // Appends the frames of a stack, root first; `stand_in` when it has none.
  void AppendStack(const TraceFile& trace, uint32_t stack, std::string_view stand_in, std::vector<size_t>* out) {
    const std::vector<uint32_t>* frames = stack != 0 ? trace.Stack(stack) : nullptr;
    if (frames == nullptr || frames->empty()) {
      out->push_back(Named(std::string(stand_in)));
      return;
    }
    for (auto it = frames->rbegin(); it != frames->rend(); ++it) out->push_back(OfTrace(trace, *it));
  }
  void Write(std::string* s) const {
    for (size_t i = 0; i < list_.size(); ++i) {
      s->append(i == 0 ? "{\"name\":" : ",{\"name\":");
      AppendJsonString(s, list_[i].name);
      if (!list_[i].file.empty()) {
        s->append(",\"file\":");
        AppendJsonString(s, list_[i].file);
        if (list_[i].line > 0) {
          s->append(",\"line\":");
          AppendUint(s, static_cast<uint64_t>(list_[i].line));
        }
      }
      s->push_back('}');
    }
  }

 private:
  struct Frame {
    std::string name;
    std::string file;
    int32_t line;
  };
  std::vector<Frame> list_;
  std::unordered_map<std::string, size_t> named_;
  std::unordered_map<uint32_t, size_t> by_id_;
};

// One sampled profile: stacks (frame indices, root first) and their weights in ns.
struct SampledProfile {
  std::string name;
  std::vector<std::vector<size_t>> samples;
  std::vector<uint64_t> weights;
};

std::vector<SampledProfile> BuildSampled(const TraceFile& trace, Frames& frames) {
  const StackProfile agg = AggregateStacks(trace);
  auto thread_name = [&](uint64_t key) {
    std::optional<uint32_t> serial = TraceRubyThread(key);
    return serial ? RubyThreadLabel(trace, *serial) : std::string("-");
  };
  std::vector<SampledProfile> out(2);
  out[0].name = "GVL blame (holder's stack, by the ns others waited)";
  for (const auto& [key, ns] : agg.attribution.blame_ns) {
    if (ns == 0) continue;
    // Blame estimated from GVL readings while tracing was paused says so at its root.
    std::vector<size_t> stack{frames.Named("holder: " + (key.holder != 0 ? thread_name(key.holder) : "-") +
                                           (key.provenance == Provenance::kInferred ? " (inferred)" : ""))};
    frames.AppendStack(trace, key.stack, BlameStandInFrame(key.source), &stack);
    if (key.gc) stack.push_back(frames.Named(std::string(kGcFrame)));
    out[0].samples.push_back(std::move(stack));
    out[0].weights.push_back(ns);
  }
  out[1].name = "wall clock (every thread's lifetime by stack and state)";
  for (const auto& [key, ns] : agg.attribution.wall_ns) {
    if (ns == 0) continue;
    std::vector<size_t> stack{frames.Named(thread_name(key.thread))};
    if (key.stack != 0) frames.AppendStack(trace, key.stack, kNoStackFrame, &stack);
    std::string state = "[" + std::string(WallStateName(key.state));
    if (key.state == WallState::kBlocked) state += ": " + std::string(ReleaseReasonName(key.reason));
    if (key.provenance == Provenance::kInferred) state += " (inferred)";
    stack.push_back(frames.Named(state + "]"));
    out[1].samples.push_back(std::move(stack));
    out[1].weights.push_back(ns);
  }
  return out;
}

Status Write(const Model& model, const TraceFile* trace, std::ostream& out) {
  // Frames: one per block label, in order of first appearance, then those of the sampled profiles.
  Frames frames;
  for (const RubyThread& thread : model.threads()) {
    for (const StateBlock& b : thread.blocks) {
      if (Exported(b)) frames.Named(StateBlockLabel(b));
    }
  }
  const std::vector<SampledProfile> sampled = trace != nullptr ? BuildSampled(*trace, frames) : std::vector<SampledProfile>{};

  ExportSink sink(out);
  std::string& s = *sink.buffer();
  s.append("{\"$schema\":");
  AppendJsonString(&s, kSpeedscopeSchema);
  s.append(",\"name\":");
  AppendJsonString(&s, "rvbpfd trace of pid " + std::to_string(model.options().pid) + " (thread states)");
  s.append(",\"exporter\":\"rvbpfd\",\"activeProfileIndex\":0,\"shared\":{\"frames\":[");
  frames.Write(&s);
  s.append("]},\"profiles\":[");
  bool first_profile = true;
  for (const RubyThread& thread : model.threads()) {
    s.append(first_profile ? "\n{" : ",\n{");
    first_profile = false;
    s.append("\"type\":\"evented\",\"name\":");
    AppendJsonString(&s, model.ThreadLabel(thread.ruby_thread));
    s.append(",\"unit\":\"nanoseconds\",\"startValue\":");
    AppendUint(&s, model.start_ns());
    s.append(",\"endValue\":");
    AppendUint(&s, model.end_ns());
    s.append(",\"events\":[");
    bool first_event = true;
    for (const StateBlock& b : thread.blocks) {
      if (!Exported(b)) continue;
      const size_t frame = frames.Named(StateBlockLabel(b));
      AppendEvent(&s, 'O', b.start_ns, frame, &first_event);
      AppendEvent(&s, 'C', b.end_ns, frame, &first_event);
      sink.MaybeFlush();
    }
    s.append("]}");
  }
  for (const SampledProfile& p : sampled) {
    s.append(first_profile ? "\n{" : ",\n{");
    first_profile = false;
    s.append("\"type\":\"sampled\",\"name\":");
    AppendJsonString(&s, p.name);
    uint64_t total = 0;
    for (uint64_t w : p.weights) total += w;
    s.append(",\"unit\":\"nanoseconds\",\"startValue\":0,\"endValue\":");
    AppendUint(&s, total);
    s.append(",\"samples\":[");
    for (size_t i = 0; i < p.samples.size(); ++i) {
      s.append(i == 0 ? "[" : ",[");
      for (size_t j = 0; j < p.samples[i].size(); ++j) {
        if (j > 0) s.push_back(',');
        AppendUint(&s, p.samples[i][j]);
      }
      s.push_back(']');
      sink.MaybeFlush();
    }
    s.append("],\"weights\":[");
    for (size_t i = 0; i < p.weights.size(); ++i) {
      if (i > 0) s.push_back(',');
      AppendUint(&s, p.weights[i]);
    }
    s.append("]}");
  }
  s.append("\n]}\n");
  return sink.Finish("speedscope");
}

}  // namespace

Status ExportSpeedscope(const Model& model, std::ostream& out) { return Write(model, nullptr, out); }

Status ExportSpeedscope(const Model& model, const TraceFile& trace, std::ostream& out) {
  return Write(model, &trace, out);
}

Status ExportSpeedscope(const std::string& trace_path, std::ostream& out) {
  Result<TraceFile> trace = TraceReader::ReadFile(trace_path);
  if (!trace.ok()) return trace.error();
  Result<Model> model = Model::FromTrace(*trace);
  if (!model.ok()) return model.error();
  return Write(*model, &*trace, out);
}

}  // namespace rvbpfd
