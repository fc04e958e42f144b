#include "export/run_summary.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "pprof_test_util.h"

namespace rvbpfd {
namespace {

using testing::SyntheticTrace;

constexpr uint64_t kMs = 1'000'000;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The line after the one starting with `header`; "" if none.
std::string LineAfter(const std::vector<std::string>& lines, std::string_view header, size_t n = 1) {
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind(header, 0) == 0) return i + n < lines.size() ? lines[i + n] : "";
  }
  return "";
}

struct Outputs {
  std::string summary;
  std::string blame;
};

Outputs Render(const TraceFile& trace) {
  const StackProfile agg = AggregateStacks(trace);
  Result<Model> model = Model::FromTrace(trace);
  EXPECT_TRUE(model.ok());
  std::ostringstream s, b;
  if (model.ok()) PrintRunSummary(trace, agg, *model, s);
  PrintBlameTotals(trace, agg, b);
  return {s.str(), b.str()};
}

// Thread 2 holds the GVL for 8 ms sampled in Hog.spin while threads 3 and 4 wait for it; then thread 3 holds it for
// 1 ms (sampled in Io#poll) while thread 4 waits; thread 4 then sleeps 5 ms. Threads 2 and 3 do not want the GVL
// again.
TraceFile HogTrace() {
  SyntheticTrace t(99);
  const uint32_t hog = t.Stack({"<main>", "block in <main>", "Hog.spin"});
  const uint32_t poll = t.Stack({"<main>", "Io#run", "Io#poll"});
  const uint32_t sleeping = t.Stack({"<main>", "Napper#run", "Kernel#sleep"});
  t.Event(0, EventName::kGvlAcquired, 2);
  t.Event(1 * kMs, EventName::kWantsGvl, 3);
  t.Event(1 * kMs, EventName::kWantsGvl, 4);
  for (int i = 2; i <= 8; ++i) t.Event(i * kMs, EventName::kSample, 2, hog);
  t.Event(9 * kMs, EventName::kGvlReleased, 2, hog);
  t.Event(9 * kMs, EventName::kGvlAcquired, 3);
  t.Event(9 * kMs + kMs / 2, EventName::kSample, 3, poll);
  t.Event(10 * kMs, EventName::kGvlReleased, 3, poll);
  t.Event(10 * kMs, EventName::kGvlAcquired, 4);
  t.Event(11 * kMs, EventName::kGvlReleased, 4, sleeping);
  t.Event(16 * kMs, EventName::kWantsGvl, 4);
  t.Event(16 * kMs, EventName::kGvlAcquired, 4);
  t.Event(17 * kMs, EventName::kThreadExited, 4);
  return t.Finish(17 * kMs);
}

TEST(RunSummary, NamesTheHolderAndItsMethodAsTopBlockerWithItsShare) {
  const TraceFile trace = HogTrace();
  const Outputs o = Render(trace);
  const std::vector<std::string> lines = Lines(o.summary);
  // Waiting: thread 3 8 ms and thread 4 9 ms; 16 ms of it while thread 2 ran Hog.spin, 1 ms thread 3 in Io#poll.
  const std::string top = LineAfter(lines, "top blockers");
  EXPECT_NE(top.find("Thread #2"), std::string::npos) << o.summary;
  EXPECT_NE(top.find("Hog.spin"), std::string::npos) << o.summary;
  EXPECT_NE(top.find("94.1%"), std::string::npos) << o.summary;  // 16 / 17
  EXPECT_NE(top.find("16.0 ms"), std::string::npos) << o.summary;
  EXPECT_NE(top.find("sampled 100.0%"), std::string::npos) << o.summary;
  const std::string second = LineAfter(lines, "top blockers", 2);
  EXPECT_NE(second.find("Thread #3"), std::string::npos) << o.summary;
  EXPECT_NE(second.find("Io#poll"), std::string::npos) << o.summary;
  EXPECT_NE(o.summary.find("gvl contention: 17.0 ms waiting for the GVL in 2 waits"), std::string::npos)
      << o.summary;
  // Blocked stacks, heaviest first, leaf < caller: threads 2 and 3 stay off the GVL after their release until the
  // end (8 and 7 ms), thread 4 sleeps 5 ms.
  const std::pair<const char*, const char*> want[] = {
      {"8.0 ms", "Hog.spin < block in <main>"}, {"7.0 ms", "Io#poll < Io#run"}, {"5.0 ms", "Kernel#sleep < Napper#run"}};
  for (size_t i = 0; i < std::size(want); ++i) {
    const std::string blocked = LineAfter(lines, "top blocked stacks", i + 1);
    EXPECT_NE(blocked.find(want[i].first), std::string::npos) << blocked;
    EXPECT_NE(blocked.find(want[i].second), std::string::npos) << blocked;
    EXPECT_NE(blocked.find(" 1 thread "), std::string::npos) << blocked;
  }
  EXPECT_NE(o.summary.find("lost: 0 events dropped (0 records), tracing paused 0 times"), std::string::npos);

  // stats: by holder, the same numbers.
  const std::vector<std::string> blame = Lines(o.blame);
  ASSERT_GE(blame.size(), 3u) << o.blame;
  EXPECT_NE(blame[0].find("17.0 ms of GVL waiting in 2 waits"), std::string::npos) << o.blame;
  EXPECT_NE(blame[1].find("Thread #2"), std::string::npos) << o.blame;
  EXPECT_NE(blame[1].find("top: Hog.spin"), std::string::npos) << o.blame;
  EXPECT_NE(blame[2].find("Thread #3"), std::string::npos) << o.blame;
}

