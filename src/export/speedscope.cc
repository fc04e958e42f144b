#include "export/speedscope.h"

#include <string>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "export/export_util.h"
#include "export/pprof.h"
#include "trace/inspect.h"
#include "trace/processes.h"

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
  // Calls `each` with the frame indices of a stack, root first (interning them on first use); `stand_in` when it
  // has none. A stack is walked again for every sample that names it, never copied per sample.
  template <typename F>
  void ForStack(const TraceFile& trace, uint32_t stack, std::string_view stand_in, F&& each) {
    const std::vector<uint32_t>* frames = stack != 0 ? trace.Stack(stack) : nullptr;
    if (frames == nullptr || frames->empty()) {
      each(Named(std::string(stand_in)));
      return;
    }
    for (auto it = frames->rbegin(); it != frames->rend(); ++it) each(OfTrace(trace, *it));
  }
  void Write(ExportSink& sink) const {
    std::string* s = sink.buffer();
    for (size_t i = 0; i < list_.size() && !sink.failed(); ++i) {
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
      sink.MaybeFlush();
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

// One sample of a sampled profile, root first: `root`, then the trace stack `stack` (or `stand_in`) unless
// `stack_part` is false, then `leaf` if any. Kept as these few words rather than the frame list, since many samples
// name the same deep stack.
struct SampleSpec {
  size_t root = 0;
  bool stack_part = true;
  uint32_t stack = 0;
  std::string_view stand_in;
  std::optional<size_t> leaf;
};

// One sampled profile: its samples and their weights in ns.
struct SampledProfile {
  std::string name;
  std::vector<SampleSpec> samples;
  std::vector<uint64_t> weights;
};

// Interns the frames of a sample's stack (once per stack: a stack's frames are interned at its first sample).
void InternStack(const TraceFile& trace, Frames& frames, const SampleSpec& spec, std::unordered_set<uint32_t>* seen) {
  if (!spec.stack_part) return;
  if (spec.stack != 0 && trace.Stack(spec.stack) != nullptr && !trace.Stack(spec.stack)->empty() &&
      !seen->insert(spec.stack).second) {
    return;
  }
  frames.ForStack(trace, spec.stack, spec.stand_in, [](size_t) {});
}

std::vector<SampledProfile> BuildSampled(const TraceFile& trace, Frames& frames) {
  const StackProfile agg = AggregateStacks(trace);
  auto thread_name = [&](uint64_t key) {
    std::optional<uint32_t> serial = TraceRubyThread(key);
    return serial ? RubyThreadLabel(trace, *serial) : std::string("-");
  };
  std::unordered_set<uint32_t> seen;
  std::vector<SampledProfile> out(2);
  out[0].name = "GVL blame (holder's stack, by the ns others waited)";
  for (const auto& [key, ns] : agg.attribution.blame_ns) {
    if (ns == 0) continue;
    // Blame estimated from GVL readings while tracing was paused says so at its root.
    SampleSpec spec{.root = frames.Named("holder: " + (key.holder != 0 ? thread_name(key.holder) : "-") +
                                         (key.provenance == Provenance::kInferred ? " (inferred)" : "")),
                    .stack = key.stack,
                    .stand_in = BlameStandInFrame(key.source)};
    InternStack(trace, frames, spec, &seen);
    if (key.gc) spec.leaf = frames.Named(std::string(kGcFrame));
    out[0].samples.push_back(spec);
    out[0].weights.push_back(ns);
  }
  out[1].name = "wall clock (every thread's lifetime by stack and state)";
  for (const auto& [key, ns] : agg.attribution.wall_ns) {
    if (ns == 0) continue;
    SampleSpec spec{.root = frames.Named(thread_name(key.thread)),
                    .stack_part = key.stack != 0,
                    .stack = key.stack,
                    .stand_in = kNoStackFrame};
    InternStack(trace, frames, spec, &seen);
    std::string state = "[" + std::string(WallStateName(key.state));
    if (key.state == WallState::kBlocked) state += ": " + std::string(ReleaseReasonName(key.reason));
    if (key.provenance == Provenance::kInferred) state += " (inferred)";
    spec.leaf = frames.Named(state + "]");
    out[1].samples.push_back(spec);
    out[1].weights.push_back(ns);
  }
  return out;
}

// One process's model and the trace it was built from (nullptr: no sampled profiles). `label` is empty for a trace's
// only process; in a trace of several, it names the process in every profile name ("pid 4242 (ruby app.rb): main").
struct SpeedscopeProcess {
  std::string label;
  const Model* model = nullptr;
  const TraceFile* trace = nullptr;
};

std::string WithProcess(const std::string& label, const std::string& name) {
  return label.empty() ? name : ProcessThreadLabel(label, name);
}

// `trace`: the dictionaries every process's stacks are read from (the whole trace's).
Status Write(const std::vector<SpeedscopeProcess>& processes, const TraceFile* trace, std::ostream& out) {
  // Frames: one per block label, in order of first appearance, then those of the sampled profiles.
  Frames frames;
  for (const SpeedscopeProcess& p : processes) {
    for (const RubyThread& thread : p.model->threads()) {
      for (const StateBlock& b : thread.blocks) {
        if (Exported(b)) frames.Named(StateBlockLabel(b));
      }
    }
  }
  std::vector<SampledProfile> sampled;
  for (const SpeedscopeProcess& p : processes) {
    if (p.trace == nullptr) continue;
    for (SampledProfile& profile : BuildSampled(*p.trace, frames)) {
      profile.name = WithProcess(p.label, profile.name);
      sampled.push_back(std::move(profile));
    }
  }
  const Model& model = *processes.front().model;

  ExportSink sink(out);
  std::string& s = *sink.buffer();
  s.append("{\"$schema\":");
  AppendJsonString(&s, kSpeedscopeSchema);
  s.append(",\"name\":");
  AppendJsonString(&s, "rvbpfd trace of pid " + std::to_string(model.options().pid) + " (thread states)");
  s.append(",\"exporter\":\"rvbpfd\",\"activeProfileIndex\":0,\"shared\":{\"frames\":[");
  frames.Write(sink);
  s.append("]},\"profiles\":[");
  bool first_profile = true;
  for (const SpeedscopeProcess& p : processes) {
    for (const RubyThread& thread : p.model->threads()) {
      s.append(first_profile ? "\n{" : ",\n{");
      first_profile = false;
      s.append("\"type\":\"evented\",\"name\":");
      AppendJsonString(&s, WithProcess(p.label, p.model->ThreadLabel(thread.ruby_thread)));
      s.append(",\"unit\":\"nanoseconds\",\"startValue\":");
      AppendUint(&s, p.model->start_ns());
      s.append(",\"endValue\":");
      AppendUint(&s, p.model->end_ns());
      s.append(",\"events\":[");
      bool first_event = true;
      for (const StateBlock& b : thread.blocks) {
        if (sink.failed()) break;
        if (!Exported(b)) continue;
        const size_t frame = frames.Named(StateBlockLabel(b));
        AppendEvent(&s, 'O', b.start_ns, frame, &first_event);
        AppendEvent(&s, 'C', b.end_ns, frame, &first_event);
        sink.MaybeFlush();
      }
      s.append("]}");
    }
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
    for (size_t i = 0; i < p.samples.size() && !sink.failed(); ++i) {
      const SampleSpec& spec = p.samples[i];
      s.append(i == 0 ? "[" : ",[");
      AppendUint(&s, spec.root);
      auto frame = [&](size_t index) {
        s.push_back(',');
        AppendUint(&s, index);
        sink.MaybeFlush();
      };
      if (spec.stack_part) frames.ForStack(*trace, spec.stack, spec.stand_in, frame);
      if (spec.leaf) frame(*spec.leaf);
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

Status ExportSpeedscope(const Model& model, std::ostream& out) {
  return Write({SpeedscopeProcess{.model = &model}}, nullptr, out);
}

Status ExportSpeedscope(const Model& model, const TraceFile& trace, std::ostream& out) {
  return Write({SpeedscopeProcess{.model = &model, .trace = &trace}}, &trace, out);
}

Status ExportSpeedscope(const TraceFile& trace, std::ostream& out) {
  if (!trace.MultiProcess()) {
    Result<Model> model = Model::FromTrace(trace);
    if (!model.ok()) return model.error();
    return ExportSpeedscope(*model, trace, out);
  }
  const std::vector<ProcessTrace> parts = SplitByProcess(trace);
  if (parts.empty()) return Error(ErrorCode::kBadTrace, "the trace has no traced process to export");
  std::vector<Model> models;
  models.reserve(parts.size());
  for (const ProcessTrace& part : parts) {
    Result<Model> model = Model::FromTrace(part.trace);
    if (!model.ok()) return model.error();
    models.push_back(std::move(model).value());
  }
  std::vector<SpeedscopeProcess> processes;
  for (size_t i = 0; i < parts.size(); ++i) {
    processes.push_back({.label = parts[i].label, .model = &models[i], .trace = &parts[i].trace});
  }
  return Write(processes, &trace, out);
}

Status ExportSpeedscope(const std::string& trace_path, std::ostream& out) {
  Result<TraceFile> trace = TraceReader::ReadFile(trace_path);
  if (!trace.ok()) return trace.error();
  return ExportSpeedscope(*trace, out);
}

}  // namespace rvbpfd
