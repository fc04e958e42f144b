#include "session/thread_info.h"

#include <chrono>
#include <utility>

#include "common/deadline.h"
#include "common/label_bound.h"
#include "stacks/symbolizer.h"
#include "target/pid_namespace.h"

namespace rvbpfd {
namespace {

// A /proc read of another process's task that takes longer than this is abandoned (common/deadline.h).
constexpr std::chrono::milliseconds kProcReadTimeout{200};

}  // namespace

std::optional<ThreadInfo> ThreadInfoTracker::Observe(const TraceEvent& e) {
  if (!e.ruby_thread) return std::nullopt;
  // Only events the thread runs itself say which native thread it is on now (STARTED and READY run elsewhere).
  const bool own = e.native_tid && e.probe_tid == e.native_tid;
  return ObserveThread(*e.ruby_thread, e.t_ns, e.event == EventName::kThreadExited, own ? *e.native_tid : 0, e.th);
}

std::optional<ThreadInfo> ThreadInfoTracker::ObserveThread(uint64_t key, uint64_t t_ns, bool exited, uint32_t own_tid,
                                                           uint64_t th) {
  if (exited) {
    last_.erase(key);
    return std::nullopt;
  }
  if (own_tid == 0) return std::nullopt;
  auto [it, first] = last_.try_emplace(key);
  State& st = it->second;
  if (!first && t_ns < st.read_at_ns + kRefreshNs) return std::nullopt;
  st.read_at_ns = t_ns;
  ThreadInfo info;
  if (sources_.ruby_name && th != 0) info.name = sources_.ruby_name(th);
  if (sources_.native_name) info.native_name = sources_.native_name(own_tid);
  if (sources_.ns_tid && st.ns_tid_of != own_tid) {
    info.ns_tid = sources_.ns_tid(own_tid);
    if (info.ns_tid) st.ns_tid_of = own_tid;
  }
  return info;
}

std::optional<std::string> ReadRubyThreadName(MemoryReader& mem, const RubyOffsets& offsets, uint64_t th) {
  if (offsets.thread_name == RubyOffsets::kNoThreadName || th == 0) return std::nullopt;
  uint64_t value = 0;
  if (!mem.ReadValue(th + offsets.thread_name, &value)) return std::nullopt;
  // nil and the other special constants are not heap objects; a name is a String (RVALUEs are 8-byte aligned).
  if (value == 0 || (value & 7) != 0) return std::nullopt;
  std::optional<std::string> name = Symbolizer(&mem, offsets, 0).ReadString(value);
  if (name) BoundLabel(&*name);
  return name;
}

ThreadInfoTracker::Sources ProcThreadInfoSources(int pid, ProcFs procfs, bool own_namespace,
                                                 std::shared_ptr<DeadlineWorker> worker) {
  if (!worker) worker = std::make_shared<DeadlineWorker>();
  ThreadInfoTracker::Sources s;
  s.native_name = [worker, pid, procfs](uint32_t tid) -> std::optional<std::string> {
    DeadlineResult<std::optional<std::string>> r = worker->Run<std::optional<std::string>>(
        kProcReadTimeout, [pid, procfs, tid] { return ReadTaskComm(procfs, pid, static_cast<int>(tid)); });
    return r.value ? *r.value : std::nullopt;
  };
  if (own_namespace) {
    s.ns_tid = [worker, pid, procfs](uint32_t tid) -> std::optional<uint32_t> {
      DeadlineResult<std::optional<uint32_t>> r = worker->Run<std::optional<uint32_t>>(
          kProcReadTimeout, [pid, procfs, tid] { return ReadTaskNsTid(procfs, pid, static_cast<int>(tid)); });
      return r.value ? *r.value : std::nullopt;
    };
  }
  return s;
}

}  // namespace rvbpfd
