#include "model/span_tracker.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

namespace rvbpfd {
namespace {

constexpr uint64_t kA = 11, kB = 12, kC = 13;  // thread keys

class Tracker {
 public:
  explicit Tracker(TrackerRules rules = TrackerRules::kStreaming)
      : t_([this](const Span& s) { spans.push_back(s); }, rules) {}

  // `reason`: the reason a gvl_released carried (nullopt: it carried none, as without a stack).
  void Ev(uint64_t t, EventName event, uint64_t thread = 0, uint32_t stack = 0,
          std::optional<ReleaseReason> reason = std::nullopt, uint32_t vm = 0) {
    t_.OnEvent(TrackerEvent{t, event, thread, vm, stack, reason.value_or(ReleaseReason::kUnknown), reason.has_value()});
  }
  void Sample(uint64_t thread, uint32_t stack, bool in_gc = false) { t_.OnSample(thread, stack, in_gc); }
  SpanTracker& tracker() { return t_; }

  std::vector<Span> Of(SpanKind kind, uint64_t thread) const {
    std::vector<Span> out;
    for (const Span& s : spans) {
      if (s.kind == kind && s.thread == thread) out.push_back(s);
    }
    return out;
  }
  std::vector<Span> Of(SpanKind kind) const {
    std::vector<Span> out;
    for (const Span& s : spans) {
      if (s.kind == kind) out.push_back(s);
    }
    return out;
  }

  std::vector<Span> spans;

 private:
  SpanTracker t_;
};

TEST(SpanTracker, OverlappingWaitersEachGetTheirOwnWaitAndTheHolderLaneSaysWhoHeld) {
  Tracker k;
  k.Ev(0, EventName::kGvlAcquired, kA);
  k.Ev(10, EventName::kGvlReleased, kB, 0);  // B was running before the trace; now off the lock
  k.Ev(100, EventName::kWantsGvl, kB);
  k.Ev(150, EventName::kWantsGvl, kC);
  k.Ev(155, EventName::kWantsGvl, kC);  // a repeated READY does not restart the wait
  EXPECT_EQ(k.tracker().holder(), kA);
  k.Ev(300, EventName::kGvlReleased, kA, 7);
  EXPECT_TRUE(k.tracker().holder_known());
  EXPECT_EQ(k.tracker().holder(), 0u);  // idle, known
  k.Ev(310, EventName::kGvlAcquired, kB);
  k.Ev(500, EventName::kGvlReleased, kB);
  k.Ev(520, EventName::kGvlAcquired, kC);

  const auto wb = k.Of(SpanKind::kGvlWait, kB);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_EQ(wb[0].start_ns, 100u);
  EXPECT_EQ(wb[0].end_ns, 310u);
  EXPECT_TRUE(wb[0].counted);
  EXPECT_EQ(wb[0].end, SpanEnd::kAcquired);
  const auto wc = k.Of(SpanKind::kGvlWait, kC);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].start_ns, 150u);
  EXPECT_EQ(wc[0].end_ns, 520u);

  // Holder lane: A [0,300] released, idle [300,310], B [310,500], idle [500,520]; C holds from 520 (still open).
  const auto h = k.Of(SpanKind::kHolder);
  ASSERT_EQ(h.size(), 4u);
  EXPECT_EQ(h[0].thread, kA);
  EXPECT_EQ(h[0].start_ns, 0u);
  EXPECT_EQ(h[0].end_ns, 300u);
  EXPECT_EQ(h[0].end, SpanEnd::kReleased);
  EXPECT_EQ(h[0].provenance, Provenance::kDerived);
  EXPECT_EQ(h[1].thread, 0u);
  EXPECT_EQ(h[1].end, SpanEnd::kAcquired);
  EXPECT_EQ(h[2].thread, kB);
  EXPECT_EQ(h[2].start_ns, 310u);
  EXPECT_EQ(h[3].thread, 0u);
  EXPECT_EQ(h[3].end_ns, 520u);
  EXPECT_EQ(k.tracker().holder(), kC);

  // A's hold goes to its release's stack.
  const auto ha = k.Of(SpanKind::kGvlHold, kA);
  ASSERT_EQ(ha.size(), 1u);
  EXPECT_EQ(ha[0].stack, 7u);
  EXPECT_EQ(ha[0].duration_ns(), 300u);
}