// Issue 47: three threads run Ledger.reconcile (in and out of Process.clock_gettime) while thread 5 waits: one row
// for the method, "3 threads", the C function beneath it, not a row of its own. Thread 6 idles in Puma's pool.
TEST(RunSummary, TopBlockersAreRubyMethodsAcrossThreadsWithTheCFunctionBeneath) {
  SyntheticTrace t(1000);
  const FrameInfo reconcile{"Ledger.reconcile", "/app/ledger.rb", 12, FrameKind::kRuby};
  const FrameInfo main_frame{"<main>", "/app/main.rb", 1, FrameKind::kRuby};
  const uint32_t ruby = t.StackOf({main_frame, reconcile});
  const uint32_t clock = t.StackOf({main_frame, reconcile, {"Process.clock_gettime", "<cfunc>", 0, FrameKind::kCfunc}});
  const uint32_t pool = t.StackOf({{"Puma::ThreadPool#spawn_thread", "/gems/puma/thread_pool.rb", 237,
                                    FrameKind::kRuby},
                                   {"Thread::ConditionVariable#wait", "<cfunc>", 0, FrameKind::kCfunc},
                                   {"Thread::Mutex#sleep", "<cfunc>", 0, FrameKind::kCfunc}});
  t.Released(0, 6, pool, "idle");
  t.Event(1 * kMs, EventName::kWantsGvl, 5);
  for (uint32_t holder = 2; holder <= 4; ++holder) {
    const uint64_t at = (holder - 1) * 2 * kMs;  // each holds 2 ms: 1 ms sampled in Ruby code, then 1 ms in the clock
    t.Event(at, EventName::kGvlAcquired, holder);
    t.Event(at + kMs / 2, EventName::kSample, holder, ruby);
    t.Event(at + kMs + kMs / 2, EventName::kSample, holder, clock);
    t.Event(at + 2 * kMs, EventName::kGvlReleased, holder, clock);
  }
  t.Event(8 * kMs, EventName::kGvlAcquired, 5);
  const TraceFile trace = t.Finish(10 * kMs);
  const Outputs o = Render(trace);
  const std::vector<std::string> lines = Lines(o.summary);
  const std::string top = LineAfter(lines, "top blockers");
  EXPECT_NE(top.find("Ledger.reconcile"), std::string::npos) << o.summary;
  EXPECT_NE(top.find("3 threads"), std::string::npos) << o.summary;
  const std::string beneath = LineAfter(lines, "top blockers", 2);
  EXPECT_NE(beneath.find("in Process.clock_gettime"), std::string::npos) << o.summary;
  // No top blocker row of its own for the C function: it is only beneath its Ruby method.
  for (size_t i = 3; i <= 4; ++i) {
    EXPECT_EQ(LineAfter(lines, "top blockers", i).find("Process.clock_gettime"), std::string::npos) << o.summary;
  }
  // The idle pool thread is no blocked stack; it has its own line.
  for (size_t i = 1; i <= kSummaryBlockedStacks; ++i) {
    EXPECT_EQ(LineAfter(lines, "top blocked stacks", i).find("spawn_thread"), std::string::npos) << o.summary;
  }
  EXPECT_NE(o.summary.find("idle (waiting for work, not contention): 10.0 ms in 1 thread"), std::string::npos)
      << o.summary;
}

