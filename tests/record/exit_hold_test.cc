// ExitHold over a scripted PtraceOps: which ptrace request answers each stop, that the exit stop is held until
// Release, and that every way out (Release, the destructor in each state) leaves the tracee running untraced.
#include "record/exit_hold.h"

#include <gtest/gtest.h>
#include <sys/ptrace.h>
#include <sys/wait.h>

#include <unistd.h>

#include <algorithm>
#include <deque>
#include <string>
#include <vector>

namespace rvbpfd {
namespace {

constexpr pid_t kPid = 4242;

// What the fake's waitid reports: a stop (CLD_TRAPPED with a status) or an exit (CLD_KILLED).
struct Report {
  int code;
  int status;
};

class FakePtrace : public PtraceOps {
 public:
  // Shared with the test after the ExitHold took ownership of the fake.
  struct Script {
    int seize_error = 0;
    int interrupt_error = 0;
    std::deque<Report> stops;  // consumed by WSTOPPED waits, in order
    bool exited = false;       // WEXITED | WNOWAIT peeks see it (never consumed)
    // Stops that arrive right after a WSTOPPED wait found none (before the next call): the race between Service's
    // stop wait and its exit peek.
    std::deque<Report> arrive_after_empty_wait;
    std::vector<std::string> calls;
    uint64_t slept_ns = 0;
    // Stops that appear when PTRACE_INTERRUPT is sent (the interrupt's own stop, or a pending signal's).
    std::deque<Report> on_interrupt;
  };
  explicit FakePtrace(Script* s) : s_(s) {}
  int Seize(pid_t pid, unsigned long options) override {
    s_->calls.push_back("seize " + std::to_string(pid) + " " + std::to_string(options));
    return s_->seize_error;
  }
  int Cont(pid_t, int sig) override {
    s_->calls.push_back("cont " + std::to_string(sig));
    return 0;
  }
  int Listen(pid_t) override {
    s_->calls.push_back("listen");
    return 0;
  }
  int Interrupt(pid_t) override {
    s_->calls.push_back("interrupt");
    for (const Report& r : s_->on_interrupt) s_->stops.push_back(r);
    s_->on_interrupt.clear();
    return s_->interrupt_error;
  }
  int Detach(pid_t, int sig) override {
    s_->calls.push_back("detach " + std::to_string(sig));
    return 0;
  }
  int WaitNoHang(pid_t pid, int options, siginfo_t* info) override {
    *info = siginfo_t{};
    if (options & WSTOPPED) {
      EXPECT_FALSE(options & WEXITED) << "a stop wait must never reap the child";
      if (s_->stops.empty()) {
        for (const Report& r : s_->arrive_after_empty_wait) s_->stops.push_back(r);
        s_->arrive_after_empty_wait.clear();
        return 0;
      }
      info->si_pid = pid;
      info->si_code = s_->stops.front().code;
      info->si_status = s_->stops.front().status;
      s_->stops.pop_front();
      return 0;
    }
    if (!(options & WNOWAIT)) {
      EXPECT_TRUE(s_->exited) << "an exit wait that consumes may only come after an exit was seen";
      s_->calls.push_back("wait exit");
    }
    // As the kernel does for its tracer: a pending ptrace stop is reported to an exit wait too (not consumed here,
    // as WNOWAIT leaves it).
    if (!s_->stops.empty()) {
      info->si_pid = pid;
      info->si_code = s_->stops.front().code;
      info->si_status = s_->stops.front().status;
      return 0;
    }
    if (s_->exited) {
      info->si_pid = pid;
      info->si_code = CLD_KILLED;
      info->si_status = SIGKILL;
    }
    return 0;
  }
  void SleepNs(uint64_t ns) override { s_->slept_ns += ns; }

