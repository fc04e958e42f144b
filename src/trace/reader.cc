#include "trace/reader.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "common/json_read.h"
#include "common/label_bound.h"
#include "common/target_file.h"
#include "trace/compressed.h"

namespace rvbpfd {
namespace {

using nlohmann::json;

// Thrown inside Parse only, turned into kBadTrace with the line number at one place.
struct LineError {
  std::string what;
};

uint64_t GetUint64(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) throw LineError{std::string("missing \"") + key + "\""};
  std::optional<uint64_t> v = JsonInteger<uint64_t>(*it);
  if (!v) throw LineError{std::string("\"") + key + "\" must be a non-negative integer"};
  return *v;
}

std::optional<uint32_t> GetOptionalUint32(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  std::optional<uint32_t> v = JsonInteger<uint32_t>(*it);
  if (!v) throw LineError{std::string("\"") + key + "\" must be null or an integer in 0..4294967295"};
  return v;
}

std::string GetString(const json& obj, const char* key, const std::string& fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) throw LineError{std::string("\"") + key + "\" must be a string"};
  return it->get<std::string>();
}

// The optional names and namespace tid of a thread or thread_info line (values of another type are ignored, as
// readers ignore what they do not know); names are bounded as frame labels are.
void UpdateThreadInfo(const json& obj, ThreadLine* line) {
  ThreadInfo& info = line->info;
  for (auto [key, field] : {std::pair{"name", &info.name}, std::pair{"native_name", &info.native_name}}) {
    auto it = obj.find(key);
    if (it == obj.end() || !it->is_string()) continue;
    std::string v = it->get<std::string>();
    BoundLabel(&v);
    if (*field && *field != v) ++line->renames;
    *field = std::move(v);
  }
  if (auto it = obj.find("ns_tid"); it != obj.end()) {
    if (std::optional<uint32_t> v = JsonInteger<uint32_t>(*it)) info.ns_tid = v;
  }
}

double GetDouble(const json& obj, const char* key, double fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_number()) throw LineError{std::string("\"") + key + "\" must be a number"};
  return it->get<double>();
}

std::vector<std::string> GetStringArray(const json& obj, const char* key) {
  std::vector<std::string> out;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return out;
  if (!it->is_array()) throw LineError{std::string("\"") + key + "\" must be an array of strings"};
  for (const json& v : *it) {
    if (!v.is_string()) throw LineError{std::string("\"") + key + "\" must be an array of strings"};
    out.push_back(v.get<std::string>());
  }
  return out;
}

TraceHeader ParseHeader(const json& obj) {
  const uint64_t version = GetUint64(obj, "rvtrace");
  if (version != kRvtraceVersion) {
    throw LineError{"unsupported rvtrace version " + std::to_string(version) + " (this rvbpfd reads version " +
                    std::to_string(kRvtraceVersion) + ")"};
  }
  TraceHeader h;
  h.recorder = GetString(obj, "recorder", "");
  if (h.recorder.empty()) throw LineError{"missing \"recorder\""};
  h.recorder_version = GetString(obj, "recorder_version", "");
  if (auto it = obj.find("pid"); it != obj.end() && !it->is_null()) {
    std::optional<int64_t> pid = JsonInteger<int64_t>(*it);
    if (!pid) throw LineError{"\"pid\" must be a 64-bit integer"};
    h.pid = *pid;
  }
  h.ruby_version = GetString(obj, "ruby_version", "");
  h.clock = GetString(obj, "clock", "monotonic");
  h.origin_ns = obj.contains("origin_ns") ? GetUint64(obj, "origin_ns") : 0;
  h.started_at = GetString(obj, "started_at", "");
  h.channels = GetStringArray(obj, "channels");
  // Absent main_thread: the thread lines say which thread is main.
  h.main_thread = GetOptionalUint32(obj, "main_thread");
  h.command = GetStringArray(obj, "command");
  h.build_id = GetString(obj, "build_id", "");
  if (auto hz = GetOptionalUint32(obj, "sample_hz"); hz && *hz > 0) h.sample_hz = hz;
  h.stacks = GetString(obj, "stacks", "");
  return h;
}

