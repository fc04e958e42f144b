#include "export/perfetto.h"

#include <memory>

#include <string_view>

#include "export/export_util.h"
#include "model/endpoint.h"
#include "trace/event.h"
#include "trace/processes.h"
#include "trace/reader.h"

namespace rvbpfd {
namespace {

// Where one process's tracks go: its two synthetic JSON pids and, in a trace of several processes, its label
// (TraceFile::ProcessLabel) and place among them.
struct PerfettoProcess {
  int ruby_pid = kPerfettoRubyPid;
  int native_pid = kPerfettoNativePid;
  std::string label;  // empty: the trace's only process (the tracks are named as they always were)
  uint64_t sort_index = 0;
};

class PerfettoWriter {
 public:
  PerfettoWriter(const Model& model, ExportSink& sink, PerfettoStacks stacks, PerfettoProcess process, bool* first)
      : model_(model), stacks_(stacks), process_(std::move(process)), sink_(sink), out_(*sink.buffer()),
        first_(*first) {
    if (stacks_.frames != nullptr && stacks_.stacks != nullptr) {
      endpoints_ = std::make_unique<TraceEndpoints>(*stacks_.frames, *stacks_.stacks);
    }
  }

  // The file's opening, naming the root process (`model` is its model).
  void WriteHead() {
    sink_.Append("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"exporter\":\"rvbpfd\",\"ruby_version\":");
    AppendJsonString(&out_, model_.options().ruby_version);
    sink_.Append(",\"pid\":");
    AppendUint(&out_, static_cast<uint64_t>(model_.options().pid));
    sink_.Append("},\"traceEvents\":[");
  }
  void WriteTracks() {
    WriteMetadata();
    WriteOwnerLane();
    WriteGc();
    for (const RubyThread& thread : model_.threads()) WriteThread(thread);
    WriteNative();
    WriteGlobalMarkers();
  }
  void WriteTail() { sink_.Append("\n]}\n"); }

 private:
  void BeginEvent(char ph, std::string_view name, int pid, uint64_t tid, uint64_t ts_ns) {
    out_.append(first_ ? "\n{" : ",\n{");
    first_ = false;
    out_.append("\"ph\":\"");
    out_.push_back(ph);
    out_.append("\",\"name\":");
    AppendJsonString(&out_, name);
    out_.append(",\"pid\":");
    AppendUint(&out_, static_cast<uint64_t>(pid));
    out_.append(",\"tid\":");
    AppendUint(&out_, tid);
    out_.append(",\"ts\":");
    AppendMicros(&out_, ts_ns);
  }
  void EndEvent() {
    out_.push_back('}');
    sink_.MaybeFlush();
  }

  void Metadata(std::string_view what, int pid, uint64_t tid, std::string_view key, std::string_view value) {
    BeginEvent('M', what, pid, tid, 0);
    out_.append(",\"args\":{");
    AppendJsonString(&out_, key);
    out_.push_back(':');
    AppendJsonString(&out_, value);
    out_.push_back('}');
    EndEvent();
  }
  void ProcessSortIndex(int pid, uint64_t index) {
    BeginEvent('M', "process_sort_index", pid, 0, 0);
    out_.append(",\"args\":{\"sort_index\":");
    AppendUint(&out_, index);
    out_.push_back('}');
    EndEvent();
  }
  void SortIndex(int pid, uint64_t tid, uint64_t index) {
    BeginEvent('M', "thread_sort_index", pid, tid, 0);
    out_.append(",\"args\":{\"sort_index\":");
    AppendUint(&out_, index);
    out_.push_back('}');
    EndEvent();
  }

