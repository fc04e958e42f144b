// A bound in time for work on one untrusted target (reading its binaries, analysing them): one bad process may cost
// the daemon at most `timeout`, never a stall of its main loop.
//
// The work runs on a helper thread (StartHelperThread: it takes no signals) while the caller waits at most `timeout`.
// Work that did not finish by then is abandoned: the thread is detached and finishes on its own (a read a FUSE server
// never answers cannot be cancelled from user space), its result is discarded, and it counts as stuck until it ends.
// At most kMaxStuck threads may be stuck at once; beyond that new work is refused at once (kTooManyStuck), so a host
// full of hostile processes costs a bounded number of threads and the memory they hold. Exceptions thrown by the work
// are caught on its thread and reported as kThrew.
#ifndef RVBPFD_SRC_COMMON_DEADLINE_H_
#define RVBPFD_SRC_COMMON_DEADLINE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "common/threads.h"

namespace rvbpfd {

enum class DeadlineStatus { kDone, kTimedOut, kTooManyStuck, kThrew };

template <typename T>
struct DeadlineResult {
  DeadlineStatus status = DeadlineStatus::kDone;
  std::optional<T> value;  // set when status is kDone
  std::string what;        // the exception's what() for kThrew
};

// Threads abandoned by RunWithDeadline that have not finished yet (all callers together).
std::atomic<int>& StuckDeadlineThreads();
inline constexpr int kMaxStuck = 8;

// Runs `fn` (which must own or share everything it touches: it may outlive the caller's frame) with a bound.
template <typename T>
DeadlineResult<T> RunWithDeadline(std::chrono::milliseconds timeout, std::function<T()> fn) {
  DeadlineResult<T> out;
  if (StuckDeadlineThreads().load() >= kMaxStuck) {
    out.status = DeadlineStatus::kTooManyStuck;
    return out;
  }
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    bool abandoned = false;
    std::optional<T> value;
    std::string what;
    bool threw = false;
  };
  auto shared = std::make_shared<Shared>();
  std::thread worker = StartHelperThread([shared, fn = std::move(fn)] {
    std::optional<T> value;
    std::string what;
    bool threw = false;
    try {
      value.emplace(fn());
    } catch (const std::exception& e) {
      threw = true;
      what = e.what();
    } catch (...) {
      threw = true;
      what = "unknown exception";
    }
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->value = std::move(value);
    shared->what = std::move(what);
    shared->threw = threw;
    shared->done = true;
    if (shared->abandoned) StuckDeadlineThreads().fetch_sub(1);
    shared->cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(shared->mu);
  if (!shared->cv.wait_for(lock, timeout, [&] { return shared->done; })) {
    shared->abandoned = true;
    StuckDeadlineThreads().fetch_add(1);
    lock.unlock();
    worker.detach();
    out.status = DeadlineStatus::kTimedOut;
    return out;
  }
  lock.unlock();
  worker.join();
  if (shared->threw) {
    out.status = DeadlineStatus::kThrew;
    out.what = std::move(shared->what);
    return out;
  }
  out.value = std::move(shared->value);
  return out;
}

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_DEADLINE_H_