TEST(SpanTracker, HolderChangeWithoutARelease) {
  Tracker k;
  k.Ev(0, EventName::kGvlAcquired, kA);
  // 3.3+ lost SUSPENDED: B's RESUMED replaces the holder; A's own hold stays open until its release.
  k.Ev(100, EventName::kGvlAcquired, kB);
  EXPECT_EQ(k.tracker().holder(), kB);
  const auto h = k.Of(SpanKind::kHolder);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].thread, kA);
  EXPECT_EQ(h[0].end, SpanEnd::kAcquired);
  // A release by A does not take the GVL from B.
  k.Ev(150, EventName::kGvlReleased, kA);
  EXPECT_EQ(k.tracker().holder(), kB);
  // 3.2 timeslice: B reports READY while holding: its hold ends there (derived) and nobody holds the lock.
  k.Sample(kB, 5);
  k.Ev(200, EventName::kWantsGvl, kB);
  EXPECT_EQ(k.tracker().holder(), 0u);
  const auto hb = k.Of(SpanKind::kGvlHold, kB);
  ASSERT_EQ(hb.size(), 1u);
  EXPECT_EQ(hb[0].end, SpanEnd::kWantsGvl);
  EXPECT_EQ(hb[0].provenance, Provenance::kDerived);
  EXPECT_EQ(hb[0].stack, 5u);  // its latest sample: no release stack exists
  k.Ev(250, EventName::kGvlAcquired, kB);
  const auto wb = k.Of(SpanKind::kGvlWait, kB);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_EQ(wb[0].duration_ns(), 50u);
  EXPECT_EQ(wb[0].stack, 5u);  // the latest sample when the wait began
}

TEST(SpanTracker, WaitStackRule) {
  Tracker k;
  // The release's stack, kept for the wait that follows.
  k.Ev(0, EventName::kGvlReleased, kA, 3);
  k.Ev(10, EventName::kWantsGvl, kA);
  k.Ev(20, EventName::kGvlAcquired, kA);
  // Once the thread ran, its old release no longer names the wait: a READY/RESUMED without a release uses the sample.
  k.Sample(kA, 4);
  k.Ev(30, EventName::kWantsGvl, kA);
  k.Ev(40, EventName::kGvlAcquired, kA);
  // The wants_gvl's own stack wins.
  k.Ev(50, EventName::kGvlReleased, kA, 3);
  k.Ev(60, EventName::kWantsGvl, kA, 9);
  k.Ev(70, EventName::kGvlAcquired, kA);
  // Nothing known when the wait began: a sample during the wait names it.
  k.Ev(80, EventName::kWantsGvl, kB);
  k.Sample(kB, 6);
  k.Ev(90, EventName::kGvlAcquired, kB);
  const auto wa = k.Of(SpanKind::kGvlWait, kA);
  ASSERT_EQ(wa.size(), 3u);
  EXPECT_EQ(wa[0].stack, 3u);
  EXPECT_EQ(wa[1].stack, 4u);
  EXPECT_EQ(wa[2].stack, 9u);
  const auto wb = k.Of(SpanKind::kGvlWait, kB);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_EQ(wb[0].stack, 6u);
}

TEST(SpanTracker, GcDuringAWaitRunsOnTheHolderNotTheWaiter) {
  Tracker k;
  k.Ev(0, EventName::kGvlAcquired, kA);
  k.Sample(kA, 2);
  k.Ev(10, EventName::kGvlReleased, kB);
  k.Ev(20, EventName::kWantsGvl, kB);
  k.Ev(30, EventName::kGcEnter);  // names no thread: the holder ran it
  k.Ev(35, EventName::kGcEnter);  // a repeated enter does not restart it
  k.Sample(kA, 8, true);          // sampled inside this GC: where it was triggered
  k.Ev(60, EventName::kGcExit);
  k.Ev(70, EventName::kGvlReleased, kA);
  k.Ev(80, EventName::kGvlAcquired, kB);
  const auto gc = k.Of(SpanKind::kGc);
  ASSERT_EQ(gc.size(), 1u);
  EXPECT_EQ(gc[0].thread, kA);
  EXPECT_EQ(gc[0].provenance, Provenance::kDerived);
  EXPECT_EQ(gc[0].start_ns, 30u);
  EXPECT_EQ(gc[0].end_ns, 60u);
  EXPECT_EQ(gc[0].stack, 8u);
  EXPECT_EQ(gc[0].end, SpanEnd::kGcExit);
  // The GC does not interrupt B's wait or A's hold.
  const auto wb = k.Of(SpanKind::kGvlWait, kB);
  ASSERT_EQ(wb.size(), 1u);
  EXPECT_EQ(wb[0].duration_ns(), 60u);
  const auto ha = k.Of(SpanKind::kGvlHold, kA);
  ASSERT_EQ(ha.size(), 1u);
  EXPECT_EQ(ha[0].duration_ns(), 70u);

  // A GC that names its thread is observed; with no holder and no thread it has none.
  k.Ev(100, EventName::kGcEnter, kB);
  k.Ev(110, EventName::kGcExit, kB);
  k.Ev(120, EventName::kGvlReleased, kB);
  k.Ev(130, EventName::kGcEnter);
  k.Ev(140, EventName::kGcExit);
  const auto gc2 = k.Of(SpanKind::kGc);
  ASSERT_EQ(gc2.size(), 3u);
  EXPECT_EQ(gc2[1].thread, kB);
  EXPECT_EQ(gc2[1].provenance, Provenance::kObserved);
  EXPECT_EQ(gc2[1].stack, 0u);  // B was never sampled
  EXPECT_EQ(gc2[2].thread, 0u);
}