  void WriteMetadata() {
    const std::string pid = std::to_string(model_.options().pid);
    if (process_.label.empty()) {
      Metadata("process_name", process_.ruby_pid, 0, "name", "Ruby threads (pid " + pid + ")");
      Metadata("process_name", process_.native_pid, 0, "name", "native threads (pid " + pid + ")");
    } else {
      // One pair of process tracks per process, in the trace's order; a process's real pid is in its name (an
      // exec'd image shares its pid with the image it replaced, so the JSON pids are synthetic).
      Metadata("process_name", process_.ruby_pid, 0, "name", process_.label + ": Ruby threads");
      Metadata("process_name", process_.native_pid, 0, "name", process_.label + ": native threads");
      ProcessSortIndex(process_.ruby_pid, 2 * process_.sort_index);
      ProcessSortIndex(process_.native_pid, 2 * process_.sort_index + 1);
    }
    Metadata("thread_name", process_.ruby_pid, kPerfettoOwnerTid, "name", "GVL owner");
    SortIndex(process_.ruby_pid, kPerfettoOwnerTid, 0);
    Metadata("thread_name", process_.ruby_pid, kPerfettoGcTid, "name", "GC");
    SortIndex(process_.ruby_pid, kPerfettoGcTid, 1);
    Metadata("thread_name", process_.ruby_pid, kPerfettoMarkerTid, "name", "trace markers");
    SortIndex(process_.ruby_pid, kPerfettoMarkerTid, 2);
    uint64_t index = 3;
    for (const RubyThread& thread : model_.threads()) {
      const uint64_t tid = kPerfettoThreadTidBase + thread.ruby_thread;
      Metadata("thread_name", process_.ruby_pid, tid, "name", model_.ThreadLabel(thread.ruby_thread));
      SortIndex(process_.ruby_pid, tid, index++);
    }
    for (const NativeThread& n : model_.native_threads()) {
      Metadata("thread_name", process_.native_pid, n.native_tid, "name", "native " + std::to_string(n.native_tid));
    }
  }

  // ,"opened_by":{"event":"gvl_acquired","cruby":"RUBY_INTERNAL_THREAD_EVENT_RESUMED","t_ns":123}
  void EventArg(std::string_view key, EventRef ref) {
    if (!ref) return;
    const TraceEvent& e = model_.events()[*ref];
    out_.append(",");
    AppendJsonString(&out_, key);
    out_.append(":{\"event\":");
    AppendJsonString(&out_, EventNameString(e.event));
    const std::string_view cruby = CrubyEventConstant(e.event);
    if (!cruby.empty()) {
      out_.append(",\"cruby\":");
      AppendJsonString(&out_, cruby);
    }
    out_.append(",\"t_ns\":");
    AppendUint(&out_, e.t_ns);
    if (e.native_tid) {
      out_.append(",\"native_tid\":");
      AppendUint(&out_, *e.native_tid);
    }
    if (e.event == EventName::kGvlReleased && !e.reason.empty()) {
      out_.append(",\"reason\":");
      AppendJsonString(&out_, e.reason);
      out_.append(",\"reason_provenance\":");
      AppendJsonString(&out_, ProvenanceString(e.reason_provenance));
    }
    StackArg(e);
    if (e.stack) EndpointArg(EndpointOf(*e.stack));
    out_.push_back('}');
  }

  // The endpoint (model/endpoint.h) of a stack id; null when the trace has no stacks.
  const Endpoint* EndpointOf(uint32_t stack) {
    if (!endpoints_) return nullptr;
    return &endpoints_->OfStack(stack);
  }
  // ,"endpoint":"LedgerController#cpu","endpoint_rule":"rails_action" (derived; "-" and no rule for none).
  void EndpointArg(const Endpoint* e) {
    if (e == nullptr) return;
    out_.append(",\"endpoint\":");
    AppendJsonString(&out_, e->name);
    if (e->rule != EndpointRule::kNone) {
      out_.append(",\"endpoint_rule\":");
      AppendJsonString(&out_, EndpointRuleName(e->rule));
    }
  }
  // The endpoint of a thread's block: its opening event's stack's, else its closing event's, else the thread's
  // latest one before it (a GVL wait is the endpoint the thread released the lock in); updates `latest`.
  const Endpoint* BlockEndpoint(EventRef opened_by, EventRef closed_by, const Endpoint*& latest) {
    for (EventRef ref : {opened_by, closed_by}) {
      if (!ref) continue;
      const TraceEvent& e = model_.events()[*ref];
      if (e.stack && *e.stack != 0) {
        latest = EndpointOf(*e.stack);
        return latest;
      }
    }
    return latest != nullptr || !endpoints_ ? latest : &endpoints_->endpoint(0);
  }

