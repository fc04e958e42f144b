#include "trace/release_reason.h"

#include <array>

namespace rvbpfd {
namespace {

struct ReasonNames {
  ReleaseReason reason;
  std::string_view trace;    // the gvl_released "reason" string; empty: never written to a trace
  std::string_view display;  // the name viewers show
};

// The one table, in enum order (checked below).
constexpr std::array<ReasonNames, kReleaseReasonCount> kNames = {{
    {ReleaseReason::kUnknown, "unknown", "unknown"},
    {ReleaseReason::kStarting, "", "starting"},
    {ReleaseReason::kSleeping, "sleep", "sleeping"},
    {ReleaseReason::kWaitingMutex, "mutex", "waiting_mutex"},
    {ReleaseReason::kPreempted, "", "preempted"},
    {ReleaseReason::kIo, "io", "io"},
    {ReleaseReason::kQueue, "queue", "queue"},
    {ReleaseReason::kConditionVariable, "condition_variable", "condition_variable"},
    {ReleaseReason::kJoin, "join", "join"},
    {ReleaseReason::kPass, "pass", "pass"},
    {ReleaseReason::kProcessWait, "process_wait", "process_wait"},
    {ReleaseReason::kTimeslice, "timeslice", "timeslice"},
    {ReleaseReason::kExit, "exit", "exit"},
    {ReleaseReason::kIdle, "idle", "idle"},
    {ReleaseReason::kDbPool, "db_pool", "db_pool"},
}};

constexpr bool InEnumOrder() {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (static_cast<size_t>(kNames[i].reason) != i) return false;
  }
  return true;
}
static_assert(InEnumOrder(), "kNames must list every ReleaseReason in enum order");

}  // namespace

std::string_view ReleaseReasonName(ReleaseReason reason) {
  const auto i = static_cast<size_t>(reason);
  return i < kNames.size() ? kNames[i].display : "?";
}

std::string_view ReleaseReasonTraceName(ReleaseReason reason) {
  const auto i = static_cast<size_t>(reason);
  if (i >= kNames.size() || kNames[i].trace.empty()) return kNames[0].trace;
  return kNames[i].trace;
}

ReleaseReason ParseReleaseReasonTraceName(std::string_view name) {
  if (name.empty()) return ReleaseReason::kUnknown;
  for (const ReasonNames& n : kNames) {
    if (n.trace == name) return n.reason;
  }
  return ReleaseReason::kUnknown;
}

}  // namespace rvbpfd
