#include "model/model.h"

#include <algorithm>
#include <charconv>
#include <unordered_map>
#include <utility>

namespace rvbpfd {
namespace {

bool HoldsGvl(ThreadState state) { return state == ThreadState::kRunning || state == ThreadState::kGc; }

// The state a thread's first event implies it was in before that event (the kBeforeFirstEvent rule).
ThreadState StateBeforeFirst(EventName event) {
  switch (event) {
    case EventName::kThreadStarted: return ThreadState::kNotStarted;
    case EventName::kWantsGvl: return ThreadState::kReleased;    // READY comes from a thread without the GVL
    case EventName::kGvlAcquired: return ThreadState::kWantsGvl;  // RESUMED ends a wait
    case EventName::kGcExit: return ThreadState::kGc;
    default: return ThreadState::kRunning;  // SUSPENDED, EXITED, GC enter and both probes run holding the GVL
  }
}

bool IsOwnThreadEvent(EventName event) {
  // Only these run on the thread's own native thread on every version (STARTED runs on the creator, READY on the
  // waker on 3.3+), so only they decide the native view.
  return event == EventName::kGvlAcquired || event == EventName::kGvlReleased || event == EventName::kThreadExited;
}

void AddDistinct(std::vector<uint32_t>* list, uint32_t value) {
  if (std::find(list->begin(), list->end(), value) == list->end()) list->push_back(value);
}

}  // namespace

// Builds a Model from events in time order. One instance per Build call.
class ModelBuilder {
 public:
  explicit ModelBuilder(Model* model) : m_(*model) {}

  void Run();

 private:
  // Per-thread work state beside the RubyThread being built.
  struct Work {
    size_t index = 0;  // into m_.threads_
    ReleaseReason pending_reason = ReleaseReason::kUnknown;  // set by a probe, consumed by the next release
    ModelRule pending_rule = ModelRule::kNone;
    bool ready_pending = false;  // READY reported while holding the GVL (3.2 timeslice)
    std::optional<uint32_t> run_tid;  // native tid of the current run, from its RESUMED
    bool exited = false;
  };

  RubyThread& Lane(const Work& w) { return m_.threads_[w.index]; }
  StateBlock& Cur(const Work& w) { return Lane(w).blocks.back(); }
  Work& Touch(uint32_t serial, uint64_t t, EventName first_event);
  void Transition(Work& w, uint64_t t, StateBlock next, EventRef closer);
  void CloseOwner(uint64_t t, OwnerEnd end, EventRef closer, OwnerBlock next);
  void TakeOwnerImplicitly(uint32_t serial, uint64_t t, size_t idx);
  void Preempt(uint32_t victim, uint64_t t, size_t idx);
  void ApplyGap(uint64_t gap_start, size_t idx, ModelRule cause);
  void NoteNativeTid(Work& w, const TraceEvent& e);

  void OnWantsGvl(Work& w, uint64_t t, size_t idx);
  void OnAcquired(Work& w, uint32_t serial, const TraceEvent& e, size_t idx);
  void OnReleased(Work& w, uint32_t serial, const TraceEvent& e, size_t idx);
  void OnStarted(Work& w, uint64_t t, size_t idx);
  void OnExited(Work& w, uint32_t serial, const TraceEvent& e, size_t idx);
  void OnGcEnter(const TraceEvent& e, size_t idx);
  void OnGcExit(const TraceEvent& e, size_t idx);
  void OnProbe(Work& w, uint32_t serial, const TraceEvent& e, size_t idx);

  void Finish();
  void BuildNativeView();
  void ComputeTotals(RubyThread& thread);