TEST(SpanTracker, ThreadExitMidWaitLeavesTheWaitUncountedButEndsAHold) {
  Tracker k;
  k.Ev(0, EventName::kThreadStarted, kA);
  k.Ev(5, EventName::kWantsGvl, kA);
  k.Ev(50, EventName::kThreadExited, kA);
  const auto wa = k.Of(SpanKind::kGvlWait, kA);
  ASSERT_EQ(wa.size(), 1u);
  EXPECT_FALSE(wa[0].counted);
  EXPECT_EQ(wa[0].end, SpanEnd::kExited);
  // Started -> wants: blocked "starting".
  const auto ba = k.Of(SpanKind::kBlocked, kA);
  ASSERT_EQ(ba.size(), 1u);
  EXPECT_EQ(ba[0].reason, ReleaseReason::kStarting);
  EXPECT_EQ(ba[0].end_ns, 5u);
  EXPECT_EQ(k.tracker().thread_count(), 0u);

  k.Ev(100, EventName::kGvlAcquired, kB);
  k.Sample(kB, 4);
  k.Ev(200, EventName::kThreadExited, kB);  // 3.3+: no release at exit
  const auto hb = k.Of(SpanKind::kGvlHold, kB);
  ASSERT_EQ(hb.size(), 1u);
  EXPECT_TRUE(hb[0].counted);
  EXPECT_EQ(hb[0].end, SpanEnd::kExited);
  EXPECT_EQ(hb[0].provenance, Provenance::kDerived);
  EXPECT_EQ(hb[0].stack, 4u);
  EXPECT_EQ(hb[0].duration_ns(), 100u);
  EXPECT_TRUE(k.tracker().holder_known());
  EXPECT_EQ(k.tracker().holder(), 0u);

  // A key started again without its exit: the old thread's spans have no end.
  k.Ev(300, EventName::kGvlAcquired, kC);
  k.Ev(310, EventName::kThreadStarted, kC);
  const auto hc = k.Of(SpanKind::kGvlHold, kC);
  ASSERT_EQ(hc.size(), 1u);
  EXPECT_FALSE(hc[0].counted);
  EXPECT_EQ(hc[0].end, SpanEnd::kRestarted);
  EXPECT_EQ(k.tracker().holder(), 0u);
}

TEST(SpanTracker, ARuby32ReleaseAfterTheExitOpensNothingAndANewThreadAtTheKeyStartsFresh) {
  Tracker k;
  k.Ev(0, EventName::kGvlAcquired, kA);
  k.Ev(100, EventName::kThreadExited, kA);
  k.Ev(105, EventName::kGvlReleased, kA, 7);  // 3.2: the dead thread's last SUSPENDED
  k.Ev(106, EventName::kThreadExited, kA);    // a repeat changes nothing either
  k.Ev(107, EventName::kSleepEnter, kA);
  k.Sample(kA, 9);  // a sample naming the dead thread (a stale thread pointer)
  EXPECT_EQ(k.tracker().thread_count(), 0u);
  k.tracker().Finish(150);
  ASSERT_EQ(k.Of(SpanKind::kGvlHold, kA).size(), 1u);
  EXPECT_EQ(k.Of(SpanKind::kGvlHold, kA)[0].end_ns, 100u);
  EXPECT_TRUE(k.Of(SpanKind::kBlocked, kA).empty()) << "a blocked span opened for a thread that had exited";

  // Any other event of the key is a new thread there, which starts with nothing of the old one.
  k.spans.clear();
  k.Ev(200, EventName::kWantsGvl, kA);
  k.Ev(230, EventName::kGvlAcquired, kA);
  k.Ev(260, EventName::kGvlReleased, kA, 8);
  EXPECT_EQ(k.tracker().thread_count(), 1u);
  const auto wa = k.Of(SpanKind::kGvlWait, kA);
  ASSERT_EQ(wa.size(), 1u);
  EXPECT_TRUE(wa[0].counted);
  EXPECT_EQ(wa[0].duration_ns(), 30u);
  EXPECT_EQ(wa[0].stack, 0u) << "the new thread waits with no stack of the dead one's";
  const auto ha = k.Of(SpanKind::kGvlHold, kA);
  ASSERT_EQ(ha.size(), 1u);
  EXPECT_EQ(ha[0].stack, 8u);

  // The marker of an exit lasts until the next prune: a later release of the key is a thread's again.
  k.Ev(300, EventName::kThreadExited, kB);
  EXPECT_EQ(k.tracker().thread_count(), 1u);
  EXPECT_EQ(k.tracker().PruneIdle(5), 0u) << "a marker is not an idle thread";
  k.spans.clear();
  k.Ev(310, EventName::kGvlReleased, kB);
  k.tracker().Finish(320);
  EXPECT_EQ(k.Of(SpanKind::kBlocked, kB).size(), 1u);
  EXPECT_EQ(k.tracker().thread_count(), 2u);
}

