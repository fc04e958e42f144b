// Hold the recorded process at its exit (and, on request, at its VM's teardown and its GCs) until its last records
// are read and their frames named: launch mode's command, and attach mode's target (--hold, on by default). The
// frames of a stack are named from the target's memory (session/stack_resolver.h); records of a process's last
// milliseconds are still in the BPF ring when it exits, and once its memory is gone they can never be named.
//
// How: the launched child is seized with ptrace before it execs (an attached target once the probes are loaded;
// PTRACE_SEIZE stops nothing), with PTRACE_O_TRACEEXIT only. Its
// main thread then stops once, early in its exit (the kernel's PTRACE_EVENT_EXIT stop: registers and memory still
// there, other threads already told to die); the recorder drains the ring, naming every frame, and Release() detaches,
// which lets the exit go on. Nothing else changes for the command: no exec, fork or clone is traced (its children are
// never seized), a signal that stops its main thread for the tracer (a signal-delivery stop) is passed on at once with
// PTRACE_CONT, and a job-control stop is kept (PTRACE_LISTEN) until SIGCONT, as without a tracer. Every path detaches:
// Release, the destructor (a running tracee is interrupted first, bounded), and the kernel itself should rvbpfd die.
// A process killed with SIGKILL (or by another thread's exit_group) makes no exit stop: nothing is held then.
//
// Waiting: Service() consumes only stop notifications (waitid WSTOPPED), never a child's exit, so HeldChild::Reap
// stays the one that reaps rvbpfd's own child. While traced, HeldChild::Reap must not run (its waitpid would take
// ptrace stops for an exit): the recorder asks Traced() first. A tracee that is not rvbpfd's child (attach mode) and
// ends without an exit stop (SIGKILL) is a zombie its tracer must wait for before its own parent can: Service does
// that wait (the kernel then hands it to its parent), or the parent would wait for rvbpfd's exit.
//
// Attach mode's target is seized while it runs (PTRACE_SEIZE stops nothing); a target traced already (a debugger,
// strace) cannot be seized (EPERM) and is recorded without the hold.
//
// Threading: every call from the thread that seized (ptrace requests must come from the tracer thread).
#ifndef RVBPFD_SRC_RECORD_EXIT_HOLD_H_
#define RVBPFD_SRC_RECORD_EXIT_HOLD_H_

#include <signal.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "common/error.h"

namespace rvbpfd {

// The ptrace and waitid calls ExitHold makes (the system's in production, fakes in tests). Each returns 0 or an
// errno value.
class PtraceOps {
 public:
  virtual ~PtraceOps() = default;
  virtual int Seize(pid_t pid, unsigned long options) = 0;
  virtual int Cont(pid_t pid, int sig) = 0;
  virtual int Listen(pid_t pid) = 0;
  virtual int Interrupt(pid_t pid) = 0;
  virtual int Detach(pid_t pid, int sig) = 0;
  // waitid(P_PID, pid, info, options | WNOHANG | __WALL); info->si_pid is 0 when nothing was waiting.
  virtual int WaitNoHang(pid_t pid, int options, siginfo_t* info) = 0;
  // Sleeps (the destructor's bounded wait for an interrupted tracee).
  virtual void SleepNs(uint64_t ns) = 0;
};
std::unique_ptr<PtraceOps> SystemPtraceOps();

class ExitHold {
 public:
  enum class State : uint8_t {
    kRunning,   // traced, running (or in a job-control stop)
    kAtExit,    // held at its exit stop: drain the ring, then Release()
    kAtTeardown,  // held at the VM's teardown (the hold signal's stop): drain the ring, then Release()
    kReleased,  // detached (after the exit stop, or by the destructor)
    kGone,      // exited without an exit stop (SIGKILL): no longer traced, waiting to be reaped
  };
  // How long the destructor waits for a running tracee to stop after PTRACE_INTERRUPT before it gives up (the kernel
  // detaches it when rvbpfd exits).
  static constexpr uint64_t kDetachWaitNs = 200'000'000;

  // Seizes `pid` (rvbpfd's own child, not yet exec'd). Errors (e.g. EPERM without CAP_SYS_PTRACE for a command that
  // runs as another user) are kNoPrivilege: the caller records without the hold.
  // `hold_signal`: a signal whose delivery stop is a hold too (kAtTeardown; 0: none): the VM's teardown probe raises
  // it (RV_TEARDOWN_SIGNAL) before the VM frees the heap, which comes well before the exit stop. Release passes it
  // on (ignored by default: a program that traps it gets it as it would untraced).
  // `own_child`: `pid` is rvbpfd's child (launch mode), reaped by its HeldChild; false: another process's (attach).
  static Result<std::unique_ptr<ExitHold>> Seize(pid_t pid, std::unique_ptr<PtraceOps> ops, int hold_signal = 0,
                                                 bool own_child = true);
  ExitHold(const ExitHold&) = delete;
  ExitHold& operator=(const ExitHold&) = delete;
  ~ExitHold();

  // Non-blocking: handles every stop waiting (passes signals on, keeps job-control stops, notes the exit stop) and
  // whether the child exited untraced. Cheap (one or two waitid calls): call it often.
  State Service();
  // Lets a held child go on: at its exit stop it is detached, at the teardown stop continued with the signal (still
  // traced, for its exit stop); nothing in any other state.
  void Release();
  State state() const { return state_; }
  // Whether waits for the child are ExitHold's (see above).
  bool Traced() const {
    return state_ == State::kRunning || state_ == State::kAtExit || state_ == State::kAtTeardown;
  }
  bool Held() const { return state_ == State::kAtExit || state_ == State::kAtTeardown; }
  // Signals passed on to the command, for tests and counters.
  uint64_t signals_forwarded() const { return signals_forwarded_; }

 private:
  ExitHold(pid_t pid, std::unique_ptr<PtraceOps> ops, int hold_signal, bool own_child)
      : pid_(pid), ops_(std::move(ops)), hold_signal_(hold_signal), own_child_(own_child) {}
  // One stop (waitid's si_status of a CLD_TRAPPED child).
  void OnStop(int status);
  // Destructor path for a running tracee: interrupt, wait for a stop (bounded), detach passing a pending signal on.
  void InterruptAndDetach();

  pid_t pid_;
  std::unique_ptr<PtraceOps> ops_;
  int hold_signal_ = 0;
  bool own_child_ = true;
  State state_ = State::kRunning;
  uint64_t signals_forwarded_ = 0;
};

// Installs a SIGCHLD handler that does nothing (SA_RESTART), so that a stop of the traced command interrupts the
// recorder's poll of the ring (poll is never restarted) and is served at once rather than at the next 20 ms tick.
void WakeOnChildStops();

// The stop a waitid si_status (CLD_TRAPPED) describes, for a tracee seized with PTRACE_SEIZE.
enum class TraceeStop : uint8_t { kExit, kGroupStop, kOtherEvent, kSignal };
TraceeStop ClassifyStop(int status);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_RECORD_EXIT_HOLD_H_
