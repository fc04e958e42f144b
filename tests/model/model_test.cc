#include "model/model.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "model/model_test_util.h"
#include "trace/writer.h"
#include "trace/trace_test_util.h"

namespace rvbpfd {
namespace {

using testing::BlockAt;
using testing::EventSeq;
using testing::ExpectAllLanesContiguous;
using testing::kMs;
using testing::kUs;
using testing::OwnerAt;

constexpr uint32_t kMain = 1;
constexpr uint32_t kT2 = 2;
constexpr uint32_t kT3 = 3;

// The seed's 3.2 timeslice: T2 reports READY straight from RUNNING (no SUSPENDED) and T3 reports RESUMED.
TEST(ModelTimeslice, Ruby32ClosesOwnerAtOtherResumedAsPreempted) {
  EventSeq s;
  s.Add(0, EventName::kTracingStarted);
  s.Add(100 * kUs, EventName::kWantsGvl, kT2, 11);
  s.Add(120 * kUs, EventName::kWantsGvl, kT3, 12);
  s.Add(200 * kUs, EventName::kGvlReleased, 0, 10);
  const size_t t2_resumed = s.Add(300 * kUs, EventName::kGvlAcquired, kT2, 11);
  const size_t t2_ready = s.Add(100 * kMs, EventName::kWantsGvl, kT2, 11);
  const size_t t3_resumed = s.Add(100 * kMs + 150 * kUs, EventName::kGvlAcquired, kT3, 12);
  const size_t t3_released = s.Add(150 * kMs, EventName::kGvlReleased, kT3, 12);
  const size_t t2_again = s.Add(150 * kMs + 10 * kUs, EventName::kGvlAcquired, kT2, 11);
  s.Add(200 * kMs, EventName::kTracingStopped);
  const Model model = s.Build("3.2.5", 0);
  ExpectAllLanesContiguous(model);
  ASSERT_TRUE(model.is_ruby_3_2());

  // T2 keeps running until T3's RESUMED; its READY is kept on the running block, not a block of its own.
  const StateBlock* run = BlockAt(model, kT2, 300 * kUs);
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->state, ThreadState::kRunning);
  EXPECT_EQ(run->provenance, Provenance::kObserved);
  EXPECT_EQ(run->opened_by, t2_resumed);
  EXPECT_EQ(run->closed_by, t3_resumed);
  EXPECT_EQ(run->end_ns, 100 * kMs + 150 * kUs);
  EXPECT_EQ(run->ready_while_running, t2_ready);
  EXPECT_EQ(run->native_tid, 11u);

  // Then waiting, labelled PREEMPTED by a derived rule, until its own RESUMED.
  const StateBlock* wait = BlockAt(model, kT2, 120 * kMs);
  ASSERT_NE(wait, nullptr);
  EXPECT_EQ(wait->state, ThreadState::kWantsGvl);
  EXPECT_EQ(wait->reason, ReleaseReason::kPreempted);
  EXPECT_EQ(wait->provenance, Provenance::kDerived);
  EXPECT_EQ(wait->rule, ModelRule::kPreemptedByResume);
  EXPECT_EQ(wait->opened_by, t3_resumed);
  EXPECT_EQ(wait->closed_by, t2_again);
  EXPECT_EQ(StateBlockLabel(*wait), "wants_gvl: preempted");

  // The owner lane: T2's ownership ends at T3's RESUMED as preempted, and T3 owns from there.
  const OwnerBlock* t2_owns = OwnerAt(model, 50 * kMs);
  ASSERT_NE(t2_owns, nullptr);
  EXPECT_EQ(t2_owns->kind, OwnerKind::kOwned);
  EXPECT_EQ(t2_owns->owner, kT2);
  EXPECT_EQ(t2_owns->end, OwnerEnd::kPreempted);
  EXPECT_EQ(t2_owns->closed_by, t3_resumed);
  const OwnerBlock* t3_owns = OwnerAt(model, 120 * kMs);
  EXPECT_EQ(t3_owns->owner, kT3);
  EXPECT_EQ(t3_owns->provenance, Provenance::kDerived);
  EXPECT_EQ(t3_owns->rule, ModelRule::kOwnerFromAcquire);
  EXPECT_EQ(t3_owns->end, OwnerEnd::kReleased);
  EXPECT_EQ(t3_owns->closed_by, t3_released);
  // Idle between T3's release and T2's RESUMED is drawn explicitly.
  const OwnerBlock* idle = OwnerAt(model, 150 * kMs + 5 * kUs);
  EXPECT_EQ(idle->kind, OwnerKind::kIdle);
  EXPECT_EQ(idle->start_ns, 150 * kMs);
  EXPECT_EQ(idle->end_ns, 150 * kMs + 10 * kUs);

