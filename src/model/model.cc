#include "model/model.h"

#include <algorithm>
#include <charconv>
#include <unordered_map>
#include <utility>

namespace rvbpfd {
namespace {

bool HoldsGvl(ThreadState state) { return state == ThreadState::kRunning || state == ThreadState::kGc; }

bool IsOwnThreadEvent(EventName event) {
  // Only these run on the thread's own native thread on every version (STARTED runs on the creator, READY on the
  // waker on 3.3+), so only they decide the native view.
  return event == EventName::kGvlAcquired || event == EventName::kGvlReleased || event == EventName::kThreadExited;
}

void AddDistinct(std::vector<uint32_t>* list, uint32_t value) {
  if (std::find(list->begin(), list->end(), value) == list->end()) list->push_back(value);
}

// The lane state a tracker phase is drawn as; nullopt for a thread the tracker has not seen.
std::optional<ThreadState> LaneState(ThreadPhase phase) {
  switch (phase) {
    case ThreadPhase::kUnseen:
      return std::nullopt;
    case ThreadPhase::kUnknown:
      return ThreadState::kUnknown;
    case ThreadPhase::kBlocked:
      return ThreadState::kReleased;
    case ThreadPhase::kWaiting:
      return ThreadState::kWantsGvl;
    case ThreadPhase::kHolding:
      return ThreadState::kRunning;
    case ThreadPhase::kGc:
      return ThreadState::kGc;
    case ThreadPhase::kExited:
      return ThreadState::kExited;
  }
  return std::nullopt;
}

// The state a thread's first event implies it was in before that event (the kBeforeFirstEvent rule): the tracker's,
// except that a thread_started's thread did not exist yet.
ThreadState StateBeforeFirst(EventName event) {
  if (event == EventName::kThreadStarted) return ThreadState::kNotStarted;
  return LaneState(SpanTracker::PhaseBeforeFirst(event)).value_or(ThreadState::kUnknown);
}

}  // namespace

// Builds a Model from events in time order. One instance per Build call.
//
// What each thread and the GVL are doing is the SpanTracker's, under its timeline rules (TrackerRules::kTimeline):
// after each event the builder reads the tracker's state of every thread the event can have changed (its own, the
// holder it preempted, every thread at a gap) and of the lock's holder, and where that differs from a lane's open
// block, closes the block and opens the next one. The builder only draws: each block names the event that opened
// it and, for a transition that was not reported, the rule that derived it; lanes also begin with the state a
// thread's first event implies (inferred), and note repeats, native threads and the unknown windows of gaps.
class ModelBuilder {
 public:
  explicit ModelBuilder(Model* model) : m_(*model), tracker_([](const Span&) {}, TrackerRules::kTimeline) {}

  void Run();

 private:
  RubyThread& Lane(size_t lane) { return m_.threads_[lane]; }
  StateBlock& Cur(size_t lane) { return m_.threads_[lane].blocks.back(); }
  // The lane of `serial`, made with its inferred first block when `first_event` at t is its first event.
  size_t Touch(uint32_t serial, uint64_t t, EventName first_event);
  void Transition(size_t lane, uint64_t t, StateBlock next, EventRef closer);
  void CloseOwner(uint64_t t, OwnerEnd end, EventRef closer, OwnerBlock next);
  void NoteNativeTid(size_t lane, const TraceEvent& e);
  // Feeds `e` to the tracker; returns the release reason it carried (parsed once: a gvl_released's, else kUnknown).
  ReleaseReason Feed(const TraceEvent& e) {
    const TrackerEvent fed = TrackerEventOf(e, TraceThreadKey(e.ruby_thread), 0);
    tracker_.OnEvent(fed);
    return fed.reason;
  }