  Model& m_;
  std::unordered_map<uint32_t, Work> work_;
  bool owner_seen_gvl_event_ = false;  // false while the owner lane is still the block before any GVL event
  std::optional<size_t> open_gc_;      // index into gc_spans_
  std::optional<uint32_t> gc_thread_;  // the thread whose lane shows the open GC
  std::optional<size_t> open_pause_;   // index into unknown_windows_
  std::optional<uint64_t> last_gap_end_;
  std::optional<ModelRule> last_gap_cause_;
};

ModelBuilder::Work& ModelBuilder::Touch(uint32_t serial, uint64_t t, EventName first_event) {
  auto it = work_.find(serial);
  if (it != work_.end()) return it->second;
  Work w;
  w.index = m_.threads_.size();
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
  return work_.emplace(serial, w).first->second;
}

void ModelBuilder::Transition(Work& w, uint64_t t, StateBlock next, EventRef closer) {
  StateBlock& cur = Cur(w);
  cur.end_ns = t;
  cur.closed_by = closer;
  if (closer && HoldsGvl(cur.state) && !cur.native_tid) {
    const TraceEvent& e = m_.events_[*closer];
    if (IsOwnThreadEvent(e.event) && e.ruby_thread && *e.ruby_thread == Lane(w).ruby_thread) {
      cur.native_tid = e.native_tid;
    }
  }
  next.start_ns = t;
  Lane(w).blocks.push_back(next);
}

void ModelBuilder::CloseOwner(uint64_t t, OwnerEnd end, EventRef closer, OwnerBlock next) {
  OwnerBlock& cur = m_.owner_lane_.back();
  cur.end_ns = t;
  cur.end = end;
  cur.closed_by = closer;
  next.start_ns = t;
  m_.owner_lane_.push_back(next);
}

void ModelBuilder::NoteNativeTid(Work& w, const TraceEvent& e) {
  if (IsOwnThreadEvent(e.event) && e.native_tid) AddDistinct(&Lane(w).native_tids, *e.native_tid);
}

// Activity of a thread that has no GVL per the model: it must have been resumed without a RESUMED we saw. The owner
// lane follows only when nobody else owns the GVL, so the lane never shows two owners.
void ModelBuilder::TakeOwnerImplicitly(uint32_t serial, uint64_t t, size_t idx) {
  const OwnerBlock& cur = m_.owner_lane_.back();
  if (cur.kind == OwnerKind::kOwned) return;
  OwnerBlock next;
  next.kind = OwnerKind::kOwned;
  next.owner = serial;
  next.provenance = Provenance::kDerived;
  next.rule = ModelRule::kImplicitResume;
  next.opened_by = idx;
  CloseOwner(t, OwnerEnd::kAcquired, idx, next);
  owner_seen_gvl_event_ = true;
}

// Another thread's RESUMED while `victim` still held the GVL. On 3.2 this is how a timeslice ends: the preempted
// thread reports READY from RUNNING and never SUSPENDED, so its lane turns to waiting at the other's RESUMED.
void ModelBuilder::Preempt(uint32_t victim, uint64_t t, size_t idx) {
  auto it = work_.find(victim);
  if (it == work_.end()) return;
  Work& v = it->second;
  if (v.exited || !HoldsGvl(Cur(v).state)) return;
  StateBlock next;
  next.state = v.ready_pending ? ThreadState::kWantsGvl : ThreadState::kReleased;
  next.reason = m_.ruby_3_2_ ? ReleaseReason::kPreempted : ReleaseReason::kUnknown;
  next.provenance = Provenance::kDerived;
  next.rule = m_.ruby_3_2_ ? ModelRule::kPreemptedByResume : ModelRule::kOwnerReplaced;
  next.opened_by = idx;
  Transition(v, t, next, idx);
  v.ready_pending = false;
  v.run_tid.reset();
  v.pending_reason = ReleaseReason::kUnknown;
  v.pending_rule = ModelRule::kNone;
}

void ModelBuilder::ApplyGap(uint64_t gap_start, size_t idx, ModelRule cause) {
  for (auto& [serial, w] : work_) {
    if (w.exited) continue;  // nothing follows EXITED, lost events or not
    w.pending_reason = ReleaseReason::kUnknown;
    w.pending_rule = ModelRule::kNone;
    w.ready_pending = false;
    w.run_tid.reset();
    if (Cur(w).state == ThreadState::kUnknown) continue;
    StateBlock unknown;
    unknown.state = ThreadState::kUnknown;
    unknown.provenance = Provenance::kDerived;
    unknown.rule = cause;
    unknown.opened_by = idx;
    Transition(w, std::max(gap_start, Cur(w).start_ns), unknown, idx);
  }
  if (m_.owner_lane_.back().kind != OwnerKind::kUnknown || !owner_seen_gvl_event_) {
    OwnerBlock unknown;
    unknown.kind = OwnerKind::kUnknown;
    unknown.provenance = Provenance::kDerived;
    unknown.rule = cause;
    unknown.opened_by = idx;
    CloseOwner(std::max(gap_start, m_.owner_lane_.back().start_ns), OwnerEnd::kGap, idx, unknown);
  }
  owner_seen_gvl_event_ = true;
  if (open_gc_) {
    GcSpan& gc = m_.gc_spans_[*open_gc_];
    gc.end_ns = std::max(gap_start, gc.start_ns);
    gc.closed_by = idx;
    open_gc_.reset();
  }
  gc_thread_.reset();
  last_gap_cause_ = cause;
}

void ModelBuilder::OnWantsGvl(Work& w, uint64_t t, size_t idx) {
  StateBlock& cur = Cur(w);
  if (HoldsGvl(cur.state)) {
    // 3.2 timeslice: READY straight from RUNNING. The thread keeps the GVL until another thread's RESUMED.
    w.ready_pending = true;
    if (!cur.ready_while_running) cur.ready_while_running = idx;
    return;
  }
  if (cur.state == ThreadState::kWantsGvl) {
    ++cur.repeats;
    return;
  }
  StateBlock next;
  next.state = ThreadState::kWantsGvl;
  next.opened_by = idx;
  Transition(w, t, next, idx);
}

void ModelBuilder::OnAcquired(Work& w, uint32_t serial, const TraceEvent& e, size_t idx) {
  const uint64_t t = e.t_ns;
  NoteNativeTid(w, e);
  // Owner lane first, so a preempted thread's lane closes at this RESUMED.
  OwnerBlock& owner = m_.owner_lane_.back();
  if (owner.kind == OwnerKind::kOwned && owner.owner == serial) {
    // Repeated RESUMED: the ownership stands.
  } else {
    OwnerEnd end = OwnerEnd::kAcquired;
    if (owner.kind == OwnerKind::kOwned) {
      Preempt(*owner.owner, t, idx);
      end = OwnerEnd::kPreempted;
    }
    OwnerBlock next;
    next.kind = OwnerKind::kOwned;
    next.owner = serial;
    next.provenance = Provenance::kDerived;
    next.rule = ModelRule::kOwnerFromAcquire;
    next.opened_by = idx;
    CloseOwner(t, end, idx, next);
  }
  owner_seen_gvl_event_ = true;

  w.pending_reason = ReleaseReason::kUnknown;
  w.pending_rule = ModelRule::kNone;
  w.ready_pending = false;
  w.run_tid = e.native_tid;
  StateBlock& cur = Cur(w);
  if (HoldsGvl(cur.state)) {
    ++cur.repeats;
    if (!cur.native_tid) cur.native_tid = e.native_tid;
    return;
  }
  StateBlock next;
  next.state = ThreadState::kRunning;
  next.opened_by = idx;
  next.native_tid = e.native_tid;
  Transition(w, t, next, idx);
}

void ModelBuilder::OnReleased(Work& w, uint32_t serial, const TraceEvent& e, size_t idx) {
  const uint64_t t = e.t_ns;
  NoteNativeTid(w, e);
  StateBlock& cur = Cur(w);
  const bool held = HoldsGvl(cur.state);
  OwnerBlock& owner = m_.owner_lane_.back();
  if (!owner_seen_gvl_event_ && held) {
    // The first GVL event is a release: this thread owned the GVL since the trace began.
    owner.kind = OwnerKind::kOwned;
    owner.owner = serial;
    owner.provenance = Provenance::kInferred;
    owner.rule = ModelRule::kBeforeFirstEvent;
  }
  if ((owner.kind == OwnerKind::kOwned && owner.owner == serial) ||
      (owner.kind == OwnerKind::kUnknown && owner_seen_gvl_event_)) {
    OwnerBlock idle;
    idle.kind = OwnerKind::kIdle;
    idle.provenance = Provenance::kDerived;
    idle.rule = ModelRule::kOwnerFromAcquire;
    idle.opened_by = idx;
    CloseOwner(t, OwnerEnd::kReleased, idx, idle);
  }
  // Otherwise (3.2's second SUSPENDED, or a release by a thread the lane does not show as owner) the owner lane
  // is left alone: a release cannot take the GVL from somebody else.
  owner_seen_gvl_event_ = true;

  if (cur.state == ThreadState::kReleased) {
    ++cur.repeats;  // 3.2: thread_sched_to_waiting and native_sleep both report SUSPENDED for one sleep
  } else {
    StateBlock next;
    next.state = ThreadState::kReleased;
    next.opened_by = idx;
    // A reason derived from the released stack names the blocking call itself, so it wins over a probe entry
    // seen earlier (which only says the thread was somewhere inside Kernel#sleep / Mutex#lock).
    const ReleaseReason from_stack = e.reason.empty() ? ReleaseReason::kUnknown : ParseReleaseReasonTraceName(e.reason);
    if (from_stack != ReleaseReason::kUnknown) {
      next.reason = from_stack;
      next.provenance = Provenance::kDerived;
      next.rule = ModelRule::kStackReason;
    } else if (held && w.pending_reason != ReleaseReason::kUnknown) {
      next.reason = w.pending_reason;
      next.provenance = Provenance::kDerived;
      next.rule = w.pending_rule;
    }
    Transition(w, t, next, idx);
  }
  w.pending_reason = ReleaseReason::kUnknown;
  w.pending_rule = ModelRule::kNone;
  w.ready_pending = false;
  w.run_tid.reset();
}

void ModelBuilder::OnStarted(Work& w, uint64_t t, size_t idx) {
  StateBlock& cur = Cur(w);
  if (cur.state != ThreadState::kNotStarted && cur.state != ThreadState::kUnknown) {
    ++cur.repeats;
    return;
  }
  StateBlock next;
  next.state = ThreadState::kReleased;
  next.reason = ReleaseReason::kStarting;
  next.opened_by = idx;
  Transition(w, t, next, idx);
}

void ModelBuilder::OnExited(Work& w, uint32_t serial, const TraceEvent& e, size_t idx) {
  NoteNativeTid(w, e);
  OwnerBlock& owner = m_.owner_lane_.back();
  if (!owner_seen_gvl_event_ && HoldsGvl(Cur(w).state)) {
    owner.kind = OwnerKind::kOwned;
    owner.owner = serial;
    owner.provenance = Provenance::kInferred;
    owner.rule = ModelRule::kBeforeFirstEvent;
  }
  if (owner.kind == OwnerKind::kOwned && owner.owner == serial) {
    OwnerBlock idle;
    idle.kind = OwnerKind::kIdle;
    idle.provenance = Provenance::kDerived;
    idle.rule = ModelRule::kExitReleases;
    idle.opened_by = idx;
    CloseOwner(e.t_ns, OwnerEnd::kExited, idx, idle);
    owner_seen_gvl_event_ = true;
  }
  StateBlock next;
  next.state = ThreadState::kExited;
  next.opened_by = idx;
  Transition(w, e.t_ns, next, idx);
  w.exited = true;
  if (gc_thread_ == serial) gc_thread_.reset();
}

void ModelBuilder::OnGcEnter(const TraceEvent& e, size_t idx) {
  if (open_gc_) return;  // GC does not nest; a repeated enter changes nothing
  GcSpan span;
  span.start_ns = e.t_ns;
  span.opened_by = idx;
  std::optional<uint32_t> thread = e.ruby_thread;
  bool from_owner = false;
  if (!thread && m_.owner_lane_.back().kind == OwnerKind::kOwned) {
    thread = m_.owner_lane_.back().owner;  // GC runs holding the GVL
    from_owner = true;
  }
  span.ruby_thread = thread;
  span.thread_provenance = from_owner ? Provenance::kDerived : Provenance::kObserved;
  open_gc_ = m_.gc_spans_.size();
  m_.gc_spans_.push_back(span);
  if (!thread) return;

  Work& w = Touch(*thread, e.t_ns, EventName::kGcEnter);
  if (w.exited) {
    ++m_.unattributed_events_;
    return;
  }
  StateBlock& cur = Cur(w);
  if (cur.state == ThreadState::kGc) {
    ++cur.repeats;
  } else {
    StateBlock next;
    next.state = ThreadState::kGc;
    next.opened_by = idx;
    if (cur.state == ThreadState::kRunning) {
      next.native_tid = cur.native_tid;
      if (from_owner) {
        next.provenance = Provenance::kDerived;
        next.rule = ModelRule::kGcOnOwner;
      }
    } else {
      next.provenance = Provenance::kDerived;
      next.rule = ModelRule::kImplicitResume;
      TakeOwnerImplicitly(*thread, e.t_ns, idx);
    }
    Transition(w, e.t_ns, next, idx);
  }
  gc_thread_ = thread;
}

void ModelBuilder::OnGcExit(const TraceEvent& e, size_t idx) {
  if (open_gc_) {
    GcSpan& gc = m_.gc_spans_[*open_gc_];
    gc.end_ns = e.t_ns;
    gc.closed_by = idx;
    gc.complete = true;
    open_gc_.reset();
  }
  std::optional<uint32_t> thread = gc_thread_ ? gc_thread_ : e.ruby_thread;
  gc_thread_.reset();
  if (!thread) return;
  Work& w = Touch(*thread, e.t_ns, EventName::kGcExit);
  if (w.exited) {
    ++m_.unattributed_events_;
    return;
  }
  StateBlock& cur = Cur(w);
  if (cur.state != ThreadState::kGc) return;
  StateBlock next;
  next.state = ThreadState::kRunning;
  next.opened_by = idx;
  next.native_tid = cur.native_tid;
  if (!e.ruby_thread) {
    next.provenance = Provenance::kDerived;
    next.rule = ModelRule::kGcOnOwner;
  }
  Transition(w, e.t_ns, next, idx);
}

void ModelBuilder::OnProbe(Work& w, uint32_t serial, const TraceEvent& e, size_t idx) {
  StateBlock& cur = Cur(w);
  if (!HoldsGvl(cur.state)) {
    // A probe runs Ruby code, which needs the GVL: the thread was resumed without a RESUMED we saw.
    TakeOwnerImplicitly(serial, e.t_ns, idx);
    StateBlock next;
    next.state = ThreadState::kRunning;
    next.provenance = Provenance::kDerived;
    next.rule = ModelRule::kImplicitResume;
    next.opened_by = idx;
    Transition(w, e.t_ns, next, idx);
  }
  // No exit probe exists, so "inside the probe" means: after its entry and before the thread next runs (RESUMED
  // clears it). The next release is labelled, derived.
  if (e.event == EventName::kSleepEnter) {
    w.pending_reason = ReleaseReason::kSleeping;
    w.pending_rule = ModelRule::kSleepProbe;
  } else {
    w.pending_reason = ReleaseReason::kWaitingMutex;
    w.pending_rule = ModelRule::kMutexProbe;
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
        ApplyGap(prev_t, idx, ModelRule::kEventsDropped);
        last_gap_end_ = t;
        break;
      }
      case EventName::kTracingPaused: {
        m_.markers_.push_back({t, e.event, e.ruby_thread, idx});
        if (open_pause_) break;
        open_pause_ = m_.unknown_windows_.size();
        m_.unknown_windows_.push_back({t, t, ModelRule::kTracingPaused, idx, 0});
        ApplyGap(t, idx, ModelRule::kTracingPaused);
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
      default: {
        if (e.event == EventName::kSleepEnter || e.event == EventName::kMutexLockEnter) {
          m_.markers_.push_back({t, e.event, e.ruby_thread, idx});
        }
        if (!e.ruby_thread) {
          ++m_.unattributed_events_;
          break;
        }
        const uint32_t serial = *e.ruby_thread;
        Work& w = Touch(serial, t, e.event);
        if (w.exited) {
          if (e.event == EventName::kGvlReleased || e.event == EventName::kThreadExited) {
            ++Cur(w).repeats;  // 3.2 reports EXITED, then SUSPENDED
          } else {
            ++m_.unattributed_events_;
          }
          break;
        }
        switch (e.event) {
          case EventName::kThreadStarted: OnStarted(w, t, idx); break;
          case EventName::kWantsGvl: OnWantsGvl(w, t, idx); break;
          case EventName::kGvlAcquired: OnAcquired(w, serial, e, idx); break;
          case EventName::kGvlReleased: OnReleased(w, serial, e, idx); break;
          case EventName::kThreadExited: OnExited(w, serial, e, idx); break;
          default: OnProbe(w, serial, e, idx); break;
        }
      }
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
  return main ? "main" : "Thread #" + std::to_string(ruby_thread);
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
