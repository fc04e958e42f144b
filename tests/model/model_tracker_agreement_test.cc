// The model's lanes and its spans() describe the same facts twice: a thread's kWantsGvl blocks are its GVL waits, its
// kRunning and kGc blocks its holds, its kReleased blocks its blocked spans (with their reason), the owner lane the
// holder spans and the GC spans the tracker's GC spans. Both come from the SpanTracker, the lanes under its timeline
// rules and the spans under its streaming rules, so these tests drive the model with generated CRuby 3.3+ event
// streams (one GVL, every transition reported, probes and GC on the holder, stacks and samples; 3.2's release after
// EXITED; lost events and pauses while the VM goes on) and require the two to agree exactly outside the gaps. Where
// the rules differ by design (TrackerRules; docs/design.md, "GVL and GC spans": a 3.2 timeslice, a lost SUSPENDED, a
// probe or GC of a thread not seen resuming, a release after a gap) the streams do not go.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "model/model.h"
#include "model/span_tracker.h"
#include "trace/event.h"

namespace rvbpfd {
namespace {

constexpr uint64_t kUs = 1000;

// One interval of one thread (or of the GVL's holder, or of a GC) as both sides can state it.
struct Interval {
  std::string what;     // "wait", "hold", "blocked", "owner", "gc"
  uint64_t thread = 0;  // tracker key (ruby_thread + 1); owner: 0 = nobody held it
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
  ReleaseReason reason = ReleaseReason::kUnknown;  // blocked only

