// OverheadBudget decides when --max-overhead pauses the high-rate probe sites.
//
// What the target pays: one int3 trap per probe hit (~1.4 us with the BPF program on a VM where the kernel emulates the
// probed instruction, ~10 us where it single-steps it), whether or not the hit becomes a record. The input is therefore
// the trap count BPF keeps before any filtering (rv_counters.probe_hits), not the records: in a shared libruby the
// Mutex#lock site is also entered by every IO#write (rb_mutex_synchronize calls rb_mutex_lock through the PLT) and BPF
// discards those hits by caller, so "records written + dropped" would miss one trap per write. For the same reason
// that site is paused with the GVL sites: left attached, its IO-rate traps alone can exceed the budget (docs/design.md,
// "Overhead and --max-overhead", has the measurements).
//
// The estimate is traps x the cost of a hit, plus what the dearer hits cost beyond that, plus charged costs
// (TrapCosts), plus the BPF time measured on the target's Ruby stacks (stack_ns: it grows with their depth). rvbpfd
// puts its probes on instructions the kernel emulates (sites/placement.h): ~1.4 us a hit on this VM with the BPF
// program; a site left on a single-stepped instruction costs ~10 us (a second exception, #DB), and BPF counts its hits
// apart. A cold hit is one with no other trap of a target on its CPU in the previous rv_config.cold_gap_ns: its path
// (kernel entry, the BPF program and maps) has left the caches, and benchmarks/trap_gap_cost.cc measures it at 2-3x a
// back-to-back one (+2.5 us emulated). Time is cut into windows (250 ms by default); within a window the probes may
// cost at most budget% of it. Once the window's allowance is spent the pausable sites are detached until the window
// ends, then reattached. Short windows bound what a short run can overspend: a run of T s pays at most one window's
// allowance more than budget% x T (the allowance is spent at the start of a window). Between two checks the daemon does
// not see traps, so the budget predicts when the allowance will run out at the current trap rate and asks to be checked
// again then (NextCheckNs, 1-5 ms, earlier by the lateness its recent wakeups showed: a loaded machine wakes the daemon
// late), and pauses early when the allowance would run out before the soonest next check. What a window still spends
// beyond its allowance (traps while the detach takes effect: 3-150 ms on a busy 2-core VM: the kernel removes the
// breakpoints only after an RCU grace period (dup_mmap_sem), then one site at a time under the target's mmap lock) is
// carried into the next window (at most four allowances; a window that owes its whole allowance is skipped, the sites
// stay detached), so over a long run the budget holds and a short run overspends by at most about one window's
// allowance plus one overshoot. The detach tail is learnt (Detached) and later pauses begin that much earlier.
//
// Detaching and reattaching: uprobe (un)registration writes the breakpoints into the target's text pages (a COW copy
// per probed page, under its mmap lock) and costs the daemon ~0.05-0.2 ms of CPU per group
// (benchmarks/reattach_cost.cc; the detach also waits ~40 ms for an RCU grace period, which blocks only the daemon). A
// shared libruby costs no more than a static ruby here: the kernel writes breakpoints only into the mm the link is
// filtered to (the target). It does take, per site and per (un)registration, the mmap write lock of every process
// mapping the file, so each pause and resume briefly holds up mmap/munmap/page faults of other processes using the same
// libruby (or the same static ruby executable); the probed text is not written there. The target-side part is below
// what that benchmark resolves on a 2-core VM, so the daemon charges what it can measure: its own CPU time for each
// detach and reattach (Charge), which on a machine whose cores are all busy competes with the target one for one.
//
// The sites that stay attached while paused (thread start/exit) keep trapping; with unpausable traps passed to Update,
// floor_pct() says what they alone cost over the last window, so the recorder can say when no pause can hold the
// budget.
//
// Pure logic with the clock passed in, so it is unit-tested without BPF. Not thread-safe; used by the main loop.
#ifndef RVBPFD_SRC_SESSION_OVERHEAD_BUDGET_H_
#define RVBPFD_SRC_SESSION_OVERHEAD_BUDGET_H_

#include <cstdint>
#include <vector>

