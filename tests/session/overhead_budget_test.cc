#include "session/overhead_budget.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace rvbpfd {
namespace {

constexpr uint64_t kMs = 1'000'000;
using Action = OverheadBudget::Action;

TEST(OverheadBudget, PausesOnceTheWindowAllowanceIsSpentAndResumesAtTheNextWindow) {
  // 5% of a 1 s window = 50 ms of traps; at 10 us per trap that is 5,000 traps.
  OverheadBudget b(5.0, 10.0, 1000 * kMs);
  EXPECT_EQ(b.Update(0, 0), Action::kNone);
  EXPECT_EQ(b.Update(500 * kMs, 100), Action::kNone);  // rate: 1 ms of traps per 500 ms
  EXPECT_EQ(b.Update(900 * kMs, 4'900), Action::kNone);
  EXPECT_EQ(b.Update(950 * kMs, 5'000), Action::kPause);
  EXPECT_TRUE(b.paused());
  EXPECT_EQ(b.Update(960 * kMs, 5'010), Action::kNone);  // stays paused: no double pause
  EXPECT_EQ(b.Update(1000 * kMs, 5'020), Action::kResume);
  EXPECT_FALSE(b.paused());
  EXPECT_NEAR(b.last_window_pct(), 5'020 * 10e-6 / 1.0 * 100, 1e-9);
  EXPECT_EQ(b.windows(), 1u);
  // The next window has the same length (no back-off: reattaching is charged instead) and starts owing what the last
  // one spent beyond its allowance: 20 traps = 0.2 ms.
  EXPECT_EQ(b.window_ns(), 1000 * kMs);
  EXPECT_EQ(b.Update(1500 * kMs, 5'120), Action::kNone);
  EXPECT_NEAR(b.current_pct(1500 * kMs, TrapCounts{5'120}), (1.0 + 0.2) / 500 * 100, 1e-9);
  EXPECT_EQ(b.Update(1999 * kMs, 5'130), Action::kNone);
  EXPECT_EQ(b.Update(2000 * kMs, 5'140), Action::kNone) << "a window that ends unpaused resumes nothing";
}

TEST(OverheadBudget, CountTrapsUsesEveryHitNotRecords) {
  // io_heavy on a shared libruby, per pipe hand-off: 6 scheduler records plus one rb_mutex_lock hit from IO#write's
  // rb_mutex_synchronize that BPF discarded by caller. The trap was taken: the budget must count it.
  rv_counters c{};
  c.events = 600;
  c.dropped = 0;
  c.probe_hits = 700;
  c.hits_discarded = 100;
  const std::vector<uint64_t> site_hits = {3, 0, 4, 690, 3};  // cookie 3: a pausable site
  const TrapCounts t = CountTraps(c, site_hits, {0, 2, 4, 9});  // cookie 9 was never assigned: 0
  EXPECT_EQ(t.total, 700u);
  EXPECT_EQ(t.unpausable, 10u);

  // The same window seen through both inputs: 5,250 traps paid (52.5 ms, over the 50 ms allowance of 5% of 1 s at
  // 10 us a trap) but only 4,500 records (6 of every 7 hits). Only the trap count pauses.
  OverheadBudget by_traps(5.0, 10.0, 1000 * kMs);
  OverheadBudget by_records(5.0, 10.0, 1000 * kMs);
  by_traps.Update(0, 0);
  by_records.Update(0, 0);
  EXPECT_EQ(by_traps.Update(600 * kMs, 5'250), Action::kPause);
  EXPECT_EQ(by_records.Update(600 * kMs, 4'500), Action::kNone);
}

TEST(OverheadBudget, ColdAndSingleSteppedTrapsCostTheirOwnPrice) {
  rv_counters c{};
  c.probe_hits = 1'000;
  c.cold_hits = 300;
  c.stepped_hits = 20;
  EXPECT_EQ(CountTraps(c, {}, {}).cold, 300u);
  EXPECT_EQ(CountTraps(c, {}, {}).stepped, 20u);

  // 10 us a trap, 15 us more for a cold one. 4,000 isolated traps in 600 ms (one every 150 us, as GC steps between
  // pipe hand-offs): 100 ms estimated against a 50 ms allowance; counted at 10 us each they would look like 40 ms.
  OverheadBudget cold_aware(5.0, TrapCosts(10.0, 0, 15.0), 1000 * kMs);
  OverheadBudget flat(5.0, 10.0, 1000 * kMs);
  cold_aware.Update(0, TrapCounts{});
  flat.Update(0, TrapCounts{});
  EXPECT_EQ(cold_aware.Update(600 * kMs, TrapCounts{4'000, 0, 4'000}), Action::kPause);
  EXPECT_EQ(flat.Update(600 * kMs, TrapCounts{4'000, 0, 4'000}), Action::kNone);
  EXPECT_NEAR(cold_aware.current_pct(600 * kMs, TrapCounts{4'000, 0, 4'000}), 100.0 / 600 * 100, 1e-9);
  EXPECT_DOUBLE_EQ(cold_aware.CostNs(10, 4), 10 * 10'000.0 + 4 * 15'000.0);

  // A burst (the traps a budget stops) is warm after its first trap: charged at the plain price.
  OverheadBudget burst(5.0, TrapCosts(10.0, 0, 15.0), 1000 * kMs);
  burst.Update(0, TrapCounts{});
  EXPECT_EQ(burst.Update(600 * kMs, TrapCounts{4'000, 0, 1}), Action::kNone);

  // 1.5 us an emulated hit, 10.5 a single-stepped one: 20,000 hits in 500 ms are 30 ms (6% of the window's 5% of 1 s
  // allowance is 50 ms: no pause) unless 3,000 of them were single-stepped (+27 ms: 57 ms, pause).
  OverheadBudget emulated(5.0, TrapCosts(1.5, 10.5, 0), 1000 * kMs);
  OverheadBudget some_stepped(5.0, TrapCosts(1.5, 10.5, 0), 1000 * kMs);
  emulated.Update(0, TrapCounts{});
  some_stepped.Update(0, TrapCounts{});
  EXPECT_EQ(emulated.Update(500 * kMs, TrapCounts{20'000, 0, 0, 0}), Action::kNone);
  EXPECT_EQ(some_stepped.Update(500 * kMs, TrapCounts{20'000, 0, 0, 3'000}), Action::kPause);
  EXPECT_DOUBLE_EQ(some_stepped.CostNs(10, 0, 2), 10 * 1'500.0 + 2 * 9'000.0);

  // A stepped price at or below the plain one changes nothing.
  EXPECT_DOUBLE_EQ(OverheadBudget(5.0, TrapCosts(10.0, 5.0, 0), 1000 * kMs).CostNs(10, 0, 10), 100'000.0);
}

TEST(OverheadBudget, EachResumeChargesWhatThePauseAndResumeCostTheTarget) {
  // 10 us a trap, 4 ms a pause + resume cycle; 5% of 1 s windows = 50 ms.
  OverheadBudget b(5.0, TrapCosts(10.0, 0, 0, 4'000), 1000 * kMs);
  OverheadBudget free_cycles(5.0, 10.0, 1000 * kMs);
  for (OverheadBudget* x : {&b, &free_cycles}) {
    x->Update(0, TrapCounts{});
    EXPECT_EQ(x->Update(900 * kMs, TrapCounts{5'000}), Action::kPause);
    EXPECT_EQ(x->Update(1000 * kMs, TrapCounts{5'000}), Action::kResume);
  }
  // The new window starts owing the cycle: 4 ms of its 50 ms, so 4,600 traps (not 5,000) exhaust it.
  EXPECT_NEAR(b.current_pct(1100 * kMs, TrapCounts{5'000}), 4.0 / 100 * 100, 1e-9);
  EXPECT_NEAR(free_cycles.current_pct(1100 * kMs, TrapCounts{5'000}), 0.0, 1e-9);
  EXPECT_EQ(b.Update(1900 * kMs, TrapCounts{9'700}), Action::kPause);
  EXPECT_EQ(free_cycles.Update(1900 * kMs, TrapCounts{9'700}), Action::kNone);
}

TEST(OverheadBudget, ChargedCostsCountAgainstTheWindow) {
  OverheadBudget b(5.0, 10.0);  // 250 ms window: 12.5 ms allowance
  EXPECT_EQ(b.window_ns(), OverheadBudget::kDefaultWindowNs);
  b.Update(0, 0);
  b.Charge(10.0 * kMs);  // e.g. the daemon's CPU time to reattach a group on a saturated machine
  EXPECT_EQ(b.Update(100 * kMs, 200), Action::kNone);  // 2 ms of traps + 10 ms charged = 12 ms
  EXPECT_NEAR(b.current_pct(100 * kMs, TrapCounts{200}), 12.0, 1e-9);
  EXPECT_EQ(b.Update(101 * kMs, 260), Action::kPause);  // 12.6 ms
  EXPECT_EQ(b.Update(250 * kMs, 260), Action::kResume);
  EXPECT_NEAR(b.last_window_pct(), 12.6 / 250 * 100, 1e-9);
  // Charges belong to the window they were made in; only the overspend (12.6 - 12.5 ms) is carried into the next.
  EXPECT_NEAR(b.current_pct(260 * kMs, TrapCounts{260}), 0.1 / 10 * 100, 1e-9);
}

// A program that traps continuously: simulate the recorder's loop (check at NextCheckNs, detach on kPause, reattach
// on kResume) and check what the target pays over runs of several lengths.
struct SimResult {
  double spent_ns = 0;
  int pauses = 0;
};
// late_ns: the daemon wakes that much later than asked; detach_ns: traps go on that long after a pause decision.
SimResult Simulate(double budget_pct, double trap_share, uint64_t run_ns, double reattach_charge_ns,
                   uint64_t late_ns = 0, uint64_t detach_ns = 0) {
  constexpr double kCostNs = 10'000;  // 10 us a trap
  OverheadBudget b(budget_pct, kCostNs / 1000);
  SimResult r;
  uint64_t now = 0;
  double traps = 0;
  bool attached = true;
  uint64_t detached_at = 0;  // while paused: when the breakpoints are really gone
  b.Update(now, 0);
  while (now < run_ns) {
    const uint64_t step = std::min(b.NextCheckNs(now) + late_ns, run_ns - now);
    const uint64_t trapping = attached ? step : std::min(step, detached_at > now ? detached_at - now : 0);
    traps += trap_share * static_cast<double>(trapping) / kCostNs;
    now += step;
    switch (b.Update(now, static_cast<uint64_t>(traps))) {
      case Action::kPause:
        attached = false;
        detached_at = now + detach_ns;
        ++r.pauses;
        break;
      case Action::kResume:
        attached = true;
        b.Charge(reattach_charge_ns);
        r.spent_ns += reattach_charge_ns;
        break;
      case Action::kNone:
        break;
    }
  }
  r.spent_ns += static_cast<double>(static_cast<uint64_t>(traps)) * kCostNs;
  return r;
}

TEST(OverheadBudget, ContinuousTrappingStaysWithinTheBudgetPlusOneWindowAllowance) {
  // A transition-heavy program spends 95% of its time in traps while attached (io_heavy traced: ~20x slower).
  for (uint64_t run_ms : {300, 1'500, 2'600, 10'000}) {
    const SimResult r = Simulate(5.0, 0.95, run_ms * kMs, 200'000);  // 0.2 ms charged per reattach
    const double run_ns = static_cast<double>(run_ms * kMs);
    const double window_allowance = 0.05 * static_cast<double>(OverheadBudget::kDefaultWindowNs);
    EXPECT_LE(r.spent_ns, 0.05 * run_ns + window_allowance + 0.2 * kMs) << run_ms << " ms run";
    EXPECT_GE(r.spent_ns, 0.045 * run_ns - window_allowance) << run_ms << " ms run: the budget is also used";
    EXPECT_GE(r.pauses, static_cast<int>(run_ms / 250) - 1);
  }
  // 10 s: the long-run share converges on the budget (the one-window slack is 0.125% of it).
  const SimResult r = Simulate(5.0, 0.95, 10'000 * kMs, 200'000);
  EXPECT_LE(r.spent_ns / (10'000.0 * kMs) * 100, 5.2);
}

TEST(OverheadBudget, OverspendFromLateChecksAndSlowDetachesIsRepaidInTheNextWindow) {
  // A busy machine: every check comes 2 ms late, and traps go on for 3 ms after each pause decision (what a loaded
  // 2-core VM showed). Each window overshoots; the next one repays it, so the long run still holds the budget.
  const SimResult slow = Simulate(5.0, 0.95, 10'000 * kMs, 200'000, 2 * kMs, 3 * kMs);
  EXPECT_LE(slow.spent_ns / (10'000.0 * kMs) * 100, 5.3);
  EXPECT_GE(slow.spent_ns / (10'000.0 * kMs) * 100, 4.0);
  // A short run pays at most one allowance and one overshoot beyond budget% of its length.
  const SimResult short_run = Simulate(5.0, 0.95, 1'500 * kMs, 200'000, 2 * kMs, 3 * kMs);
  EXPECT_LE(short_run.spent_ns, 0.05 * 1'500 * kMs + 2 * 0.05 * OverheadBudget::kDefaultWindowNs);
}

TEST(OverheadBudget, ASlowDetachIsOwedAndLaterPausesStartEarlierByItsTail) {
  OverheadBudget b(5.0, 10.0);  // 12.5 ms allowance per 250 ms window
  b.Update(0, 0);
  EXPECT_EQ(b.Update(5 * kMs, 500), Action::kNone);     // rate 1.0
  EXPECT_EQ(b.Update(10 * kMs, 1'000), Action::kNone);  // 10 ms spent
  EXPECT_EQ(b.Update(12 * kMs, 1'200), Action::kPause);  // 12 ms + 1 ms ahead
  // The detach took effect only after 30 ms more of traps (an RCU grace period on a busy machine).
  b.Detached(TrapCounts{4'200});
  // 43 ms spent, 30.5 ms over: owed by the next windows. Owing a whole allowance, the next window stays paused
  // (reattaching would cost another tail), and so does the one after (18 ms owed).
  EXPECT_EQ(b.Update(250 * kMs, 4'300), Action::kNone);
  EXPECT_TRUE(b.paused());
  EXPECT_NEAR(b.current_pct(260 * kMs, TrapCounts{4'300}), 30.5 / 10 * 100, 1e-9);
  EXPECT_EQ(b.Update(500 * kMs, 4'300), Action::kNone);
  EXPECT_EQ(b.Update(750 * kMs, 4'300), Action::kResume);
  EXPECT_NEAR(b.current_pct(760 * kMs, TrapCounts{4'300}), 5.5 / 10 * 100, 1e-9);
  // 5.5 ms owed and a 30 ms detach tail to expect: pausing now is what keeps the window closest to its allowance.
  EXPECT_EQ(b.Update(760 * kMs, 4'300), Action::kPause);
  b.Detached(TrapCounts{4'400});  // a 1 ms tail this time: the estimate decays (30 -> 22.75 ms), it does not vanish
  EXPECT_EQ(b.Update(1000 * kMs, 4'400), Action::kResume);  // 6.5 ms spent: nothing owed
  // A tail longer than the allowance: each resumed window is one short burst (the first check, then the detach).
  EXPECT_EQ(b.Update(1005 * kMs, 4'400), Action::kPause);

  // The debt is capped at four allowances: a floor far above the budget must not keep the sites detached for long
  // once it is gone.
  OverheadBudget c(5.0, 10.0);
  c.Update(0, 0);
  EXPECT_EQ(c.Update(5 * kMs, 100'000), Action::kPause);  // 1 s of traps in 5 ms
  for (uint64_t t : {250, 500, 750, 1000}) EXPECT_EQ(c.Update(t * kMs, 100'000), Action::kNone) << t;
  EXPECT_EQ(c.Update(1250 * kMs, 100'000), Action::kResume);
}

TEST(OverheadBudget, LateWakeupsMakeItPauseEarlier) {
  OverheadBudget on_time(5.0, 10.0), late(5.0, 10.0);  // 12.5 ms allowance per 250 ms window
  for (OverheadBudget* b : {&on_time, &late}) {
    b->Update(0, 0);
    EXPECT_EQ(b->NextCheckNs(0), OverheadBudget::kMaxCheckNs);
  }
  EXPECT_EQ(on_time.Update(5 * kMs, 500), Action::kNone);  // as asked; 5 ms of traps in 5 ms
  EXPECT_EQ(late.Update(9 * kMs, 500), Action::kNone);     // 4 ms late
  on_time.NextCheckNs(5 * kMs);
  EXPECT_EQ(late.NextCheckNs(9 * kMs), OverheadBudget::kMaxCheckNs);
  // Same spend (10 ms) and rate (1.0) in both: the on-time budget expects its next check within 1 ms and goes on
  // (11 ms < 12.5 ms); the late one allows for its wakeups coming ~3 ms late and pauses now.
  EXPECT_EQ(on_time.Update(10 * kMs, 1'000), Action::kNone);
  EXPECT_NEAR(static_cast<double>(on_time.NextCheckNs(10 * kMs)), 2.5 * kMs, 2.0);
  EXPECT_EQ(late.Update(14 * kMs, 1'000), Action::kPause);
}

TEST(OverheadBudget, NextCheckPredictsWhenTheAllowanceRunsOut) {
  OverheadBudget b(5.0, 10.0);  // 12.5 ms allowance per 250 ms window
  b.Update(0, 0);
  EXPECT_EQ(b.NextCheckNs(0), OverheadBudget::kMaxCheckNs) << "no rate known yet";
  EXPECT_EQ(b.Update(5 * kMs, 100), Action::kNone);  // 1 ms of traps in 5 ms: rate 0.2
  // 11.5 ms left at 0.2 -> 57.5 ms away: the usual 5 ms check.
  EXPECT_EQ(b.NextCheckNs(5 * kMs), OverheadBudget::kMaxCheckNs);
  EXPECT_EQ(b.Update(10 * kMs, 1'000), Action::kNone);  // 9 ms in 5 ms: rate 1.8; 10 ms spent, 2.5 ms left
  EXPECT_NEAR(static_cast<double>(b.NextCheckNs(10 * kMs)), 2.5 / 1.8 * kMs, 2.0);
  EXPECT_EQ(b.Update(11 * kMs, 1'150), Action::kPause)  // 11.5 ms + 1 ms at 1.5 >= 12.5: pause a little early
      << "the allowance would run out before the soonest next check";
  EXPECT_EQ(b.NextCheckNs(11 * kMs), OverheadBudget::kMaxCheckNs);
  EXPECT_EQ(b.NextCheckNs(248 * kMs), 2 * kMs) << "paused: checked again when the window ends";
  EXPECT_EQ(b.NextCheckNs(249'900'000), OverheadBudget::kMinCheckNs);
}

TEST(OverheadBudget, FloorSaysWhatTheSitesThatStayAttachedCostAlone) {
  OverheadBudget b(5.0, 10.0, 1000 * kMs);
  b.Update(0, 0, 0);
  EXPECT_EQ(b.Update(100 * kMs, 5'000, 4'000), Action::kPause);
  // Paused: only the unpausable sites (e.g. a GC.start loop: GC enter/exit sites) keep trapping, 6,000 more.
  // 110 ms spent in a 50 ms allowance: the next window owes more than its allowance and stays paused.
  EXPECT_EQ(b.Update(1000 * kMs, 11'000, 10'000), Action::kNone);
  EXPECT_NEAR(b.floor_pct(), 10.0, 1e-9) << "100 ms of unpausable traps in 1 s";
  EXPECT_NEAR(b.last_window_pct(), 11.0, 1e-9);
  EXPECT_GT(b.floor_pct(), 5.0);
}

TEST(OverheadBudget, ZeroBudgetOnlyEstimates) {
  OverheadBudget b(0, 13.0, 1000 * kMs);
  EXPECT_EQ(b.Update(0, 0), Action::kNone);
  EXPECT_EQ(b.Update(900 * kMs, 1'000'000), Action::kNone);
  EXPECT_FALSE(b.paused());
  EXPECT_NEAR(b.current_pct(1000 * kMs, TrapCounts{1'000'000}), 1'000'000 * 13e-6 * 100, 1e-6);
  EXPECT_EQ(b.NextCheckNs(950 * kMs), OverheadBudget::kMaxCheckNs);
  EXPECT_EQ(b.Update(1000 * kMs, 1'000'000), Action::kNone);
  EXPECT_NEAR(b.last_window_pct(), 1300.0, 1e-6);
}

TEST(OverheadBudget, QuietProgramNeverPauses) {
  OverheadBudget b(5.0, 10.0);
  uint64_t traps = 0;
  for (uint64_t t = 0; t < 10'000 * kMs; t += 5 * kMs) {
    traps += 20;  // 4,000 traps/s = 4% of wall time
    EXPECT_EQ(b.Update(t, traps), Action::kNone) << t;
  }
  EXPECT_NEAR(b.last_window_pct(), 4.0, 0.1);
}

}  // namespace
}  // namespace rvbpfd
