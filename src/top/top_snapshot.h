// What `rvbpfd top` shows of one interval (src/top/top_state.h builds it, top_render.h draws it): per thread the
// share of the interval in each state, the GVL holder, the top blockers and the top blocked stacks. Plain data, so
// that rendering is a pure function of it.
#ifndef RVBPFD_SRC_TOP_TOP_SNAPSHOT_H_
#define RVBPFD_SRC_TOP_TOP_SNAPSHOT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rvbpfd {

struct TopThread {
  uint32_t ruby_thread = 0;              // the trace's numbering (main = 1)
  std::optional<uint32_t> native_tid;
  std::string name;                      // ThreadInfo::DisplayName (Thread#name, else its native name), "" when none
  // What it is doing at the end of the interval: "running", "gc", "gvl_wait", "blocked", "exited" or "unknown".
  std::string state;
  std::string reason;                    // state "blocked": the release reason ("sleep", "io", ...), else ""
  bool holds_gvl = false;                // the GVL holder at the end of the interval
  // ns of the interval: holding the GVL (running Ruby, GC excluded), running a GC, waiting for the GVL, blocked
  // (by release reason, heaviest first), and not known (idle: no event said what it did, or not alive).
  uint64_t running_ns = 0;
  uint64_t gc_ns = 0;
  uint64_t gvl_wait_ns = 0;
  std::vector<std::pair<std::string, uint64_t>> blocked_ns;
  uint64_t idle_ns = 0;
  std::string where;                     // its latest known Ruby method (StackWhere), "" when none
  // The endpoint of that latest stack (model/endpoint.h: the Rails action or job it works for, derived), "-" when
  // no rule names one.
  std::string endpoint = "-";

  uint64_t blocked_total_ns() const {
    uint64_t n = 0;
    for (const auto& [reason, ns] : blocked_ns) n += ns;
    return n;
  }
};

// A holder's Ruby method that made others wait for the GVL (model/blockers.h grouping), this interval.
struct TopBlocker {
  std::string method;
  uint64_t wait_ns = 0;                  // others' GVL wait blamed on it
  std::vector<uint32_t> holders;         // ruby_thread of the holders, heaviest first (none: nobody / not known)
};

// Where threads waited: a stack, as StackWhere names it, and what they waited for there.
struct TopBlockedStack {
  std::string state;                     // "gvl_wait" or the blocked reason ("sleep", "io", "mutex", ...)
  std::string where;
  uint64_t ns = 0;
  std::vector<uint32_t> threads;         // ruby_thread, ascending
};

struct TopSnapshot {
  int pid = 0;
  std::string ruby_version;
  uint64_t number = 0;                   // 1 for the first interval
  uint64_t start_ns = 0;                 // the interval, in the events' time (ns since the recording's origin)
  uint64_t end_ns = 0;
  std::optional<uint32_t> gvl_holder;    // ruby_thread holding the GVL at the end, when known
  uint64_t events = 0;                   // events of the interval
  uint64_t dropped = 0;                  // events lost in the interval (ring full)
  std::vector<TopThread> threads;        // most waiting first (TopThreadOrder)
  std::vector<TopBlocker> blockers;      // heaviest first
  std::vector<TopBlockedStack> blocked_stacks;  // heaviest first

  uint64_t interval_ns() const { return end_ns > start_ns ? end_ns - start_ns : 0; }
};

// The order rows are shown in: the most GVL wait first, then the most blocked time, then the thread number.
bool TopThreadOrder(const TopThread& a, const TopThread& b);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TOP_TOP_SNAPSHOT_H_
