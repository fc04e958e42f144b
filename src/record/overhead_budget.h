// OverheadBudget decides when --max-overhead pauses the high-rate probe sites.
//
// The target pays one int3 trap per probe hit (about 10-13 us on a VM), so its time lost to probes is estimated as
// hits x cost_per_hit. Time is cut into windows (1 s by default); within a window the probes may cost at most
// budget% of the window. Once the window's allowance is spent, the high-rate sites are detached until the window
// ends, then reattached: over each window the estimated cost stays within the budget plus what accrues between two
// checks (the daemon checks every 5 ms while a budget is set). Detaching and reattaching uprobes is itself costly for
// the target (breakpoints are written into its text pages under its mmap lock), so while the program stays busy
// each paused window is followed by one twice as long (up to 8x the base); a window that ends without a pause resets
// the length.
//
// Pure logic with the clock passed in, so it is unit-tested without BPF. Not thread-safe; used by the main loop.
#ifndef RVBPFD_SRC_RECORD_OVERHEAD_BUDGET_H_
#define RVBPFD_SRC_RECORD_OVERHEAD_BUDGET_H_

#include <cstdint>

namespace rvbpfd {

class OverheadBudget {
 public:
  enum class Action { kNone, kPause, kResume };

  // budget_pct <= 0: never pauses (estimates only). cost_us: one probe hit, microseconds.
  OverheadBudget(double budget_pct, double cost_us, uint64_t window_ns = 1'000'000'000)
      : budget_pct_(budget_pct), cost_ns_(cost_us * 1000.0), base_window_ns_(window_ns), window_ns_(window_ns) {}

  // now_ns: monotonic time; hits_total: cumulative probe hits (records written + dropped) since the start.
  Action Update(uint64_t now_ns, uint64_t hits_total);

  bool paused() const { return paused_; }
  // Estimated share of wall time the target spent in probe traps during the last complete window (percent).
  double last_window_pct() const { return last_window_pct_; }
  // Length of the current window (ns): the base length, doubled after each window that ended paused.
  uint64_t window_ns() const { return window_ns_; }
  // The same for the current window so far (percent).
  double current_pct(uint64_t now_ns, uint64_t hits_total) const;

 private:
  double budget_pct_;
  double cost_ns_;
  uint64_t base_window_ns_;
  uint64_t window_ns_;
  bool started_ = false;
  bool paused_ = false;
  uint64_t window_start_ns_ = 0;
  uint64_t window_start_hits_ = 0;
  double last_window_pct_ = 0;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_RECORD_OVERHEAD_BUDGET_H_
