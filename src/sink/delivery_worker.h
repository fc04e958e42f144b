// The queue and worker thread shared by DirSink and PushSink: a bounded FIFO of uploads delivered oldest first by
// one thread, with retry, exponential backoff and jitter for failures the delivery function calls retryable.
//
// Time and randomness are injected (SinkClock, JitterSource) so unit tests run the real worker thread in virtual
// time and can assert exact backoff delays; production uses the steady clock and a SplitMix64 seeded per sink.
#ifndef RVBPFD_SRC_SINK_DELIVERY_WORKER_H_
#define RVBPFD_SRC_SINK_DELIVERY_WORKER_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "sink/profile_upload.h"
#include "sink/sink.h"

namespace rvbpfd {

// Monotonic time for the delivery worker. Thread-safe.
class SinkClock {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  virtual ~SinkClock() = default;
  virtual TimePoint Now() = 0;
  // Blocks on `cv` (`lock` held on entry and on return) until `cv` is notified or Now() reaches `deadline`.
  // Spurious returns are allowed: the caller re-checks its state and calls again.
  virtual void WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, TimePoint deadline) = 0;
  // The steady clock (one shared instance).
  static std::shared_ptr<SinkClock> Steady();
};

// Uniform 64-bit random values for backoff jitter. Called from the worker thread only.
class JitterSource {
 public:
  virtual ~JitterSource() = default;
  virtual uint64_t Next() = 0;
};

// SplitMix64 (Steele, Lea, Flood 2014): tiny, seedable, and the same sequence on every platform, unlike the
// standard library's distributions. Seed 0 gives 0xe220a8397b1dcdaf first.
class SplitMix64Jitter : public JitterSource {
 public:
  explicit SplitMix64Jitter(uint64_t seed) : state_(seed) {}
  uint64_t Next() override;

 private:
  uint64_t state_;
};

struct BackoffPolicy {
  std::chrono::milliseconds min{500};     // delay before the first retry (before jitter)
  std::chrono::milliseconds max{30000};   // the doubling stops here
};

// The delay before retry number `failures` (1 = after the first failed attempt): base = min * 2^(failures-1),
// capped at max, then "equal jitter": base/2 + (jitter_bits mod (base - base/2 + 1)) ms, i.e. uniform in
// [base/2, base]. Half the delay is fixed so a fleet of agents spreads out without ever retrying almost at once.
std::chrono::milliseconds BackoffDelay(const BackoffPolicy& policy, uint64_t failures, uint64_t jitter_bits);

// What one delivery attempt achieved.
struct DeliveryOutcome {
  enum class Kind { kDelivered, kRetry, kFailed };
  Kind kind = Kind::kDelivered;
  // kRetry: the server's Retry-After (0 = none). The next attempt waits at least this long, capped at backoff max.
  std::chrono::milliseconds retry_after{0};
  std::string error;  // kRetry/kFailed: one line for SinkStats::last_error

  static DeliveryOutcome Delivered() { return {}; }
  static DeliveryOutcome Retry(std::string error, std::chrono::milliseconds retry_after = {}) {
    return {Kind::kRetry, retry_after, std::move(error)};
  }
  static DeliveryOutcome Failed(std::string error) { return {Kind::kFailed, {}, std::move(error)}; }
};

// Passed to each attempt.
struct DeliveryContext {
  std::chrono::milliseconds timeout{10000};   // a request's budget (shortened to what is left of a Flush)
  const std::atomic<bool>* cancel = nullptr;  // becomes true when the sink is being destroyed: abort promptly
  // While a Flush waits: when it gives up. An attempt of several requests starts none after it (the uploads left go
  // back unattempted) and cuts each request's timeout to what is left of it.
  std::optional<SinkClock::TimePoint> deadline;

  // What is left of the deadline at `now`, in whole ms rounded up (0 or less once it passed); nullopt without one.
  std::optional<std::chrono::milliseconds> LeftAt(SinkClock::TimePoint now) const {
    if (!deadline) return std::nullopt;
    return std::chrono::ceil<std::chrono::milliseconds>(*deadline - now);
  }
  // The timeout of a request that starts at `now`: `timeout`, cut to what is left of the deadline, at least 1 ms.
  std::chrono::milliseconds RequestTimeout(SinkClock::TimePoint now) const {
    const std::optional<std::chrono::milliseconds> left = LeftAt(now);
    return left ? std::clamp(*left, std::chrono::milliseconds(1), timeout) : timeout;
  }
};