TEST(RunSummary, WaitsEstimatedWhilePausedAreNamedAsSuchAndCountInTheShares) {
  SyntheticTrace t(100);  // 10 ms a sample
  const uint32_t hog = t.Stack({"<main>", "Hog.spin"});
  const uint32_t poll = t.Stack({"<main>", "Io#poll"});
  // 1 ms observed (thread 3 waits on the hog), then a pause in which readings show thread 3 queued behind the hog.
  t.Event(0, EventName::kGvlAcquired, 2);
  t.Event(1 * kMs, EventName::kWantsGvl, 3);
  t.Event(2 * kMs, EventName::kGvlReleased, 2, hog);
  t.Event(2 * kMs, EventName::kGvlAcquired, 3);
  t.Event(3 * kMs, EventName::kGvlReleased, 3, poll);
  t.Event(3 * kMs, EventName::kGvlAcquired, 2);
  t.Event(10 * kMs, EventName::kTracingPaused, std::nullopt);
  t.Reading(20 * kMs, 2, hog, 2, {3});
  t.Reading(30 * kMs, 2, hog, 2, {3});
  t.Event(40 * kMs, EventName::kTracingResumed, std::nullopt);
  t.Event(45 * kMs, EventName::kGvlReleased, 2, hog);
  t.Event(45 * kMs, EventName::kGvlAcquired, 3);
  const TraceFile trace = t.Finish(50 * kMs);
  const Outputs o = Render(trace);
  // Thread 3 joined the queue between the pause and the first reading (5 ms), then waited to 45 ms: 30 ms inferred.
  EXPECT_NE(o.summary.find("gvl contention: 1.0 ms waiting for the GVL in 1 waits"), std::string::npos) << o.summary;
  EXPECT_NE(o.summary.find("while paused, 30.0 ms more estimated from 2 samples' GVL readings (inferred)"),
            std::string::npos)
      << o.summary;
  const std::string top = LineAfter(Lines(o.summary), "top blockers");
  EXPECT_NE(top.find("Hog.spin"), std::string::npos) << o.summary;
  EXPECT_NE(top.find("100.0%"), std::string::npos) << o.summary;  // (1 + 30) of 31 ms
  EXPECT_NE(top.find("inferred 96.8%"), std::string::npos) << o.summary;  // 30 of its 31 ms
  EXPECT_NE(o.summary.find("but for the GVL waits estimated from the samples' readings"), std::string::npos) << o.summary;
  EXPECT_NE(o.blame.find("30.0 ms more estimated while tracing was paused (inferred)"), std::string::npos) << o.blame;
}

TEST(RunSummary, EndpointsSectionSumsEachEndpointsStatesAndTheBlameItCaused) {
  SyntheticTrace t(99);
  // Root first: two Rails actions and a thread outside any request.
  const uint32_t cpu = t.Stack({"Puma::Server#process_client", "AbstractController::Base#process_action",
                                "LedgerController#cpu", "LedgerCruncher.reconcile"});
  const uint32_t nap = t.Stack({"Puma::Server#process_client", "AbstractController::Base#process_action",
                                "LedgerController#nap", "Kernel#sleep"});
  const uint32_t loop = t.Stack({"Puma::Reactor#select_loop", "IO.select"});
  // Thread 2 runs the cpu action 0-9 ms (sampled); thread 3 released in the nap action at 0 and waits 1-9 ms for the
  // GVL; thread 4 is blocked in IO.select from 0 on.
  t.Event(0, EventName::kGvlAcquired, 2);
  t.Released(0, 3, nap, "sleep");
  t.Released(0, 4, loop, "io");
  t.Event(1 * kMs, EventName::kWantsGvl, 3);
  for (int i = 2; i <= 8; ++i) t.Event(i * kMs, EventName::kSample, 2, cpu);
  t.Event(9 * kMs, EventName::kGvlReleased, 2, cpu);
  t.Event(9 * kMs, EventName::kGvlAcquired, 3);
  t.Event(10 * kMs, EventName::kGvlReleased, 3, nap);
  const std::vector<std::string> lines = Lines(Render(t.Finish(10 * kMs)).summary);
  size_t at = 0;
  while (at < lines.size() && lines[at].rfind("endpoints (derived", 0) != 0) ++at;
  ASSERT_LT(at + 5, lines.size()) << Render(t.Finish(10 * kMs)).summary;
  // Columns: running, gvl_wait, blocked, blamed (the wait others had while it held the lock), reasons.
  EXPECT_EQ(lines[at + 3].substr(0, 2 + 24), "  LedgerController#cpu    ");
  EXPECT_NE(lines[at + 3].find("9.0       0.0       1.0       8.0  unknown 1.0"), std::string::npos) << lines[at + 3];
  EXPECT_EQ(lines[at + 4].substr(0, 22), "  LedgerController#nap");
  EXPECT_NE(lines[at + 4].find("1.0       8.0       1.0       0.0  sleeping 1.0"), std::string::npos) << lines[at + 4];
  EXPECT_EQ(lines[at + 5].substr(0, 3), "  -");
  EXPECT_NE(lines[at + 5].find("io 10.0"), std::string::npos) << lines[at + 5];
}