 private:
  Script* s_;
};

Report SignalStop(int sig) { return {CLD_TRAPPED, sig}; }
Report EventStop(int event, int sig) { return {CLD_TRAPPED, sig | (event << 8)}; }

std::unique_ptr<ExitHold> Seized(FakePtrace::Script* s) {
  Result<std::unique_ptr<ExitHold>> h = ExitHold::Seize(kPid, std::make_unique<FakePtrace>(s));
  EXPECT_TRUE(h.ok());
  return h ? std::move(h.value()) : nullptr;
}

TEST(ClassifyStopTest, NamesEachStop) {
  EXPECT_EQ(ClassifyStop(SIGTRAP | (PTRACE_EVENT_EXIT << 8)), TraceeStop::kExit);
  EXPECT_EQ(ClassifyStop(SIGTSTP | (PTRACE_EVENT_STOP << 8)), TraceeStop::kGroupStop);
  EXPECT_EQ(ClassifyStop(SIGSTOP | (PTRACE_EVENT_STOP << 8)), TraceeStop::kGroupStop);
  EXPECT_EQ(ClassifyStop(SIGTRAP | (PTRACE_EVENT_STOP << 8)), TraceeStop::kOtherEvent);  // PTRACE_INTERRUPT's
  EXPECT_EQ(ClassifyStop(SIGTRAP | (PTRACE_EVENT_EXEC << 8)), TraceeStop::kOtherEvent);
  EXPECT_EQ(ClassifyStop(SIGVTALRM), TraceeStop::kSignal);
  EXPECT_EQ(ClassifyStop(SIGTRAP), TraceeStop::kSignal);  // a real SIGTRAP is the program's, passed on
}

TEST(ExitHoldTest, SeizesWithTheExitOptionOnly) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  ASSERT_FALSE(s.calls.empty());
  EXPECT_EQ(s.calls[0], "seize 4242 " + std::to_string(PTRACE_O_TRACEEXIT));
}

TEST(ExitHoldTest, SeizeFailureIsAnErrorAndTouchesNothingElse) {
  FakePtrace::Script s;
  s.seize_error = EPERM;
  Result<std::unique_ptr<ExitHold>> h = ExitHold::Seize(kPid, std::make_unique<FakePtrace>(&s));
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.error().code(), ErrorCode::kNoPrivilege);
  EXPECT_EQ(s.calls.size(), 1u);
}

TEST(ExitHoldTest, PassesSignalsOnAtOnce) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  s.stops = {SignalStop(SIGVTALRM), SignalStop(SIGINT)};
  EXPECT_EQ(h->Service(), ExitHold::State::kRunning);
  EXPECT_EQ(s.calls, (std::vector<std::string>{s.calls[0], "cont " + std::to_string(SIGVTALRM),
                                               "cont " + std::to_string(SIGINT)}));
  EXPECT_EQ(h->signals_forwarded(), 2u);
  EXPECT_TRUE(h->Traced());
}

TEST(ExitHoldTest, KeepsJobControlStopsAndResumesOtherEvents) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  s.stops = {EventStop(PTRACE_EVENT_STOP, SIGTSTP), EventStop(PTRACE_EVENT_STOP, SIGTRAP)};
  h->Service();
  ASSERT_EQ(s.calls.size(), 3u);
  EXPECT_EQ(s.calls[1], "listen");
  EXPECT_EQ(s.calls[2], "cont 0");
}

TEST(ExitHoldTest, HoldsTheExitStopUntilRelease) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  s.stops = {EventStop(PTRACE_EVENT_EXIT, SIGTRAP)};
  EXPECT_EQ(h->Service(), ExitHold::State::kAtExit);
  EXPECT_EQ(h->Service(), ExitHold::State::kAtExit);  // held: nothing answers it
  EXPECT_EQ(s.calls.size(), 1u);
  EXPECT_TRUE(h->Traced());  // HeldChild must not wait yet
  h->Release();
  EXPECT_EQ(s.calls.back(), "detach 0");
  EXPECT_EQ(h->state(), ExitHold::State::kReleased);
  EXPECT_FALSE(h->Traced());
  h.reset();
  EXPECT_EQ(s.calls.size(), 2u);  // released once only
}

