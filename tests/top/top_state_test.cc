// TopState (top/top_state.h) on synthetic recorder events: each interval's shares per thread, the holder, the order
// of the rows, the blockers and blocked stacks, and states that continue across intervals.
#include "top/top_state.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace rvbpfd {
namespace {

constexpr uint64_t kMs = 1'000'000;

class TopStateTest : public ::testing::Test {
 protected:
  uint32_t Stack(std::vector<FrameInfo> leaf_first) {
    std::vector<uint32_t> ids;
    for (const FrameInfo& f : leaf_first) ids.push_back(table_.InternFrame(f).id);
    return table_.InternStack(ids).id;
  }
  void Event(uint64_t t, uint32_t thread, EventName name, uint32_t stack = 0, const char* reason = "") {
    TraceEvent e;
    e.t_ns = t;
    e.ruby_thread = thread;
    e.native_tid = 1000 + thread;
    e.event = name;
    e.reason = reason;
    if (stack != 0) e.stack = stack;
    state_.OnEvent(e);
  }
  static const TopThread* Row(const TopSnapshot& s, uint32_t thread) {
    for (const TopThread& t : s.threads) {
      if (t.ruby_thread == thread) return &t;
    }
    return nullptr;
  }
  // Thread 2 holds the GVL from 1 ms on (sampled in TopBusy.burn), thread 3 waits for it from 2 ms on, thread 4
  // released it to sleep at 0.9 ms; thread 5 lives 10-20 ms.
  void Feed() {
    state_.Start(0);
    burn_ = Stack({{"TopBusy.burn", "/app/top.rb", 12, FrameKind::kRuby}});
    sleep_ = Stack({{"Kernel#sleep", "<cfunc>", 0, FrameKind::kCfunc}, {"TopBusy.nap", "/app/top.rb", 29}});
    read_ = Stack({{"IO#read", "<cfunc>", 0, FrameKind::kCfunc}, {"TopBusy.pipe", "/app/top.rb", 20}});
    Event(kMs / 2, 4, EventName::kGvlAcquired);
    Event(9 * kMs / 10, 4, EventName::kGvlReleased, sleep_, "sleep");
    Event(1 * kMs, 2, EventName::kGvlAcquired);
    Event(2 * kMs, 3, EventName::kWantsGvl, read_);
    Event(10 * kMs, 5, EventName::kThreadStarted);
    Event(20 * kMs, 5, EventName::kThreadExited);
    Event(500 * kMs, 2, EventName::kSample, burn_);
  }