  // ,"stack":["Integer#times (<internal:numeric>:237)", ...] leaf first; nothing when the trace has no stacks.
  void StackArg(const TraceEvent& e) {
    if (!e.stack || !stacks_.stacks || !stacks_.frames) return;
    auto it = stacks_.stacks->find(*e.stack);
    if (it == stacks_.stacks->end()) return;
    out_.append(",\"stack\":[");
    bool first = true;
    for (uint32_t id : it->second) {
      auto f = stacks_.frames->find(id);
      std::string text = f == stacks_.frames->end() ? "<undefined frame>" : f->second.label;
      if (f != stacks_.frames->end() && !f->second.path.empty()) {
        text += " (" + f->second.path + ":" + std::to_string(f->second.line) + ")";
      }
      if (!first) out_.push_back(',');
      first = false;
      AppendJsonString(&out_, text);
      // A deep stack of long labels is megabytes per event: written as it goes, and given up once the stream failed.
      sink_.MaybeFlush();
      if (sink_.failed()) return;
    }
    out_.push_back(']');
  }

  // Opens a complete event; the caller appends args and calls EndEvent().
  void Slice(std::string_view name, Provenance provenance, int pid, uint64_t tid, uint64_t start, uint64_t end) {
    BeginEvent('X', name, pid, tid, start);
    out_.append(",\"dur\":");
    AppendMicros(&out_, end - start);
    out_.append(",\"cat\":");
    AppendJsonString(&out_, ProvenanceString(provenance));
  }

  void CommonArgs(Provenance provenance, ModelRule rule) {
    out_.append(",\"args\":{\"provenance\":");
    AppendJsonString(&out_, ProvenanceString(provenance));
    if (rule != ModelRule::kNone) {
      out_.append(",\"rule\":");
      AppendJsonString(&out_, ModelRuleName(rule));
    }
  }

  void WriteOwnerLane() {
    for (const OwnerBlock& b : model_.owner_lane()) {
      if (sink_.failed()) return;
      const std::string name = b.kind == OwnerKind::kOwned ? model_.ThreadLabel(*b.owner)
                               : b.kind == OwnerKind::kIdle ? std::string("idle")
                                                            : std::string("unknown");
      Slice(name, b.provenance, process_.ruby_pid, kPerfettoOwnerTid, b.start_ns, b.end_ns);
      CommonArgs(b.provenance, b.rule);
      if (b.owner) {
        out_.append(",\"ruby_thread\":");
        AppendUint(&out_, *b.owner);
      }
      out_.append(",\"ended_by\":");
      AppendJsonString(&out_, OwnerEndName(b.end));
      EventArg("opened_by", b.opened_by);
      EventArg("closed_by", b.closed_by);
      out_.push_back('}');
      EndEvent();
    }
  }

  void WriteGc() {
    for (const GcSpan& gc : model_.gc_spans()) {
      if (sink_.failed()) return;
      Slice("GC", Provenance::kObserved, process_.ruby_pid, kPerfettoGcTid, gc.start_ns, gc.end_ns);
      CommonArgs(Provenance::kObserved, ModelRule::kNone);
      if (gc.ruby_thread) {
        out_.append(",\"ruby_thread\":");
        AppendUint(&out_, *gc.ruby_thread);
        out_.append(",\"thread_provenance\":");
        AppendJsonString(&out_, ProvenanceString(gc.thread_provenance));
      }
      out_.append(gc.complete ? ",\"complete\":true" : ",\"complete\":false");
      EventArg("opened_by", gc.opened_by);
      EventArg("closed_by", gc.closed_by);
      out_.push_back('}');
      EndEvent();
    }
  }

