#include "dump/dump_analysis.h"

#include <algorithm>
#include <map>

#include "record/release_reason.h"
#include "trace/release_reason.h"

namespace rvbpfd {
namespace {

std::string StateOf(const DumpedThread& t) {
  if (t.status == RubyThreadStatus::kKilled) return "exited";
  if (t.holds_gvl) return t.task_state == 'S' || t.task_state == 'D' ? "holding_gvl" : "running";
  if (t.gvl_queue_position >= 0) return "waiting_gvl";
  if (!t.status || t.status == RubyThreadStatus::kStopped || t.status == RubyThreadStatus::kStoppedForever) {
    return "blocked";
  }
  return "runnable";
}

// waiting_for's kind for a blocked thread's release reason; empty: none.
std::string KindOf(ReleaseReason r) {
  switch (r) {
    case ReleaseReason::kWaitingMutex: return "mutex";
    case ReleaseReason::kQueue: return "queue";
    case ReleaseReason::kConditionVariable: return "condvar";
    case ReleaseReason::kJoin: return "join";
    case ReleaseReason::kIo: return "io";
    case ReleaseReason::kSleeping: return "sleep";
    case ReleaseReason::kProcessWait: return "process_wait";
    default: return "";
  }
}

// The Queue, SizedQueue, ConditionVariable or Monitor a blocked thread waits on, where its stack's receiver is one
// that agrees with its release reason: a queue for "queue" (pop or push: the wait list it is in), a condvar for
// "condvar", a Monitor whose own Mutex it sleeps to lock for "mutex" (then "monitor", owned as that Mutex is).
void AttachWaitObject(const DumpedThread& t, const std::map<uint64_t, const WaitObject*>& objects, WaitingFor* w) {
  auto it = objects.find(t.wait_object);
  if (t.wait_object == 0 || it == objects.end()) return;
  const WaitObject& o = *it->second;
  const bool queue = o.type == "queue" || o.type == "sized_queue";
  if (w->kind == "queue" && queue) {
    if (std::find(o.push_waiters.begin(), o.push_waiters.end(), t.th) != o.push_waiters.end()) {
      w->operation = "push";
    } else if (std::find(o.waiters.begin(), o.waiters.end(), t.th) != o.waiters.end()) {
      w->operation = "pop";
    }
  } else if (w->kind == "mutex" && o.type == "monitor" && o.monitor_mutex != 0 && o.monitor_mutex == t.locking_mutex) {
    w->kind = "monitor";
  } else if (!(w->kind == "condvar" && o.type == "condvar")) {
    return;
  }
  w->object = o.object;
  w->object_type = WaitObjectClass(o.type);
}

}  // namespace

const char* WaitObjectClass(std::string_view type) {
  if (type == "queue") return "Thread::Queue";
  if (type == "sized_queue") return "Thread::SizedQueue";
  if (type == "condvar") return "Thread::ConditionVariable";
  if (type == "monitor") return "Monitor";
  return "?";
}

std::vector<std::vector<size_t>> FindWaitCycles(const std::vector<std::optional<size_t>>& waits_for) {
  const size_t n = waits_for.size();
  // 0: unvisited, 1: on the current path, 2: done.
  std::vector<uint8_t> mark(n, 0);
  std::vector<std::vector<size_t>> cycles;
  for (size_t start = 0; start < n; start++) {
    std::vector<size_t> path;
    size_t v = start;
    while (v < n && mark[v] == 0) {
      mark[v] = 1;
      path.push_back(v);
      if (!waits_for[v]) break;
      v = *waits_for[v];
    }
    if (v < n && mark[v] == 1 && waits_for[path.back()] && *waits_for[path.back()] == v) {
      // The path came back to v, which is on it: the cycle is the path from v on.
      std::vector<size_t> cycle(std::find(path.begin(), path.end(), v), path.end());
      std::rotate(cycle.begin(), std::min_element(cycle.begin(), cycle.end()), cycle.end());
      cycles.push_back(std::move(cycle));
    }
    for (size_t p : path) mark[p] = 2;
  }
  std::sort(cycles.begin(), cycles.end());
  return cycles;
}

void DeriveStates(DumpSnapshot* snap) {
  std::map<uint64_t, size_t> by_fiber, by_th;
  for (size_t i = 0; i < snap->threads.size(); i++) {
    if (snap->threads[i].fiber != 0) by_fiber[snap->threads[i].fiber] = i;
    by_th[snap->threads[i].th] = i;
  }
  // Who joins whom: a joiner appears in its target's join list.
  std::map<size_t, size_t> joins;
  for (size_t i = 0; i < snap->threads.size(); i++) {
    for (uint64_t j : snap->threads[i].joined_by) {
      if (auto it = by_th.find(j); it != by_th.end()) joins[it->second] = i;
    }
  }
  std::map<uint64_t, const WaitObject*> objects;
  for (const WaitObject& o : snap->wait_objects) objects[o.object] = &o;
  std::vector<std::optional<size_t>> waits_for(snap->threads.size());
  for (size_t i = 0; i < snap->threads.size(); i++) {
    DumpedThread& t = snap->threads[i];
    t.state = StateOf(t);
    t.reason.reset();
    if (t.state == "running" || t.state == "waiting_gvl" || t.state == "exited") {
      t.waiting_for.reset();
      continue;
    }
    const ReleaseReason r = DeriveReleaseReason(t.frames, ReleaseSite::kOther);
    if (r != ReleaseReason::kUnknown) t.reason = std::string(ReleaseReasonTraceName(r));
    WaitingFor w = t.waiting_for.value_or(WaitingFor{});
    w.kind = KindOf(r);
    w.owner.reset();
    w.object = 0;
    w.object_type.clear();
    w.operation.reset();
    if (t.locking_mutex != 0) {
      // Sleeping to lock a Mutex (Mutex#lock, #synchronize, re-locking after ConditionVariable#wait, or a Monitor's).
      w.kind = "mutex";
      w.object = t.locking_mutex;
      w.object_type = "Thread::Mutex";
      if (auto it = by_fiber.find(t.mutex_owner_fiber); t.mutex_owner_fiber != 0 && it != by_fiber.end()) {
        w.owner = it->second;
      }
    } else if (r == ReleaseReason::kJoin) {
      if (auto it = joins.find(i); it != joins.end()) w.owner = it->second;
    }
    AttachWaitObject(t, objects, &w);
    if (w.kind != "io") {
      w.fd.reset();
      w.fd_target.reset();
    }
    if (w.kind.empty()) {
      t.waiting_for.reset();
    } else {
      t.waiting_for = std::move(w);
      if (t.state == "blocked" && (t.waiting_for->kind == "mutex" || t.waiting_for->kind == "monitor" ||
                                   t.waiting_for->kind == "join")) {
        waits_for[i] = t.waiting_for->owner;
      }
    }
  }
  snap->deadlocks = FindWaitCycles(waits_for);
}

}  // namespace rvbpfd
