#include "dump/dump_output.h"

#include <string>

#include "common/hex.h"

namespace rvbpfd {
namespace {

nlohmann::json NullOr(const std::optional<std::string>& s) { return s ? nlohmann::json(*s) : nlohmann::json(); }

// rb_profile_frame_path: nil for C frames (the trace's "<cfunc>" convention is not CRuby's).
nlohmann::json FramePath(const FrameInfo& f) {
  if (f.kind == FrameKind::kCfunc || f.path.empty()) return nullptr;
  return f.path;
}

nlohmann::json WaitingJson(const DumpSnapshot& snap, const WaitingFor& w) {
  nlohmann::json j = {{"kind", w.kind}, {"owner_native_tid", nullptr}, {"owner_ruby_thread", nullptr}};
  if (w.owner) {
    const DumpedThread& o = snap.threads[*w.owner];
    j["owner_native_tid"] = o.native_tid != 0 ? nlohmann::json(o.native_tid) : nlohmann::json();
    j["owner_ruby_thread"] = o.ruby_thread;
  }
  if (w.object != 0) j["mutex"] = Hex(w.object);
  if (w.fd) j["fd"] = *w.fd;
  if (w.fd_target) j["fd_target"] = *w.fd_target;
  return j;
}

std::string ThreadTitle(const DumpedThread& t) {
  std::string s = "thread " + std::to_string(t.ruby_thread);
  if (t.name) s += " \"" + *t.name + "\"";
  s += " (tid " + (t.native_tid != 0 ? std::to_string(t.native_tid) : std::string("?"));
  if (t.ns_tid != 0 && t.ns_tid != t.native_tid) s += ", " + std::to_string(t.ns_tid) + " in its pid namespace";
  return s + ")";
}

std::string FrameText(const FrameInfo& f) {
  if (f.kind == FrameKind::kCfunc || f.path.empty()) return f.label;
  return f.label + " at " + f.path + ":" + std::to_string(f.line);
}

// Where a thread wants what it waits for: its innermost frame of program code (not a C frame, not <internal:...>).
std::string WantedAt(const DumpedThread& t) {
  for (const FrameInfo& f : t.frames) {
    if (f.kind == FrameKind::kRuby && f.path.rfind("<internal:", 0) != 0) return ", in " + FrameText(f);
  }
  return "";
}

std::string WaitingText(const DumpSnapshot& snap, const WaitingFor& w) {
  std::string s;
  if (w.kind == "mutex") {
    s = "waiting for Mutex " + Hex(w.object);
    s += w.owner ? " owned by " + ThreadTitle(snap.threads[*w.owner]) : std::string(" (owner not among the threads)");
  } else if (w.kind == "join") {
    s = "joining " + (w.owner ? ThreadTitle(snap.threads[*w.owner]) : std::string("a thread"));
  } else if (w.kind == "io") {
    s = "waiting for IO";
    if (w.fd) s += " on fd " + std::to_string(*w.fd);
    if (w.fd_target) s += " (" + *w.fd_target + ")";
  } else {
    s = "waiting (" + w.kind + ")";
  }
  return s;
}

}  // namespace

nlohmann::json DumpToJson(const DumpSnapshot& snap) {
  nlohmann::json threads = nlohmann::json::array();
  for (const DumpedThread& t : snap.threads) {
    nlohmann::json frames = nlohmann::json::array();
    for (const FrameInfo& f : t.frames) frames.push_back({{"label", f.label}, {"path", FramePath(f)}, {"line", f.line}});
    threads.push_back({
        {"ruby_thread", t.ruby_thread},
        {"native_tid", t.native_tid != 0 ? nlohmann::json(t.native_tid) : nlohmann::json()},
        {"ns_tid", t.ns_tid != 0 ? nlohmann::json(t.ns_tid) : nlohmann::json()},
        {"name", NullOr(t.name)},
        {"state", t.state},
        {"reason", NullOr(t.reason)},
        {"holds_gvl", t.holds_gvl},
        {"gvl_queue_position", t.gvl_queue_position >= 0 ? nlohmann::json(t.gvl_queue_position) : nlohmann::json()},
        {"frames", std::move(frames)},
        {"stack_complete", t.stack_complete},
        {"changed", t.changed},
        {"waiting_for", t.waiting_for ? WaitingJson(snap, *t.waiting_for) : nlohmann::json()},
    });
  }
  nlohmann::json deadlocks = nlohmann::json::array();
  for (const std::vector<size_t>& cycle : snap.deadlocks) {
    nlohmann::json c = nlohmann::json::array();
    for (size_t i : cycle) c.push_back(snap.threads[i].native_tid);
    deadlocks.push_back(std::move(c));
  }
  nlohmann::json waiters = nlohmann::json::array();
  for (size_t i : snap.gvl_waiters) waiters.push_back(snap.threads[i].native_tid);
  return {{"pid", snap.pid},
          {"ruby_version", snap.ruby_version},
          {"threads", std::move(threads)},
          {"gvl",
           {{"holder_native_tid",
             snap.gvl_holder ? nlohmann::json(snap.threads[*snap.gvl_holder].native_tid) : nlohmann::json()},
            {"waiting", snap.gvl_waiting_count},
            {"waiters_native_tids", std::move(waiters)}}},
          {"deadlocks", std::move(deadlocks)},
          {"attempts", snap.attempts},
          {"torn", snap.torn},
          {"notes", snap.notes}};
}

void PrintDumpText(const DumpSnapshot& snap, std::ostream& out) {
  out << "Process " << snap.pid << ", CRuby " << snap.ruby_version << ", " << snap.threads.size() << " thread"
      << (snap.threads.size() == 1 ? "" : "s") << "\n";
  out << "GVL: " << (snap.gvl_holder ? "held by " + ThreadTitle(snap.threads[*snap.gvl_holder]) : "not held");
  out << "; " << snap.gvl_waiting_count << " waiting";
  for (size_t k = 0; k < snap.gvl_waiters.size(); k++) {
    out << (k == 0 ? ": " : ", ") << ThreadTitle(snap.threads[snap.gvl_waiters[k]]);
  }
  out << "\n";
  for (const std::vector<size_t>& cycle : snap.deadlocks) {
    out << "DEADLOCK among " << cycle.size() << " threads:\n";
    for (size_t i : cycle) {
      const DumpedThread& t = snap.threads[i];
      out << "  " << ThreadTitle(t) << " " << WaitingText(snap, *t.waiting_for) << WantedAt(t) << "\n";
    }
  }
  for (const std::string& note : snap.notes) out << "note: " << note << "\n";
  for (const DumpedThread& t : snap.threads) {
    out << "\n" << ThreadTitle(t) << ": " << t.state;
    if (t.reason) out << " (" << *t.reason << ")";
    if (t.waiting_for) out << ", " << WaitingText(snap, *t.waiting_for);
    if (t.changed) out << " [changed while read]";
    out << "\n";
    for (const FrameInfo& f : t.frames) out << "    " << FrameText(f) << "\n";
    if (!t.stack_complete) out << "    <incomplete stack>\n";
  }
}

}  // namespace rvbpfd