  bool operator<(const Interval& o) const {
    return std::tie(what, thread, start_ns, end_ns, reason) <
           std::tie(o.what, o.thread, o.start_ns, o.end_ns, o.reason);
  }
  bool operator==(const Interval& o) const {
    return std::tie(what, thread, start_ns, end_ns, reason) ==
           std::tie(o.what, o.thread, o.start_ns, o.end_ns, o.reason);
  }
};

std::string Describe(const Interval& i) {
  return i.what + " thread " + std::to_string(i.thread) + " [" + std::to_string(i.start_ns) + ", " +
         std::to_string(i.end_ns) + "] " + std::string(ReleaseReasonName(i.reason));
}

// Whether `ref` is an events_dropped or tracing_paused event: what it closed has an unknown end.
bool ClosedByGap(const Model& model, EventRef ref) {
  if (!ref) return false;
  const EventName e = model.events()[*ref].event;
  return e == EventName::kEventsDropped || e == EventName::kTracingPaused;
}

// What the model's lanes say. Inferred blocks (before a thread's first event, before the first GVL event) have no
// tracker counterpart: the tracker states nothing it did not see. Nor do blocks a gap cut (the tracker's spans cut
// there are uncounted) or the unknown blocks after one.
std::vector<Interval> FromLanes(const Model& model) {
  std::vector<Interval> out;
  for (const RubyThread& t : model.threads()) {
    const uint64_t key = TraceThreadKey(t.ruby_thread);
    const std::vector<StateBlock>& blocks = t.blocks;
    // A block ends in a gap when a gap event closed it. A hold also does when its last block was closed by an event
    // that continues it (a GC's) and the lane is unknown next: the lane prunes the zero-length block that the gap
    // closed at once (the model's unknown starts at the event before the gap).
    auto cut = [&](size_t i) {
      if (ClosedByGap(model, blocks[i].closed_by)) return true;
      if (blocks[i].state != ThreadState::kRunning && blocks[i].state != ThreadState::kGc) return false;
      const bool unknown_next = i + 1 < blocks.size() && blocks[i + 1].state == ThreadState::kUnknown;
      const EventName closer = blocks[i].closed_by ? model.events()[*blocks[i].closed_by].event : EventName::kCount;
      return unknown_next && (closer == EventName::kGcEnter || closer == EventName::kGcExit);
    };
    auto holds = [&](size_t i) {
      return blocks[i].state == ThreadState::kRunning || blocks[i].state == ThreadState::kGc;
    };
    for (size_t i = 0; i < blocks.size(); ++i) {
      const StateBlock& b = blocks[i];
      if (b.provenance == Provenance::kInferred) continue;
      if (holds(i)) {
        // Consecutive kRunning / kGc blocks are one hold.
        size_t last = i;
        while (last + 1 < blocks.size() && holds(last + 1)) ++last;
        if (!cut(last)) out.push_back({"hold", key, b.start_ns, blocks[last].end_ns});
        i = last;
      } else if (cut(i) || b.start_ns == b.end_ns) {
        continue;
      } else if (b.state == ThreadState::kWantsGvl) {
        out.push_back({"wait", key, b.start_ns, b.end_ns});
      } else if (b.state == ThreadState::kReleased) {
        out.push_back({"blocked", key, b.start_ns, b.end_ns, b.reason});
      }
    }
  }
  const std::vector<OwnerBlock>& owners = model.owner_lane();
  for (size_t i = 0; i < owners.size(); ++i) {
    const OwnerBlock& o = owners[i];
    const bool cut = o.end == OwnerEnd::kGap;
    // After a gap the model takes a release as the end of the releaser's ownership (idle from there); the tracker
    // leaves the holder unknown until an acquisition is seen, since a release whose hold was not seen (3.2's second
    // SUSPENDED of one sleep) does not prove that nobody else holds the lock.
    const bool idle_after_gap = o.kind == OwnerKind::kIdle && i > 0 && owners[i - 1].kind == OwnerKind::kUnknown;
    if (idle_after_gap || o.kind == OwnerKind::kUnknown || o.provenance == Provenance::kInferred ||
        o.start_ns == o.end_ns || cut) {
      continue;
    }
    out.push_back({"owner", o.kind == OwnerKind::kOwned ? TraceThreadKey(o.owner) : 0, o.start_ns, o.end_ns});
  }
  for (const GcSpan& g : model.gc_spans()) {
    if (g.start_ns == g.end_ns || ClosedByGap(model, g.closed_by)) continue;
    out.push_back({"gc", TraceThreadKey(g.ruby_thread), g.start_ns, g.end_ns});
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What the tracker's spans say (they are emitted whole here: nothing cuts them but the end of the trace).
// Spans of unknown extent (cut by a gap) state nothing; without gaps there must be none.
std::vector<Interval> FromSpans(const Model& model, bool gaps) {
  std::vector<Interval> out;
  for (const Span& s : model.spans()) {
    EXPECT_TRUE(s.counted || gaps) << "a span of unknown extent in a stream without gaps";
    if (s.start_ns == s.end_ns || !s.counted) continue;
    switch (s.kind) {
      case SpanKind::kGvlWait:
        out.push_back({"wait", s.thread, s.start_ns, s.end_ns});
        break;
      case SpanKind::kGvlHold:
        out.push_back({"hold", s.thread, s.start_ns, s.end_ns});
        break;
      case SpanKind::kBlocked:
        out.push_back({"blocked", s.thread, s.start_ns, s.end_ns, s.reason});
        break;
      case SpanKind::kHolder:
        out.push_back({"owner", s.thread, s.start_ns, s.end_ns});
        break;
      case SpanKind::kGc:
        out.push_back({"gc", s.thread, s.start_ns, s.end_ns});
        break;
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct StreamOptions {
  bool ruby32_exits = false;  // a thread's exit is reported as 3.2 does: EXITED,
                              // then a SUSPENDED
  // Now and then events are lost (events_dropped) or tracing pauses, while the VM goes on. The holder then makes no
  // probe or GC event until its own gvl_acquired is seen again: the model would take either as the sign of a resume it
  // did not see (its implicit-resume rule, which the tracker does not share).
  bool gaps = false;
};

// A CRuby 3.3+ process as its hooks report it: threads 1 (main) to `threads`, one GVL, every transition seen (outside
// the gaps). Each step is one of the moves the VM can make from the current state, chosen at random.
std::vector<TraceEvent> Generate(uint32_t seed, uint32_t threads, int steps, StreamOptions options) {
  enum class St { kNotStarted, kBlocked, kWaiting, kHolding, kExited };
  std::mt19937 rng(seed);
  auto pick = [&rng](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  std::vector<St> st(threads + 1, St::kNotStarted);
  uint32_t holder = 0;
  bool in_gc = false;
  uint64_t t = 0;
  std::vector<TraceEvent> events;
  int unseen = 0;   // moves left that no event reports (inside a gap)
  TraceEvent lost;  // what add() fills for them
  auto add = [&](EventName event, std::optional<uint32_t> thread) -> TraceEvent& {
    t += 1 + pick(400) * kUs;
    TraceEvent e;
    e.t_ns = t;
    e.event = event;
    e.ruby_thread = thread;
    if (thread) e.native_tid = 100 + *thread;
    if (unseen > 0) {
      lost = e;
      return lost;
    }
    events.push_back(e);
    return events.back();
  };
  add(EventName::kTracingStarted, std::nullopt);
  add(EventName::kWantsGvl, 1u);
  add(EventName::kGvlAcquired, 1u);
  st[1] = St::kHolding;
  holder = 1;
  const char* kReasons[] = {"sleep", "mutex", "io", "condition_variable"};
  bool paused = false;
  bool holder_seen = true;  // the holder's gvl_acquired was seen (not lost in a gap)
  for (int step = 0; step < steps; ++step) {
    if (unseen > 0 && --unseen == 0 && paused) {
      add(EventName::kTracingResumed, std::nullopt);
      paused = false;
    }
    if (options.gaps && unseen == 0 && pick(25) == 0) {
      paused = pick(2) == 0;
      if (paused) {
        add(EventName::kTracingPaused, std::nullopt);
      } else {
        add(EventName::kEventsDropped, std::nullopt).count = 1 + pick(4);
      }
      unseen = 1 + static_cast<int>(pick(4));
      holder_seen = false;
      continue;
    }
    std::vector<uint32_t> startable, blocked, waiting;
    for (uint32_t i = 2; i <= threads; ++i) {
      if (st[i] == St::kNotStarted) startable.push_back(i);
    }
    for (uint32_t i = 1; i <= threads; ++i) {
      if (st[i] == St::kBlocked) blocked.push_back(i);
      if (st[i] == St::kWaiting) waiting.push_back(i);
    }
    switch (pick(9)) {
      case 0:  // the holder creates a thread (3.3: STARTED on the creator, naming
               // the new thread)
        if (holder == 0 || startable.empty() || in_gc) break;
        {
          const uint32_t th = startable[pick(startable.size())];
          st[th] = St::kBlocked;
          add(EventName::kThreadStarted, th);
        }
        break;
      case 1:  // a thread off the GVL wants it back; its READY may carry its stack
        if (blocked.empty()) break;
        {
          const uint32_t th = blocked[pick(blocked.size())];
          st[th] = St::kWaiting;
          TraceEvent& e = add(EventName::kWantsGvl, th);
          if (pick(2) == 0) e.stack = 1 + static_cast<uint32_t>(pick(5));
        }
        break;
      case 2:  // the GVL is free: a waiter takes it
      case 3:
        if (holder != 0 || waiting.empty()) break;
        holder = waiting[pick(waiting.size())];
        st[holder] = St::kHolding;
        add(EventName::kGvlAcquired, holder);
        holder_seen = unseen == 0;
        break;
      case 4:  // the holder releases it, with a stack and maybe the reason the
               // recorder derived from it
        if (holder == 0 || in_gc) break;
        {
          TraceEvent& e = add(EventName::kGvlReleased, holder);
          if (pick(2) == 0) e.stack = 1 + static_cast<uint32_t>(pick(5));
          if (pick(3) == 0) {
            e.reason = kReasons[pick(4)];
            e.reason_provenance = Provenance::kDerived;
          }
          st[holder] = St::kBlocked;
          holder = 0;
        }
        break;
      case 5:  // the holder enters Kernel#sleep or Mutex#lock (its release
               // follows, or it keeps running)
        if (holder == 0 || in_gc || !holder_seen) break;
        add(pick(2) == 0 ? EventName::kSleepEnter : EventName::kMutexLockEnter, holder);
        break;
      case 6:  // a GC on the holder, its events naming the thread or not; or that
               // GC's end
        if (holder == 0 || (!holder_seen && !in_gc)) break;
        add(in_gc ? EventName::kGcExit : EventName::kGcEnter,
            pick(2) == 0 ? std::optional<uint32_t>(holder) : std::nullopt);
        in_gc = !in_gc;
        break;
      case 7:  // an on-CPU sample of the holder
        if (holder == 0) break;
        add(EventName::kSample, holder).stack = 1 + static_cast<uint32_t>(pick(5));
        break;
      case 8:  // a thread other than main ends while holding (3.3+ reports no
               // SUSPENDED at exit)
        if (holder <= 1 || in_gc || pick(3) != 0) break;
        st[holder] = St::kExited;
        add(EventName::kThreadExited, holder);
        if (options.ruby32_exits) add(EventName::kGvlReleased, holder).stack = 1 + static_cast<uint32_t>(pick(5));
        holder = 0;
        break;
    }
  }
  unseen = 0;
  if (paused) add(EventName::kTracingResumed, std::nullopt);
  if (in_gc) add(EventName::kGcExit, holder != 0 ? std::optional<uint32_t>(holder) : std::nullopt);
  add(EventName::kTracingStopped, std::nullopt);
  return events;
}

void ExpectAgreementOn(const std::vector<TraceEvent>& events, bool gaps, const std::string& ruby_version,
                       const std::string& what) {
  ModelOptions options;
  options.ruby_version = ruby_version;
  options.main_thread = 1;
  Result<Model> model = Model::Build(events, options);
  ASSERT_TRUE(model.ok()) << what;
  const std::vector<Interval> lanes = FromLanes(*model);
  const std::vector<Interval> spans = FromSpans(*model, gaps);
  std::vector<Interval> only_lanes, only_spans;
  std::set_difference(lanes.begin(), lanes.end(), spans.begin(), spans.end(), std::back_inserter(only_lanes));
  std::set_difference(spans.begin(), spans.end(), lanes.begin(), lanes.end(), std::back_inserter(only_spans));
  for (const Interval& i : only_lanes) ADD_FAILURE() << what << ": only the lanes say " << Describe(i);
  for (const Interval& i : only_spans) ADD_FAILURE() << what << ": only the spans say " << Describe(i);
  EXPECT_GT(lanes.size(), 10u) << what << ": the stream says too little to compare";
}

// 200 streams of 300 moves, 2 to 5 threads each.
void ExpectAgreement(StreamOptions options, const std::string& ruby_version) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    ExpectAgreementOn(Generate(seed, 2 + seed % 4, 300, options), options.gaps, ruby_version,
                      "seed " + std::to_string(seed));
    if (::testing::Test::HasFailure()) break;  // one stream's report is enough to read
  }
}

TEST(ModelTrackerAgreement, LanesAndSpansStateTheSameIntervalsOnConsistentStreams) { ExpectAgreement({}, "3.4.5"); }

// 3.2 reports a thread's exit as EXITED, then SUSPENDED: the model absorbs the release into the exit, and the tracker
// must not open a blocked span for the dead thread either.
TEST(ModelTrackerAgreement, ARuby32ReleaseAfterTheExitOpensNothingOnEitherSide) {
  ExpectAgreement({.ruby32_exits = true}, "3.2.9");
}

// Lost events and pauses: what either side states outside them (and does not leave unknown) must agree.
TEST(ModelTrackerAgreement, OutsideGapsLanesAndSpansAgree) { ExpectAgreement({.gaps = true}, "3.4.5"); }

}  // namespace
}  // namespace rvbpfd