  StackTable table_;
  TopState state_{42, "3.4.5", &table_};
  uint32_t burn_ = 0, sleep_ = 0, read_ = 0;
};

TEST_F(TopStateTest, SharesOfTheIntervalPerThread) {
  Feed();
  const TopSnapshot s = state_.Cut(1000 * kMs);
  EXPECT_EQ(s.number, 1u);
  EXPECT_EQ(s.interval_ns(), 1000 * kMs);
  ASSERT_NE(Row(s, 2), nullptr);
  EXPECT_EQ(Row(s, 2)->running_ns, 999 * kMs);
  EXPECT_EQ(Row(s, 2)->idle_ns, 1 * kMs);
  EXPECT_EQ(Row(s, 2)->state, "running");
  EXPECT_TRUE(Row(s, 2)->holds_gvl);
  EXPECT_EQ(Row(s, 3)->gvl_wait_ns, 998 * kMs);
  EXPECT_EQ(Row(s, 3)->state, "gvl_wait");
  EXPECT_FALSE(Row(s, 3)->holds_gvl);
  ASSERT_EQ(Row(s, 4)->blocked_ns.size(), 1u);
  EXPECT_EQ(Row(s, 4)->blocked_ns[0].first, "sleep");
  EXPECT_EQ(Row(s, 4)->blocked_ns[0].second, 1000 * kMs - 9 * kMs / 10);
  EXPECT_EQ(Row(s, 4)->running_ns, 4 * kMs / 10);
  EXPECT_EQ(Row(s, 4)->state, "blocked");
  EXPECT_EQ(Row(s, 4)->reason, "sleep");
  EXPECT_EQ(Row(s, 4)->where, "Kernel#sleep in TopBusy.nap (/app/top.rb:29)");
  EXPECT_EQ(Row(s, 2)->where, "TopBusy.burn (/app/top.rb:12)");
  ASSERT_TRUE(s.gvl_holder.has_value());
  EXPECT_EQ(*s.gvl_holder, 2u);
  EXPECT_EQ(Row(s, 3)->native_tid, 1003u);
}

TEST_F(TopStateTest, RowsMostWaitingFirst) {
  Feed();
  const TopSnapshot s = state_.Cut(1000 * kMs);
  ASSERT_GE(s.threads.size(), 3u);
  EXPECT_EQ(s.threads[0].ruby_thread, 3u);  // waits for the GVL
  EXPECT_EQ(s.threads[1].ruby_thread, 4u);  // blocked
  EXPECT_EQ(s.threads.back().ruby_thread, 2u);
}

TEST_F(TopStateTest, BlockersAndBlockedStacks) {
  Feed();
  const TopSnapshot s = state_.Cut(1000 * kMs);
  ASSERT_FALSE(s.blockers.empty());
  EXPECT_EQ(s.blockers[0].method, "TopBusy.burn");
  EXPECT_EQ(s.blockers[0].wait_ns, 998 * kMs);  // thread 3's whole wait, cut at the interval's end
  EXPECT_EQ(s.blockers[0].holders, std::vector<uint32_t>{2});
  ASSERT_GE(s.blocked_stacks.size(), 2u);
  EXPECT_EQ(s.blocked_stacks[0].state, "sleep");
  EXPECT_EQ(s.blocked_stacks[0].where, "Kernel#sleep in TopBusy.nap (/app/top.rb:29)");
  EXPECT_EQ(s.blocked_stacks[0].threads, std::vector<uint32_t>{4});
  EXPECT_EQ(s.blocked_stacks[1].state, "gvl_wait");
  EXPECT_EQ(s.blocked_stacks[1].where, "IO#read in TopBusy.pipe (/app/top.rb:20)");
}

TEST_F(TopStateTest, StatesContinueIntoTheNextInterval) {
  Feed();
  state_.Cut(1000 * kMs);
  const TopSnapshot s = state_.Cut(2000 * kMs);  // no event in between
  EXPECT_EQ(s.number, 2u);
  EXPECT_EQ(s.start_ns, 1000 * kMs);
  EXPECT_EQ(Row(s, 2)->running_ns, 1000 * kMs);
  EXPECT_EQ(Row(s, 3)->gvl_wait_ns, 1000 * kMs);
  EXPECT_EQ(Row(s, 4)->blocked_total_ns(), 1000 * kMs);
  EXPECT_EQ(s.blockers.at(0).wait_ns, 1000 * kMs);
  EXPECT_EQ(s.events, 0u);
}

TEST_F(TopStateTest, ALongBlockedThreadKeepsItsStateIntervalAfterInterval) {
  Feed();
  for (uint64_t i = 1; i <= 8; ++i) state_.Cut(i * 1000 * kMs);
  const TopSnapshot s = state_.Cut(9000 * kMs);
  ASSERT_NE(Row(s, 4), nullptr);
  EXPECT_EQ(Row(s, 4)->blocked_total_ns(), 1000 * kMs);
  EXPECT_EQ(Row(s, 4)->reason, "sleep");
  EXPECT_EQ(Row(s, 3)->gvl_wait_ns, 1000 * kMs);
}

TEST_F(TopStateTest, ExitedThreadShownOnceThenGone) {
  Feed();
  const TopSnapshot first = state_.Cut(1000 * kMs);
  ASSERT_NE(Row(first, 5), nullptr);
  EXPECT_EQ(Row(first, 5)->state, "exited");
  const TopSnapshot second = state_.Cut(2000 * kMs);
  EXPECT_EQ(Row(second, 5), nullptr);
}

TEST_F(TopStateTest, RowsCarryTheThreadsNamesUntilTheyExit) {
  ThreadInfo main_info;
  main_info.native_name = "ruby";
  state_.SetThreadInfo(1, main_info);
  ThreadInfo named;
  named.name = "cpu";
  state_.SetThreadInfo(2, named);
  ThreadInfo inherited;  // an unnamed thread's native name is the process's: not a name
  inherited.native_name = "ruby";
  state_.SetThreadInfo(3, inherited);
  ThreadInfo renamed;
  renamed.native_name = "short-lived";
  state_.SetThreadInfo(5, renamed);
  Feed();
  const TopSnapshot first = state_.Cut(1000 * kMs);
  ASSERT_NE(Row(first, 2), nullptr);
  EXPECT_EQ(Row(first, 2)->name, "cpu");
  EXPECT_EQ(Row(first, 3)->name, "");
  EXPECT_EQ(Row(first, 5)->name, "short-lived");
  // Thread 5 exited in the first interval: its name is forgotten with it, thread 2's is kept.
  Event(1500 * kMs, 2, EventName::kGvlReleased, burn_, "io");
  Event(1600 * kMs, 5, EventName::kGvlAcquired);  // a stray event of the old number: no name comes back
  const TopSnapshot second = state_.Cut(2000 * kMs);
  EXPECT_EQ(Row(second, 2)->name, "cpu");
  ASSERT_NE(Row(second, 5), nullptr);
  EXPECT_EQ(Row(second, 5)->name, "");
}

TEST_F(TopStateTest, NothingBeforeTheStartIsCounted) {
  StackTable table;
  TopState state(1, "3.3.8", &table);
  TraceEvent e;
  e.ruby_thread = 2;
  e.event = EventName::kGvlAcquired;
  e.t_ns = 0;
  state.OnEvent(e);
  state.Start(500 * kMs);
  const TopSnapshot s = state.Cut(1000 * kMs);
  ASSERT_EQ(s.threads.size(), 1u);
  EXPECT_EQ(s.threads[0].running_ns, 500 * kMs);
  EXPECT_EQ(s.interval_ns(), 500 * kMs);
}

TEST(StackWhereTest, NamesTheProgramMethodAndTheLibraryCall) {
  StackTable t;
  const uint32_t c = t.InternFrame({"Thread::Queue#pop", "<internal:thread_sync>", 18, FrameKind::kRuby}).id;
  const uint32_t r = t.InternFrame({"Worker#run", "/app/w.rb", 7, FrameKind::kRuby}).id;
  const std::vector<uint32_t> ids = {c, r};
  const uint32_t s = t.InternStack(ids).id;
  EXPECT_EQ(StackWhere(t, s), "Thread::Queue#pop in Worker#run (/app/w.rb:7)");
  const std::vector<uint32_t> only = {c};
  EXPECT_EQ(StackWhere(t, t.InternStack(only).id), "Thread::Queue#pop (<internal:thread_sync>:18)");
  EXPECT_EQ(StackWhere(t, 0), "");
  EXPECT_EQ(StackWhere(t, 999), "");
}

// A thread's row names the endpoint of its latest stack (the Rails action it serves), "-" outside any.
TEST_F(TopStateTest, RowsNameTheEndpointOfTheLatestStack) {
  state_.Start(0);
  const uint32_t action = Stack({{"Kernel#sleep", "<cfunc>", 0, FrameKind::kCfunc},
                                 {"LedgerController#nap", "/app/application.rb", 102, FrameKind::kRuby},
                                 {"ActionController::BasicImplicitRender#send_action",
                                  "/gems/actionpack/lib/action_controller/metal/basic_implicit_render.rb", 8,
                                  FrameKind::kRuby},
                                 {"AbstractController::Base#process_action",
                                  "/gems/actionpack/lib/abstract_controller/base.rb", 226, FrameKind::kRuby}});
  const uint32_t idle = Stack({{"Thread::ConditionVariable#wait", "<cfunc>", 0, FrameKind::kCfunc},
                               {"Puma::ThreadPool#spawn_thread", "/gems/puma/thread_pool.rb", 167, FrameKind::kRuby}});
  Event(1 * kMs, 2, EventName::kGvlAcquired);
  Event(2 * kMs, 2, EventName::kGvlReleased, action, "sleep");
  Event(3 * kMs, 3, EventName::kGvlAcquired);
  Event(4 * kMs, 3, EventName::kGvlReleased, idle, "idle");
  const TopSnapshot s = state_.Cut(10 * kMs);
  ASSERT_NE(Row(s, 2), nullptr);
  ASSERT_NE(Row(s, 3), nullptr);
  EXPECT_EQ(Row(s, 2)->endpoint, "LedgerController#nap");
  EXPECT_EQ(Row(s, 3)->endpoint, "-");
  EXPECT_EQ(StackEndpoint(table_, 0), "-");
  EXPECT_EQ(StackEndpoint(table_, 999), "-");
}

}  // namespace
}  // namespace rvbpfd