TEST(ExitHoldTest, HoldsTheTeardownSignalThenPassesItOnAndStaysTraced) {
  FakePtrace::Script s;
  Result<std::unique_ptr<ExitHold>> r = ExitHold::Seize(kPid, std::make_unique<FakePtrace>(&s), SIGURG);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<ExitHold> h = std::move(r.value());
  s.stops = {SignalStop(SIGURG)};
  EXPECT_EQ(h->Service(), ExitHold::State::kAtTeardown);
  EXPECT_TRUE(h->Held());
  EXPECT_EQ(s.calls.size(), 1u);  // held: not continued yet
  h->Release();
  EXPECT_EQ(s.calls.back(), "cont " + std::to_string(SIGURG));  // as it would get it untraced (ignored by default)
  EXPECT_EQ(h->state(), ExitHold::State::kRunning);
  s.stops = {EventStop(PTRACE_EVENT_EXIT, SIGTRAP)};  // the exit stop still comes
  EXPECT_EQ(h->Service(), ExitHold::State::kAtExit);
  h->Release();
  EXPECT_EQ(s.calls.back(), "detach 0");
}

TEST(ExitHoldTest, WithoutAHoldSignalThatSignalIsPassedOn) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  s.stops = {SignalStop(SIGURG)};
  EXPECT_EQ(h->Service(), ExitHold::State::kRunning);
  EXPECT_EQ(s.calls.back(), "cont " + std::to_string(SIGURG));
}

TEST(ExitHoldTest, DestructorAtTeardownDetachesWithTheSignal) {
  FakePtrace::Script s;
  Result<std::unique_ptr<ExitHold>> r = ExitHold::Seize(kPid, std::make_unique<FakePtrace>(&s), SIGURG);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<ExitHold> h = std::move(r.value());
  s.stops = {SignalStop(SIGURG)};
  h->Service();
  h.reset();
  EXPECT_EQ(s.calls.back(), "detach " + std::to_string(SIGURG));
}

TEST(ExitHoldTest, AnExitWithoutExitStopIsLeftToTheReaper) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  s.exited = true;  // SIGKILL: no exit stop
  EXPECT_EQ(h->Service(), ExitHold::State::kGone);
  EXPECT_FALSE(h->Traced());
  h.reset();
  EXPECT_EQ(s.calls.size(), 1u);  // nothing to detach
}

// The race that ended launch recordings early at a held GC: a stop (here the hold signal's; any signal's does the
// same) arrives after Service's stop wait found nothing; the exit peek then reports that stop, which must not pass
// for an exit (the reaper's waitpid would take the stop for the exit status). The next Service handles the stop.
TEST(ExitHoldTest, AStopBetweenTheWaitsIsNotAnExit) {
  FakePtrace::Script s;
  Result<std::unique_ptr<ExitHold>> r = ExitHold::Seize(kPid, std::make_unique<FakePtrace>(&s), SIGURG);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<ExitHold> h = std::move(r.value());
  s.arrive_after_empty_wait = {SignalStop(SIGURG)};
  EXPECT_EQ(h->Service(), ExitHold::State::kRunning);
  EXPECT_TRUE(h->Traced());
  EXPECT_EQ(h->Service(), ExitHold::State::kAtTeardown);
  h->Release();
  EXPECT_EQ(h->state(), ExitHold::State::kRunning);
  s.arrive_after_empty_wait = {SignalStop(SIGVTALRM)};
  EXPECT_EQ(h->Service(), ExitHold::State::kRunning);
  EXPECT_EQ(h->Service(), ExitHold::State::kRunning);
  EXPECT_EQ(h->signals_forwarded(), 2u);  // the hold signal on Release, SIGVTALRM at once
  EXPECT_EQ(s.calls.back(), "cont " + std::to_string(SIGVTALRM));
}

// The destructor's wait for an interrupted command: the interrupt's stop, arriving after the first stop wait and so
// seen first by the exit peek, is no exit; the command is detached from that stop, not left stopped.
TEST(ExitHoldTest, DestructorDoesNotTakeTheInterruptStopForAnExit) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  s.arrive_after_empty_wait = {EventStop(PTRACE_EVENT_STOP, SIGTRAP)};
  h.reset();
  ASSERT_GE(s.calls.size(), 3u);
  EXPECT_EQ(s.calls[1], "interrupt");
  EXPECT_EQ(s.calls.back(), "detach 0");
}