TEST(SpanTracker, LostEventsAndPausesMakeOpenSpansAndTheHolderUnknown) {
  for (EventName gap : {EventName::kEventsDropped, EventName::kTracingPaused, EventName::kTracingResumed}) {
    Tracker k;
    k.Ev(0, EventName::kGvlAcquired, kA);
    k.Ev(10, EventName::kGvlReleased, kB, 0, ReleaseReason::kIo);
    k.Ev(20, EventName::kWantsGvl, kC);
    k.Ev(25, EventName::kGcEnter, kA);
    k.Ev(30, gap);
    EXPECT_FALSE(k.tracker().holder_known()) << EventNameString(gap);
    for (const Span& s : k.spans) {
      EXPECT_FALSE(s.counted && s.end == SpanEnd::kGap) << EventNameString(gap);
    }
    EXPECT_EQ(k.Of(SpanKind::kGvlHold, kA).size(), 1u);
    EXPECT_FALSE(k.Of(SpanKind::kGvlHold, kA)[0].counted);
    EXPECT_FALSE(k.Of(SpanKind::kGvlWait, kC)[0].counted);
    EXPECT_FALSE(k.Of(SpanKind::kBlocked, kB)[0].counted);
    EXPECT_FALSE(k.Of(SpanKind::kGc)[0].counted);
    const auto h = k.Of(SpanKind::kHolder);
    ASSERT_EQ(h.size(), 1u);
    EXPECT_EQ(h[0].thread, kA);
    EXPECT_FALSE(h[0].counted);  // A held it up to some point in the gap, not known when
    // Ends after the gap belong to nothing that is open: no counted span appears from them.
    const size_t before = k.spans.size();
    k.Ev(40, EventName::kGvlAcquired, kC);
    k.Ev(50, EventName::kGcExit, kA);
    k.Ev(60, EventName::kGvlReleased, kA);
    EXPECT_EQ(k.spans.size(), before) << EventNameString(gap);
    EXPECT_EQ(k.tracker().holder(), kC);
    // The holder is known again from the next gvl_acquired; the unknown time is simply not covered.
    k.Ev(70, EventName::kGvlReleased, kC);
    const auto h2 = k.Of(SpanKind::kHolder);
    ASSERT_EQ(h2.size(), 2u);
    EXPECT_EQ(h2[1].thread, kC);
    EXPECT_EQ(h2[1].start_ns, 40u);
    EXPECT_TRUE(h2[1].counted);
  }
}

TEST(SpanTracker, ReleaseWhileWaitingMeansTheAcquisitionWasLost) {
  Tracker k;
  k.Ev(0, EventName::kWantsGvl, kA);
  k.Ev(10, EventName::kGvlReleased, kA);
  const auto w = k.Of(SpanKind::kGvlWait, kA);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_FALSE(w[0].counted);
  EXPECT_EQ(w[0].end, SpanEnd::kReleased);
}

TEST(SpanTracker, MNThreadsSharingANativeThreadAndSeparateVms) {
  // Under RUBY_MN_THREADS=1, A and B take turns on one native thread; the tracker follows Ruby threads only.
  Tracker k;
  k.Ev(0, EventName::kGvlAcquired, kA);
  k.Ev(100, EventName::kGvlReleased, kA);
  k.Ev(101, EventName::kWantsGvl, kA);
  k.Ev(102, EventName::kGvlAcquired, kB);
  k.Ev(200, EventName::kGvlReleased, kB);
  k.Ev(201, EventName::kGvlAcquired, kA);
  const auto h = k.Of(SpanKind::kHolder);
  ASSERT_EQ(h.size(), 4u);
  EXPECT_EQ(h[0].thread, kA);
  EXPECT_EQ(h[2].thread, kB);
  EXPECT_EQ(k.tracker().holder(), kA);
  EXPECT_EQ(k.Of(SpanKind::kGvlWait, kA).at(0).duration_ns(), 100u);

  // Two VMs (ractors) each have their own GVL: holders do not replace each other.
  Tracker v;
  v.Ev(0, EventName::kGvlAcquired, kA, 0, ReleaseReason::kUnknown, 0);
  v.Ev(10, EventName::kGvlAcquired, kB, 0, ReleaseReason::kUnknown, 1);
  EXPECT_EQ(v.tracker().holder(0), kA);
  EXPECT_EQ(v.tracker().holder(1), kB);
  EXPECT_TRUE(v.Of(SpanKind::kHolder).empty());
  v.Ev(20, EventName::kGcEnter, 0, 0, ReleaseReason::kUnknown, 1);
  v.Ev(30, EventName::kGcExit, 0, 0, ReleaseReason::kUnknown, 1);
  EXPECT_EQ(v.Of(SpanKind::kGc).at(0).thread, kB);
  v.Ev(40, EventName::kGvlReleased, kB, 0, ReleaseReason::kUnknown, 1);
  EXPECT_EQ(v.tracker().holder(0), kA);
  EXPECT_EQ(v.tracker().holder(1), 0u);
  EXPECT_EQ(v.Of(SpanKind::kHolder).at(0).vm, 1u);
}

