#include "record/release_reason.h"

#include <array>
#include <utility>

namespace rvbpfd {
namespace {

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// The Ruby-level wrappers of monitor.rb (the monitor extension's Ruby half, MonitorMixin) around Monitor's C methods:
// ActiveRecord's pool and many gems wait through them, so they count as library frames when they come from a file
// named monitor.rb.
bool IsMonitorWrapper(const FrameInfo& f) {
  if (f.kind != FrameKind::kRuby || !EndsWith(f.path, "/monitor.rb")) return false;
  for (std::string_view l : {"MonitorMixin::ConditionVariable#wait", "MonitorMixin::ConditionVariable#wait_while",
                             "MonitorMixin::ConditionVariable#wait_until", "MonitorMixin#mon_synchronize",
                             "MonitorMixin#mon_enter"}) {
    if (f.label == l) return true;
  }
  return false;
}

// Library frames: C functions, the Ruby-level builtins CRuby ships in <internal:...> (Thread::Queue#pop,
// Kernel#loop, ... on 3.3+) and monitor.rb's wrappers. Anything else is program code, which ends the search.
bool IsLibraryFrame(const FrameInfo& f) { return IsVmLibraryFrame(f) || IsMonitorWrapper(f); }

// Exact labels (rb_profile_frame_full_label) of methods that block the calling thread.
constexpr std::array<std::pair<std::string_view, ReleaseReason>, 34> kExact = {{
    {"Kernel#sleep", ReleaseReason::kSleeping},
    {"Thread::Mutex#lock", ReleaseReason::kWaitingMutex},
    {"Thread::Mutex#synchronize", ReleaseReason::kWaitingMutex},
    {"Monitor#enter", ReleaseReason::kWaitingMutex},
    {"Monitor#synchronize", ReleaseReason::kWaitingMutex},
    {"Monitor#mon_enter", ReleaseReason::kWaitingMutex},
    {"MonitorMixin#mon_synchronize", ReleaseReason::kWaitingMutex},
    {"MonitorMixin#mon_enter", ReleaseReason::kWaitingMutex},
    {"Thread::Queue#pop", ReleaseReason::kQueue},
    {"Thread::Queue#shift", ReleaseReason::kQueue},
    {"Thread::Queue#deq", ReleaseReason::kQueue},
    {"Thread::SizedQueue#pop", ReleaseReason::kQueue},
    {"Thread::SizedQueue#shift", ReleaseReason::kQueue},
    {"Thread::SizedQueue#deq", ReleaseReason::kQueue},
    {"Thread::SizedQueue#push", ReleaseReason::kQueue},
    {"Thread::SizedQueue#<<", ReleaseReason::kQueue},
    {"Thread::SizedQueue#enq", ReleaseReason::kQueue},
    {"Thread::ConditionVariable#wait", ReleaseReason::kConditionVariable},
    {"Thread::Mutex#sleep", ReleaseReason::kConditionVariable},  // what ConditionVariable#wait blocks in
    {"Monitor#wait_for_cond", ReleaseReason::kConditionVariable},  // what MonitorMixin::ConditionVariable#wait calls
    {"MonitorMixin::ConditionVariable#wait", ReleaseReason::kConditionVariable},
    {"MonitorMixin::ConditionVariable#wait_while", ReleaseReason::kConditionVariable},
    {"MonitorMixin::ConditionVariable#wait_until", ReleaseReason::kConditionVariable},
    {"Thread#join", ReleaseReason::kJoin},
    {"Thread#value", ReleaseReason::kJoin},
    {"Thread.pass", ReleaseReason::kPass},
    {"Process.wait", ReleaseReason::kProcessWait},
    {"Process.wait2", ReleaseReason::kProcessWait},
    {"Process.waitpid", ReleaseReason::kProcessWait},
    {"Process.waitpid2", ReleaseReason::kProcessWait},
    {"Process.waitall", ReleaseReason::kProcessWait},
    {"Process::Status.wait", ReleaseReason::kProcessWait},
    {"NIO::Selector#select", ReleaseReason::kIo},  // nio4r's C extension (Puma's reactor): epoll/kqueue via libev
}};

// IO: any library method of IO or its subclasses (C, or <internal:io> on 3.4+), Dir, socket classes, Kernel's
// console methods, select.
bool IsIoFrame(const FrameInfo& f) {
  const std::string_view l = f.label;
  for (std::string_view p : {"IO#", "IO.", "File#", "File.", "Dir#", "Dir.", "BasicSocket#", "Socket#", "TCPSocket#", "TCPServer#",
                             "UNIXSocket#", "UNIXServer#", "UDPSocket#", "IPSocket#", "OpenSSL::SSL::SSLSocket#", "Socket.", "Addrinfo#", "Addrinfo."}) {
    if (StartsWith(l, p)) return true;
  }
  for (std::string_view k : {"Kernel#gets", "Kernel#readline", "Kernel#readlines", "Kernel#puts", "Kernel#print",
                             "Kernel#p", "Kernel#select", "Kernel#open", "Kernel#`", "Kernel#system"}) {
    if (l == k) return true;
  }
  return false;
}

// "Puma::ThreadPool#spawn_thread" for "block (2 levels) in Puma::ThreadPool#spawn_thread": the method a frame's code
// is in.
std::string_view MethodOfLabel(std::string_view label) {
  if (!StartsWith(label, "block ")) return label;
  const size_t in = label.find(" in ");
  return in == std::string_view::npos ? label : label.substr(in + 4);
}

// A wait (mutex, condition variable, queue) refined by the program method that waits, its innermost program frame:
//   - Puma's pool thread waiting for a request (puma/thread_pool.rb, spawn_thread's `not_empty.wait mutex`): idle;
//   - ActiveRecord's connection pool (connection_pool/queue.rb `Queue#wait_poll`'s `@cond.wait`, its
//     BiasedConditionVariable, or the pool's monitor): db_pool.
ReleaseReason RefineWait(ReleaseReason found, std::string_view program_label) {
  if (found != ReleaseReason::kConditionVariable && found != ReleaseReason::kWaitingMutex &&
      found != ReleaseReason::kQueue) {
    return found;
  }
  const std::string_view method = MethodOfLabel(program_label);
  // A contended pool mutex is contention, not idleness: only a wait for a signal or an item is idle.
  if (method == "Puma::ThreadPool#spawn_thread" && found != ReleaseReason::kWaitingMutex) return ReleaseReason::kIdle;
  constexpr std::string_view kPool = "ActiveRecord::ConnectionAdapters::ConnectionPool";
  if (StartsWith(method, kPool) && method.size() > kPool.size() &&
      (method[kPool.size()] == '#' || method[kPool.size()] == ':')) {
    return ReleaseReason::kDbPool;
  }
  return found;
}

}  // namespace

ReleaseSite ClassifyReleaseSite(std::string_view function) {
  if (function == "rb_thread_schedule_limits") return ReleaseSite::kYield;
  if (function == "thread_start_func_2") return ReleaseSite::kThreadEnd;
  return ReleaseSite::kOther;
}

ReleaseReason DeriveReleaseReason(std::span<const FrameInfo> frames, ReleaseSite site) {
  // The site alone: the release at the end of thread_start_func_2 is the thread finishing, whatever the stack.
  if (site == ReleaseSite::kThreadEnd) return ReleaseReason::kExit;
  ReleaseReason found = ReleaseReason::kUnknown;
  size_t i = 0;
  for (; i < frames.size() && IsLibraryFrame(frames[i]); ++i) {
    if (found != ReleaseReason::kUnknown) continue;  // decided; go on to the innermost program frame
    for (const auto& [label, reason] : kExact) {
      if (frames[i].label == label) found = reason;
    }
    if (found == ReleaseReason::kUnknown && IsIoFrame(frames[i])) found = ReleaseReason::kIo;
  }
  if (found != ReleaseReason::kUnknown) {
    return i < frames.size() ? RefineWait(found, frames[i].label) : found;
  }
  // A yield with no Thread.pass on the stack: the timer thread asked the running thread to give others a turn
  // (the ready queue was non-empty when its time slice ran out); the program was not blocked.
  if (site == ReleaseSite::kYield) return ReleaseReason::kTimeslice;
  return ReleaseReason::kUnknown;
}

}  // namespace rvbpfd