  // Draws the tracker's state of the lane's thread after event `idx` (at t): a new block when it changed. `subject`:
  // the event is about this thread (a gap is about every thread); otherwise the thread is the holder another
  // thread's gvl_acquired preempted. `carried`: the reason a gvl_released carried (Feed's).
  void Follow(size_t lane, const TraceEvent& e, size_t idx, bool subject, uint64_t t,
              ReleaseReason carried = ReleaseReason::kUnknown);
  // Draws the tracker's holder after a non-gap event of `subject` (`seen_before`: a GVL event or gap was seen
  // before this event, so the owner lane is no longer the block inferred since the trace began).
  void FollowOwner(const TraceEvent& e, size_t idx, uint32_t subject, bool seen_before);

  void OnThreadEvent(const TraceEvent& e, size_t idx);
  void OnGcEnter(const TraceEvent& e, size_t idx);
  void OnGcExit(const TraceEvent& e, size_t idx);
  void OnGap(const TraceEvent& e, size_t idx, uint64_t gap_start, ModelRule cause);

  void Finish();
  void BuildNativeView();
  void ComputeTotals(RubyThread& thread);

  Model& m_;
  SpanTracker tracker_;  // thread keys: TraceThreadKey(ruby_thread); the lock of VM 0 (traces name no VM)
  std::unordered_map<uint32_t, size_t> lanes_;  // ruby_thread -> index into m_.threads_
  std::optional<size_t> open_gc_;               // index into gc_spans_
  std::optional<size_t> open_pause_;            // index into unknown_windows_
  std::optional<uint64_t> last_gap_end_;
  std::optional<ModelRule> last_gap_cause_;
};

size_t ModelBuilder::Touch(uint32_t serial, uint64_t t, EventName first_event) {
  auto it = lanes_.find(serial);
  if (it != lanes_.end()) return it->second;
  const size_t index = m_.threads_.size();
  RubyThread thread;
  thread.ruby_thread = serial;
  thread.main = (m_.options_.main_thread && *m_.options_.main_thread == serial) ||
                std::find(m_.options_.extra_main.begin(), m_.options_.extra_main.end(), serial) !=
                    m_.options_.extra_main.end();
  uint64_t inferred_from = m_.start_ns_;
  if (last_gap_end_) {
    // Events were lost (or tracing paused) before this thread's first event: they may have been about it.
    const uint64_t gap_end = std::min(*last_gap_end_, t);
    StateBlock unknown;
    unknown.start_ns = m_.start_ns_;
    unknown.end_ns = gap_end;
    unknown.state = ThreadState::kUnknown;
    unknown.provenance = Provenance::kDerived;
    unknown.rule = *last_gap_cause_;
    thread.blocks.push_back(unknown);
    inferred_from = gap_end;
  }
  StateBlock inferred;
  inferred.start_ns = inferred_from;
  inferred.state = StateBeforeFirst(first_event);
  inferred.provenance = Provenance::kInferred;
  inferred.rule = ModelRule::kBeforeFirstEvent;
  thread.blocks.push_back(inferred);
  m_.threads_.push_back(std::move(thread));
  lanes_.emplace(serial, index);
  return index;
}

void ModelBuilder::Transition(size_t lane, uint64_t t, StateBlock next, EventRef closer) {
  StateBlock& cur = Cur(lane);
  cur.end_ns = t;
  cur.closed_by = closer;
  if (closer && HoldsGvl(cur.state) && !cur.native_tid) {
    const TraceEvent& e = m_.events_[*closer];
    if (IsOwnThreadEvent(e.event) && e.ruby_thread && *e.ruby_thread == Lane(lane).ruby_thread) {
      cur.native_tid = e.native_tid;
    }
  }
  next.start_ns = t;
  Lane(lane).blocks.push_back(next);
}

void ModelBuilder::CloseOwner(uint64_t t, OwnerEnd end, EventRef closer, OwnerBlock next) {
  OwnerBlock& cur = m_.owner_lane_.back();
  cur.end_ns = t;
  cur.end = end;
  cur.closed_by = closer;
  next.start_ns = t;
  m_.owner_lane_.push_back(next);
}

void ModelBuilder::NoteNativeTid(size_t lane, const TraceEvent& e) {
  if (IsOwnThreadEvent(e.event) && e.native_tid) AddDistinct(&Lane(lane).native_tids, *e.native_tid);
}

void ModelBuilder::Follow(size_t lane, const TraceEvent& e, size_t idx, bool subject, uint64_t t,
                          ReleaseReason carried) {
  const std::optional<ThreadState> now = LaneState(tracker_.phase(TraceThreadKey(Lane(lane).ruby_thread)));
  StateBlock& cur = Cur(lane);
  if (!now || *now == cur.state) {
    if (!subject) return;
    // The event changed nothing: a repeat the block absorbs (3.2 reports two SUSPENDED for one sleep), or a 3.2
    // READY while running, which the thread's hold keeps until another thread's RESUMED.
    switch (e.event) {
      case EventName::kWantsGvl:
        if (HoldsGvl(cur.state)) {
          if (!cur.ready_while_running) cur.ready_while_running = idx;
        } else {
          ++cur.repeats;
        }
        break;
      case EventName::kGvlAcquired:
        ++cur.repeats;
        if (!cur.native_tid) cur.native_tid = e.native_tid;
        break;
      case EventName::kGvlReleased:
      case EventName::kThreadStarted:
      case EventName::kGcEnter:
        ++cur.repeats;
        break;
      default:
        break;
    }
    return;
  }
  StateBlock next;
  next.state = *now;
  next.opened_by = idx;
  if (*now == ThreadState::kUnknown) {
    next.provenance = Provenance::kDerived;
    next.rule = *last_gap_cause_;
  } else if (!subject) {
    // Another thread's RESUMED took the lock this one had not released: on 3.2 a timeslice, on 3.3+ a lost SUSPENDED.
    next.reason = m_.ruby_3_2_ ? ReleaseReason::kPreempted : ReleaseReason::kUnknown;
    next.provenance = Provenance::kDerived;
    next.rule = m_.ruby_3_2_ ? ModelRule::kPreemptedByResume : ModelRule::kOwnerReplaced;
  } else {
    switch (e.event) {
      case EventName::kGvlAcquired:
        next.native_tid = e.native_tid;
        break;
      case EventName::kGvlReleased: {
        const ReleaseReason reason = tracker_.blocked_reason(TraceThreadKey(e.ruby_thread));
        if (carried != ReleaseReason::kUnknown) {
          // The recorder derived it from the released stack (the tracker's reason is this one).
          next.reason = carried;
          next.provenance = Provenance::kDerived;
          next.rule = ModelRule::kStackReason;
        } else if (reason != ReleaseReason::kUnknown) {
          // The release carried no reason (no stack was taken): the tracker took a Kernel#sleep / Mutex#lock probe
          // entered since the thread last ran. A carried "unknown" leaves the tracker's reason unknown too.
          next.reason = reason;
          next.provenance = Provenance::kDerived;
          next.rule = reason == ReleaseReason::kSleeping ? ModelRule::kSleepProbe : ModelRule::kMutexProbe;
        }
        break;
      }
      case EventName::kThreadStarted:
        next.reason = ReleaseReason::kStarting;
        break;
      case EventName::kGcEnter:
        if (cur.state == ThreadState::kRunning) {
          next.native_tid = cur.native_tid;
          if (!e.ruby_thread) {
            next.provenance = Provenance::kDerived;
            next.rule = ModelRule::kGcOnOwner;
          }
        } else {
          next.provenance = Provenance::kDerived;
          next.rule = ModelRule::kImplicitResume;
        }
        break;
      case EventName::kGcExit:
        next.native_tid = cur.native_tid;
        if (!e.ruby_thread) {
          next.provenance = Provenance::kDerived;
          next.rule = ModelRule::kGcOnOwner;
        }
        break;
      case EventName::kSleepEnter:
      case EventName::kMutexLockEnter:
        // A probe runs Ruby code, which needs the GVL: the thread was resumed without a RESUMED we saw.
        next.provenance = Provenance::kDerived;
        next.rule = ModelRule::kImplicitResume;
        break;
      default:
        break;
    }
  }
  Transition(lane, t, next, idx);
}

void ModelBuilder::FollowOwner(const TraceEvent& e, size_t idx, uint32_t subject, bool seen_before) {
  if (!tracker_.holder_known()) return;  // only a gap loses the holder (OnGap)
  const std::optional<uint32_t> holder = TraceRubyThread(tracker_.holder());
  OwnerBlock& cur = m_.owner_lane_.back();
  if (holder ? cur.kind == OwnerKind::kOwned && cur.owner == holder : cur.kind == OwnerKind::kIdle) return;
  OwnerBlock next;
  next.provenance = Provenance::kDerived;
  next.opened_by = idx;
  OwnerEnd end = OwnerEnd::kAcquired;
  if (holder) {
    next.kind = OwnerKind::kOwned;
    next.owner = holder;
    next.rule = e.event == EventName::kGvlAcquired ? ModelRule::kOwnerFromAcquire : ModelRule::kImplicitResume;
    if (cur.kind == OwnerKind::kOwned) end = OwnerEnd::kPreempted;
  } else {
    if (!seen_before) {
      // The first GVL event is a release or exit of a thread holding the GVL: it owned it since the trace began.
      cur.kind = OwnerKind::kOwned;
      cur.owner = subject;
      cur.provenance = Provenance::kInferred;
      cur.rule = ModelRule::kBeforeFirstEvent;
    }
    next.kind = OwnerKind::kIdle;
    const bool exit = e.event == EventName::kThreadExited;
    next.rule = exit ? ModelRule::kExitReleases : ModelRule::kOwnerFromAcquire;
    end = exit ? OwnerEnd::kExited : OwnerEnd::kReleased;
  }
  CloseOwner(e.t_ns, end, idx, next);
}

void ModelBuilder::OnThreadEvent(const TraceEvent& e, size_t idx) {
  const uint32_t serial = *e.ruby_thread;
  const size_t lane = Touch(serial, e.t_ns, e.event);
  if (Cur(lane).state == ThreadState::kExited) {
    // Nothing follows EXITED (the tracker ignores it too); 3.2 reports EXITED, then SUSPENDED.
    if (e.event == EventName::kGvlReleased || e.event == EventName::kThreadExited) {
      ++Cur(lane).repeats;
    } else {
      ++m_.unattributed_events_;
    }
    return;
  }
  const uint64_t holder_before = tracker_.holder();
  const bool seen_before = tracker_.holder_seen();
  const ReleaseReason carried = Feed(e);
  NoteNativeTid(lane, e);
  FollowOwner(e, idx, serial, seen_before);
  if (holder_before != 0 && holder_before != TraceThreadKey(serial)) {
    // The holder a RESUMED preempted (the tracker's state of any other thread cannot have changed).
    if (auto it = lanes_.find(*TraceRubyThread(holder_before)); it != lanes_.end()) {
      Follow(it->second, e, idx, /*subject=*/false, e.t_ns);
    }
  }
  Follow(lane, e, idx, /*subject=*/true, e.t_ns, carried);
}

void ModelBuilder::OnGcEnter(const TraceEvent& e, size_t idx) {
  if (open_gc_) return;  // GC does not nest; a repeated enter changes nothing
  const bool seen_before = tracker_.holder_seen();
  Feed(e);
  // The GC's thread: the event's, else the GVL's holder (GC runs holding the GVL: derived).
  const std::optional<uint32_t> thread = TraceRubyThread(tracker_.gc_thread());
  GcSpan span;
  span.start_ns = e.t_ns;
  span.opened_by = idx;
  span.ruby_thread = thread;
  span.thread_provenance = !e.ruby_thread && thread ? Provenance::kDerived : Provenance::kObserved;
  open_gc_ = m_.gc_spans_.size();
  m_.gc_spans_.push_back(span);
  if (!thread) return;
  const size_t lane = Touch(*thread, e.t_ns, EventName::kGcEnter);
  if (Cur(lane).state == ThreadState::kExited) {
    ++m_.unattributed_events_;
    return;
  }
  FollowOwner(e, idx, *thread, seen_before);
  Follow(lane, e, idx, /*subject=*/true, e.t_ns);
}

void ModelBuilder::OnGcExit(const TraceEvent& e, size_t idx) {
  const std::optional<uint32_t> thread = TraceRubyThread(tracker_.GcExitThread(TraceThreadKey(e.ruby_thread)));
  Feed(e);
  if (open_gc_) {
    GcSpan& gc = m_.gc_spans_[*open_gc_];
    gc.end_ns = e.t_ns;
    gc.closed_by = idx;
    gc.complete = true;
    open_gc_.reset();
  }
  if (!thread) return;
  const size_t lane = Touch(*thread, e.t_ns, EventName::kGcExit);
  if (Cur(lane).state == ThreadState::kExited) {
    ++m_.unattributed_events_;
    return;
  }
  Follow(lane, e, idx, /*subject=*/true, e.t_ns);
}

void ModelBuilder::OnGap(const TraceEvent& e, size_t idx, uint64_t gap_start, ModelRule cause) {
  const bool seen_before = tracker_.holder_seen();
  last_gap_cause_ = cause;
  Feed(e);
  // Every thread's state is unknown from the gap's start (nothing follows EXITED, lost events or not).
  for (size_t lane = 0; lane < m_.threads_.size(); ++lane) {
    Follow(lane, e, idx, /*subject=*/true, std::max(gap_start, Cur(lane).start_ns));
  }
  if (m_.owner_lane_.back().kind != OwnerKind::kUnknown || !seen_before) {
    OwnerBlock unknown;
    unknown.kind = OwnerKind::kUnknown;
    unknown.provenance = Provenance::kDerived;
    unknown.rule = cause;
    unknown.opened_by = idx;
    CloseOwner(std::max(gap_start, m_.owner_lane_.back().start_ns), OwnerEnd::kGap, idx, unknown);
  }
  if (open_gc_) {
    GcSpan& gc = m_.gc_spans_[*open_gc_];
    gc.end_ns = std::max(gap_start, gc.start_ns);
    gc.closed_by = idx;
    open_gc_.reset();
  }
}

void ModelBuilder::Run() {
  OwnerBlock initial;
  initial.start_ns = m_.start_ns_;
  initial.kind = OwnerKind::kUnknown;
  initial.provenance = Provenance::kInferred;
  initial.rule = ModelRule::kBeforeFirstEvent;
  m_.owner_lane_.push_back(initial);

  uint64_t prev_t = m_.start_ns_;
  for (size_t idx = 0; idx < m_.events_.size(); ++idx) {
    const TraceEvent& e = m_.events_[idx];
    const uint64_t t = e.t_ns;
    switch (e.event) {
      case EventName::kTracingStarted:
      case EventName::kTracingStopped:
      case EventName::kSample:  // CPU samples say where a thread was, not a state change; exporters read them
      case EventName::kCount:
        break;
      case EventName::kEventsDropped: {
        m_.markers_.push_back({t, e.event, e.ruby_thread, idx});
        // The lost events fell somewhere after the last event that made it.
        UnknownWindow window{prev_t, t, ModelRule::kEventsDropped, idx, e.count};
        m_.unknown_windows_.push_back(window);
        OnGap(e, idx, prev_t, ModelRule::kEventsDropped);
        last_gap_end_ = t;
        break;
      }
      case EventName::kTracingPaused: {
        m_.markers_.push_back({t, e.event, e.ruby_thread, idx});
        if (open_pause_) break;
        open_pause_ = m_.unknown_windows_.size();
        m_.unknown_windows_.push_back({t, t, ModelRule::kTracingPaused, idx, 0});
        OnGap(e, idx, t, ModelRule::kTracingPaused);
        last_gap_end_ = t;
        break;
      }
      case EventName::kTracingResumed:
        m_.markers_.push_back({t, e.event, e.ruby_thread, idx});
        if (open_pause_) {
          m_.unknown_windows_[*open_pause_].end_ns = t;
          open_pause_.reset();
          last_gap_end_ = t;
        }
        break;
      case EventName::kGcEnter:
        OnGcEnter(e, idx);
        break;
      case EventName::kGcExit:
        OnGcExit(e, idx);
        break;
      default:
        if (e.event == EventName::kSleepEnter || e.event == EventName::kMutexLockEnter) {
          m_.markers_.push_back({t, e.event, e.ruby_thread, idx});
        }
        if (!e.ruby_thread) {
          ++m_.unattributed_events_;
          break;
        }
        OnThreadEvent(e, idx);
        break;
    }
    prev_t = t;
  }
  Finish();
}

void ModelBuilder::Finish() {
  const uint64_t end = m_.end_ns_;
  auto prune = [](auto& blocks) {
    // Zero-length blocks (a thread first seen at the trace start, a gap at the instant of a transition) say nothing
    // a viewer could draw; the lane stays contiguous without them.
    if (blocks.size() <= 1) return;
    auto kept = std::remove_if(blocks.begin(), blocks.end(), [](const auto& b) { return b.end_ns == b.start_ns; });
    if (kept == blocks.begin()) kept = std::next(kept);
    blocks.erase(kept, blocks.end());
  };
  for (RubyThread& thread : m_.threads_) {
    thread.blocks.back().end_ns = end;
    prune(thread.blocks);
  }
  m_.owner_lane_.back().end_ns = end;
  prune(m_.owner_lane_);
  if (open_gc_) m_.gc_spans_[*open_gc_].end_ns = end;
  if (open_pause_) m_.unknown_windows_[*open_pause_].end_ns = end;

  std::sort(m_.threads_.begin(), m_.threads_.end(),
            [](const RubyThread& a, const RubyThread& b) { return a.ruby_thread < b.ruby_thread; });
  for (RubyThread& thread : m_.threads_) ComputeTotals(thread);
  BuildNativeView();
}

void ModelBuilder::ComputeTotals(RubyThread& thread) {
  ThreadTotals& totals = thread.totals;
  std::array<ReasonTotal, kReleaseReasonCount> reasons{};
  for (const StateBlock& b : thread.blocks) {
    const uint64_t ns = b.duration_ns();
    totals.ns_by_state[static_cast<size_t>(b.state)] += ns;
    if (b.state == ThreadState::kWantsGvl) {
      ++totals.waits;
      totals.wait_total_ns += ns;
      totals.wait_longest_ns = std::max(totals.wait_longest_ns, ns);
    } else if (b.state == ThreadState::kReleased) {
      ReasonTotal& r = reasons[static_cast<size_t>(b.reason)];
      r.reason = b.reason;
      r.ns += ns;
      ++r.count;
    } else if (b.state == ThreadState::kRunning && b.opened_by &&
               m_.events_[*b.opened_by].event == EventName::kGvlAcquired) {
      ++totals.acquisitions;
    }
  }
  for (const ReasonTotal& r : reasons) {
    if (r.count > 0) totals.release_reasons.push_back(r);
  }
  std::stable_sort(totals.release_reasons.begin(), totals.release_reasons.end(),
                   [](const ReasonTotal& a, const ReasonTotal& b) {
                     if (a.ns != b.ns) return a.ns > b.ns;
                     return a.count > b.count;
                   });
}

void ModelBuilder::BuildNativeView() {
  std::vector<NativeThread>& natives = m_.native_threads_;
  auto find = [&natives](uint32_t tid) -> NativeThread& {
    for (NativeThread& n : natives) {
      if (n.native_tid == tid) return n;
    }
    natives.push_back(NativeThread{tid, {}, {}});
    return natives.back();
  };
  for (const RubyThread& thread : m_.threads_) {
    for (const StateBlock& b : thread.blocks) {
      if (!HoldsGvl(b.state) || !b.native_tid || b.start_ns == b.end_ns) continue;
      NativeThread& n = find(*b.native_tid);
      if (!n.spans.empty() && n.spans.back().ruby_thread == thread.ruby_thread &&
          n.spans.back().end_ns == b.start_ns) {
        NativeSpan& last = n.spans.back();
        last.end_ns = b.end_ns;
        last.provenance = std::max(last.provenance, b.provenance);  // the weaker knowledge wins
        continue;
      }
      n.spans.push_back({b.start_ns, b.end_ns, thread.ruby_thread, b.provenance});
    }
  }
  for (NativeThread& n : natives) {
    std::stable_sort(n.spans.begin(), n.spans.end(),
                     [](const NativeSpan& a, const NativeSpan& b) { return a.start_ns < b.start_ns; });
    for (const NativeSpan& s : n.spans) AddDistinct(&n.ruby_threads, s.ruby_thread);
  }
  std::sort(natives.begin(), natives.end(),
            [](const NativeThread& a, const NativeThread& b) { return a.native_tid < b.native_tid; });
}

std::optional<std::pair<int, int>> ParseRubyMajorMinor(std::string_view version) {
  int major = 0, minor = 0;
  const char* p = version.data();
  const char* end = version.data() + version.size();
  auto r1 = std::from_chars(p, end, major);
  if (r1.ec != std::errc() || r1.ptr == end || *r1.ptr != '.') return std::nullopt;
  auto r2 = std::from_chars(r1.ptr + 1, end, minor);
  if (r2.ec != std::errc()) return std::nullopt;
  return std::make_pair(major, minor);
}

Result<Model> Model::Build(std::vector<TraceEvent> events, const ModelOptions& options) {
  Model model;
  model.options_ = options;
  if (auto mm = ParseRubyMajorMinor(options.ruby_version)) {
    if (*mm < std::make_pair(3, 2)) {
      return Error(ErrorCode::kBadTrace, "the trace names Ruby " + options.ruby_version +
                                             ", which has no thread scheduler events (CRuby 3.2 or newer)");
    }
    model.ruby_3_2_ = *mm == std::make_pair(3, 2);
  }
  // The reorder window can let a late event through out of order; the model needs time order.
  std::stable_sort(events.begin(), events.end(),
                   [](const TraceEvent& a, const TraceEvent& b) { return a.t_ns < b.t_ns; });
  model.events_ = std::move(events);
  if (!model.events_.empty()) {
    model.start_ns_ = model.events_.front().t_ns;
    model.end_ns_ = model.events_.back().t_ns;
  }
  ModelBuilder builder(&model);
  builder.Run();
  SpanTracker tracker([&model](const Span& s) { model.spans_.push_back(s); });
  for (const TraceEvent& e : model.events_) {
    const uint64_t key = TraceThreadKey(e.ruby_thread);
    if (e.event == EventName::kSample) {
      tracker.OnSample(key, e.stack.value_or(0), false);
    } else {
      tracker.OnEvent(TrackerEventOf(e, key, e.stack.value_or(0)));
    }
  }
  tracker.Finish(model.end_ns_);
  return model;
}

Result<Model> Model::FromTrace(TraceFile trace) {
  ModelOptions options;
  options.ruby_version = trace.header.ruby_version;
  options.main_thread = trace.header.main_thread;
  options.pid = trace.header.pid;
  for (const ThreadLine& line : trace.threads) {
    if (line.main) options.extra_main.push_back(line.ruby_thread);
    if (!line.info.empty()) options.thread_infos[line.ruby_thread] = line.info;
  }
  return Build(std::move(trace.events), options);
}

Result<Model> Model::FromFile(const std::string& path) {
  Result<TraceFile> trace = TraceReader::ReadFile(path);
  if (!trace.ok()) return trace.error();
  return FromTrace(std::move(trace).value());
}

const RubyThread* Model::FindThread(uint32_t ruby_thread) const {
  auto it = std::lower_bound(threads_.begin(), threads_.end(), ruby_thread,
                             [](const RubyThread& t, uint32_t serial) { return t.ruby_thread < serial; });
  return it != threads_.end() && it->ruby_thread == ruby_thread ? &*it : nullptr;
}

std::string Model::ThreadLabel(uint32_t ruby_thread) const {
  const RubyThread* thread = FindThread(ruby_thread);
  const bool main = thread ? thread->main
                           : (options_.main_thread && *options_.main_thread == ruby_thread);
  return ThreadLabelWithName(ruby_thread, main, ThreadName(ruby_thread));
}

const ThreadInfo* Model::FindThreadInfo(uint32_t ruby_thread) const {
  auto it = options_.thread_infos.find(ruby_thread);
  return it == options_.thread_infos.end() ? nullptr : &it->second;
}

std::string Model::ThreadName(uint32_t ruby_thread) const {
  const ThreadInfo* info = FindThreadInfo(ruby_thread);
  if (info == nullptr) return "";
  std::optional<std::string> process_comm;
  for (const RubyThread& t : threads_) {
    if (!t.main) continue;
    if (const ThreadInfo* m = FindThreadInfo(t.ruby_thread)) process_comm = m->native_name;
    break;
  }
  return info->DisplayName(process_comm);
}

std::string_view ThreadStateName(ThreadState state) {
  switch (state) {
    case ThreadState::kNotStarted: return "not_started";
    case ThreadState::kRunning: return "running";
    case ThreadState::kWantsGvl: return "wants_gvl";
    case ThreadState::kReleased: return "released";
    case ThreadState::kGc: return "gc";
    case ThreadState::kExited: return "exited";
    case ThreadState::kUnknown: return "unknown";
    case ThreadState::kCount: break;
  }
  return "?";
}

std::string_view ModelRuleName(ModelRule rule) {
  switch (rule) {
    case ModelRule::kNone: return "";
    case ModelRule::kBeforeFirstEvent: return "before_first_event";
    case ModelRule::kSleepProbe: return "sleep_probe";
    case ModelRule::kMutexProbe: return "mutex_probe";
    case ModelRule::kPreemptedByResume: return "preempted_by_resume";
    case ModelRule::kOwnerReplaced: return "owner_replaced";
    case ModelRule::kImplicitResume: return "implicit_resume";
    case ModelRule::kGcOnOwner: return "gc_on_owner";
    case ModelRule::kOwnerFromAcquire: return "owner_from_acquire";
    case ModelRule::kExitReleases: return "exit_releases";
    case ModelRule::kEventsDropped: return "events_dropped";
    case ModelRule::kTracingPaused: return "tracing_paused";
    case ModelRule::kStackReason: return "stack_reason";
    case ModelRule::kCount: break;
  }
  return "?";
}

std::string_view OwnerEndName(OwnerEnd end) {
  switch (end) {
    case OwnerEnd::kTraceEnd: return "trace_end";
    case OwnerEnd::kReleased: return "released";
    case OwnerEnd::kPreempted: return "preempted";
    case OwnerEnd::kExited: return "exited";
    case OwnerEnd::kAcquired: return "acquired";
    case OwnerEnd::kGap: return "gap";
  }
  return "?";
}

std::string StateBlockLabel(const StateBlock& block) {
  std::string label(ThreadStateName(block.state));
  const bool show_reason = block.state == ThreadState::kReleased ||
                           (block.state == ThreadState::kWantsGvl && block.reason != ReleaseReason::kUnknown);
  if (show_reason) {
    label += ": ";
    label += ReleaseReasonName(block.reason);
  }
  return label;
}

}  // namespace rvbpfd