  // The preempted wait counts as GVL contention.
  const RubyThread* t2 = model.FindThread(kT2);
  EXPECT_EQ(t2->totals.wait_longest_ns, wait->duration_ns());
}

TEST(ModelTimeslice, OnLaterRubiesTheSameShapeIsNotCalledPreempted) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  s.Add(10 * kMs, EventName::kWantsGvl, kT2, 11);
  const size_t t3 = s.Add(20 * kMs, EventName::kGvlAcquired, kT3, 12);
  s.Add(30 * kMs, EventName::kTracingStopped);
  const Model model = s.Build("3.4.8");
  const StateBlock* after = BlockAt(model, kT2, 25 * kMs);
  ASSERT_NE(after, nullptr);
  EXPECT_EQ(after->state, ThreadState::kWantsGvl);
  EXPECT_EQ(after->reason, ReleaseReason::kUnknown);
  EXPECT_EQ(after->provenance, Provenance::kDerived);
  EXPECT_EQ(after->rule, ModelRule::kOwnerReplaced);
  EXPECT_EQ(after->opened_by, t3);
  EXPECT_EQ(OwnerAt(model, 15 * kMs)->end, OwnerEnd::kPreempted);
}

TEST(ModelTimeslice, PreemptedWithoutReadyIsReleasedNotWaiting) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  s.Add(20 * kMs, EventName::kGvlAcquired, kT3, 12);
  s.Add(30 * kMs, EventName::kTracingStopped);
  const Model model = s.Build("3.2.0", 0);
  const StateBlock* after = BlockAt(model, kT2, 25 * kMs);
  EXPECT_EQ(after->state, ThreadState::kReleased);
  EXPECT_EQ(after->reason, ReleaseReason::kPreempted);
  EXPECT_EQ(after->rule, ModelRule::kPreemptedByResume);
}

// The seed's 3.2 sleep: thread_sched_to_waiting and native_sleep both report SUSPENDED.
TEST(ModelStackReasons, ReasonFromTheReleasedStackLabelsTheBlockAndBeatsAProbe) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  s.Add(1 * kMs, EventName::kMutexLockEnter, kT2, 11);  // an uncontended lock earlier...
  const size_t io = s.ReleasedWithReason(2 * kMs, kT2, 11, "io");  // ...then a release the stack shows is IO
  s.Add(3 * kMs, EventName::kWantsGvl, kT2, 11);
  s.Add(3 * kMs + 5 * kUs, EventName::kGvlAcquired, kT2, 11);
  s.ReleasedWithReason(4 * kMs, kT2, 11, "condition_variable");
  s.Add(5 * kMs, EventName::kWantsGvl, kT2, 11);
  s.Add(5 * kMs + 5 * kUs, EventName::kGvlAcquired, kT2, 11);
  s.ReleasedWithReason(6 * kMs, kT2, 11, "unknown");
  s.Add(7 * kMs, EventName::kTracingStopped);
  const Model model = s.Build("3.4.5", 1);
  ExpectAllLanesContiguous(model);
  const StateBlock* b = BlockAt(model, kT2, 2500 * kUs);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->state, ThreadState::kReleased);
  EXPECT_EQ(b->reason, ReleaseReason::kIo);
  EXPECT_EQ(b->provenance, Provenance::kDerived);
  EXPECT_EQ(b->rule, ModelRule::kStackReason);
  EXPECT_EQ(b->opened_by, io);
  EXPECT_EQ(BlockAt(model, kT2, 4500 * kUs)->reason, ReleaseReason::kConditionVariable);
  const StateBlock* unknown = BlockAt(model, kT2, 6500 * kUs);
  EXPECT_EQ(unknown->reason, ReleaseReason::kUnknown);
  EXPECT_EQ(unknown->provenance, Provenance::kObserved);
}

// Puma's reactor (issue 47): nio4r took an uncontended Mutex#lock 20 us before blocking in select. The trace's
// gvl_released carried its own reason; inspect's block must say that reason, never the probe's waiting_mutex.
TEST(ModelStackReasons, ACarriedUnknownReasonIsNotReplacedByAnEarlierProbe) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  s.Add(1 * kMs, EventName::kMutexLockEnter, kT2, 11);
  const size_t rel = s.ReleasedWithReason(1 * kMs + 20 * kUs, kT2, 11, "unknown");
  s.Add(3 * kMs, EventName::kWantsGvl, kT2, 11);
  s.Add(3 * kMs + 5 * kUs, EventName::kGvlAcquired, kT2, 11);
  s.Add(4 * kMs, EventName::kSleepEnter, kT2, 11);
  s.ReleasedWithReason(4 * kMs + 20 * kUs, kT2, 11, "idle");
  s.Add(6 * kMs, EventName::kTracingStopped);
  const Model model = s.Build("3.3.8", 1);
  const StateBlock* b = BlockAt(model, kT2, 2 * kMs);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->state, ThreadState::kReleased);
  EXPECT_EQ(b->reason, ReleaseReason::kUnknown);
  EXPECT_EQ(b->rule, ModelRule::kNone);
  EXPECT_EQ(b->opened_by, rel);
  const StateBlock* idle = BlockAt(model, kT2, 5 * kMs);
  EXPECT_EQ(idle->reason, ReleaseReason::kIdle);
  EXPECT_EQ(idle->rule, ModelRule::kStackReason);
  // The spans every export reads say the same.
  for (const Span& sp : model.spans()) {
    if (sp.kind == SpanKind::kBlocked && sp.start_ns == 1 * kMs + 20 * kUs) {
      EXPECT_EQ(sp.reason, ReleaseReason::kUnknown);
    }
  }
}

