#include "dump/dump_output.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/hex.h"
#include "dump/dump_analysis.h"

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
  if (w.object != 0) {
    j["object"] = Hex(w.object);
    j["object_type"] = w.object_type;
    if (w.kind == "mutex") j["mutex"] = Hex(w.object);
  }
  if (w.operation) j["operation"] = *w.operation;
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
  } else if (w.kind == "monitor") {
    s = "waiting for Monitor " + Hex(w.object);
    s += w.owner ? " owned by " + ThreadTitle(snap.threads[*w.owner]) : std::string(" (owner not among the threads)");
  } else if ((w.kind == "queue" || w.kind == "condvar") && w.object != 0) {
    s = std::string("waiting ") + (w.operation ? "to " + *w.operation + " " : std::string("on ")) + w.object_type +
        " " + Hex(w.object);
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

// The threads of `ths` (rb_thread_t *) as indexes of the snapshot's threads, in order; those not among them counted.
std::vector<size_t> Listed(const DumpSnapshot& snap, const std::vector<uint64_t>& ths, size_t* unlisted) {
  std::vector<size_t> out;
  for (uint64_t th : ths) {
    auto it = std::find_if(snap.threads.begin(), snap.threads.end(), [&](const DumpedThread& t) { return t.th == th; });
    if (it == snap.threads.end()) {
      (*unlisted)++;
    } else {
      out.push_back(static_cast<size_t>(it - snap.threads.begin()));
    }
  }
  return out;
}

// A Monitor's waiters: the threads whose waiting_for is it, in thread order (the VM keeps them in its Mutex).
std::vector<size_t> MonitorWaiters(const DumpSnapshot& snap, uint64_t monitor) {
  std::vector<size_t> out;
  for (size_t i = 0; i < snap.threads.size(); i++) {
    const auto& w = snap.threads[i].waiting_for;
    if (w && w->kind == "monitor" && w->object == monitor) out.push_back(i);
  }
  return out;
}

std::optional<size_t> MonitorOwner(const DumpSnapshot& snap, const WaitObject& o) {
  for (size_t i = 0; i < snap.threads.size(); i++) {
    if (o.owner_fiber != 0 && snap.threads[i].fiber == o.owner_fiber) return i;
  }
  return std::nullopt;
}

nlohmann::json Tids(const DumpSnapshot& snap, const std::vector<size_t>& idx) {
  nlohmann::json a = nlohmann::json::array();
  for (size_t i : idx) a.push_back(snap.threads[i].native_tid);
  return a;
}

nlohmann::json WaitObjectsJson(const DumpSnapshot& snap) {
  nlohmann::json out = nlohmann::json::array();
  for (const WaitObject& o : snap.wait_objects) {
    size_t unlisted = 0;
    nlohmann::json j = {{"object", Hex(o.object)}, {"type", WaitObjectClass(o.type)}};
    if (o.type == "monitor") {
      std::optional<size_t> owner = MonitorOwner(snap, o);
      j["owner_native_tid"] = owner ? nlohmann::json(snap.threads[*owner].native_tid) : nlohmann::json();
      j["waiters_native_tids"] = Tids(snap, MonitorWaiters(snap, o.object));
    } else {
      j["waiters_native_tids"] = Tids(snap, Listed(snap, o.waiters, &unlisted));
      if (o.type == "sized_queue") j["push_waiters_native_tids"] = Tids(snap, Listed(snap, o.push_waiters, &unlisted));
      j["unlisted_waiters"] = unlisted;
      j["lists_complete"] = o.lists_complete;
    }
    out.push_back(std::move(j));
  }
  return out;
}

std::string TitleList(const DumpSnapshot& snap, const std::vector<size_t>& idx) {
  std::string s;
  for (size_t k = 0; k < idx.size(); k++) s += (k == 0 ? ": " : ", ") + ThreadTitle(snap.threads[idx[k]]);
  return s;
}

void PrintWaitObjects(const DumpSnapshot& snap, std::ostream& out) {
  if (snap.wait_objects.empty()) return;
  out << "Waited on:\n";
  for (const WaitObject& o : snap.wait_objects) {
    out << "  " << WaitObjectClass(o.type) << " " << Hex(o.object);
    if (o.type == "monitor") {
      std::optional<size_t> owner = MonitorOwner(snap, o);
      const std::vector<size_t> w = MonitorWaiters(snap, o.object);
      out << (owner ? " owned by " + ThreadTitle(snap.threads[*owner]) : std::string(", owner not among the threads"))
          << "; " << w.size() << " waiting to enter" << TitleList(snap, w) << "\n";
      continue;
    }
    size_t unlisted = 0;
    const std::vector<size_t> pop = Listed(snap, o.waiters, &unlisted);
    const std::vector<size_t> push = Listed(snap, o.push_waiters, &unlisted);
    out << ": " << pop.size() << (o.type == "condvar" ? " waiting" : " waiting to pop") << TitleList(snap, pop);
    if (o.type == "sized_queue") out << "; " << push.size() << " waiting to push" << TitleList(snap, push);
    if (unlisted != 0) out << "; " << unlisted << " not among the threads";
    if (!o.lists_complete) out << " (its wait list could not be read whole)";
    out << "\n";
  }
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
          {"waited_on", WaitObjectsJson(snap)},
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
  PrintWaitObjects(snap, out);
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
