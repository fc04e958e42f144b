// A bound in time for work on one untrusted target (reading its binaries, analysing them): one bad process may cost
// the daemon at most `timeout`, never a stall of its main loop.
//
// The work runs on a helper thread (StartHelperThread: it takes no signals) while the caller waits at most `timeout`.
// Work that did not finish by then is abandoned: the thread is detached and finishes on its own (a read a FUSE server
// never answers cannot be cancelled from user space), its result is discarded, and it counts as stuck until it ends.
// At most kMaxStuck threads may be stuck at once; beyond that new work is refused at once (kTooManyStuck), so a host
// full of hostile processes costs a bounded number of threads and the memory they hold. Exceptions thrown by the work
// are caught on its thread and reported as kThrew. A caller may also pass a cancel flag (set by a SIGINT/SIGTERM
// handler): the wait then ends within kCancelPollMs of it being set, and the work is abandoned as at the deadline
// (kCancelled), so Ctrl-C ends a command whose helper is stuck in a read that only SIGKILL would end.
#ifndef RVBPFD_SRC_COMMON_DEADLINE_H_
#define RVBPFD_SRC_COMMON_DEADLINE_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "common/error.h"
#include "common/threads.h"

namespace rvbpfd {

enum class DeadlineStatus { kDone, kTimedOut, kTooManyStuck, kThrew, kCancelled };

// How often a wait looks at its cancel flag (a signal handler cannot notify a condition variable).
inline constexpr int kCancelPollMs = 20;

template <typename T>
struct DeadlineResult {
  DeadlineStatus status = DeadlineStatus::kDone;
  std::optional<T> value;  // set when status is kDone
  std::string what;        // the exception's what() for kThrew
};

// Threads abandoned by RunWithDeadline that have not finished yet (all callers together).
std::atomic<int>& StuckDeadlineThreads();
inline constexpr int kMaxStuck = 8;

// RunWithDeadline's bound on a helper thread that is kept for the next call: work done often (the agent inspects every
// pid that execs on the host) then costs no thread creation and exit each time. Work that overruns its bound is
// abandoned with its thread, as RunWithDeadline's is (detached, counted stuck until it ends); the next Run starts a
// new thread. The idle thread is stopped and joined by the destructor.
// Threading: one caller at a time (the owner's thread); the helper thread only runs the work it is handed.
class DeadlineWorker {
 public:
  DeadlineWorker() = default;
  DeadlineWorker(const DeadlineWorker&) = delete;
  DeadlineWorker& operator=(const DeadlineWorker&) = delete;
  DeadlineWorker(DeadlineWorker&&) = default;
  DeadlineWorker& operator=(DeadlineWorker&&) = delete;
  ~DeadlineWorker() { StopIdleThread(); }

  // Runs `fn` (which must own or share everything it touches: it may outlive the caller's frame) with a bound; when
  // `cancel` is given, its being set ends the wait as the bound does (kCancelled).
  template <typename T>
  DeadlineResult<T> Run(std::chrono::milliseconds timeout, std::function<T()> fn,
                        const std::atomic<bool>* cancel = nullptr);

 private:
  // What the owner and its thread share; the thread holds it, so it outlives an abandoned thread's owner.
  struct Channel {
    std::mutex mu;
    std::condition_variable cv;
    std::function<void()> job;  // handed over, not yet taken
    bool stop = false;          // exit once the job in hand (if any) is done
  };

  void StopIdleThread() {
    if (!channel_) return;
    {
      std::lock_guard<std::mutex> lock(channel_->mu);
      channel_->stop = true;
    }
    channel_->cv.notify_all();
    thread_.join();
    channel_.reset();
  }