TEST(ModelStackReasons, EveryTraceReasonNameParses) {
  for (const char* name : {"sleep", "io", "mutex", "queue", "condition_variable", "join", "pass", "process_wait",
                           "timeslice", "exit", "idle", "db_pool"}) {
    const ReleaseReason r = ParseReleaseReasonTraceName(name);
    EXPECT_NE(r, ReleaseReason::kUnknown) << name;
    EXPECT_FALSE(ReleaseReasonName(r).empty());
  }
  EXPECT_EQ(ParseReleaseReasonTraceName("unknown"), ReleaseReason::kUnknown);
  EXPECT_EQ(ParseReleaseReasonTraceName("from-the-future"), ReleaseReason::kUnknown);
}

TEST(ModelRepeats, DoubleSuspendedOpensOneSleepingBlock) {
  EventSeq s;
  const size_t resumed = s.Add(0, EventName::kGvlAcquired, kT2, 11);
  const size_t sleep = s.Add(450 * kMs, EventName::kSleepEnter, kT2, 11);
  const size_t first = s.Add(450 * kMs + 7 * kUs, EventName::kGvlReleased, kT2, 11);
  s.Add(450 * kMs + 9 * kUs, EventName::kGvlReleased, kT2, 11);
  const size_t ready = s.Add(650 * kMs, EventName::kWantsGvl, kT2, 11);
  const size_t back = s.Add(650 * kMs + 4 * kUs, EventName::kGvlAcquired, kT2, 11);
  s.Add(700 * kMs, EventName::kTracingStopped);
  const Model model = s.Build("3.2.5", 0);
  ExpectAllLanesContiguous(model);

  const RubyThread* t2 = model.FindThread(kT2);
  ASSERT_NE(t2, nullptr);
  const auto released = std::count_if(t2->blocks.begin(), t2->blocks.end(),
                                      [](const StateBlock& b) { return b.state == ThreadState::kReleased; });
  EXPECT_EQ(released, 1);
  const StateBlock* b = BlockAt(model, kT2, 500 * kMs);
  EXPECT_EQ(b->state, ThreadState::kReleased);
  EXPECT_EQ(b->reason, ReleaseReason::kSleeping);
  EXPECT_EQ(b->provenance, Provenance::kDerived);
  EXPECT_EQ(b->rule, ModelRule::kSleepProbe);
  EXPECT_EQ(b->opened_by, first);
  EXPECT_EQ(b->closed_by, ready);
  EXPECT_EQ(b->repeats, 1u);
  EXPECT_EQ(StateBlockLabel(*b), "released: sleeping");
  // The running block before the sleep is not split by the probe.
  const StateBlock* run = BlockAt(model, kT2, 450 * kMs);
  EXPECT_EQ(run->opened_by, resumed);
  EXPECT_EQ(run->state, ThreadState::kRunning);
  EXPECT_EQ(BlockAt(model, kT2, 660 * kMs)->opened_by, back);
  // The second SUSPENDED does not split the idle owner block either.
  const OwnerBlock* idle = OwnerAt(model, 500 * kMs);
  EXPECT_EQ(idle->kind, OwnerKind::kIdle);
  EXPECT_EQ(idle->start_ns, 450 * kMs + 7 * kUs);
  EXPECT_EQ(idle->end_ns, 650 * kMs + 4 * kUs);
  // The marker for the probe is kept for the exporters.
  ASSERT_EQ(model.markers().size(), 1u);
  EXPECT_EQ(model.markers()[0].event_index, sleep);
}

