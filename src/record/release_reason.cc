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
constexpr std::array<std::pair<std::string_view, StackReleaseReason>, 27> kExact = {{
    {"Kernel#sleep", StackReleaseReason::kSleep},
    {"Thread::Mutex#lock", StackReleaseReason::kMutex},
    {"Thread::Mutex#synchronize", StackReleaseReason::kMutex},
    {"Monitor#enter", StackReleaseReason::kMutex},
    {"Monitor#synchronize", StackReleaseReason::kMutex},
    {"Monitor#mon_enter", StackReleaseReason::kMutex},
    {"Thread::Queue#pop", StackReleaseReason::kQueue},
    {"Thread::Queue#shift", StackReleaseReason::kQueue},
    {"Thread::Queue#deq", StackReleaseReason::kQueue},
    {"Thread::SizedQueue#pop", StackReleaseReason::kQueue},
    {"Thread::SizedQueue#shift", StackReleaseReason::kQueue},
    {"Thread::SizedQueue#deq", StackReleaseReason::kQueue},
    {"Thread::SizedQueue#push", StackReleaseReason::kQueue},
    {"Thread::SizedQueue#<<", StackReleaseReason::kQueue},
    {"Thread::SizedQueue#enq", StackReleaseReason::kQueue},
    {"Thread::ConditionVariable#wait", StackReleaseReason::kConditionVariable},
    {"Thread::Mutex#sleep", StackReleaseReason::kConditionVariable},  // what ConditionVariable#wait blocks in
    {"MonitorMixin::ConditionVariable#wait", StackReleaseReason::kConditionVariable},
    {"Thread#join", StackReleaseReason::kJoin},
    {"Thread#value", StackReleaseReason::kJoin},
    {"Thread.pass", StackReleaseReason::kPass},
    {"Process.wait", StackReleaseReason::kProcessWait},
    {"Process.wait2", StackReleaseReason::kProcessWait},
    {"Process.waitpid", StackReleaseReason::kProcessWait},
    {"Process.waitpid2", StackReleaseReason::kProcessWait},
    {"Process.waitall", StackReleaseReason::kProcessWait},
    {"Process::Status.wait", StackReleaseReason::kProcessWait},
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

std::string_view ReleaseReasonString(StackReleaseReason reason) {
  switch (reason) {
    case StackReleaseReason::kSleep: return "sleep";
    case StackReleaseReason::kIo: return "io";
    case StackReleaseReason::kMutex: return "mutex";
    case StackReleaseReason::kQueue: return "queue";
    case StackReleaseReason::kConditionVariable: return "condition_variable";
    case StackReleaseReason::kJoin: return "join";
    case StackReleaseReason::kPass: return "pass";
    case StackReleaseReason::kProcessWait: return "process_wait";
    case StackReleaseReason::kTimeslice: return "timeslice";
    case StackReleaseReason::kExit: return "exit";
    case StackReleaseReason::kUnknown: break;
  }
  return "unknown";
}

ReleaseSite ClassifyReleaseSite(std::string_view function) {
  if (function == "rb_thread_schedule_limits") return ReleaseSite::kYield;
  if (function == "thread_start_func_2") return ReleaseSite::kThreadEnd;
  return ReleaseSite::kOther;
}

StackReleaseReason DeriveReleaseReason(std::span<const FrameInfo> frames, ReleaseSite site) {
  // The site alone: the release at the end of thread_start_func_2 is the thread finishing, whatever the stack.
  if (site == ReleaseSite::kThreadEnd) return StackReleaseReason::kExit;
  for (const FrameInfo& f : frames) {
    if (!IsLibraryFrame(f)) break;
    for (const auto& [label, reason] : kExact) {
      if (f.label == label) return reason;
    }
    if (IsIoFrame(f)) return StackReleaseReason::kIo;
  }
  // A yield with no Thread.pass on the stack: the timer thread asked the running thread to give others a turn
  // (the ready queue was non-empty when its time slice ran out); the program was not blocked.
  if (site == ReleaseSite::kYield) return StackReleaseReason::kTimeslice;
  return StackReleaseReason::kUnknown;
}

}  // namespace rvbpfd