TEST(SpanTracker, BlockedSpansCarryTheReleaseReason) {
  Tracker k;
  k.Ev(0, EventName::kGvlAcquired, kA);
  k.Ev(10, EventName::kSleepEnter, kA);
  k.Ev(20, EventName::kGvlReleased, kA, 3);  // inside the sleep probe: sleeping, derived
  k.Ev(25, EventName::kGvlReleased, kA, 3);  // 3.2's second SUSPENDED continues the block
  k.Ev(100, EventName::kWantsGvl, kA);
  k.Ev(110, EventName::kGvlAcquired, kA);
  k.Ev(120, EventName::kMutexLockEnter, kA);
  k.Ev(130, EventName::kGvlReleased, kA, 0, ReleaseReason::kIo);  // the stack's reason wins over the probe's
  k.Ev(140, EventName::kGvlAcquired, kA);
  k.Ev(150, EventName::kGvlReleased, kA);  // the probe entered before the last run no longer applies
  k.Ev(160, EventName::kWantsGvl, kA);
  const auto b = k.Of(SpanKind::kBlocked, kA);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].reason, ReleaseReason::kSleeping);
  EXPECT_EQ(b[0].reason_provenance, Provenance::kDerived);
  EXPECT_EQ(b[0].start_ns, 20u);
  EXPECT_EQ(b[0].end_ns, 100u);
  EXPECT_EQ(b[0].stack, 3u);
  EXPECT_EQ(b[1].reason, ReleaseReason::kIo);
  EXPECT_EQ(b[1].end, SpanEnd::kAcquired);
  EXPECT_EQ(b[2].reason, ReleaseReason::kUnknown);
  EXPECT_EQ(b[2].reason_provenance, Provenance::kObserved);
}

// Puma's reactor: nio4r's Selector#select takes its (uncontended) Mutex#lock, returns from it and blocks in epoll.
// The release's own stack said what it could ("unknown" here, io with the nio4r rule); the probe says nothing more.
TEST(SpanTracker, AProbeNeverOverridesTheReasonTheReleaseCarried) {
  for (const TrackerRules rules : {TrackerRules::kStreaming, TrackerRules::kTimeline}) {
    Tracker k(rules);
    k.Ev(0, EventName::kGvlAcquired, kA);
    k.Ev(10, EventName::kMutexLockEnter, kA);
    k.Ev(30, EventName::kGvlReleased, kA, 3, ReleaseReason::kUnknown);
    k.Ev(40, EventName::kGvlAcquired, kA);
    k.Ev(50, EventName::kSleepEnter, kA);
    k.Ev(60, EventName::kGvlReleased, kA, 4, ReleaseReason::kIo);
    k.Ev(70, EventName::kGvlAcquired, kA);
    k.Ev(80, EventName::kMutexLockEnter, kA);
    k.Ev(90, EventName::kGvlReleased, kA);  // no reason carried (no stack taken): the probe stands in
    k.Ev(100, EventName::kGvlAcquired, kA);
    const auto b = k.Of(SpanKind::kBlocked, kA);
    ASSERT_EQ(b.size(), 3u);
    EXPECT_EQ(b[0].reason, ReleaseReason::kUnknown);
    EXPECT_EQ(b[0].reason_provenance, Provenance::kObserved);
    EXPECT_EQ(b[1].reason, ReleaseReason::kIo);
    EXPECT_EQ(b[2].reason, ReleaseReason::kWaitingMutex);
    EXPECT_EQ(b[2].reason_provenance, Provenance::kDerived);
  }
}

TEST(SpanTracker, ATraceReleaseCarriesItsReasonEvenWhenUnknown) {
  TraceEvent e;
  e.event = EventName::kGvlReleased;
  e.reason = "unknown";
  EXPECT_TRUE(TrackerEventOf(e, 1, 0).reason_carried);
  e.reason = "";
  EXPECT_FALSE(TrackerEventOf(e, 1, 0).reason_carried);
  e.reason = "idle";
  EXPECT_EQ(TrackerEventOf(e, 1, 0).reason, ReleaseReason::kIdle);
}

