#include "export/speedscope.h"

#include <string>
#include <unordered_map>
#include <vector>

#include "export/export_util.h"

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

}  // namespace

Status ExportSpeedscope(const Model& model, std::ostream& out) {
  // Frames: one per block label, in order of first appearance.
  std::vector<std::string> frames;
  std::unordered_map<std::string, size_t> frame_index;
  for (const RubyThread& thread : model.threads()) {
    for (const StateBlock& b : thread.blocks) {
      if (!Exported(b)) continue;
      std::string label = StateBlockLabel(b);
      if (frame_index.emplace(label, frames.size()).second) frames.push_back(std::move(label));
    }
  }

  ExportSink sink(out);
  std::string& s = *sink.buffer();
  s.append("{\"$schema\":");
  AppendJsonString(&s, kSpeedscopeSchema);
  s.append(",\"name\":");
  AppendJsonString(&s, "rvbpfd trace of pid " + std::to_string(model.options().pid) + " (thread states)");
  s.append(",\"exporter\":\"rvbpfd\",\"activeProfileIndex\":0,\"shared\":{\"frames\":[");
  for (size_t i = 0; i < frames.size(); ++i) {
    s.append(i == 0 ? "{\"name\":" : ",{\"name\":");
    AppendJsonString(&s, frames[i]);
    s.push_back('}');
  }
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
      const size_t frame = frame_index.at(StateBlockLabel(b));
      AppendEvent(&s, 'O', b.start_ns, frame, &first_event);
      AppendEvent(&s, 'C', b.end_ns, frame, &first_event);
      sink.MaybeFlush();
    }
    s.append("]}");
  }
  s.append("\n]}\n");
  return sink.Finish("speedscope");
}

Status ExportSpeedscope(const std::string& trace_path, std::ostream& out) {
  Result<Model> model = Model::FromFile(trace_path);
  if (!model.ok()) return model.error();
  return ExportSpeedscope(*model, out);
}

}  // namespace rvbpfd