  void WriteThread(const RubyThread& thread) {
    const uint64_t tid = kPerfettoThreadTidBase + thread.ruby_thread;
    // Probe markers interleave with the slices so timestamps on the track stay in order.
    const auto& markers = model_.markers();
    size_t m = 0;
    auto flush_markers = [&](uint64_t until_ns) {
      for (; m < markers.size() && markers[m].t_ns <= until_ns; ++m) {
        const ModelMarker& mk = markers[m];
        if (mk.ruby_thread != thread.ruby_thread) continue;
        if (mk.event != EventName::kSleepEnter && mk.event != EventName::kMutexLockEnter) continue;
        BeginEvent('i', mk.event == EventName::kSleepEnter ? "Kernel#sleep" : "Thread::Mutex#lock",
                   process_.ruby_pid, tid, mk.t_ns);
        out_.append(",\"s\":\"t\",\"cat\":\"probe\",\"args\":{\"provenance\":\"observed\"");
        EventArg("event", mk.event_index);
        out_.append("}");
        EndEvent();
      }
    };
    const Endpoint* latest = nullptr;  // the thread's endpoint as of its latest event with a stack
    for (const StateBlock& b : thread.blocks) {
      if (sink_.failed()) return;
      flush_markers(b.start_ns);
      Slice(StateBlockLabel(b), b.provenance, process_.ruby_pid, tid, b.start_ns, b.end_ns);
      CommonArgs(b.provenance, b.rule);
      out_.append(",\"state\":");
      AppendJsonString(&out_, ThreadStateName(b.state));
      if (b.state == ThreadState::kReleased || b.state == ThreadState::kWantsGvl) {
        out_.append(",\"reason\":");
        AppendJsonString(&out_, ReleaseReasonName(b.reason));
      }
      if (b.native_tid) {
        out_.append(",\"native_tid\":");
        AppendUint(&out_, *b.native_tid);
      }
      if (b.repeats > 0) {
        out_.append(",\"repeated_transitions\":");
        AppendUint(&out_, b.repeats);
      }
      EndpointArg(BlockEndpoint(b.opened_by, b.closed_by, latest));
      EventArg("opened_by", b.opened_by);
      EventArg("closed_by", b.closed_by);
      EventArg("ready_while_running", b.ready_while_running);
      out_.push_back('}');
      EndEvent();
    }
    flush_markers(UINT64_MAX);
  }

  void WriteNative() {
    for (const NativeThread& n : model_.native_threads()) {
      for (const NativeSpan& s : n.spans) {
        if (sink_.failed()) return;
        Slice(model_.ThreadLabel(s.ruby_thread), s.provenance, process_.native_pid, n.native_tid, s.start_ns,
              s.end_ns);
        CommonArgs(s.provenance, ModelRule::kNone);
        out_.append(",\"ruby_thread\":");
        AppendUint(&out_, s.ruby_thread);
        out_.push_back('}');
        EndEvent();
      }
    }
  }

  void WriteGlobalMarkers() {
    for (const ModelMarker& mk : model_.markers()) {
      if (sink_.failed()) return;
      if (mk.event == EventName::kSleepEnter || mk.event == EventName::kMutexLockEnter) continue;
      const TraceEvent& e = model_.events()[mk.event_index];
      BeginEvent('i', EventNameString(mk.event), process_.ruby_pid, kPerfettoMarkerTid, mk.t_ns);
      out_.append(",\"s\":\"g\",\"cat\":\"daemon\",\"args\":{");
      bool comma = false;
      if (mk.event == EventName::kEventsDropped) {
        out_.append("\"count\":");
        AppendUint(&out_, e.count);
        comma = true;
      }
      if (!e.reason.empty()) {
        if (comma) out_.push_back(',');
        out_.append("\"reason\":");
        AppendJsonString(&out_, e.reason);
      }
      out_.push_back('}');
      EndEvent();
    }
  }