TEST(SpanTracker, CutSplitsOpenSpansAndPruneForgetsIdleThreads) {
  Tracker k;
  k.Ev(0, EventName::kGvlAcquired, kA);
  k.Sample(kA, 2);
  k.Ev(10, EventName::kGvlReleased, kB, 4);
  k.Ev(20, EventName::kWantsGvl, kB);
  k.tracker().Cut(50);
  k.tracker().Cut(50);  // nothing more before the same cut
  ASSERT_EQ(k.Of(SpanKind::kGvlHold, kA).size(), 1u);
  EXPECT_EQ(k.Of(SpanKind::kGvlHold, kA)[0].end, SpanEnd::kCut);
  EXPECT_EQ(k.Of(SpanKind::kGvlHold, kA)[0].stack, 2u);  // the release is still to come
  EXPECT_EQ(k.Of(SpanKind::kGvlHold, kA)[0].duration_ns(), 50u);
  ASSERT_EQ(k.Of(SpanKind::kGvlWait, kB).size(), 1u);
  EXPECT_EQ(k.Of(SpanKind::kGvlWait, kB)[0].duration_ns(), 30u);
  EXPECT_EQ(k.Of(SpanKind::kGvlWait, kB)[0].stack, 4u);
  k.Ev(70, EventName::kGvlReleased, kA, 6);
  k.Ev(80, EventName::kGvlAcquired, kB);
  EXPECT_EQ(k.Of(SpanKind::kGvlHold, kA).at(1).start_ns, 50u);
  EXPECT_EQ(k.Of(SpanKind::kGvlHold, kA).at(1).stack, 6u);
  EXPECT_EQ(k.Of(SpanKind::kGvlWait, kB).at(1).start_ns, 50u);

  // A (off the lock, idle) is dropped after 2 idle rounds; B (holding) never is.
  EXPECT_EQ(k.tracker().PruneIdle(2), 0u);
  EXPECT_EQ(k.tracker().PruneIdle(2), 0u);
  EXPECT_EQ(k.tracker().PruneIdle(2), 1u);
  EXPECT_EQ(k.tracker().thread_count(), 1u);
  // The stack ids held are renumbered on request.
  k.tracker().RemapStacks([](uint32_t id) { return id + 100; });
  k.Ev(90, EventName::kWantsGvl, kB);  // a release not seen: B's hold ends on its latest sample (none)
  k.Ev(95, EventName::kGvlAcquired, kB);
  EXPECT_EQ(k.Of(SpanKind::kGvlWait, kB).back().stack, 0u);
}

TEST(SpanTracker, TraceEventsAndKeys) {
  TraceEvent e;
  e.t_ns = 5;
  e.event = EventName::kGvlReleased;
  e.reason = "sleep";
  const TrackerEvent te = TrackerEventOf(e, TraceThreadKey(0u), 3);
  EXPECT_EQ(te.thread, 1u);  // serial 0 (3.2's main thread) is a real thread
  EXPECT_EQ(te.reason, ReleaseReason::kSleeping);
  EXPECT_EQ(te.stack, 3u);
  EXPECT_EQ(TraceThreadKey(std::nullopt), 0u);
  EXPECT_EQ(TraceRubyThread(1), std::optional<uint32_t>(0));
  EXPECT_EQ(TraceRubyThread(0), std::nullopt);
}

TEST(ReleaseReasonNames, OneTableTwoSpellings) {
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kSleeping), "sleep");
  EXPECT_EQ(ReleaseReasonName(ReleaseReason::kSleeping), "sleeping");
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kWaitingMutex), "mutex");
  EXPECT_EQ(ReleaseReasonName(ReleaseReason::kWaitingMutex), "waiting_mutex");
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kStarting), "unknown");  // never written
  EXPECT_EQ(ReleaseReasonTraceName(ReleaseReason::kPreempted), "unknown");
  for (size_t i = 0; i < kReleaseReasonCount; ++i) {
    const auto r = static_cast<ReleaseReason>(i);
    if (r == ReleaseReason::kStarting || r == ReleaseReason::kPreempted) continue;
    EXPECT_EQ(ParseReleaseReasonTraceName(ReleaseReasonTraceName(r)), r) << ReleaseReasonName(r);
  }
  EXPECT_EQ(ParseReleaseReasonTraceName(""), ReleaseReason::kUnknown);
  EXPECT_EQ(ParseReleaseReasonTraceName("sleeping"), ReleaseReason::kUnknown);  // a display name is not a trace name
}

// The timeline rules (the model's lanes): each differs from the streaming rules only where a transition was not
// reported. Each test drives both trackers with the same events and checks where they part.

