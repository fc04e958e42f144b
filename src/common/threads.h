// Helper threads that never take the daemon's signals.
//
// A process-directed signal (SIGTERM from systemd, SIGINT from a terminal) is delivered to any one thread that does not
// block it. The main loop is what reacts to them (its handlers set a flag its poll wakes up on), so every other thread
// starts with them blocked: otherwise the kernel may pick the helper, the main thread's blocking call is never
// interrupted, and only SIGKILL stops the daemon.
#ifndef RVBPFD_SRC_COMMON_THREADS_H_
#define RVBPFD_SRC_COMMON_THREADS_H_

#include <signal.h>

#include <thread>
#include <utility>

namespace rvbpfd {

// The signals only the main thread takes: the stop and reload requests and the terminal's job-control ones.
inline sigset_t MainThreadSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD, SIGPIPE, SIGALRM, SIGTSTP, SIGTTIN,
                  SIGTTOU, SIGWINCH}) {
    sigaddset(&set, sig);
  }
  return set;
}

// Starts `fn` on a new std::thread whose signal mask blocks MainThreadSignals() (a new thread inherits its creator's
// mask, so the creator blocks them around the creation and restores its own mask after).
template <typename Fn>
std::thread StartHelperThread(Fn&& fn) {
  const sigset_t block = MainThreadSignals();
  sigset_t old;
  pthread_sigmask(SIG_BLOCK, &block, &old);
  std::thread t(std::forward<Fn>(fn));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return t;
}

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_THREADS_H_
