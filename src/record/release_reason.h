// Why a thread gave up the GVL, derived from the stack it had at gvl_released and from the probe site
// (docs/design.md, "Release reasons"). An in-process recorder only sees "suspended"; the stack says why.
#ifndef RVBPFD_SRC_RECORD_RELEASE_REASON_H_
#define RVBPFD_SRC_RECORD_RELEASE_REASON_H_

#include <span>
#include <string_view>

#include "trace/release_reason.h"
#include "trace/stacks.h"

namespace rvbpfd {

// Where a SUSPENDED hook site is, as far as the rule cares.
enum class ReleaseSite : uint8_t {
  kOther,      // blocking regions, sleeps, waits: the stack decides
  kYield,      // rb_thread_schedule_limits: the thread yields to a waiting thread (Thread.pass or the timer's slice)
  kThreadEnd,  // thread_start_func_2: the thread's block returned; thread_exited follows
};

// Classifies a SUSPENDED site by its enclosing function (ProbeSite::function).
ReleaseSite ClassifyReleaseSite(std::string_view function);

// The rule; the recorder writes its result with ReleaseReasonTraceName. `frames` is the released thread's stack,
// leaf first. Only the frames above the innermost frame of program code are looked at (C frames and <internal:...>
// builtins and monitor.rb's wrappers: the library call the program is blocked in); the first of those that names a
// known blocking method decides, and a wait (mutex, condition variable, queue) is then refined by the innermost
// program frame (a pool waiting for work: kIdle; ActiveRecord's connection pool: kDbPool). Never kStarting or
// kPreempted, which no stack gives.
ReleaseReason DeriveReleaseReason(std::span<const FrameInfo> frames, ReleaseSite site);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_RECORD_RELEASE_REASON_H_