TEST(ModelRepeats, RepeatedReadyAndResumedDoNotOpenBlocks) {
  EventSeq s;
  s.Add(0, EventName::kGvlReleased, kT2, 11);
  s.Add(1 * kMs, EventName::kWantsGvl, kT2, 11);
  s.Add(2 * kMs, EventName::kWantsGvl, kT2, 11);
  s.Add(3 * kMs, EventName::kGvlAcquired, kT2, 11);
  s.Add(4 * kMs, EventName::kGvlAcquired, kT2, 11);
  s.Add(5 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  const RubyThread* t2 = model.FindThread(kT2);
  ASSERT_EQ(t2->blocks.size(), 3u);  // released, wants_gvl, running (the inferred running before 0 is empty)
  EXPECT_EQ(t2->blocks[1].state, ThreadState::kWantsGvl);
  EXPECT_EQ(t2->blocks[1].repeats, 1u);
  EXPECT_EQ(t2->blocks[2].state, ThreadState::kRunning);
  EXPECT_EQ(t2->blocks[2].repeats, 1u);
  EXPECT_EQ(model.owner_lane().back().start_ns, 3 * kMs);
}

TEST(ModelReasons, ReleaseInsideMutexLockIsWaitingMutex) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  s.Add(1 * kMs, EventName::kMutexLockEnter, kT2, 11);
  const size_t rel = s.Add(1 * kMs + 3 * kUs, EventName::kGvlReleased, kT2, 11);
  s.Add(5 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  const StateBlock* b = BlockAt(model, kT2, 2 * kMs);
  EXPECT_EQ(b->state, ThreadState::kReleased);
  EXPECT_EQ(b->reason, ReleaseReason::kWaitingMutex);
  EXPECT_EQ(b->provenance, Provenance::kDerived);
  EXPECT_EQ(b->rule, ModelRule::kMutexProbe);
  EXPECT_EQ(b->opened_by, rel);
}

TEST(ModelReasons, ProbeLabelEndsWhenTheThreadRunsAgain) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  s.Add(1 * kMs, EventName::kSleepEnter, kT2, 11);
  s.Add(2 * kMs, EventName::kGvlReleased, kT2, 11);
  s.Add(3 * kMs, EventName::kGvlAcquired, kT2, 11);
  s.Add(4 * kMs, EventName::kGvlReleased, kT2, 11);  // an IO release after the sleep returned
  s.Add(5 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  EXPECT_EQ(BlockAt(model, kT2, 2 * kMs)->reason, ReleaseReason::kSleeping);
  const StateBlock* io = BlockAt(model, kT2, 4 * kMs);
  EXPECT_EQ(io->state, ThreadState::kReleased);
  EXPECT_EQ(io->reason, ReleaseReason::kUnknown);
  EXPECT_EQ(io->provenance, Provenance::kObserved);
  EXPECT_EQ(io->rule, ModelRule::kNone);
}

// The seed's M:N example: T2 and T3 take turns on native thread 285098.
TEST(ModelNative, MnThreadsShareOneNativeThread) {
  constexpr uint32_t kTid = 285098;
  EventSeq s;
  s.Add(217 * kUs, EventName::kGvlAcquired, kT2, kTid);
  s.Add(101861 * kUs, EventName::kGvlReleased, kT2, kTid);
  s.Add(101863 * kUs, EventName::kWantsGvl, kT2, kTid);
  s.Add(101865 * kUs, EventName::kGvlAcquired, kT3, kTid);
  s.Add(203674 * kUs, EventName::kGvlReleased, kT3, kTid);
  s.Add(203675 * kUs, EventName::kGvlAcquired, kT2, kTid);
  s.Add(250000 * kUs, EventName::kTracingStopped);
  const Model model = s.Build("3.4.8");
  ExpectAllLanesContiguous(model);

  ASSERT_EQ(model.native_threads().size(), 1u);
  const NativeThread& n = model.native_threads()[0];
  EXPECT_EQ(n.native_tid, kTid);
  EXPECT_EQ(n.ruby_threads, (std::vector<uint32_t>{kT2, kT3}));
  ASSERT_EQ(n.spans.size(), 3u);
  EXPECT_EQ(n.spans[0].ruby_thread, kT2);
  EXPECT_EQ(n.spans[0].start_ns, 217 * kUs);
  EXPECT_EQ(n.spans[0].end_ns, 101861 * kUs);
  EXPECT_EQ(n.spans[1].ruby_thread, kT3);
  EXPECT_EQ(n.spans[1].start_ns, 101865 * kUs);
  EXPECT_EQ(n.spans[1].end_ns, 203674 * kUs);
  EXPECT_EQ(n.spans[2].ruby_thread, kT2);
  EXPECT_EQ(model.FindThread(kT2)->native_tids, (std::vector<uint32_t>{kTid}));
  EXPECT_EQ(model.FindThread(kT3)->native_tids, (std::vector<uint32_t>{kTid}));
}

TEST(ModelNative, StartedAndReadyDoNotDecideTheNativeThread) {
  // On 3.3+ STARTED runs on the creator and READY on the waker: their native tid is someone else's.
  EventSeq s;
  s.Add(0, EventName::kThreadStarted, kT2, 10);
  s.Add(1 * kMs, EventName::kWantsGvl, kT2, 10);
  s.Add(2 * kMs, EventName::kGvlAcquired, kT2, 11);
  s.Add(3 * kMs, EventName::kGvlReleased, kT2, 11);
  const Model model = s.Build();
  EXPECT_EQ(model.FindThread(kT2)->native_tids, (std::vector<uint32_t>{11}));
  ASSERT_EQ(model.native_threads().size(), 1u);
  EXPECT_EQ(model.native_threads()[0].native_tid, 11u);
}

TEST(ModelInference, StateBeforeFirstEventIsInferred) {
  EventSeq s;
  s.Add(0, EventName::kTracingStarted);
  s.Add(1 * kMs, EventName::kGvlReleased, kMain, 10);   // was running
  s.Add(2 * kMs, EventName::kThreadStarted, kT2, 10);   // did not exist
  s.Add(3 * kMs, EventName::kGvlAcquired, kT3, 12);     // was waiting
  s.Add(4 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  ExpectAllLanesContiguous(model);
  struct Case {
    uint32_t thread;
    ThreadState before;
  };
  for (const Case& c : {Case{kMain, ThreadState::kRunning}, Case{kT2, ThreadState::kNotStarted},
                        Case{kT3, ThreadState::kWantsGvl}}) {
    const RubyThread* t = model.FindThread(c.thread);
    ASSERT_NE(t, nullptr);
    const StateBlock& first = t->blocks.front();
    EXPECT_EQ(first.state, c.before) << c.thread;
    EXPECT_EQ(first.provenance, Provenance::kInferred) << c.thread;
    EXPECT_EQ(first.rule, ModelRule::kBeforeFirstEvent) << c.thread;
    EXPECT_EQ(first.start_ns, 0u) << c.thread;
    EXPECT_FALSE(first.opened_by.has_value()) << c.thread;
  }
  EXPECT_TRUE(model.FindThread(kMain)->main);
  EXPECT_EQ(model.ThreadLabel(kMain), "main");
  EXPECT_EQ(model.ThreadLabel(kT2), "Thread #2");
  // After STARTED the new thread has not asked for the GVL yet.
  const StateBlock* starting = BlockAt(model, kT2, 2500 * kUs);
  EXPECT_EQ(starting->state, ThreadState::kReleased);
  EXPECT_EQ(starting->reason, ReleaseReason::kStarting);
  EXPECT_EQ(starting->provenance, Provenance::kObserved);
  // The owner lane before the first GVL event: main, inferred from its release; then idle.
  const OwnerBlock& first_owner = model.owner_lane().front();
  EXPECT_EQ(first_owner.kind, OwnerKind::kOwned);
  EXPECT_EQ(first_owner.owner, kMain);
  EXPECT_EQ(first_owner.provenance, Provenance::kInferred);
  EXPECT_EQ(first_owner.rule, ModelRule::kBeforeFirstEvent);
  EXPECT_EQ(OwnerAt(model, 2 * kMs)->kind, OwnerKind::kIdle);
}

TEST(ModelInference, OwnerBeforeAnAcquireIsUnknown) {
  EventSeq s;
  s.Add(0, EventName::kTracingStarted);
  s.Add(1 * kMs, EventName::kGvlAcquired, kT2, 11);
  s.Add(2 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  EXPECT_EQ(model.owner_lane().front().kind, OwnerKind::kUnknown);
  EXPECT_EQ(model.owner_lane().front().end_ns, 1 * kMs);
}

TEST(ModelImplicitResume, ProbeAfterSuspendedResumesTheThread) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  const size_t rel = s.Add(1 * kMs, EventName::kGvlReleased, kT2, 11);
  const size_t probe = s.Add(5 * kMs, EventName::kSleepEnter, kT2, 11);  // no RESUMED in between
  const size_t rel2 = s.Add(6 * kMs, EventName::kGvlReleased, kT2, 11);
  s.Add(8 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  ExpectAllLanesContiguous(model);
  const StateBlock* released = BlockAt(model, kT2, 2 * kMs);
  EXPECT_EQ(released->state, ThreadState::kReleased);
  EXPECT_EQ(released->closed_by, probe);
  const StateBlock* resumed = BlockAt(model, kT2, 5 * kMs);
  EXPECT_EQ(resumed->state, ThreadState::kRunning);
  EXPECT_EQ(resumed->provenance, Provenance::kDerived);
  EXPECT_EQ(resumed->rule, ModelRule::kImplicitResume);
  EXPECT_EQ(resumed->opened_by, probe);
  EXPECT_EQ(resumed->closed_by, rel2);
  EXPECT_EQ(BlockAt(model, kT2, 7 * kMs)->reason, ReleaseReason::kSleeping);
  // The idle owner lane follows, derived.
  const OwnerBlock* owner = OwnerAt(model, 5500 * kUs);
  EXPECT_EQ(owner->kind, OwnerKind::kOwned);
  EXPECT_EQ(owner->owner, kT2);
  EXPECT_EQ(owner->provenance, Provenance::kDerived);
  EXPECT_EQ(owner->rule, ModelRule::kImplicitResume);
  EXPECT_EQ(OwnerAt(model, 2 * kMs)->closed_by, probe);
  EXPECT_EQ(OwnerAt(model, 2 * kMs)->opened_by, rel);
}

TEST(ModelImplicitResume, DoesNotTakeTheGvlFromAnOwner) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  s.Add(1 * kMs, EventName::kGvlReleased, kT2, 11);
  s.Add(2 * kMs, EventName::kGvlAcquired, kT3, 12);
  s.Add(3 * kMs, EventName::kMutexLockEnter, kT2, 11);
  s.Add(4 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  EXPECT_EQ(BlockAt(model, kT2, 3 * kMs)->rule, ModelRule::kImplicitResume);
  const OwnerBlock* owner = OwnerAt(model, 3500 * kUs);
  EXPECT_EQ(owner->owner, kT3);  // the lane never shows two owners; T3's RESUMED stands
}

TEST(ModelGc, GcWithoutThreadRunsOnTheOwnerDerived) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  const size_t enter = s.Add(1 * kMs, EventName::kGcEnter);
  const size_t exit = s.Add(3 * kMs, EventName::kGcExit);
  s.Add(4 * kMs, EventName::kGvlReleased, kT2, 11);
  s.Add(5 * kMs, EventName::kGcEnter, kT3, 12);
  s.Add(6 * kMs, EventName::kGcExit, kT3, 12);
  s.Add(7 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  ExpectAllLanesContiguous(model);
  ASSERT_EQ(model.gc_spans().size(), 2u);
  const GcSpan& gc = model.gc_spans()[0];
  EXPECT_EQ(gc.start_ns, 1 * kMs);
  EXPECT_EQ(gc.end_ns, 3 * kMs);
  EXPECT_TRUE(gc.complete);
  EXPECT_EQ(gc.ruby_thread, kT2);
  EXPECT_EQ(gc.thread_provenance, Provenance::kDerived);
  const StateBlock* b = BlockAt(model, kT2, 2 * kMs);
  EXPECT_EQ(b->state, ThreadState::kGc);
  EXPECT_EQ(b->provenance, Provenance::kDerived);
  EXPECT_EQ(b->rule, ModelRule::kGcOnOwner);
  EXPECT_EQ(b->opened_by, enter);
  EXPECT_EQ(b->closed_by, exit);
  EXPECT_EQ(b->native_tid, 11u);
  EXPECT_EQ(BlockAt(model, kT2, 3 * kMs)->state, ThreadState::kRunning);
  EXPECT_EQ(model.FindThread(kT2)->totals.ns(ThreadState::kGc), 2 * kMs);
  // A GC that names its thread is observed (T3 was first seen in it: running before, inferred).
  EXPECT_EQ(model.gc_spans()[1].thread_provenance, Provenance::kObserved);
  EXPECT_EQ(BlockAt(model, kT3, 5500 * kUs)->provenance, Provenance::kObserved);
  EXPECT_EQ(BlockAt(model, kT3, 5500 * kUs)->state, ThreadState::kGc);
  // The GVL stays with T2 through its GC: no ownership change.
  EXPECT_EQ(OwnerAt(model, 2 * kMs)->start_ns, 0u);
}

TEST(ModelExit, ExitedEndsOwnershipAndSuspendedAfterExitIsARepeat) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  const size_t exited = s.Add(2 * kMs, EventName::kThreadExited, kT2, 11);
  s.Add(2 * kMs + 1 * kUs, EventName::kGvlReleased, kT2, 11);  // 3.2 order
  s.Add(3 * kMs, EventName::kTracingStopped);
  const Model model = s.Build("3.2.5", 0);
  ExpectAllLanesContiguous(model);
  const RubyThread* t2 = model.FindThread(kT2);
  ASSERT_EQ(t2->blocks.size(), 2u);  // running, exited (the inferred wait before t=0 is empty and pruned)
  EXPECT_EQ(t2->blocks.back().state, ThreadState::kExited);
  EXPECT_EQ(t2->blocks.back().opened_by, exited);
  EXPECT_EQ(t2->blocks.back().repeats, 1u);
  const OwnerBlock* owner = OwnerAt(model, 1 * kMs);
  EXPECT_EQ(owner->end, OwnerEnd::kExited);
  EXPECT_EQ(owner->closed_by, exited);
  const OwnerBlock* idle = OwnerAt(model, 2500 * kUs);
  EXPECT_EQ(idle->kind, OwnerKind::kIdle);
  EXPECT_EQ(idle->provenance, Provenance::kDerived);
  EXPECT_EQ(idle->rule, ModelRule::kExitReleases);
}

TEST(ModelGaps, EventsDroppedMakeStatesUnknownNotInvented) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  const size_t last_before = s.Add(1 * kMs, EventName::kWantsGvl, kT3, 12);
  const size_t drop = s.Dropped(4 * kMs, 17);
  const size_t t3_acq = s.Add(5 * kMs, EventName::kGvlAcquired, kT3, 12);
  s.Add(6 * kMs, EventName::kGvlReleased, 5, 15);  // first seen after the drop
  s.Add(8 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  ExpectAllLanesContiguous(model);
  ASSERT_EQ(model.unknown_windows().size(), 1u);
  const UnknownWindow& w = model.unknown_windows()[0];
  EXPECT_EQ(w.start_ns, s.events()[last_before].t_ns);
  EXPECT_EQ(w.end_ns, 4 * kMs);
  EXPECT_EQ(w.dropped, 17u);
  EXPECT_EQ(w.event, drop);
  EXPECT_EQ(w.cause, ModelRule::kEventsDropped);

  // T2 was running; from the last event before the drop its state is unknown until it reports again (never).
  const StateBlock* t2 = BlockAt(model, kT2, 3 * kMs);
  EXPECT_EQ(t2->state, ThreadState::kUnknown);
  EXPECT_EQ(t2->start_ns, 1 * kMs);
  EXPECT_EQ(t2->end_ns, 8 * kMs);
  EXPECT_EQ(t2->provenance, Provenance::kDerived);
  EXPECT_EQ(t2->rule, ModelRule::kEventsDropped);
  EXPECT_EQ(t2->opened_by, drop);
  // T3 was waiting; unknown until its RESUMED, which is observed again. No wait is invented across the gap.
  const StateBlock* t3 = BlockAt(model, kT3, 4500 * kUs);
  EXPECT_EQ(t3->state, ThreadState::kUnknown);
  EXPECT_EQ(t3->closed_by, t3_acq);
  EXPECT_EQ(BlockAt(model, kT3, 5 * kMs)->provenance, Provenance::kObserved);
  // The owner lane is unknown over the gap, not T2.
  const OwnerBlock* owner = OwnerAt(model, 3 * kMs);
  EXPECT_EQ(owner->kind, OwnerKind::kUnknown);
  EXPECT_EQ(owner->rule, ModelRule::kEventsDropped);
  EXPECT_EQ(OwnerAt(model, 500 * kUs)->end, OwnerEnd::kGap);
  EXPECT_EQ(OwnerAt(model, 5500 * kUs)->owner, kT3);
  // A thread first seen after the drop: unknown up to the drop, inferred only after it.
  const RubyThread* t5 = model.FindThread(5);
  ASSERT_NE(t5, nullptr);
  EXPECT_EQ(t5->blocks[0].state, ThreadState::kUnknown);
  EXPECT_EQ(t5->blocks[0].end_ns, 4 * kMs);
  EXPECT_EQ(t5->blocks[1].state, ThreadState::kRunning);
  EXPECT_EQ(t5->blocks[1].provenance, Provenance::kInferred);
  EXPECT_EQ(t5->totals.ns(ThreadState::kUnknown), 4 * kMs);
}

TEST(ModelGaps, PausedWindowIsUnknownAndCutsGc) {
  EventSeq s;
  s.Add(0, EventName::kGvlAcquired, kT2, 11);
  s.Add(1 * kMs, EventName::kGcEnter, kT2, 11);
  const size_t pause = s.Add(2 * kMs, EventName::kTracingPaused);
  s.Add(7 * kMs, EventName::kTracingResumed);
  s.Add(8 * kMs, EventName::kGvlReleased, kT2, 11);
  s.Add(9 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  ExpectAllLanesContiguous(model);
  ASSERT_EQ(model.unknown_windows().size(), 1u);
  EXPECT_EQ(model.unknown_windows()[0].start_ns, 2 * kMs);
  EXPECT_EQ(model.unknown_windows()[0].end_ns, 7 * kMs);
  EXPECT_EQ(model.unknown_windows()[0].cause, ModelRule::kTracingPaused);
  const StateBlock* b = BlockAt(model, kT2, 5 * kMs);
  EXPECT_EQ(b->state, ThreadState::kUnknown);
  EXPECT_EQ(b->rule, ModelRule::kTracingPaused);
  EXPECT_EQ(b->opened_by, pause);
  EXPECT_EQ(b->end_ns, 8 * kMs);  // unknown until the thread reports again
  ASSERT_EQ(model.gc_spans().size(), 1u);
  EXPECT_FALSE(model.gc_spans()[0].complete);
  EXPECT_EQ(model.gc_spans()[0].end_ns, 2 * kMs);
  EXPECT_EQ(model.gc_spans()[0].closed_by, pause);
  // After the release the GVL is known to be idle again.
  EXPECT_EQ(OwnerAt(model, 8500 * kUs)->kind, OwnerKind::kIdle);
}

TEST(ModelTotals, TimeInStatesContentionAndReasons) {
  EventSeq s;
  s.Add(0, EventName::kWantsGvl, kT2, 11);
  s.Add(3 * kMs, EventName::kGvlAcquired, kT2, 11);   // waited 3 ms
  s.Add(4 * kMs, EventName::kSleepEnter, kT2, 11);
  s.Add(5 * kMs, EventName::kGvlReleased, kT2, 11);   // sleeping 10 ms
  s.Add(15 * kMs, EventName::kWantsGvl, kT2, 11);
  s.Add(16 * kMs, EventName::kGvlAcquired, kT2, 11);  // waited 1 ms
  s.Add(17 * kMs, EventName::kGvlReleased, kT2, 11);  // unknown 2 ms
  s.Add(19 * kMs, EventName::kWantsGvl, kT2, 11);
  s.Add(24 * kMs, EventName::kGvlAcquired, kT2, 11);  // waited 5 ms
  s.Add(25 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  const ThreadTotals& t = model.FindThread(kT2)->totals;
  EXPECT_EQ(t.ns(ThreadState::kWantsGvl), 9 * kMs);
  EXPECT_EQ(t.wait_total_ns, 9 * kMs);
  EXPECT_EQ(t.wait_longest_ns, 5 * kMs);
  EXPECT_EQ(t.waits, 3u);
  EXPECT_EQ(t.acquisitions, 3u);
  EXPECT_EQ(t.ns(ThreadState::kRunning), 2 * kMs + 1 * kMs + 1 * kMs);
  EXPECT_EQ(t.ns(ThreadState::kReleased), 12 * kMs);
  ASSERT_EQ(t.release_reasons.size(), 2u);
  EXPECT_EQ(t.release_reasons[0].reason, ReleaseReason::kSleeping);
  EXPECT_EQ(t.release_reasons[0].ns, 10 * kMs);
  EXPECT_EQ(t.release_reasons[1].reason, ReleaseReason::kUnknown);
  EXPECT_EQ(t.release_reasons[1].ns, 2 * kMs);
  EXPECT_EQ(t.release_reasons[1].count, 1u);
  uint64_t sum = 0;
  for (uint64_t ns : t.ns_by_state) sum += ns;
  EXPECT_EQ(sum, model.end_ns() - model.start_ns());
}

TEST(ModelBuild, SortsEventsThatArrivedOutOfOrder) {
  EventSeq s;
  s.Add(2 * kMs, EventName::kGvlReleased, kT2, 11);
  s.Add(1 * kMs, EventName::kGvlAcquired, kT2, 11);
  s.Add(3 * kMs, EventName::kTracingStopped);
  const Model model = s.Build();
  ASSERT_EQ(model.events().size(), 3u);
  EXPECT_EQ(model.events()[0].event, EventName::kGvlAcquired);
  EXPECT_EQ(BlockAt(model, kT2, 1500 * kUs)->state, ThreadState::kRunning);
  EXPECT_EQ(model.start_ns(), 1 * kMs);
}

TEST(ModelBuild, RejectsRubiesWithoutSchedulerEvents) {
  ModelOptions options;
  options.ruby_version = "3.1.4";
  Result<Model> model = Model::Build({}, options);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.error().code(), ErrorCode::kBadTrace);
  EXPECT_EQ(ParseRubyMajorMinor("3.2.5"), std::make_pair(3, 2));
  EXPECT_EQ(ParseRubyMajorMinor("4.0.0-preview"), std::make_pair(4, 0));
  EXPECT_FALSE(ParseRubyMajorMinor("ruby").has_value());
}

TEST(ModelBuild, EmptyTraceHasNoThreads) {
  Result<Model> model = Model::Build({}, ModelOptions{});
  ASSERT_TRUE(model.ok());
  EXPECT_TRUE(model->threads().empty());
  EXPECT_EQ(model->owner_lane().size(), 1u);
}

TEST(ModelBuild, FromFileReadsHeaderAndEvents) {
  testing::ScratchDir dir;
  const std::string path = dir.File("t.rvtrace");
  TraceHeader header;
  header.ruby_version = "3.2.5";
  header.main_thread = 0;
  header.pid = 777;
  {
    Result<TraceWriter> writer = TraceWriter::Create(path, header);
    ASSERT_TRUE(writer.ok()) << writer.error().ToString();
    EventSeq s;
    s.Add(1 * kMs, EventName::kGvlAcquired, 0, 10);
    s.Add(2 * kMs, EventName::kWantsGvl, 0, 10);
    s.Add(3 * kMs, EventName::kGvlAcquired, kT2, 11);
    for (const TraceEvent& e : s.events()) ASSERT_TRUE(writer->Write(e).ok());
    ASSERT_TRUE(writer->Finish(FinishInfo{4 * kMs}).ok());
  }
  Result<Model> model = Model::FromFile(path);
  ASSERT_TRUE(model.ok()) << model.error().ToString();
  EXPECT_TRUE(model->is_ruby_3_2());
  EXPECT_EQ(model->options().pid, 777);
  EXPECT_EQ(model->ThreadLabel(0), "main");
  EXPECT_EQ(BlockAt(*model, 0, 3500 * kUs)->reason, ReleaseReason::kPreempted);

  Result<Model> missing = Model::FromFile(dir.File("nope.rvtrace"));
  EXPECT_FALSE(missing.ok());
}

}  // namespace
}  // namespace rvbpfd

namespace rvbpfd {
namespace {

// Every rule at once: the lanes stay contiguous, the owner lane agrees with the thread lanes (an owned block's
// thread is running or in GC over it, unless the block is the inferred one before the first event), and each
// thread's states add up to the trace's length.
TEST(ModelInvariants, EveryRuleSequenceIsConsistent) {
  const Model model = testing::EveryRuleSequence().Build("3.2.5", 0);
  ExpectAllLanesContiguous(model);
  for (const OwnerBlock& o : model.owner_lane()) {
    if (o.kind != OwnerKind::kOwned || o.duration_ns() == 0) continue;
    const uint64_t mid = o.start_ns + o.duration_ns() / 2;
    const StateBlock* b = BlockAt(model, *o.owner, mid);
    ASSERT_NE(b, nullptr);
    EXPECT_TRUE(b->state == ThreadState::kRunning || b->state == ThreadState::kGc)
        << model.ThreadLabel(*o.owner) << " owns at " << mid << " but is " << StateBlockLabel(*b);
  }
  for (const RubyThread& t : model.threads()) {
    uint64_t sum = 0;
    for (uint64_t ns : t.totals.ns_by_state) sum += ns;
    EXPECT_EQ(sum, model.end_ns() - model.start_ns());
    for (const StateBlock& b : t.blocks) {
      // Only observed blocks may lack a rule; every derived/inferred one names it.
      EXPECT_EQ(b.provenance == Provenance::kObserved, b.rule == ModelRule::kNone) << StateBlockLabel(b);
    }
  }
  // T2 and T3 shared native tid 135.
  bool shared = false;
  for (const NativeThread& n : model.native_threads()) {
    if (n.native_tid == 135) shared = n.ruby_threads == std::vector<uint32_t>{2, 3};
  }
  EXPECT_TRUE(shared);
}

}  // namespace
}  // namespace rvbpfd