  const Model& model_;
  PerfettoStacks stacks_;
  std::unique_ptr<TraceEndpoints> endpoints_;  // the stacks' endpoints (model/endpoint.h); null without stacks
  PerfettoProcess process_;
  ExportSink& sink_;
  std::string& out_;
  bool& first_;  // no event written yet (shared by the writers of one file's processes)
};

}  // namespace

Status ExportPerfetto(const Model& model, std::ostream& out, PerfettoStacks stacks) {
  ExportSink sink(out);
  bool first = true;
  PerfettoWriter w(model, sink, stacks, PerfettoProcess{}, &first);
  w.WriteHead();
  w.WriteTracks();
  w.WriteTail();
  return sink.Finish("Perfetto");
}

Status ExportPerfetto(const std::vector<PerfettoProcessModel>& processes, std::ostream& out, PerfettoStacks stacks) {
  if (processes.empty()) return Error(ErrorCode::kBadTrace, "the trace has no traced process to export");
  ExportSink sink(out);
  bool first = true;
  PerfettoWriter(*processes.front().model, sink, stacks, PerfettoProcess{}, &first).WriteHead();
  for (size_t i = 0; i < processes.size(); ++i) {
    const PerfettoProcess where{.ruby_pid = static_cast<int>(2 * i + kPerfettoRubyPid),
                                .native_pid = static_cast<int>(2 * i + kPerfettoNativePid),
                                .label = processes[i].label,
                                .sort_index = i};
    PerfettoWriter(*processes[i].model, sink, stacks, where, &first).WriteTracks();
  }
  PerfettoWriter(*processes.front().model, sink, stacks, PerfettoProcess{}, &first).WriteTail();
  return sink.Finish("Perfetto");
}

Status ExportPerfetto(const TraceFile& trace, std::ostream& out) {
  if (!trace.MultiProcess()) {
    Result<Model> model = Model::FromTrace(trace);
    if (!model.ok()) return model.error();
    return ExportPerfetto(*model, out, PerfettoStacks{&trace.frames, &trace.stacks});
  }
  // One model per process (each has its own GVL), each process's tracks apart.
  std::vector<ProcessTrace> parts = SplitByProcess(trace);
  std::vector<Model> models;
  models.reserve(parts.size());
  for (ProcessTrace& part : parts) {
    part.trace.frames.clear();  // the whole trace's dictionaries serve the args
    part.trace.stacks.clear();
    Result<Model> model = Model::FromTrace(std::move(part.trace));
    if (!model.ok()) return model.error();
    models.push_back(std::move(model).value());
  }
  std::vector<PerfettoProcessModel> processes;
  for (size_t i = 0; i < parts.size(); ++i) processes.push_back({.label = parts[i].label, .model = &models[i]});
  return ExportPerfetto(processes, out, PerfettoStacks{&trace.frames, &trace.stacks});
}

Status ExportPerfetto(const std::string& trace_path, std::ostream& out) {
  Result<TraceFile> trace = TraceReader::ReadFile(trace_path);
  if (!trace.ok()) return trace.error();
  if (trace->MultiProcess()) return ExportPerfetto(*trace, out);
  // The model takes the events; the stack dictionaries stay here for the args.
  const std::unordered_map<uint32_t, FrameInfo> frames = std::move(trace->frames);
  const std::unordered_map<uint32_t, std::vector<uint32_t>> stacks = std::move(trace->stacks);
  Result<Model> model = Model::FromTrace(std::move(trace.value()));
  if (!model.ok()) return model.error();
  return ExportPerfetto(*model, out, PerfettoStacks{&frames, &stacks});
}

}  // namespace rvbpfd
