#include "record/release_reason.h"

#include <array>
#include <utility>

namespace rvbpfd {
namespace {

bool StartsWith(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// Library frames: C functions and the Ruby-level builtins CRuby ships in <internal:...> (Thread::Queue#pop,
// Kernel#loop, ... on 3.3+). Anything else is program code, which ends the search.
bool IsLibraryFrame(const FrameInfo& f) {
  return f.kind == FrameKind::kCfunc || (f.kind == FrameKind::kRuby && StartsWith(f.path, "<internal:"));
}

// Exact labels (rb_profile_frame_full_label) of methods that block the calling thread.
constexpr std::array<std::pair<std::string_view, ReleaseReason>, 27> kExact = {{
    {"Kernel#sleep", ReleaseReason::kSleeping},
    {"Thread::Mutex#lock", ReleaseReason::kWaitingMutex},
    {"Thread::Mutex#synchronize", ReleaseReason::kWaitingMutex},
    {"Monitor#enter", ReleaseReason::kWaitingMutex},
    {"Monitor#synchronize", ReleaseReason::kWaitingMutex},
    {"Monitor#mon_enter", ReleaseReason::kWaitingMutex},
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
    {"MonitorMixin::ConditionVariable#wait", ReleaseReason::kConditionVariable},
    {"Thread#join", ReleaseReason::kJoin},
    {"Thread#value", ReleaseReason::kJoin},
    {"Thread.pass", ReleaseReason::kPass},
    {"Process.wait", ReleaseReason::kProcessWait},
    {"Process.wait2", ReleaseReason::kProcessWait},
    {"Process.waitpid", ReleaseReason::kProcessWait},
    {"Process.waitpid2", ReleaseReason::kProcessWait},
    {"Process.waitall", ReleaseReason::kProcessWait},
    {"Process::Status.wait", ReleaseReason::kProcessWait},
}};

// IO: any library method of IO or its subclasses (C, or <internal:io> on 3.4+), Dir, socket classes, Kernel's
// console methods, select.
bool IsIoFrame(const FrameInfo& f) {
  const std::string_view l = f.label;
  for (std::string_view p : {"IO#", "IO.", "File#", "File.", "Dir#", "Dir.", "BasicSocket#", "Socket#", "TCPSocket#", "TCPServer#",
                             "UNIXSocket#", "UNIXServer#", "UDPSocket#", "IPSocket#", "OpenSSL::SSL::SSLSocket#"}) {
    if (StartsWith(l, p)) return true;
  }
  for (std::string_view k : {"Kernel#gets", "Kernel#readline", "Kernel#readlines", "Kernel#puts", "Kernel#print",
                             "Kernel#p", "Kernel#select", "Kernel#open", "Kernel#`", "Kernel#system"}) {
    if (l == k) return true;
  }
  return false;
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
  for (const FrameInfo& f : frames) {
    if (!IsLibraryFrame(f)) break;
    for (const auto& [label, reason] : kExact) {
      if (f.label == label) return reason;
    }
    if (IsIoFrame(f)) return ReleaseReason::kIo;
  }
  // A yield with no Thread.pass on the stack: the timer thread asked the running thread to give others a turn
  // (the ready queue was non-empty when its time slice ran out); the program was not blocked.
  if (site == ReleaseSite::kYield) return ReleaseReason::kTimeslice;
  return ReleaseReason::kUnknown;
}

}  // namespace rvbpfd