// A sample's "gvl" object. Absent keys take their defaults (other recorders may write a subset); a present key of the
// wrong type rejects the line, as elsewhere. Queued threads beyond `waiting` are kept and `waiting` raised to match:
// the list is what the reading saw.
std::shared_ptr<GvlReading> ParseGvlReading(const json& obj) {
  if (!obj.is_object()) throw LineError{"\"gvl\" must be an object"};
  auto g = std::make_shared<GvlReading>();
  g->holder = GetOptionalUint32(obj, "holder");
  if (auto held = obj.find("held"); held != obj.end() && !held->is_null()) {
    if (!held->is_boolean()) throw LineError{"\"gvl.held\" must be a boolean"};
    g->held = held->get<bool>();
  } else {
    g->held = g->holder.has_value();
  }
  if (g->holder && !g->held) throw LineError{"\"gvl\" names a holder but says the GVL was not held"};
  g->waiting = GetOptionalUint32(obj, "waiting").value_or(0);
  if (auto q = obj.find("queued"); q != obj.end() && !q->is_null()) {
    if (!q->is_array()) throw LineError{"\"gvl.queued\" must be an array of thread ids"};
    for (const json& v : *q) {
      std::optional<uint32_t> id = JsonInteger<uint32_t>(v);
      if (!id) throw LineError{"\"gvl.queued\" must be an array of thread ids"};
      g->queued.push_back(*id);
    }
  }
  if (g->queued.size() > g->waiting) g->waiting = static_cast<uint32_t>(g->queued.size());
  return g;
}

// A wants_gvl's contention keys (docs/rvtrace.md): `holder` (a thread id, or null for a holder the trace does not
// name) and `holder_stack`; either one says the READY found the GVL held.
void ParseHolder(const json& obj, TraceEvent* e) {
  auto holder = obj.find("holder");
  e->holder_stack = GetOptionalUint32(obj, "holder_stack");
  if (holder == obj.end() && !e->holder_stack) return;
  auto g = std::make_shared<GvlReading>();
  g->held = true;
  if (holder != obj.end() && !holder->is_null()) {
    g->holder = JsonInteger<uint32_t>(*holder);
    if (!g->holder) throw LineError{"\"holder\" must be a thread id or null"};
  }
  e->gvl = std::move(g);
}

// Returns nullopt for an event name this version does not know.
std::optional<TraceEvent> ParseEvent(const json& obj) {
  TraceEvent e;
  // A recorder that stamps an event before taking its origin writes a negative offset; clamp it like FromRecord.
  if (const json& t = obj.at("t_ns"); t.is_number_integer() && !t.is_number_unsigned()) {
    e.t_ns = 0;
  } else {
    e.t_ns = GetUint64(obj, "t_ns");
  }
  auto name_it = obj.find("event");
  if (name_it == obj.end() || !name_it->is_string()) throw LineError{"\"event\" must be a string"};
  std::optional<EventName> name = ParseEventName(name_it->get_ref<const std::string&>());
  if (!name) return std::nullopt;
  e.event = *name;
  e.ruby_thread = GetOptionalUint32(obj, "ruby_thread");
  e.native_tid = GetOptionalUint32(obj, "native_tid");
  e.probe_tid = GetOptionalUint32(obj, "probe_tid");
  if (auto th = obj.find("th"); th != obj.end() && th->is_string()) {
    e.th = std::strtoull(th->get_ref<const std::string&>().c_str(), nullptr, 16);
  }
  e.source = InternSource(GetString(obj, "source", ""));
  const std::string provenance = GetString(obj, "provenance", "observed");
  std::optional<Provenance> p = ParseProvenance(provenance);
  if (!p) throw LineError{"unknown provenance \"" + provenance + "\" (expected observed, derived or inferred)"};
  e.provenance = *p;
  if (e.event == EventName::kEventsDropped) e.count = GetUint64(obj, "count");
  e.reason = GetString(obj, "reason", "");
  if (auto rp = obj.find("reason_provenance"); rp != obj.end() && !rp->is_null()) {
    if (!rp->is_string()) throw LineError{"\"reason_provenance\" must be a string"};
    std::optional<Provenance> p = ParseProvenance(rp->get_ref<const std::string&>());
    if (!p) throw LineError{"unknown reason_provenance \"" + rp->get<std::string>() + "\""};
    e.reason_provenance = *p;
  }
  e.stack = GetOptionalUint32(obj, "stack");
  e.overhead_pct = GetDouble(obj, "overhead_pct", -1);
  if (auto g = obj.find("gvl"); g != obj.end() && !g->is_null()) e.gvl = ParseGvlReading(*g);
  if (e.event == EventName::kWantsGvl) ParseHolder(obj, &e);
  return e;
}

