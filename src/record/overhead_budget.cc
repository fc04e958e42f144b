#include "record/overhead_budget.h"

#include <algorithm>

namespace rvbpfd {

double OverheadBudget::current_pct(uint64_t now_ns, uint64_t hits_total) const {
  if (!started_ || now_ns <= window_start_ns_) return 0;
  const double cost = static_cast<double>(hits_total - window_start_hits_) * cost_ns_;
  return cost / static_cast<double>(now_ns - window_start_ns_) * 100.0;
}

OverheadBudget::Action OverheadBudget::Update(uint64_t now_ns, uint64_t hits_total) {
  if (!started_) {
    started_ = true;
    window_start_ns_ = now_ns;
    window_start_hits_ = hits_total;
    return Action::kNone;
  }
  if (now_ns - window_start_ns_ >= window_ns_) {
    last_window_pct_ = current_pct(now_ns, hits_total);
    window_start_ns_ = now_ns;
    window_start_hits_ = hits_total;
    if (paused_) {
      paused_ = false;
      window_ns_ = std::min(window_ns_ * 2, base_window_ns_ * 8);
      return Action::kResume;
    }
    window_ns_ = base_window_ns_;
    return Action::kNone;
  }
  if (budget_pct_ <= 0 || paused_) return Action::kNone;
  const double spent_ns = static_cast<double>(hits_total - window_start_hits_) * cost_ns_;
  const double allowance_ns = budget_pct_ / 100.0 * static_cast<double>(window_ns_);
  if (spent_ns >= allowance_ns) {
    paused_ = true;
    return Action::kPause;
  }
  return Action::kNone;
}

}  // namespace rvbpfd
