#include "record/exit_hold.h"

#include <sys/ptrace.h>
#include <sys/wait.h>
#include <time.h>

#include <cerrno>
#include <string>
#include <utility>

namespace rvbpfd {
namespace {

class SystemPtrace : public PtraceOps {
 public:
  int Seize(pid_t pid, unsigned long options) override {
    return ptrace(PTRACE_SEIZE, pid, nullptr, reinterpret_cast<void*>(options)) == 0 ? 0 : errno;
  }
  int Cont(pid_t pid, int sig) override {
    return ptrace(PTRACE_CONT, pid, nullptr, reinterpret_cast<void*>(static_cast<long>(sig))) == 0 ? 0 : errno;
  }
  int Listen(pid_t pid) override { return ptrace(PTRACE_LISTEN, pid, nullptr, nullptr) == 0 ? 0 : errno; }
  int Interrupt(pid_t pid) override { return ptrace(PTRACE_INTERRUPT, pid, nullptr, nullptr) == 0 ? 0 : errno; }
  int Detach(pid_t pid, int sig) override {
    return ptrace(PTRACE_DETACH, pid, nullptr, reinterpret_cast<void*>(static_cast<long>(sig))) == 0 ? 0 : errno;
  }
  int WaitNoHang(pid_t pid, int options, siginfo_t* info) override {
    *info = siginfo_t{};
    int r;
    do {
      r = waitid(P_PID, static_cast<id_t>(pid), info, options | WNOHANG | __WALL);
    } while (r != 0 && errno == EINTR);
    return r == 0 ? 0 : errno;
  }
  void SleepNs(uint64_t ns) override {
    timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
};

void IgnoreSignal(int) {}

bool IsJobControlStop(int sig) { return sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU; }

// Whether an exit peek (waitid WEXITED | WNOWAIT) saw the child end. For a traced child the kernel reports a pending
// ptrace stop to that call too (CLD_TRAPPED: "ptrace'd stopped tasks regardless of options"), so si_pid alone does
// not say it exited: a stop that arrives between Service's stop wait and its peek would pass for an exit, and the
// reaper's waitpid would then take that stop for the exit status (the command then looked exited while it ran on).
bool PeekSawExit(const siginfo_t& info, pid_t pid) {
  return info.si_pid == pid &&
         (info.si_code == CLD_EXITED || info.si_code == CLD_KILLED || info.si_code == CLD_DUMPED);
}

}  // namespace

std::unique_ptr<PtraceOps> SystemPtraceOps() { return std::make_unique<SystemPtrace>(); }

void WakeOnChildStops() {
  struct sigaction sa {};
  sa.sa_handler = IgnoreSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGCHLD, &sa, nullptr);
}

TraceeStop ClassifyStop(int status) {
  const int event = (status >> 8) & 0xff;
  const int sig = status & 0x7f;
  if (event == PTRACE_EVENT_EXIT) return TraceeStop::kExit;
  if (event == PTRACE_EVENT_STOP) return IsJobControlStop(sig) ? TraceeStop::kGroupStop : TraceeStop::kOtherEvent;
  if (event != 0) return TraceeStop::kOtherEvent;
  return TraceeStop::kSignal;
}

Result<std::unique_ptr<ExitHold>> ExitHold::Seize(pid_t pid, std::unique_ptr<PtraceOps> ops, int hold_signal,
                                                  bool own_child) {
  if (int err = ops->Seize(pid, PTRACE_O_TRACEEXIT); err != 0) {
    return Error(ErrorCode::kNoPrivilege,
                 ErrnoMessage(std::string(own_child ? "holding the launched command" : "holding the target") +
                                  " at its exit (ptrace seize of pid " + std::to_string(pid) + ")",
                              err) +
                     (err == EPERM && !own_child ? " (traced by a debugger already, or ptrace is restricted)" : ""));
  }
  return std::unique_ptr<ExitHold>(new ExitHold(pid, std::move(ops), hold_signal, own_child));
}

void ExitHold::OnStop(int status) {
  switch (ClassifyStop(status)) {
    case TraceeStop::kExit:
      state_ = State::kAtExit;  // held until Release
      return;
    case TraceeStop::kGroupStop:
      ops_->Listen(pid_);  // stays stopped as it would untraced, until SIGCONT
      return;
    case TraceeStop::kOtherEvent:
      ops_->Cont(pid_, 0);
      return;
    case TraceeStop::kSignal:
      if (hold_signal_ != 0 && (status & 0x7f) == hold_signal_) {
        state_ = State::kAtTeardown;  // held until Release, which passes the signal on
        return;
      }
      ++signals_forwarded_;
      ops_->Cont(pid_, status & 0x7f);  // the signal the tracee was about to take, taken now
      return;
  }
}

ExitHold::State ExitHold::Service() {
  while (state_ == State::kRunning) {
    siginfo_t info;
    if (ops_->WaitNoHang(pid_, WSTOPPED, &info) != 0 || info.si_pid == 0) break;
    if (info.si_code == CLD_TRAPPED) OnStop(info.si_status);
  }
  if (state_ == State::kRunning) {
    // Gone without an exit stop (SIGKILL): peek, leaving the zombie to HeldChild::Reap.
    siginfo_t info;
    if (ops_->WaitNoHang(pid_, WEXITED | WNOWAIT, &info) == 0 && PeekSawExit(info, pid_)) {
      state_ = State::kGone;
      // Not rvbpfd's child: the tracer's wait lets the kernel hand the zombie to its parent.
      if (!own_child_) ops_->WaitNoHang(pid_, WEXITED, &info);
    }
  }
  return state_;
}

void ExitHold::Release() {
  if (state_ == State::kAtTeardown) {
    ++signals_forwarded_;
    ops_->Cont(pid_, hold_signal_);
    state_ = State::kRunning;
    return;
  }
  if (state_ != State::kAtExit) return;
  ops_->Detach(pid_, 0);  // ESRCH (killed meanwhile) changes nothing: it is not held any more either way
  state_ = State::kReleased;
}

void ExitHold::InterruptAndDetach() {
  if (ops_->Interrupt(pid_) != 0) return;  // gone: nothing traced any more
  for (uint64_t waited = 0; waited < kDetachWaitNs; waited += 1'000'000) {
    siginfo_t info;
    if (ops_->WaitNoHang(pid_, WSTOPPED, &info) == 0 && info.si_pid == pid_ && info.si_code == CLD_TRAPPED) {
      const int status = info.si_status;
      // A signal it was about to take goes with it; any other stop (the interrupt, a group stop, its exit) needs none.
      ops_->Detach(pid_, ClassifyStop(status) == TraceeStop::kSignal ? (status & 0x7f) : 0);
      return;
    }
    siginfo_t exited;
    if (ops_->WaitNoHang(pid_, WEXITED | WNOWAIT, &exited) == 0 && PeekSawExit(exited, pid_)) return;
    ops_->SleepNs(1'000'000);
  }
}

ExitHold::~ExitHold() {
  switch (state_) {
    case State::kAtExit:
      Release();
      break;
    case State::kAtTeardown:
      ops_->Detach(pid_, hold_signal_);
      break;
    case State::kRunning:
      InterruptAndDetach();
      break;
    case State::kReleased:
    case State::kGone:
      break;
  }
}

}  // namespace rvbpfd
