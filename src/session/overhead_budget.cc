#include "session/overhead_budget.h"

#include <algorithm>

namespace rvbpfd {

TrapCounts CountTraps(const rv_counters& counters, const std::vector<uint64_t>& site_hits,
                      const std::vector<uint64_t>& unpausable_cookies) {
  TrapCounts t;
  t.total = counters.probe_hits;
  t.cold = counters.cold_hits;
  t.stepped = counters.stepped_hits;
  t.stack_ns = counters.stack_ns;
  for (uint64_t cookie : unpausable_cookies) {
    if (cookie < site_hits.size()) t.unpausable += site_hits[cookie];
  }
  return t;
}

double OverheadBudget::SpentNs(double cost_total_ns) const {
  return cost_total_ns - window_start_cost_ns_ + charged_ns_;
}

double OverheadBudget::current_pct(uint64_t now_ns, const TrapCounts& traps) const {
  if (!started_ || now_ns <= window_start_ns_) return 0;
  return SpentNs(CostNs(traps)) / static_cast<double>(now_ns - window_start_ns_) * 100.0;
}

OverheadBudget::Action OverheadBudget::Update(uint64_t now_ns, const TrapCounts& traps) {
  const uint64_t unpausable_total = traps.unpausable;
  // Cumulative like the counters (a double holds 2^53 ns, ~104 days of traps, exactly).
  const double cost_total = CostNs(traps);
  if (!started_) {
    started_ = true;
    window_start_ns_ = last_ns_ = now_ns;
    window_start_cost_ns_ = last_cost_ns_ = cost_total;
    window_start_unpausable_ = unpausable_total;
    return Action::kNone;
  }
  // The trap rate is learnt only while attached: the paused rate says nothing about the rate after resuming, and the
  // first check of the next window needs the attached one.
  if (!paused_ && now_ns > last_ns_) {
    rate_ = (cost_total - last_cost_ns_) / static_cast<double>(now_ns - last_ns_);
  }
  // How late the daemon woke for the check it asked for (a busy machine): rises at once, decays slowly.
  if (requested_ns_ > 0 && now_ns >= requested_at_ns_) {
    const double late =
        std::max(0.0, static_cast<double>(now_ns - requested_at_ns_) - static_cast<double>(requested_ns_));
    lateness_ns_ = late > lateness_ns_ ? late : 0.75 * lateness_ns_ + 0.25 * late;
    requested_ns_ = 0;
  }
  last_ns_ = now_ns;
  last_cost_ns_ = cost_total;
  const double allowance_ns = budget_pct_ / 100.0 * static_cast<double>(window_ns_);
  if (now_ns - window_start_ns_ >= window_ns_) {
    const double len = static_cast<double>(now_ns - window_start_ns_);
    const double spent_ns = SpentNs(cost_total);
    last_window_pct_ = (spent_ns - carried_ns_) / len * 100.0;
    floor_pct_ = static_cast<double>(unpausable_total - window_start_unpausable_) * cost_ns_ / len * 100.0;
    ++windows_;
    window_start_ns_ = now_ns;
    window_start_cost_ns_ = cost_total;
    window_start_unpausable_ = unpausable_total;
    // What the window spent beyond its allowance (traps between the last check and the detach taking effect, a
    // late check on a busy machine, traps of the sites that stay attached) is owed by the next windows, at most four
    // allowances (1 s of 250 ms windows): a floor above the budget must not keep the sites detached long after it is
    // gone.
    carried_ns_ = budget_pct_ > 0 ? std::clamp(spent_ns - allowance_ns, 0.0, kMaxCarryWindows * allowance_ns) : 0.0;
    charged_ns_ = carried_ns_;
    if (paused_) {
      // A window that already owes its whole allowance stays paused: reattaching would cost a detach tail on top.
      if (carried_ns_ >= allowance_ns) return Action::kNone;
      paused_ = false;
      charged_ns_ += cycle_ns_;  // the detach that began the pause and the reattach now, on the target's side
      return Action::kResume;
    }
    return Action::kNone;
  }
  if (budget_pct_ <= 0 || paused_) return Action::kNone;
  // Pause when the allowance is spent, or would be before the soonest next check (kMinCheckNs plus the lateness seen
  // recently) at the current rate plus the detach tail. Better early than late: what the target pays beyond the
  // allowance is only repaid in the next windows.
  if (SpentNs(cost_total) + rate_ * (static_cast<double>(kMinCheckNs) + lateness_ns_) + tail_ns_ >= allowance_ns) {
    paused_ = true;
    cost_at_pause_ns_ = cost_total;
    return Action::kPause;
  }
  return Action::kNone;
}

void OverheadBudget::Detached(const TrapCounts& traps) {
  const double cost_total = CostNs(traps);
  if (!paused_ || cost_total < cost_at_pause_ns_) return;
  const double tail = cost_total - cost_at_pause_ns_;
  tail_ns_ = tail > tail_ns_ ? tail : 0.75 * tail_ns_ + 0.25 * tail;
}

uint64_t OverheadBudget::NextCheckNs(uint64_t now_ns) {
  uint64_t next = kMaxCheckNs;
  if (started_ && budget_pct_ > 0 && !paused_ && rate_ > 0) {
    const double allowance_ns = budget_pct_ / 100.0 * static_cast<double>(window_ns_);
    // ns of wall time until the allowance is spent, less the lateness the daemon's wakeups have shown
    const double until_spent = (allowance_ns - SpentNs(last_cost_ns_) - tail_ns_) / rate_ - lateness_ns_;
    next = until_spent <= static_cast<double>(kMinCheckNs) ? kMinCheckNs
           : until_spent >= static_cast<double>(kMaxCheckNs) ? kMaxCheckNs
                                                              : static_cast<uint64_t>(until_spent);
  }
  if (started_) {
    const uint64_t window_end = window_start_ns_ + window_ns_;
    const uint64_t to_end = window_end > now_ns ? window_end - now_ns : 0;
    next = std::max(std::min(next, to_end), kMinCheckNs);
  }
  requested_at_ns_ = now_ns;
  requested_ns_ = next;
  return next;
}

}  // namespace rvbpfd
