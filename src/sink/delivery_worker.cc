#include "sink/delivery_worker.h"

#include <algorithm>
#include <system_error>
#include <utility>

#include "common/threads.h"

namespace rvbpfd {
namespace {

class SteadySinkClock : public SinkClock {
 public:
  TimePoint Now() override { return std::chrono::steady_clock::now(); }
  void WaitUntil(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, TimePoint deadline) override {
    cv.wait_until(lock, deadline);
  }
};

}  // namespace

std::shared_ptr<SinkClock> SinkClock::Steady() {
  static const std::shared_ptr<SinkClock> clock = std::make_shared<SteadySinkClock>();
  return clock;
}

uint64_t SplitMix64Jitter::Next() {
  state_ += 0x9e3779b97f4a7c15ULL;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::chrono::milliseconds BackoffDelay(const BackoffPolicy& policy, uint64_t failures, uint64_t jitter_bits) {
  const int64_t max_ms = std::max<int64_t>(policy.max.count(), 0);
  int64_t base = std::clamp<int64_t>(policy.min.count(), 0, max_ms);
  // Doubling by a loop (not a shift) so a long outage can never overflow; it stops at max within ~40 steps.
  for (uint64_t i = 1; i < failures && base < max_ms; ++i) {
    base = base > max_ms / 2 ? max_ms : std::max<int64_t>(base * 2, 1);
  }
  const int64_t half = base / 2;
  const uint64_t span = static_cast<uint64_t>(base - half) + 1;
  return std::chrono::milliseconds(half + static_cast<int64_t>(jitter_bits % span));
}

DeliveryWorker::DeliveryWorker(DeliveryWorkerOptions options, DeliverFunction deliver)
    : options_(std::move(options)), deliver_(std::move(deliver)), queue_limit_(options_.max_queue) {}

Result<std::unique_ptr<DeliveryWorker>> DeliveryWorker::Start(DeliveryWorkerOptions options,
                                                              DeliverFunction deliver) {
  if (options.max_queue == 0) {
    return Error(ErrorCode::kUsage, "sink queue length must be at least 1 (--push-queue)");
  }
  if (options.max_batch == 0) return Error(ErrorCode::kInternal, "sink worker started with max_batch 0");
  if (!deliver) return Error(ErrorCode::kInternal, "sink worker started without a delivery function");
  if (!options.clock) options.clock = SinkClock::Steady();
  if (!options.jitter) options.jitter = std::make_shared<SplitMix64Jitter>(0);
  std::unique_ptr<DeliveryWorker> worker(new DeliveryWorker(std::move(options), std::move(deliver)));
  try {
    worker->thread_ = StartHelperThread([w = worker.get()] { w->Run(); });
  } catch (const std::system_error& e) {
    return Error(ErrorCode::kInternal, std::string("starting the sink's delivery thread: ") + e.what());
  }
  return worker;
}

DeliveryWorker::~DeliveryWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cancel_.store(true, std::memory_order_relaxed);
  work_cv_.notify_all();
  idle_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void DeliveryWorker::DropOverflowLocked() {
  while (queue_.size() > queue_limit_) {
    queue_.pop_front();
    ++stats_.dropped_queue_full;
  }
}

void DeliveryWorker::Submit(ProfileUpload upload) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    queue_.push_back(std::move(upload));
    DropOverflowLocked();
  }
  work_cv_.notify_all();
}

void DeliveryWorker::SubmitAll(std::vector<ProfileUpload> uploads) {
  if (uploads.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    queue_limit_ = std::max(queue_limit_, uploads.size());
    for (ProfileUpload& u : uploads) queue_.push_back(std::move(u));
    DropOverflowLocked();
  }
  work_cv_.notify_all();
}

bool DeliveryWorker::Flush(std::chrono::milliseconds deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (DrainedLocked()) return true;
  const uint64_t lost_before = stats_.delivery_failures + stats_.dropped_queue_full;
  const SinkClock::TimePoint now = options_.clock->Now();
  const SinkClock::TimePoint my_deadline = now + std::max(deadline, std::chrono::milliseconds(0));
  const uint64_t generation = ++flush_generation_;
  flush_deadline_ = flush_active_ ? std::max(flush_deadline_, my_deadline) : my_deadline;
  flush_active_ = true;
  if (next_attempt_at_ > now) next_attempt_at_ = now;  // one immediate attempt instead of sleeping out the backoff
  work_cv_.notify_all();
  idle_cv_.wait(lock, [&] { return stopping_ || DrainedLocked() || flush_expired_ >= generation; });
  const bool drained = DrainedLocked();
  if (drained && generation == flush_generation_) flush_active_ = false;
  return drained && stats_.delivery_failures + stats_.dropped_queue_full == lost_before;
}

