// The dump's conclusions from threads it read: states, reasons (the recorder's rule), who waits for whom, and the
// deadlock-cycle finder.
#include "dump/dump_analysis.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace rvbpfd {
namespace {

using Waits = std::vector<std::optional<size_t>>;

FrameInfo C(const char* label) { return FrameInfo{label, "<cfunc>", 0, FrameKind::kCfunc}; }
FrameInfo R(const char* label, int line = 3) { return FrameInfo{label, "/app/x.rb", line, FrameKind::kRuby}; }

TEST(FindWaitCyclesTest, TwoThreadsWaitingForEachOtherAreOneCycle) {
  EXPECT_EQ(FindWaitCycles(Waits{std::nullopt, 2, 1, std::nullopt}), (std::vector<std::vector<size_t>>{{1, 2}}));
}

TEST(FindWaitCyclesTest, ThreadsLeadingIntoACycleAreNotPartOfIt) {
  // 0 -> 3 -> 4 -> 5 -> 3, and 1 -> 0: one cycle {3, 4, 5}, in wait order.
  EXPECT_EQ(FindWaitCycles(Waits{3, 0, std::nullopt, 4, 5, 3}), (std::vector<std::vector<size_t>>{{3, 4, 5}}));
  // Entered at its higher node (0 -> 5 -> 4 -> 5): still listed from its lowest, in wait order.
  EXPECT_EQ(FindWaitCycles(Waits{5, std::nullopt, std::nullopt, std::nullopt, 5, 4}),
            (std::vector<std::vector<size_t>>{{4, 5}}));
}

TEST(FindWaitCyclesTest, EachCycleOnceStartingAtItsLowestIndexAndSorted) {
  // 5 -> 4 -> 5 and 2 -> 3 -> 1 -> 2; a thread waiting for itself (a Mutex it owns on another fiber) is a cycle too.
  EXPECT_EQ(FindWaitCycles(Waits{std::nullopt, 2, 3, 1, 5, 4, 6}),
            (std::vector<std::vector<size_t>>{{1, 2, 3}, {4, 5}, {6}}));
}

TEST(FindWaitCyclesTest, ChainsWithoutACycleGiveNone) {
  EXPECT_TRUE(FindWaitCycles(Waits{1, 2, std::nullopt, 2}).empty());
  EXPECT_TRUE(FindWaitCycles(Waits{}).empty());
  // A waits-for index outside the graph (an owner not among the threads) ends the chain.
  EXPECT_TRUE(FindWaitCycles(Waits{7, 0}).empty());
}

DumpedThread Thread(int n, uint64_t th, std::vector<FrameInfo> frames, RubyThreadStatus status) {
  DumpedThread t;
  t.ruby_thread = n;
  t.th = th;
  t.native_tid = 100 + n;
  t.fiber = th + 1;
  t.frames = std::move(frames);
  t.status = status;
  return t;
}

// The stuck workload of the e2e test, by hand: two threads locking two Mutexes in opposite order, one in
// Queue#pop, one reading a pipe, one joining another, one running, the main thread sleeping.
DumpSnapshot Stuck() {
  DumpSnapshot s;
  const auto kStop = RubyThreadStatus::kStoppedForever;
  s.threads.push_back(Thread(1, 0x1000, {C("Kernel#sleep"), R("<main>")}, RubyThreadStatus::kStopped));
  s.threads.push_back(Thread(2, 0x2000, {C("Thread::Mutex#lock"), R("Object#a")}, kStop));
  s.threads.push_back(Thread(3, 0x3000, {C("Thread::Mutex#lock"), R("Object#b")}, kStop));
  s.threads.push_back(Thread(4, 0x4000, {R("Object#spin")}, RubyThreadStatus::kRunnable));
  s.threads.push_back(
      Thread(5, 0x5000, {FrameInfo{"Thread::Queue#pop", "<internal:thread_sync>", 18, FrameKind::kRuby}, R("x")},
             kStop));
  s.threads.push_back(Thread(6, 0x6000, {C("IO#read"), R("Object#pull")}, RubyThreadStatus::kStopped));
  s.threads.push_back(Thread(7, 0x7000, {C("Thread#join"), R("Object#wait_for")}, kStop));
  s.threads[1].locking_mutex = 0xa0;
  s.threads[1].mutex_owner_fiber = s.threads[2].fiber;
  s.threads[2].locking_mutex = 0xb0;
  s.threads[2].mutex_owner_fiber = s.threads[1].fiber;
  s.threads[3].holds_gvl = true;
  s.threads[3].task_state = 'R';
  s.threads[5].joined_by = {0x7000};  // thread 7 joins thread 6
  s.gvl_holder = 3;
  return s;
}

TEST(DeriveStatesTest, StatesReasonsOwnersAndTheOneDeadlock) {
  DumpSnapshot s = Stuck();
  DeriveStates(&s);
  const std::vector<std::string> states = {"blocked", "blocked", "blocked", "running", "blocked", "blocked", "blocked"};
  for (size_t i = 0; i < states.size(); i++) EXPECT_EQ(s.threads[i].state, states[i]) << "thread " << i + 1;
  EXPECT_EQ(s.threads[0].reason, "sleep");
  EXPECT_EQ(s.threads[1].reason, "mutex");
  EXPECT_EQ(s.threads[3].reason, std::nullopt);
  EXPECT_EQ(s.threads[4].reason, "queue");
  EXPECT_EQ(s.threads[5].reason, "io");
  EXPECT_EQ(s.threads[6].reason, "join");
  ASSERT_TRUE(s.threads[1].waiting_for);
  EXPECT_EQ(s.threads[1].waiting_for->kind, "mutex");
  EXPECT_EQ(s.threads[1].waiting_for->owner, 2u);
  EXPECT_EQ(s.threads[1].waiting_for->object, 0xa0u);
  EXPECT_EQ(s.threads[2].waiting_for->owner, 1u);
  EXPECT_EQ(s.threads[4].waiting_for->kind, "queue");
  EXPECT_EQ(s.threads[4].waiting_for->owner, std::nullopt);
  EXPECT_EQ(s.threads[6].waiting_for->kind, "join");
  EXPECT_EQ(s.threads[6].waiting_for->owner, 5u);
  EXPECT_FALSE(s.threads[3].waiting_for);
  EXPECT_EQ(s.deadlocks, (std::vector<std::vector<size_t>>{{1, 2}}));
}

TEST(DeriveStatesTest, GvlHolderAsleepInTheKernelAndQueuedThreads) {
  DumpSnapshot s = Stuck();
  s.threads[3].task_state = 'S';
  s.threads[5].gvl_queue_position = 0;
  DeriveStates(&s);
  EXPECT_EQ(s.threads[3].state, "holding_gvl");
  EXPECT_EQ(s.threads[5].state, "waiting_gvl");
  EXPECT_FALSE(s.threads[5].waiting_for);
}

TEST(DeriveStatesTest, AMutexWhoseOwnerIsNoListedThreadIsNoDeadlock) {
  DumpSnapshot s = Stuck();
  s.threads[2].mutex_owner_fiber = 0xdead;  // a fiber that is no thread's current one
  DeriveStates(&s);
  EXPECT_EQ(s.threads[2].waiting_for->owner, std::nullopt);
  EXPECT_TRUE(s.deadlocks.empty());
}

TEST(DeriveStatesTest, JoinCycleIsADeadlockToo) {
  DumpSnapshot s = Stuck();
  s.threads[6].joined_by = {0x6000};  // thread 6 joins 7, 7 joins 6
  s.threads[5].frames = {C("Thread#join"), R("Object#x")};
  s.threads[5].status = RubyThreadStatus::kStoppedForever;
  DeriveStates(&s);
  EXPECT_EQ(s.deadlocks, (std::vector<std::vector<size_t>>{{1, 2}, {5, 6}}));
}

// Queue, SizedQueue, ConditionVariable and Monitor waiters: the object a thread's stack waits on is its waiting_for's
// when it agrees with the release reason; a queue waiter's operation is the list it is in; a Monitor's waiter waits
// for its owner (its Mutex's), which can make a deadlock.
TEST(DeriveStatesTest, QueueCondvarAndMonitorWaitersGetTheirObject) {
  DumpSnapshot s;
  const auto kStop = RubyThreadStatus::kStoppedForever;
  const FrameInfo pop{"Thread::Queue#pop", "<internal:thread_sync>", 18, FrameKind::kRuby};
  const FrameInfo push{"Thread::SizedQueue#push", "<internal:thread_sync>", 63, FrameKind::kRuby};
  s.threads.push_back(Thread(1, 0x1000, {pop, R("a")}, kStop));
  s.threads.push_back(Thread(2, 0x2000, {push, R("b")}, kStop));
  s.threads.push_back(
      Thread(3, 0x3000, {C("Thread::Mutex#sleep"), C("Thread::ConditionVariable#wait"), R("c")}, kStop));
  s.threads.push_back(Thread(4, 0x4000, {C("Monitor#synchronize"), R("d")}, kStop));
  s.threads.push_back(Thread(5, 0x5000, {C("Monitor#enter"), R("e")}, kStop));
  s.threads.push_back(Thread(6, 0x6000, {C("Kernel#sleep"), R("f")}, kStop));  // its top receiver a queue: no matter
  s.threads[0].wait_object = 0xa0;
  s.threads[1].wait_object = 0xb0;
  s.threads[2].wait_object = 0xc0;
  s.threads[3].wait_object = 0xd0;
  s.threads[3].locking_mutex = 0xd8;
  s.threads[3].mutex_owner_fiber = s.threads[4].fiber;
  s.threads[4].wait_object = 0xe0;
  s.threads[4].locking_mutex = 0xe8;
  s.threads[4].mutex_owner_fiber = s.threads[3].fiber;
  s.threads[5].wait_object = 0xa0;
  s.wait_objects = {
      WaitObject{.object = 0xa0, .type = "queue", .waiters = {0x1000}},
      WaitObject{.object = 0xb0, .type = "sized_queue", .waiters = {}, .push_waiters = {0x2000}},
      WaitObject{.object = 0xc0, .type = "condvar", .waiters = {0x3000}},
      WaitObject{.object = 0xd0, .type = "monitor", .monitor_mutex = 0xd8, .owner_fiber = s.threads[4].fiber},
      WaitObject{.object = 0xe0, .type = "monitor", .monitor_mutex = 0xe8, .owner_fiber = s.threads[3].fiber},
  };
  DeriveStates(&s);
  auto w = [&](size_t i) { return s.threads[i].waiting_for.value_or(WaitingFor{}); };
  EXPECT_EQ(w(0).kind, "queue");
  EXPECT_EQ(w(0).object, 0xa0u);
  EXPECT_EQ(w(0).object_type, "Thread::Queue");
  EXPECT_EQ(w(0).operation, "pop");
  EXPECT_EQ(w(1).kind, "queue");
  EXPECT_EQ(w(1).object_type, "Thread::SizedQueue");
  EXPECT_EQ(w(1).operation, "push");
  EXPECT_EQ(w(2).kind, "condvar");
  EXPECT_EQ(w(2).object, 0xc0u);
  EXPECT_EQ(w(2).object_type, "Thread::ConditionVariable");
  EXPECT_EQ(w(3).kind, "monitor");
  EXPECT_EQ(w(3).object, 0xd0u);
  EXPECT_EQ(w(3).owner, 4u);
  EXPECT_EQ(w(4).kind, "monitor");
  EXPECT_EQ(w(4).owner, 3u);
  EXPECT_EQ(w(5).kind, "sleep");
  EXPECT_EQ(w(5).object, 0u);
  EXPECT_EQ(s.deadlocks, (std::vector<std::vector<size_t>>{{3, 4}}));
  // A Monitor whose Mutex is not the one the thread sleeps to lock: a plain Mutex wait.
  s.wait_objects[3].monitor_mutex = 0x99;
  DeriveStates(&s);
  EXPECT_EQ(w(3).kind, "mutex");
  EXPECT_EQ(w(3).object, 0xd8u);
  EXPECT_EQ(w(3).object_type, "Thread::Mutex");
}

}  // namespace
}  // namespace rvbpfd
