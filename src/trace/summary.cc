#include "trace/summary.h"

#include <algorithm>

namespace rvbpfd {

ThreadAccounting::State& ThreadAccounting::Lookup(uint32_t ruby_thread, bool* created) {
  *created = false;
  if (last_ < threads_.size() && threads_[last_].ruby_thread == ruby_thread) return threads_[last_];
  auto [it, inserted] = index_.try_emplace(ruby_thread, threads_.size());
  if (inserted) {
    threads_.push_back(State{.ruby_thread = ruby_thread});
    *created = true;
  }
  last_ = it->second;
  return threads_[last_];
}

bool ThreadAccounting::Observe(const TraceEvent& event) {
  if (!event.ruby_thread) return false;
  bool created = false;
  State& state = Lookup(*event.ruby_thread, &created);
  switch (event.event) {
    case EventName::kGvlAcquired:
      if (!state.acquired_at) state.acquired_at = event.t_ns;
      break;
    case EventName::kGvlReleased:
    case EventName::kThreadExited:
      if (state.acquired_at) {
        // A late (reordered) release can precede its acquire in time; count nothing rather than wrap around.
        if (event.t_ns > *state.acquired_at) state.running_ns += event.t_ns - *state.acquired_at;
        state.acquired_at.reset();
      }
      break;
    default:
      break;
  }
  switch (event.event) {
    case EventName::kGvlAcquired:
    case EventName::kGvlReleased:
    case EventName::kThreadExited:
    case EventName::kSleepEnter:
    case EventName::kMutexLockEnter:
      if (event.native_tid &&
          std::find(state.native_tids.begin(), state.native_tids.end(), *event.native_tid) ==
              state.native_tids.end()) {
        state.native_tids.push_back(*event.native_tid);
      }
      break;
    default:
      break;
  }
  return created;
}

void ThreadAccounting::MarkMain(uint32_t ruby_thread) {
  bool created = false;
  Lookup(ruby_thread, &created).marked_main = true;
}

bool ThreadAccounting::IsMain(uint32_t ruby_thread) const {
  if (main_thread_ && *main_thread_ == ruby_thread) return true;
  auto it = index_.find(ruby_thread);
  return it != index_.end() && threads_[it->second].marked_main;
}

std::vector<ThreadSummary> ThreadAccounting::Summarize(uint64_t end_t_ns) const {
  std::vector<ThreadSummary> out;
  out.reserve(threads_.size());
  for (const State& state : threads_) {
    uint64_t running_ns = state.running_ns;
    if (state.acquired_at && end_t_ns > *state.acquired_at) running_ns += end_t_ns - *state.acquired_at;
    out.push_back(ThreadSummary{.ruby_thread = state.ruby_thread,
                                .main = IsMain(state.ruby_thread),
                                .native_tids = state.native_tids,
                                .running_ms = static_cast<double>(running_ns) / 1e6});
  }
  std::sort(out.begin(), out.end(),
            [](const ThreadSummary& a, const ThreadSummary& b) { return a.ruby_thread < b.ruby_thread; });
  return out;
}

}  // namespace rvbpfd