SinkStats DeliveryWorker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SinkStats s = stats_;
  s.queued = queue_.size() + in_flight_;
  s.consecutive_failures = consecutive_failures_;
  return s;
}

void DeliveryWorker::CountFailure(std::string error) {
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.delivery_failures;
  stats_.last_error = std::move(error);
}

void DeliveryWorker::CountRotated(uint64_t files) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.rotated_files += files;
}

void DeliveryWorker::CheckFlushDeadlineLocked(SinkClock::TimePoint now) {
  if (flush_active_ && now >= flush_deadline_) {
    flush_active_ = false;
    flush_expired_ = flush_generation_;
    idle_cv_.notify_all();
  }
}

void DeliveryWorker::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const SinkClock::TimePoint now = options_.clock->Now();
    CheckFlushDeadlineLocked(now);
    if (queue_.empty()) {
      idle_cv_.notify_all();
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      continue;
    }
    if (now < next_attempt_at_) {
      SinkClock::TimePoint wake = next_attempt_at_;
      if (flush_active_) wake = std::min(wake, flush_deadline_);
      options_.clock->WaitUntil(lock, work_cv_, wake);
      continue;
    }

    // The batch: the oldest upload, then the ones after it while they fit (DeliveryWorkerOptions::max_batch).
    size_t n = 1;
    uint64_t bytes = queue_.front().pprof_bytes;
    while (n < std::min(options_.max_batch, queue_.size()) &&
           queue_[n].pprof_bytes <= options_.max_batch_bytes - std::min(bytes, options_.max_batch_bytes)) {
      bytes += queue_[n].pprof_bytes;
      ++n;
    }
    std::vector<ProfileUpload> batch(std::make_move_iterator(queue_.begin()),
                                     std::make_move_iterator(queue_.begin() + static_cast<ptrdiff_t>(n)));
    queue_.erase(queue_.begin(), queue_.begin() + static_cast<ptrdiff_t>(n));
    in_flight_ = n;
    DeliveryContext context{options_.attempt_timeout, &cancel_};
    if (flush_active_) {
      context.deadline = flush_deadline_;
      context.timeout = context.RequestTimeout(now);
    }
    lock.unlock();
    std::vector<DeliveryOutcome> outcomes = deliver_(batch, context);
    lock.lock();
    in_flight_ = 0;
    if (outcomes.empty()) outcomes.push_back(DeliveryOutcome::Retry("sink: the attempt reported no outcome"));
    outcomes.resize(std::min(outcomes.size(), batch.size()));

    // Back to the head, in order: the retried uploads, then the unattempted ones.
    std::vector<ProfileUpload> back;
    std::chrono::milliseconds retry_after{0};
    bool retry = false;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (i >= outcomes.size()) {
        back.push_back(std::move(batch[i]));
        continue;
      }
      DeliveryOutcome& outcome = outcomes[i];
      switch (outcome.kind) {
        case DeliveryOutcome::Kind::kDelivered:
          ++stats_.delivered;
          stats_.bytes_delivered += batch[i].pprof_gz.size();
          break;
        case DeliveryOutcome::Kind::kFailed:
          ++stats_.delivery_failures;
          stats_.last_error = std::move(outcome.error);
          break;
        case DeliveryOutcome::Kind::kRetry:
          retry = true;
          retry_after = std::max(retry_after, outcome.retry_after);
          stats_.last_error = std::move(outcome.error);
          back.push_back(std::move(batch[i]));
          break;
      }
    }
    if (retry) {
      ++stats_.retries;
      ++consecutive_failures_;
      std::chrono::milliseconds delay = BackoffDelay(options_.backoff, consecutive_failures_, options_.jitter->Next());
      delay = std::max(delay, std::min(retry_after, options_.backoff.max));
      next_attempt_at_ = options_.clock->Now() + delay;
    } else {
      consecutive_failures_ = 0;  // delivered, or the backend answered: no reason to slow down the next upload
    }
    // Newer uploads may have filled the queue meanwhile: these are then the oldest, and dropped first.
    queue_.insert(queue_.begin(), std::make_move_iterator(back.begin()), std::make_move_iterator(back.end()));
    DropOverflowLocked();
    idle_cv_.notify_all();
  }
}

}  // namespace rvbpfd