  std::shared_ptr<Channel> channel_;  // null: no thread (none yet, or the last one was abandoned)
  std::thread thread_;
};

template <typename T>
DeadlineResult<T> DeadlineWorker::Run(std::chrono::milliseconds timeout, std::function<T()> fn,
                                      const std::atomic<bool>* cancel) {
  DeadlineResult<T> out;
  if (cancel != nullptr && cancel->load()) {
    out.status = DeadlineStatus::kCancelled;
    return out;
  }
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
  std::function<void()> job = [shared, fn = std::move(fn)] {
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
  };
  if (!channel_) {
    // channel_ is set only once the thread runs: a failed thread creation (it throws) leaves no channel without one.
    auto channel = std::make_shared<Channel>();
    thread_ = StartHelperThread([channel] {
      std::unique_lock<std::mutex> lock(channel->mu);
      for (;;) {
        channel->cv.wait(lock, [&] { return channel->stop || channel->job != nullptr; });
        if (channel->job == nullptr) return;
        std::function<void()> next = std::move(channel->job);
        channel->job = nullptr;
        lock.unlock();
        next();
        next = nullptr;  // what the work captured is released before the thread waits again
        lock.lock();
      }
    });
    channel_ = std::move(channel);
  }
  {
    std::lock_guard<std::mutex> lock(channel_->mu);
    channel_->job = std::move(job);
  }
  channel_->cv.notify_all();
  std::unique_lock<std::mutex> lock(shared->mu);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  bool cancelled = false;
  bool done = false;
  if (cancel == nullptr) {
    done = shared->cv.wait_until(lock, deadline, [&] { return shared->done; });
  } else {
    for (;;) {
      const auto step = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(kCancelPollMs));
      done = shared->cv.wait_until(lock, step, [&] { return shared->done; });
      cancelled = !done && cancel->load();
      if (done || cancelled || std::chrono::steady_clock::now() >= deadline) break;
    }
  }
  if (!done) {
    shared->abandoned = true;
    StuckDeadlineThreads().fetch_add(1);
    lock.unlock();
    {
      std::lock_guard<std::mutex> channel_lock(channel_->mu);
      channel_->stop = true;  // the thread exits once the stuck work ends
    }
    thread_.detach();
    channel_.reset();
    out.status = cancelled ? DeadlineStatus::kCancelled : DeadlineStatus::kTimedOut;
    return out;
  }
  lock.unlock();
  if (shared->threw) {
    out.status = DeadlineStatus::kThrew;
    out.what = std::move(shared->what);
    return out;
  }
  out.value = std::move(shared->value);
  return out;
}

// Runs `fn` (which must own or share everything it touches: it may outlive the caller's frame) with a bound, on a
// helper thread of its own.
template <typename T>
DeadlineResult<T> RunWithDeadline(std::chrono::milliseconds timeout, std::function<T()> fn,
                                  const std::atomic<bool>* cancel = nullptr) {
  DeadlineWorker worker;
  return worker.Run<T>(timeout, std::move(fn), cancel);
}

// RunWithDeadline for work that returns a Result (reading a target's files from a command): every way the bound can
// end becomes one error naming `step` ("reading the files of pid 42"). A timeout is kIo ("took more than N ms: a
// file it reads stalls (a FUSE or NFS mount that does not answer?)"), a cancel is kIo ("stopped by a signal"), an
// exception kInternal.
template <typename T>
Result<T> RunBounded(const std::string& step, std::chrono::milliseconds timeout, const std::atomic<bool>* cancel,
                     std::function<Result<T>()> fn) {
  DeadlineResult<Result<T>> r = RunWithDeadline<Result<T>>(timeout, std::move(fn), cancel);
  switch (r.status) {
    case DeadlineStatus::kDone: return std::move(*r.value);
    case DeadlineStatus::kTimedOut:
      return Error(ErrorCode::kIo, step + " took more than " + std::to_string(timeout.count()) +
                                       " ms: a file it reads stalls (a FUSE or NFS mount that does not answer?); gave "
                                       "up");
    case DeadlineStatus::kCancelled: return Error(ErrorCode::kIo, step + ": stopped by a signal");
    case DeadlineStatus::kTooManyStuck:
      return Error(ErrorCode::kIo, step + ": " + std::to_string(kMaxStuck) + " earlier reads are still stuck");
    case DeadlineStatus::kThrew: break;
  }
  return Error(ErrorCode::kInternal, step + " failed: " + r.what);
}

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_DEADLINE_H_