#include "rvbpfd/abi.h"

namespace rvbpfd {

// The budget's inputs, from BPF's counters: every trap of the target (probe_hits, which includes the hits BPF
// discarded; never records written + dropped, which miss those), and the traps of the sites that stay attached while
// paused (per-site hits summed over their cookies; cookies beyond site_hits count 0).
struct TrapCounts {
  uint64_t total = 0;
  uint64_t unpausable = 0;
  uint64_t cold = 0;     // of total, the cold ones (rv_counters.cold_hits)
  uint64_t stepped = 0;  // of total, the hits of single-stepped sites (rv_counters.stepped_hits)
  uint64_t stack_ns = 0;  // BPF time spent on the target's Ruby stacks (rv_counters.stack_ns), charged as measured
};

// What one trap costs the target, microseconds.
struct TrapCosts {
  TrapCosts(double hit) : hit_us(hit) {}  // NOLINT: a plain figure is a hit's cost and nothing dearer
  TrapCosts(double hit, double stepped, double cold_extra, double cycle = 0)
      : hit_us(hit), stepped_us(stepped), cold_extra_us(cold_extra), cycle_us(cycle) {}
  double hit_us;              // a hit of a probe on an emulated instruction
  double stepped_us = 0;      // a hit of a single-stepped probe (at most hit_us: no difference)
  double cold_extra_us = 0;   // added for a cold hit
  // The target's own cost of one pause + resume (detach and reattach of the pausable group), charged at each
  // resume, beyond the daemon's CPU time the caller charges: kCycleTargetUs.
  double cycle_us = 0;
};

// What a detach + reattach of the pausable group costs a target that is trapping (us): 3.6-4.5 ms of its progress
// per cycle in `bench_reattach_cost VM RUBY 250 8 2000 io-detached 1` (a pinned pipe-passing target), against
// 0.2 ms for a CPU-bound one; charged only when the budget cycles, i.e. for targets that trap enough to need it.
constexpr double kCycleTargetUs = 4000;
TrapCounts CountTraps(const rv_counters& counters, const std::vector<uint64_t>& site_hits,
                      const std::vector<uint64_t>& unpausable_cookies);

class OverheadBudget {
 public:
  enum class Action { kNone, kPause, kResume };

  static constexpr uint64_t kDefaultWindowNs = 250'000'000;
  // A trap with no trap of a target on its CPU in the previous 50 us is cold (rv_config.cold_gap_ns): below that the
  // trap path is still cached (benchmarks/trap_gap_cost.cc: within 10% of back to back up to ~20 us of work between
  // traps, 1.3-1.6x after ~50 us, 1.5-2x after 150-200 us).
  static constexpr uint32_t kColdGapNs = 50'000;
  // Bounds of NextCheckNs: never later than the daemon's usual 5 ms check, never sooner than 1 ms (poll granularity).
  static constexpr uint64_t kMaxCheckNs = 5'000'000;
  static constexpr uint64_t kMinCheckNs = 1'000'000;
  // A window's overspend is carried into the next ones up to this many allowances.
  static constexpr double kMaxCarryWindows = 4;

  // budget_pct <= 0: never pauses (estimates only).
  OverheadBudget(double budget_pct, TrapCosts costs, uint64_t window_ns = kDefaultWindowNs)
      : budget_pct_(budget_pct),
        cost_ns_(costs.hit_us * 1000.0),
        stepped_extra_ns_(costs.stepped_us > costs.hit_us ? (costs.stepped_us - costs.hit_us) * 1000.0 : 0.0),
        cold_extra_ns_(costs.cold_extra_us > 0 ? costs.cold_extra_us * 1000.0 : 0.0),
        cycle_ns_(costs.cycle_us > 0 ? costs.cycle_us * 1000.0 : 0.0),
        window_ns_(window_ns) {}