// The summary is informational (the events are the data) and other recorders write their own keys in it (the
// in-process recorder writes "counts", and "threads" as a number), so keys of an unexpected type are skipped
// rather than rejected. Only the per-thread list is trusted when it has our shape; *threads_valid says so.
TraceSummary ParseSummary(const json& obj, bool* threads_valid) {
  if (!obj.is_object()) throw LineError{"\"summary\" must be an object"};
  TraceSummary s;
  for (const char* key : {"event_counts", "counts"}) {
    auto it = obj.find(key);
    if (it == obj.end() || !it->is_object()) continue;
    for (auto& [name, count] : it->items()) {
      std::optional<EventName> event = ParseEventName(name);
      if (!event || !count.is_number_unsigned()) continue;  // a newer recorder's event: nothing to count it as
      s.event_counts[static_cast<size_t>(*event)] = count.get<uint64_t>();
    }
    break;
  }
  auto uint_or_zero = [&](const char* key) -> uint64_t {
    auto it = obj.find(key);
    return it != obj.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
  };
  s.events_dropped = uint_or_zero("events_dropped");
  s.drop_records = uint_or_zero("drop_records");
  s.ring_high_water_bytes = uint_or_zero("ring_high_water_bytes");
  s.late_events = uint_or_zero("late_events");
  s.frames = uint_or_zero("frames");
  s.stacks = uint_or_zero("stacks");
#define RV_TRAP_READ(field, fold, label)                                                      \
  if (auto it = obj.find(#field); it != obj.end() && it->is_number_unsigned()) s.field = it->get<uint64_t>();
  RV_TRAP_COUNTERS(RV_TRAP_READ)
  RV_GVL_COUNTERS(RV_TRAP_READ)
#undef RV_TRAP_READ
  if (auto it = obj.find("sample_ec_routes"); it != obj.end() && it->is_object()) {
    SampleEcRoutes r;
#define RV_ROUTE_READ(field, fold, label, key)                                                   \
  if (auto v = it->find(#key); v != it->end() && v->is_number_unsigned()) r.key = v->get<uint64_t>();
    RV_EC_ROUTE_COUNTERS(RV_ROUTE_READ)
#undef RV_ROUTE_READ
    s.sample_ec_routes = r;
  }
  if (auto it = obj.find("duration_ms"); it != obj.end() && it->is_number()) s.duration_ms = it->get<double>();
  *threads_valid = false;
  if (auto it = obj.find("threads"); it != obj.end() && it->is_array()) {
    for (const json& t : *it) {
      if (!t.is_object()) throw LineError{"each of \"threads\" must be an object"};
      ThreadSummary ts;
      ts.ruby_thread = static_cast<uint32_t>(GetUint64(t, "ruby_thread"));
      if (auto m = t.find("main"); m != t.end() && !m->is_null()) {
        if (!m->is_boolean()) throw LineError{"\"main\" must be true or false"};
        ts.main = m->get<bool>();
      }
      if (auto n = t.find("native_tids"); n != t.end() && !n->is_null()) {
        if (!n->is_array()) throw LineError{"\"native_tids\" must be an array"};
        for (const json& tid : *n) {
          std::optional<uint32_t> t = JsonInteger<uint32_t>(tid);
          if (!t) throw LineError{"\"native_tids\" must hold integers in 0..4294967295"};
          ts.native_tids.push_back(*t);
        }
      }
      ts.running_ms = GetDouble(t, "running_ms", 0);
      s.threads.push_back(std::move(ts));
    }
    *threads_valid = true;
  }
  return s;
}

FrameInfo ParseFrame(const json& obj, uint32_t* id) {
  if (!obj.is_object()) throw LineError{"\"frame\" must be an object"};
  const uint64_t raw_id = GetUint64(obj, "id");
  if (raw_id > UINT32_MAX) throw LineError{"frame \"id\" out of range"};
  *id = static_cast<uint32_t>(raw_id);
  FrameInfo f;
  f.label = GetString(obj, "label", "");
  f.path = GetString(obj, "path", "");
  // Labels and paths past kMaxLabelBytes (another recorder's, an older rvbpfd's, a crafted trace) are cut and marked
  // as rvbpfd's symbolizer cuts them, so no export multiplies them.
  BoundLabel(&f.label);
  BoundLabel(&f.path);
  if (auto l = obj.find("line"); l != obj.end() && !l->is_null()) {
    std::optional<int32_t> line = JsonInteger<int32_t>(*l);
    if (!line) throw LineError{"frame \"line\" must be a 32-bit integer"};
    f.line = *line;
  }
  const std::string kind = GetString(obj, "kind", "ruby");
  std::optional<FrameKind> k = ParseFrameKind(kind);
  // A newer recorder's frame kind still has a label worth showing.
  f.kind = k ? *k : FrameKind::kUnresolved;
  return f;
}

std::vector<uint32_t> ParseStack(const json& obj, const TraceFile& file, uint32_t* id) {
  if (!obj.is_object()) throw LineError{"\"stack\" must be an object"};
  const uint64_t raw_id = GetUint64(obj, "id");
  if (raw_id > UINT32_MAX) throw LineError{"stack \"id\" out of range"};
  *id = static_cast<uint32_t>(raw_id);
  auto it = obj.find("frames");
  if (it == obj.end() || !it->is_array()) throw LineError{"stack \"frames\" must be an array of frame ids"};
  std::vector<uint32_t> ids;
  ids.reserve(it->size());
  for (const json& v : *it) {
    std::optional<uint32_t> frame_id = JsonInteger<uint32_t>(v);
    if (!frame_id) throw LineError{"stack \"frames\" must be an array of frame ids"};
    const uint32_t fid = *frame_id;
    if (!file.frames.contains(fid)) {
      throw LineError{"stack " + std::to_string(*id) + " uses frame " + std::to_string(fid) +
                      " before its frame line"};
    }
    ids.push_back(fid);
  }
  return ids;
}


// The most arguments of a process's command kept (each cut as frame labels are): a target chooses its argv, and the
// label tools show needs the first few.
constexpr size_t kMaxCommandArgs = 64;

// An optional string of a process or process_end line: a value of another type is ignored (as thread names are),
// a string is cut as frame labels are.
std::string BoundedString(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return "";
  std::string v = it->get<std::string>();
  BoundLabel(&v);
  return v;
}

// The id of a process or process_end line: required, 1 or more (0 names no process).
uint32_t GetProcessId(const json& obj) {
  auto it = obj.find("id");
  std::optional<uint32_t> id = it == obj.end() ? std::nullopt : JsonInteger<uint32_t>(*it);
  if (!id || *id == 0) throw LineError{"process \"id\" must be an integer in 1..4294967295"};
  return *id;
}

// The ids of the process lines read so far (the root is always defined: the header's). A set, so that a file of many
// process and thread lines is read in linear time.
using ProcessIds = std::unordered_set<uint32_t>;

bool HasProcess(const ProcessIds& ids, uint32_t id) { return id == kRootProcessId || ids.contains(id); }

// A process line (docs/rvtrace.md, "Process lines"). Only the id is required; optional keys of another type are
// ignored. A parent is kept only when an earlier line defined it or it is the root (the writer writes a parent first),
// so the processes always form a forest, whatever a crafted file says.
ProcessInfo ParseProcess(const json& obj, const ProcessIds& ids) {
  if (!obj.is_object()) throw LineError{"\"process\" must be an object"};
  ProcessInfo p;
  p.id = GetProcessId(obj);
  if (auto it = obj.find("pid"); it != obj.end()) p.pid = JsonInteger<uint32_t>(*it).value_or(0);
  if (auto it = obj.find("parent"); it != obj.end()) {
    std::optional<uint32_t> parent = JsonInteger<uint32_t>(*it);
    // The root has none: with that, a parent defined earlier (or the root) can never close a cycle.
    if (parent && p.id != kRootProcessId && *parent != p.id && HasProcess(ids, *parent)) p.parent = parent;
  }
  p.cause = BoundedString(obj, "cause");
  if (auto it = obj.find("t_ns"); it != obj.end()) p.t_ns = JsonInteger<uint64_t>(*it).value_or(0);
  if (auto it = obj.find("command"); it != obj.end() && it->is_array()) {
    for (const json& arg : *it) {
      if (!arg.is_string()) continue;
      if (p.command.size() == kMaxCommandArgs) break;
      p.command.push_back(arg.get<std::string>());
      BoundLabel(&p.command.back());
    }
  }
  p.ruby_version = BoundedString(obj, "ruby_version");
  p.build_id = BoundedString(obj, "build_id");
  p.skipped = BoundedString(obj, "skipped");
  return p;
}

// A process_end line: its process must have been defined (the root always is).
ProcessEnd ParseProcessEnd(const json& obj, const ProcessIds& ids) {
  if (!obj.is_object()) throw LineError{"\"process_end\" must be an object"};
  ProcessEnd end;
  end.id = GetProcessId(obj);
  if (!HasProcess(ids, end.id)) {
    throw LineError{"process_end names process " + std::to_string(end.id) + " before its process line"};
  }
  if (auto it = obj.find("t_ns"); it != obj.end()) end.t_ns = JsonInteger<uint64_t>(*it).value_or(0);
  end.how = BoundedString(obj, "how");
  if (auto it = obj.find("exit_code"); it != obj.end()) end.exit_code = JsonInteger<int32_t>(*it);
  if (auto it = obj.find("signal"); it != obj.end()) end.signal = JsonInteger<int32_t>(*it);
  return end;
}

// The process a thread line names ("process"; absent: the root). It must be defined by an earlier process line, as
// a stack's frames must: a thread is never attributed to a process the file does not describe.
uint32_t ParseThreadProcess(const json& obj, const ProcessIds& ids) {
  auto it = obj.find("process");
  if (it == obj.end() || it->is_null()) return kRootProcessId;
  std::optional<uint32_t> id = JsonInteger<uint32_t>(*it);
  if (!id || *id == 0) throw LineError{"thread \"process\" must be a process id (an integer in 1..4294967295)"};
  if (!HasProcess(ids, *id)) {
    throw LineError{"thread names process " + std::to_string(*id) + " before its process line"};
  }
  return *id;
}

// Which process each event belongs to while reading: by its Ruby thread's line, else (an event naming no thread, a
// GC without its thread) by a native tid seen on an earlier event of a known thread, else the root.
class ProcessOfEvents {
 public:
  void AddThread(uint32_t ruby_thread, uint32_t process) {
    by_thread_[ruby_thread] = process;
    several_ = several_ || process != kRootProcessId;
  }
  void Assign(TraceEvent* e) {
    if (!several_) return;  // only the root's threads so far: every event is the root's
    if (e->ruby_thread) {
      auto it = by_thread_.find(*e->ruby_thread);
      if (it == by_thread_.end()) return;
      e->process = it->second;
      if (e->native_tid) by_tid_[*e->native_tid] = e->process;
      return;
    }
    for (std::optional<uint32_t> tid : {e->native_tid, e->probe_tid}) {
      if (!tid) continue;
      if (auto it = by_tid_.find(*tid); it != by_tid_.end()) {
        e->process = it->second;
        return;
      }
    }
  }

 private:
  bool several_ = false;                              // a thread of another process than the root was seen
  std::unordered_map<uint32_t, uint32_t> by_thread_;
  std::unordered_map<uint32_t, uint32_t> by_tid_;     // host tid -> process, from the latest event naming both
};

// The root process as the header describes it (a pid outside 1..UINT32_MAX is not known).
ProcessInfo RootFromHeader(const TraceHeader& h) {
  ProcessInfo root;
  root.pid = h.pid > 0 && h.pid <= UINT32_MAX ? static_cast<uint32_t>(h.pid) : 0;
  root.command = h.command;
  root.ruby_version = h.ruby_version;
  root.build_id = h.build_id;
  return root;
}

// A multi-process trace whose root has no process line (a writer that omitted it) gets one from the header, so
// every consumer finds the root among `processes`.
void AddRootFromHeader(TraceFile* file) {
  if (file->processes.empty() || file->FindProcess(kRootProcessId) != nullptr) return;
  file->processes.insert(file->processes.begin(), RootFromHeader(file->header));
}

}  // namespace

const std::vector<uint32_t>* TraceFile::Stack(uint32_t id) const {
  auto it = stacks.find(id);
  return it == stacks.end() ? nullptr : &it->second;
}

const FrameInfo* TraceFile::Frame(uint32_t id) const {
  auto it = frames.find(id);
  return it == frames.end() ? nullptr : &it->second;
}

bool StackTakenInGc(const std::unordered_map<uint32_t, FrameInfo>& frames,
                    const std::unordered_map<uint32_t, std::vector<uint32_t>>& stacks, uint32_t id) {
  auto st = stacks.find(id);
  if (st == stacks.end() || st->second.empty()) return false;
  auto leaf = frames.find(st->second.front());
  return leaf != frames.end() && leaf->second.kind == FrameKind::kGc;
}

bool TraceFile::StackInGc(uint32_t id) const { return StackTakenInGc(frames, stacks, id); }

bool TraceFile::IsMain(std::optional<uint32_t> ruby_thread) const {
  if (!ruby_thread) return false;
  if (header.main_thread && *header.main_thread == *ruby_thread) return true;
  for (const ThreadLine& t : threads) {
    if (t.ruby_thread == *ruby_thread) return t.main;
  }
  return false;
}

const ThreadInfo* TraceFile::FindThreadInfo(uint32_t ruby_thread) const {
  for (auto it = threads.rbegin(); it != threads.rend(); ++it) {
    if (it->ruby_thread == ruby_thread) return &it->info;
  }
  return nullptr;
}

std::string TraceFile::ThreadName(uint32_t ruby_thread) const {
  const ThreadInfo* info = FindThreadInfo(ruby_thread);
  if (info == nullptr) return "";
  // The name unnamed threads inherit is their own process's (its main thread's native name).
  const uint32_t process = ProcessOf(ruby_thread);
  std::optional<std::string> process_comm;
  for (const ThreadLine& t : threads) {
    if (t.process == process && IsMain(t.ruby_thread)) process_comm = t.info.native_name;
  }
  return info->DisplayName(process_comm);
}

const ProcessInfo* TraceFile::FindProcess(uint32_t id) const {
  for (const ProcessInfo& p : processes) {
    if (p.id == id) return &p;
  }
  return nullptr;
}

const ProcessEnd* TraceFile::FindProcessEnd(uint32_t id) const {
  for (const ProcessEnd& e : process_ends) {
    if (e.id == id) return &e;
  }
  return nullptr;
}

uint32_t TraceFile::ProcessOf(uint32_t ruby_thread) const {
  for (auto it = threads.rbegin(); it != threads.rend(); ++it) {
    if (it->ruby_thread == ruby_thread) return it->process;
  }
  return kRootProcessId;
}

std::string TraceFile::ProcessLabel(uint32_t id) const {
  if (const ProcessInfo* p = FindProcess(id)) return rvbpfd::ProcessLabel(*p);
  if (id == kRootProcessId) return rvbpfd::ProcessLabel(RootFromHeader(header));
  return "process " + std::to_string(id);
}

std::string ProcessLabel(const ProcessInfo& process) {
  std::string label = process.pid != 0 ? "pid " + std::to_string(process.pid) : "process " + std::to_string(process.id);
  std::string command;
  for (const std::string& arg : process.command) {
    if (!command.empty()) command += ' ';
    command += arg;
    if (command.size() > kMaxProcessCommandLabelBytes) break;
  }
  if (command.empty()) return label;
  if (command.size() > kMaxProcessCommandLabelBytes) {
    // Cut on a UTF-8 sequence boundary: never half a character.
    size_t cut = kMaxProcessCommandLabelBytes;
    while (cut > 0 && (static_cast<unsigned char>(command[cut]) & 0xC0) == 0x80) --cut;
    command.resize(cut);
    command += "\xe2\x80\xa6";
  }
  return label + " (" + command + ")";
}

std::string ThreadLabelWithName(uint32_t ruby_thread, bool main, std::string_view name) {
  std::string label = main ? "main" : "Thread #" + std::to_string(ruby_thread);
  if (!name.empty() && !(main && name == "main")) {
    label += " (";
    label += name;
    label += ')';
  }
  return label;
}

Result<TraceFile> TraceReader::Parse(std::string_view text, const std::string& name) {
  TraceFile file;
  ProcessOfEvents process_of;
  ProcessIds process_ids, ended_ids;
  bool have_header = false;
  bool have_prev_event = false;
  uint64_t prev_t_ns = 0;
  size_t pos = 0;
  size_t line_no = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) {
      // No terminating newline: the writer was cut inside this line. Every line the writer finishes ends in '\n',
      // so even a prefix that happens to parse is not trusted.
      file.truncated_last_line = true;
      break;
    }
    const std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto bad = [&](const std::string& what) {
      return Error(ErrorCode::kBadTrace, "reading trace " + name + ": line " + std::to_string(line_no) + ": " + what);
    };
    json obj = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
    if (obj.is_discarded()) return bad("not valid JSON");
    if (!obj.is_object()) return bad("not a JSON object");
    ++file.lines;
    try {
      if (!have_header) {
        if (!obj.contains("rvtrace")) return bad("not an .rvtrace file: the first line is not a header");
        file.header = ParseHeader(obj);
        have_header = true;
      } else if (auto t = obj.find("t_ns"); t != obj.end()) {
        std::optional<TraceEvent> event = ParseEvent(obj);
        if (!event) {
          ++file.unknown_event_lines;
          continue;
        }
        if (event->stack && !file.stacks.contains(*event->stack)) {
          return bad("event uses stack " + std::to_string(*event->stack) + " before its stack line");
        }
        if (event->holder_stack && !file.stacks.contains(*event->holder_stack)) {
          return bad("event uses holder stack " + std::to_string(*event->holder_stack) + " before its stack line");
        }
        process_of.Assign(&*event);
        if (have_prev_event && event->t_ns < prev_t_ns) ++file.out_of_order_events;
        prev_t_ns = event->t_ns;
        have_prev_event = true;
        file.events.push_back(std::move(*event));
      } else if (auto th = obj.find("thread"); th != obj.end()) {
        if (!th->is_object()) return bad("\"thread\" must be an object");
        ThreadLine tl;
        tl.ruby_thread = static_cast<uint32_t>(GetUint64(*th, "ruby_thread"));
        if (auto m = th->find("main"); m != th->end() && m->is_boolean()) tl.main = m->get<bool>();
        tl.process = ParseThreadProcess(*th, process_ids);
        process_of.AddThread(tl.ruby_thread, tl.process);
        UpdateThreadInfo(*th, &tl);
        file.threads.push_back(tl);
      } else if (auto ti = obj.find("thread_info"); ti != obj.end()) {
        if (!ti->is_object()) return bad("\"thread_info\" must be an object");
        const uint32_t id = static_cast<uint32_t>(GetUint64(*ti, "ruby_thread"));
        // The latest thread line of that id (a thread_info line before any is another recorder's: ignored).
        for (auto it = file.threads.rbegin(); it != file.threads.rend(); ++it) {
          if (it->ruby_thread != id) continue;
          UpdateThreadInfo(*ti, &*it);
          break;
        }
      } else if (auto fr = obj.find("frame"); fr != obj.end()) {
        uint32_t id = 0;
        FrameInfo f = ParseFrame(*fr, &id);
        auto [it, inserted] = file.frames.try_emplace(id, f);
        if (!inserted && !(it->second == f)) return bad("frame " + std::to_string(id) + " defined twice, differently");
      } else if (auto st = obj.find("stack"); st != obj.end() && st->is_object()) {
        uint32_t id = 0;
        std::vector<uint32_t> ids = ParseStack(*st, file, &id);
        auto [it, inserted] = file.stacks.try_emplace(id, ids);
        if (!inserted && it->second != ids) return bad("stack " + std::to_string(id) + " defined twice, differently");
      } else if (auto pr = obj.find("process"); pr != obj.end()) {
        ProcessInfo p = ParseProcess(*pr, process_ids);
        if (process_ids.contains(p.id)) {
          if (!(*file.FindProcess(p.id) == p)) {
            return bad("process " + std::to_string(p.id) + " defined twice, differently");
          }
        } else {
          process_ids.insert(p.id);
          file.processes.push_back(std::move(p));
        }
      } else if (auto pe = obj.find("process_end"); pe != obj.end()) {
        ProcessEnd end = ParseProcessEnd(*pe, process_ids);
        // A repeated end (a crafted file) keeps the first: a process ends once.
        if (ended_ids.insert(end.id).second) file.process_ends.push_back(std::move(end));
      } else if (auto s = obj.find("summary"); s != obj.end()) {
        file.summary = ParseSummary(*s, &file.summary_has_threads);
      } else if (obj.contains("rvtrace")) {
        return bad("a second header line");
      } else {
        ++file.unknown_lines;
      }
    } catch (const LineError& e) {
      return bad(e.what);
    } catch (const json::exception& e) {
      return bad(e.what());
    }
  }
  if (!have_header) {
    return Error(ErrorCode::kBadTrace, "reading trace " + name + ": no complete header line (empty or cut file)");
  }
  AddRootFromHeader(&file);
  return file;
}

Result<TraceFile> TraceReader::ReadFile(const std::string& path) {
  // A trace is a regular file of bounded size: a FIFO must not block `inspect`, /dev/zero must not be read until
  // memory runs out, and a directory is not "an empty or cut file".
  Result<FileFd> fd = OpenRegularFile(path, "trace file");
  if (!fd) {
    const Error& e = fd.error();
    if (e.message().find(", not a regular file") != std::string::npos) {
      return Error(ErrorCode::kBadTrace, "reading trace: " + e.message() + "; give the path of an .rvtrace file");
    }
    return Error(e.code(), e.message() + "; check the path and permissions");
  }
  Result<MappedFile> content = MappedFile::FromFd(fd->get(), path, "trace file", kMaxTraceBytes,
                                                        {.allow_empty = true});
  if (!content) {
    return Error(ErrorCode::kBadTrace, "reading trace: " + content.error().message() +
                                           " (the most a trace may have; its events are held in memory)");
  }
  return ParseBytes(std::string_view(reinterpret_cast<const char*>(content->data()), content->size()), path);
}

Result<TraceFile> TraceReader::ParseBytes(std::string_view bytes, const std::string& name, uint64_t max_text_bytes) {
  if (!LooksZstd(bytes)) return Parse(bytes, name);
  Result<DecompressedText> text = DecompressZstd(bytes, name, max_text_bytes);
  if (!text) return text.error();
  Result<TraceFile> file = Parse(text->text, name);
  if (file) file->truncated_frame = text->cut;
  return file;
}

}  // namespace rvbpfd