TEST(RunSummary, NoEndpointsSectionWhenNoStackNamesOne) {
  EXPECT_EQ(Render(HogTrace()).summary.find("endpoints"), std::string::npos);
}

TEST(RunSummary, ThreadRowsAreTheWallClockByStateSummingToTheLifetime) {
  const TraceFile trace = HogTrace();
  const std::vector<std::string> lines = Lines(Render(trace).summary);
  // Thread 4: lifetime 1..17 ms = 16 ms: running 2 (10-11, 16-17), gvl_wait 9, blocked 5.
  std::string row;
  for (const std::string& l : lines) {
    if (l.rfind("  Thread #4", 0) == 0) row = l;
  }
  ASSERT_FALSE(row.empty());
  std::istringstream in(row.substr(std::string("  Thread #4").size()));
  std::string native;
  double lifetime = 0, running = 0, gc = 0, wait = 0, blocked = 0, unknown = 0;
  in >> native >> lifetime >> running >> gc >> wait >> blocked >> unknown;
  EXPECT_DOUBLE_EQ(lifetime, 16.0) << row;
  EXPECT_DOUBLE_EQ(running, 2.0) << row;
  EXPECT_DOUBLE_EQ(gc, 0.0) << row;
  EXPECT_DOUBLE_EQ(wait, 9.0) << row;
  EXPECT_DOUBLE_EQ(blocked, 5.0) << row;
  EXPECT_DOUBLE_EQ(unknown, 0.0) << row;
}

TEST(RunSummary, ManyThreadsStayOnOneScreen) {
  SyntheticTrace t(99);
  const uint32_t s = t.Stack({"<main>", "Work#run"});
  uint64_t now = 0;
  for (uint32_t th = 2; th < 60; ++th) {
    t.Event(now += 1000, EventName::kGvlAcquired, th);
    t.Event(now += 1000, EventName::kWantsGvl, th + 1);
    t.Event(now += 1000, EventName::kSample, th, s);
    t.Event(now += 1000, EventName::kGvlReleased, th, t.Stack({"<main>", "M" + std::to_string(th) + "#io"}));
    t.Event(now += 1000, EventName::kEventsDropped, std::nullopt);
  }
  const TraceFile trace = t.Finish(now + 1000);
  const Outputs o = Render(trace);
  const std::string& out = o.summary;
  const std::vector<std::string> lines = Lines(out);
  EXPECT_LE(lines.size(), 40u) << out;
  EXPECT_NE(out.find("... 47 more threads"), std::string::npos) << out;  // 59 threads, 12 rows
  EXPECT_NE(out.find("lost: 174 events dropped (58 records)"), std::string::npos) << out;  // 3 per record
}

// Thread 100 waits 15 ms while threads 2..16 hold the GVL 1 ms each: stats names 10 holders and counts the rest.
TEST(RunSummary, StatsNamesTheTopHoldersAndCountsTheRest) {
  SyntheticTrace t(99);
  t.Event(0, EventName::kWantsGvl, 100);
  for (uint32_t th = 2; th <= 16; ++th) {
    const uint64_t at = (th - 2) * kMs;
    t.Event(at, EventName::kGvlAcquired, th);
    t.Event(at + kMs, EventName::kGvlReleased, th, t.Stack({"<main>", "M" + std::to_string(th) + "#run"}));
  }
  t.Event(15 * kMs, EventName::kGvlAcquired, 100);
  const TraceFile trace = t.Finish(16 * kMs);
  const std::vector<std::string> lines = Lines(Render(trace).blame);
  ASSERT_EQ(lines.size(), 1u + kStatsHolders + 1u) << Render(trace).blame;
  EXPECT_NE(lines[0].find("15.0 ms of GVL waiting in 1 waits"), std::string::npos) << lines[0];
  for (size_t i = 1; i <= kStatsHolders; ++i) {
    EXPECT_NE(lines[i].find("1.0 ms"), std::string::npos) << lines[i];
    EXPECT_NE(lines[i].find("6.7%"), std::string::npos) << lines[i];
  }
  EXPECT_EQ(lines.back(), "  ... 5 more holders, 5.0 ms");
}

}  // namespace
}  // namespace rvbpfd