TEST(SpanTrackerTimeline, ATimesliceKeepsTheLockUntilAnotherThreadTakesIt) {
  Tracker stream, timeline(TrackerRules::kTimeline);
  for (Tracker* k : {&stream, &timeline}) {
    k->Ev(0, EventName::kGvlAcquired, kA);
    k->Ev(5, EventName::kWantsGvl, kB);
    k->Ev(10, EventName::kWantsGvl, kA);  // 3.2: READY while holding, no SUSPENDED
  }
  // Streaming: the hold ends at the READY, and A waits.
  EXPECT_EQ(stream.tracker().phase(kA), ThreadPhase::kWaiting);
  // Timeline: A keeps the lock, marked ready, until B's RESUMED preempts it.
  EXPECT_EQ(timeline.tracker().phase(kA), ThreadPhase::kHolding);
  EXPECT_TRUE(timeline.tracker().ready_while_holding(kA));
  EXPECT_EQ(timeline.tracker().holder(), kA);
  timeline.Ev(20, EventName::kGvlAcquired, kB);
  EXPECT_EQ(timeline.tracker().phase(kA), ThreadPhase::kWaiting);
  EXPECT_EQ(timeline.tracker().phase(kB), ThreadPhase::kHolding);
  EXPECT_EQ(timeline.tracker().holder(), kB);
  const auto holds = timeline.Of(SpanKind::kGvlHold, kA);
  ASSERT_EQ(holds.size(), 1u);
  EXPECT_EQ(holds[0].end_ns, 20u);
  EXPECT_EQ(holds[0].end, SpanEnd::kPreempted);
  EXPECT_EQ(holds[0].provenance, Provenance::kDerived);
  EXPECT_FALSE(timeline.tracker().ready_while_holding(kA));
}

TEST(SpanTrackerTimeline, AnAcquisitionWhileAnotherHoldsEndsThatHoldOnTheTimelineOnly) {
  Tracker stream, timeline(TrackerRules::kTimeline);
  for (Tracker* k : {&stream, &timeline}) {
    k->Ev(0, EventName::kGvlAcquired, kA);
    k->Ev(3, EventName::kSleepEnter, kA);
    k->Ev(10, EventName::kGvlAcquired, kB);  // A's SUSPENDED was lost
  }
  EXPECT_EQ(stream.tracker().phase(kA), ThreadPhase::kHolding);
  EXPECT_EQ(timeline.tracker().phase(kA), ThreadPhase::kBlocked);
  // Its probe reason is forgotten: the release it would have named was not seen.
  EXPECT_EQ(timeline.tracker().blocked_reason(kA), ReleaseReason::kUnknown);
  EXPECT_EQ(timeline.tracker().holder(), kB);
  EXPECT_EQ(stream.tracker().holder(), kB);
}

TEST(SpanTrackerTimeline, AProbeOrAGcOfAThreadOffTheLockResumesIt) {
  Tracker stream, timeline(TrackerRules::kTimeline);
  for (Tracker* k : {&stream, &timeline}) {
    k->Ev(0, EventName::kGvlAcquired, kA);
    k->Ev(5, EventName::kGvlReleased, kA);
    k->Ev(8, EventName::kMutexLockEnter, kA);  // its RESUMED was not seen
  }
  EXPECT_EQ(stream.tracker().phase(kA), ThreadPhase::kBlocked);
  EXPECT_EQ(timeline.tracker().phase(kA), ThreadPhase::kHolding);
  EXPECT_EQ(timeline.tracker().holder(), kA);  // nobody else held it: A does
  timeline.Ev(12, EventName::kGvlReleased, kA);
  EXPECT_EQ(timeline.tracker().blocked_reason(kA), ReleaseReason::kWaitingMutex);

  Tracker gc(TrackerRules::kTimeline);
  gc.Ev(0, EventName::kGvlAcquired, kB);
  gc.Ev(1, EventName::kGvlReleased, kA);
  gc.Ev(2, EventName::kGcEnter, kA);  // A runs a GC while B is the holder: A resumed unseen; B stays the holder
  EXPECT_EQ(gc.tracker().phase(kA), ThreadPhase::kGc);
  EXPECT_EQ(gc.tracker().holder(), kB);
  gc.Ev(3, EventName::kGcExit, kA);
  EXPECT_EQ(gc.tracker().phase(kA), ThreadPhase::kHolding);
}