  // now_ns: monotonic time. traps.total: cumulative probe traps of the target since the start (BPF probe_hits: every
  // hit, including those BPF discarded); .unpausable: the part taken at sites that stay attached while paused (0 when
  // unknown); .cold, .stepped: the parts that cost more (cumulative too).
  Action Update(uint64_t now_ns, const TrapCounts& traps);
  // Only a total (every hit at the plain cost).
  Action Update(uint64_t now_ns, uint64_t traps_total, uint64_t unpausable_total = 0) {
    return Update(now_ns, TrapCounts{traps_total, unpausable_total, 0, 0, 0});
  }

  // Estimated target time (ns) that `traps` traps cost, `cold` of them cold and `stepped` single-stepped, plus
  // stack_ns of measured BPF stack work.
  double CostNs(uint64_t traps, uint64_t cold = 0, uint64_t stepped = 0, uint64_t stack_ns = 0) const {
    return static_cast<double>(traps) * cost_ns_ + static_cast<double>(cold) * cold_extra_ns_ +
           static_cast<double>(stepped) * stepped_extra_ns_ + static_cast<double>(stack_ns);
  }
  double CostNs(const TrapCounts& t) const { return CostNs(t.total, t.cold, t.stepped, t.stack_ns); }

  // Target time the probes cost outside their traps (ns), charged to the current window: the daemon's CPU time for
  // detaching and reattaching a group.
  void Charge(double cost_ns) { charged_ns_ += cost_ns; }
  // Call when the detach that followed kPause has returned, with the traps counted then: the traps taken between
  // the decision and the breakpoints' removal (the kernel waits for an RCU grace period first, milliseconds to
  // ~150 ms on a busy VM) are the detach tail, which later pauses start that much earlier to allow for.
  void Detached(const TrapCounts& traps);

  // When to call Update next (ns from now_ns): at the predicted exhaustion of the allowance at the trap rate seen
  // between the last two updates, less the lateness of recent wakeups, within [kMinCheckNs, kMaxCheckNs];
  // kMaxCheckNs while paused or without a budget; capped at the end of the window. The next Update measures how
  // late it came against this answer.
  uint64_t NextCheckNs(uint64_t now_ns);

  bool paused() const { return paused_; }
  uint64_t window_ns() const { return window_ns_; }
  // Estimated share of wall time the target spent in probe traps (and charges) during the last complete window (%).
  double last_window_pct() const { return last_window_pct_; }
  // The same for the unpausable sites alone (%): above the budget, pausing cannot hold it.
  double floor_pct() const { return floor_pct_; }
  // The same for the current window so far (percent).
  double current_pct(uint64_t now_ns, const TrapCounts& traps) const;
  // Windows that have ended so far.
  uint64_t windows() const { return windows_; }

 private:
  // Spent in the current window (ns) when the traps since the start have cost cost_total_ns (CostNs).
  double SpentNs(double cost_total_ns) const;

  double budget_pct_;
  double cost_ns_;
  double stepped_extra_ns_;  // what a single-stepped hit costs beyond cost_ns_
  double cold_extra_ns_;     // what a cold hit costs beyond its price
  double cycle_ns_;          // the target's cost of a pause + resume, charged at each kResume
  uint64_t window_ns_;
  bool started_ = false;
  bool paused_ = false;
  uint64_t window_start_ns_ = 0;
  double window_start_cost_ns_ = 0;  // CostNs of the traps before the window
  uint64_t window_start_unpausable_ = 0;
  double charged_ns_ = 0;  // charges in the current window, including carried_ns_
  double carried_ns_ = 0;  // the previous window's overspend, owed by this one
  uint64_t requested_at_ns_ = 0;  // when NextCheckNs was last asked, and what it answered (0: not since Update)
  uint64_t requested_ns_ = 0;
  double lateness_ns_ = 0;  // how much later than asked the daemon's checks came, recently
  double cost_at_pause_ns_ = 0;
  double tail_ns_ = 0;  // trap cost of recent detach tails (rises at once, decays)
  uint64_t last_ns_ = 0;   // previous Update
  double last_cost_ns_ = 0;
  double rate_ = 0;  // trap cost per ns of wall time between the last two updates (unitless share)
  double last_window_pct_ = 0;
  double floor_pct_ = 0;
  uint64_t windows_ = 0;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SESSION_OVERHEAD_BUDGET_H_