// One attempt: delivers `uploads`, the oldest queued (at least one, see DeliveryWorkerOptions::max_batch), and
// returns one outcome per upload attempted, in their order. Uploads past the outcomes were not attempted and go back
// to the head of the queue as they were. An empty result counts as a retryable failure of the first upload. Called
// on the worker thread only, one attempt at a time, without the worker's lock held.
using DeliverFunction =
    std::function<std::vector<DeliveryOutcome>(std::span<const ProfileUpload>, const DeliveryContext&)>;

struct DeliveryWorkerOptions {
  size_t max_queue = 256;                        // uploads waiting (>= 1), besides the ones being sent
  // An attempt carries the oldest upload and the ones after it while there are at most max_batch (>= 1) and their
  // pprof_bytes sum to at most max_batch_bytes (the first goes whatever its size).
  size_t max_batch = 1;
  uint64_t max_batch_bytes = UINT64_MAX;
  BackoffPolicy backoff;
  std::chrono::milliseconds attempt_timeout{10000};
  std::shared_ptr<SinkClock> clock;              // null = SinkClock::Steady()
  std::shared_ptr<JitterSource> jitter;          // null = SplitMix64Jitter(0)
};

// Thread-safe. Owns its thread: the destructor cancels an attempt in progress, stops and joins; uploads still
// queued then are discarded (call Flush first to deliver them).
//
// Policy:
//   - uploads are attempted strictly oldest first, in batches of the oldest (max_batch); retried and unattempted
//     uploads go back to the head, so order is kept;
//   - at most max_queue uploads wait besides the ones being sent, or as many as the largest SubmitAll handed over if
//     that was more (a cut of more profiles than max_queue is not cut short while the backend keeps up); beyond it
//     Submit drops the oldest waiting ones, and uploads whose attempt failed retryably are dropped if that many newer
//     ones arrived meanwhile (they are then the oldest); both count in dropped_queue_full;
//   - kRetry on any upload of an attempt: retries += 1 (one per attempt, whatever its size), the head waits
//     BackoffDelay(consecutive failures) (at least the largest Retry-After) before the next attempt; the failure
//     count is the backend's, not the upload's, and resets after an attempt without kRetry;
//   - kFailed: the upload is given up on (delivery_failures += 1).
class DeliveryWorker {
 public:
  static Result<std::unique_ptr<DeliveryWorker>> Start(DeliveryWorkerOptions options, DeliverFunction deliver);
  ~DeliveryWorker();
  DeliveryWorker(const DeliveryWorker&) = delete;
  DeliveryWorker& operator=(const DeliveryWorker&) = delete;

  void Submit(ProfileUpload upload);
  // Queues `uploads` in order under one lock and wakes the worker once, so they can leave in one attempt.
  void SubmitAll(std::vector<ProfileUpload> uploads);
  // See ProfileSink::Flush. If the head is waiting out a backoff, it is attempted at once (a shutdown should not
  // sleep through the last chance to deliver); later failures back off as usual, each attempt's timeout is cut to
  // what is left of `deadline`. Concurrent Flush calls share the latest of their deadlines.
  bool Flush(std::chrono::milliseconds deadline);
  SinkStats stats() const;
  // Records a failure that happened outside an attempt (e.g. an upload refused before queueing).
  void CountFailure(std::string error);
  // Adds to rotated_files (DirSink's cap).
  void CountRotated(uint64_t files);

 private:
  DeliveryWorker(DeliveryWorkerOptions options, DeliverFunction deliver);
  void Run();
  bool DrainedLocked() const { return queue_.empty() && in_flight_ == 0; }
  void DropOverflowLocked();  // down to queue_limit_, oldest first
  void CheckFlushDeadlineLocked(SinkClock::TimePoint now);

  const DeliveryWorkerOptions options_;
  const DeliverFunction deliver_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the worker waits here: new uploads, flush, stop, backoff timer
  std::condition_variable idle_cv_;  // Flush waits here: an attempt finished, drained, flush deadline passed
  std::deque<ProfileUpload> queue_;  // oldest first
  size_t in_flight_ = 0;             // uploads the worker holds outside queue_ while attempting them
  size_t queue_limit_ = 0;           // max(max_queue, the largest SubmitAll's size)
  bool stopping_ = false;
  SinkClock::TimePoint next_attempt_at_{};  // the head is not attempted before this (backoff)
  uint64_t consecutive_failures_ = 0;
  bool flush_active_ = false;
  SinkClock::TimePoint flush_deadline_{};
  uint64_t flush_generation_ = 0;  // Flush calls so far
  uint64_t flush_expired_ = 0;     // Flush calls whose (shared) deadline has passed
  SinkStats stats_;
  std::atomic<bool> cancel_{false};
  std::thread thread_;  // last member: started after everything above exists
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SINK_DELIVERY_WORKER_H_