TEST(SpanTrackerTimeline, AFirstEventOnlyAHolderReportsSaysTheThreadHeldTheLock) {
  Tracker stream, timeline(TrackerRules::kTimeline);
  for (Tracker* k : {&stream, &timeline}) {
    k->Ev(0, EventName::kSleepEnter, kA);
    k->Ev(1, EventName::kWantsGvl, kA);  // 3.2: READY while holding
  }
  EXPECT_EQ(stream.tracker().phase(kA), ThreadPhase::kWaiting);
  EXPECT_EQ(timeline.tracker().phase(kA), ThreadPhase::kHolding);

  // A release as the first GVL event: its thread held the lock since before, so nobody holds it now. A release by a
  // thread not known to hold it says nothing before the first GVL event.
  Tracker first(TrackerRules::kTimeline);
  first.Ev(0, EventName::kWantsGvl, kB);
  first.Ev(1, EventName::kGvlReleased, kB);
  EXPECT_FALSE(first.tracker().holder_known());
  Tracker held(TrackerRules::kTimeline);
  held.Ev(0, EventName::kGvlReleased, kA);
  EXPECT_TRUE(held.tracker().holder_known());
  EXPECT_EQ(held.tracker().holder(), 0u);
  EXPECT_EQ(held.tracker().phase(kA), ThreadPhase::kBlocked);
}

TEST(SpanTrackerTimeline, AfterAGapAReleaseSaysNobodyHoldsTheLock) {
  Tracker stream, timeline(TrackerRules::kTimeline);
  for (Tracker* k : {&stream, &timeline}) {
    k->Ev(0, EventName::kGvlAcquired, kA);
    k->Ev(5, EventName::kEventsDropped);
    k->Ev(9, EventName::kGvlReleased, kB);
  }
  EXPECT_FALSE(stream.tracker().holder_known());
  EXPECT_TRUE(timeline.tracker().holder_known());
  EXPECT_EQ(timeline.tracker().holder(), 0u);
  EXPECT_EQ(timeline.tracker().phase(kA), ThreadPhase::kUnknown);
  EXPECT_TRUE(timeline.tracker().holder_seen());
}

TEST(SpanTrackerTimeline, AnExitIsFinalAndAResumeIsNoGap) {
  Tracker stream, timeline(TrackerRules::kTimeline);
  for (Tracker* k : {&stream, &timeline}) {
    k->Ev(0, EventName::kGvlAcquired, kA);
    k->Ev(2, EventName::kWantsGvl, kB);
    k->Ev(5, EventName::kThreadExited, kA);
    k->Ev(6, EventName::kTracingPaused);
    k->Ev(7, EventName::kGvlAcquired, kB);
    k->Ev(8, EventName::kTracingResumed);
    k->Ev(9, EventName::kGvlAcquired, kA);  // the exited key again
  }
  // Streaming: the resume is a gap that forgets B's hold; the key of an exited thread is a new thread after a gap.
  EXPECT_EQ(stream.tracker().phase(kB), ThreadPhase::kUnknown);
  EXPECT_EQ(stream.tracker().phase(kA), ThreadPhase::kHolding);
  // Timeline: B holds since 7; A stays exited.
  EXPECT_EQ(timeline.tracker().phase(kB), ThreadPhase::kHolding);
  EXPECT_EQ(timeline.tracker().phase(kA), ThreadPhase::kExited);
  EXPECT_EQ(timeline.tracker().holder(), kB);
}

TEST(SpanTrackerTimeline, AStartOfALiveThreadIsARepeat) {
  Tracker stream, timeline(TrackerRules::kTimeline);
  for (Tracker* k : {&stream, &timeline}) {
    k->Ev(0, EventName::kGvlAcquired, kA);
    k->Ev(5, EventName::kThreadStarted, kA);
  }
  EXPECT_EQ(stream.tracker().phase(kA), ThreadPhase::kBlocked);  // a new thread at the key
  EXPECT_EQ(stream.tracker().blocked_reason(kA), ReleaseReason::kStarting);
  EXPECT_EQ(timeline.tracker().phase(kA), ThreadPhase::kHolding);
  EXPECT_EQ(timeline.tracker().holder(), kA);
}

TEST(SpanTrackerTimeline, AGcThreadThatGivesTheLockUpNoLongerRunsTheGc) {
  Tracker k(TrackerRules::kTimeline);
  k.Ev(0, EventName::kGvlAcquired, kA);
  k.Ev(1, EventName::kGcEnter);  // names no thread: the holder's
  EXPECT_EQ(k.tracker().gc_thread(), kA);
  EXPECT_EQ(k.tracker().phase(kA), ThreadPhase::kGc);
  k.Ev(2, EventName::kGvlAcquired, kB);  // A preempted inside the GC
  k.Ev(3, EventName::kGvlAcquired, kA);
  EXPECT_EQ(k.tracker().phase(kA), ThreadPhase::kHolding);
  EXPECT_EQ(k.tracker().GcExitThread(kB), kA);  // the GC is still A's to end
  k.Ev(4, EventName::kGcExit);
  EXPECT_EQ(k.tracker().gc_thread(), 0u);
}

}  // namespace
}  // namespace rvbpfd