// Attach mode's tracee is not rvbpfd's child: killed without an exit stop, its zombie is waited for once, so that
// the kernel hands it to its own parent (who would otherwise wait until rvbpfd exits); rvbpfd's own child is left
// to HeldChild::Reap.
TEST(ExitHoldTest, AnotherProcessKilledIsHandedBackToItsParent) {
  FakePtrace::Script s;
  Result<std::unique_ptr<ExitHold>> r = ExitHold::Seize(kPid, std::make_unique<FakePtrace>(&s), 0, false);
  ASSERT_TRUE(r.ok());
  std::unique_ptr<ExitHold> h = std::move(r.value());
  EXPECT_EQ(h->Service(), ExitHold::State::kRunning);
  EXPECT_EQ(std::count(s.calls.begin(), s.calls.end(), "wait exit"), 0);
  s.exited = true;
  EXPECT_EQ(h->Service(), ExitHold::State::kGone);
  EXPECT_EQ(h->Service(), ExitHold::State::kGone);
  EXPECT_EQ(std::count(s.calls.begin(), s.calls.end(), "wait exit"), 1);
  h.reset();
  EXPECT_EQ(s.calls.back(), "wait exit");  // nothing to detach after
}

TEST(ExitHoldTest, DestructorLetsGoOfACommandHeldAtExit) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  s.stops = {EventStop(PTRACE_EVENT_EXIT, SIGTRAP)};
  h->Service();
  h.reset();  // e.g. an error before the drain
  EXPECT_EQ(s.calls.back(), "detach 0");
}

TEST(ExitHoldTest, DestructorInterruptsARunningCommandAndDetaches) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  s.on_interrupt = {EventStop(PTRACE_EVENT_STOP, SIGTRAP)};
  h.reset();
  ASSERT_EQ(s.calls.size(), 3u);
  EXPECT_EQ(s.calls[1], "interrupt");
  EXPECT_EQ(s.calls[2], "detach 0");
}

TEST(ExitHoldTest, DestructorPassesAPendingSignalOnWhenDetaching) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  s.on_interrupt = {SignalStop(SIGINT)};  // Ctrl-C reached the command as rvbpfd stopped
  h.reset();
  EXPECT_EQ(s.calls.back(), "detach " + std::to_string(SIGINT));
}

TEST(ExitHoldTest, DestructorWaitIsBounded) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  h.reset();  // the interrupt's stop never comes
  EXPECT_EQ(s.calls.back(), "interrupt");
  EXPECT_GE(s.slept_ns, ExitHold::kDetachWaitNs - 1'000'000);
  EXPECT_LE(s.slept_ns, ExitHold::kDetachWaitNs);
}

TEST(ExitHoldTest, DestructorStopsWaitingForACommandThatExited) {
  FakePtrace::Script s;
  std::unique_ptr<ExitHold> h = Seized(&s);
  s.exited = true;
  s.interrupt_error = 0;
  h.reset();
  EXPECT_EQ(s.calls.back(), "interrupt");
  EXPECT_EQ(s.slept_ns, 0u);
}

// The system calls on a real child: a signal it handles reaches it through the tracer, it is held at its exit stop
// (not reapable), and once released it exits with its own status.
TEST(ExitHoldSystemTest, RealChildGetsItsSignalAndIsHeldAtExit) {
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    static volatile sig_atomic_t got = 0;
    signal(SIGUSR1, [](int) { got = 1; });
    close(ready[0]);
    if (write(ready[1], "r", 1) != 1) _exit(90);
    while (!got) pause();
    _exit(42);
  }
  close(ready[1]);
  Result<std::unique_ptr<ExitHold>> h = ExitHold::Seize(pid, SystemPtraceOps());
  ASSERT_TRUE(h.ok()) << h.error().ToString();
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  close(ready[0]);
  ASSERT_EQ(kill(pid, SIGUSR1), 0);
  ExitHold::State st = ExitHold::State::kRunning;
  while ((st = (*h)->Service()) == ExitHold::State::kRunning) usleep(1000);
  EXPECT_EQ(st, ExitHold::State::kAtExit);
  EXPECT_EQ((*h)->signals_forwarded(), 1u);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT), 0);
  EXPECT_EQ(info.si_pid, 0) << "exited while held";
  (*h)->Release();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 42);
}

}  // namespace
}  // namespace rvbpfd
