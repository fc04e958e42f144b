#include "model/span_tracker.h"

#include <algorithm>

#include "common/heap_estimate.h"

namespace rvbpfd {

TrackerEvent TrackerEventOf(const TraceEvent& e, uint64_t key, uint32_t stack) {
  TrackerEvent out;
  out.t_ns = e.t_ns;
  out.event = e.event;
  out.thread = key;
  out.stack = stack;
  if (e.event == EventName::kGvlReleased) {
    out.reason = ParseReleaseReasonTraceName(e.reason);
    out.reason_carried = !e.reason.empty();
  }
  return out;
}

SpanTracker::Thread& SpanTracker::Touch(uint64_t key) {
  Thread& t = threads_[key];
  t.idle = 0;
  return t;
}

SpanTracker::Thread* SpanTracker::Find(uint64_t key) { return threads_.find(key); }

SpanTracker::Holder& SpanTracker::HolderOf(uint32_t vm) {
  for (Holder& h : holders_) {
    if (h.vm == vm) return h;
  }
  holders_.push_back(Holder{vm, false, 0, 0});
  return holders_.back();
}

bool SpanTracker::waiting(uint64_t thread) const {
  const Thread* t = threads_.find(thread);
  return t != nullptr && t->waiting;
}

ThreadPhase SpanTracker::phase(uint64_t thread) const {
  const Thread* t = threads_.find(thread);
  if (t == nullptr) return ThreadPhase::kUnseen;
  if (t->exited) return ThreadPhase::kExited;
  if (t->holding) {
    return gc_open_ && gc_thread_ == thread && !(timeline_ && gc_thread_left_) ? ThreadPhase::kGc
                                                                               : ThreadPhase::kHolding;
  }
  if (t->waiting) return ThreadPhase::kWaiting;
  if (t->blocked) return ThreadPhase::kBlocked;
  return ThreadPhase::kUnknown;
}

bool SpanTracker::ready_while_holding(uint64_t thread) const {
  const Thread* t = threads_.find(thread);
  return t != nullptr && t->holding && t->ready;
}

ReleaseReason SpanTracker::blocked_reason(uint64_t thread) const {
  const Thread* t = threads_.find(thread);
  return t != nullptr && t->blocked ? t->blocked_reason : ReleaseReason::kUnknown;
}

bool SpanTracker::holder_seen(uint32_t vm) const {
  if (gap_seen_) return true;
  for (const Holder& h : holders_) {
    if (h.vm == vm) return h.seen;
  }
  return false;
}

ThreadPhase SpanTracker::PhaseBeforeFirst(EventName first) {
  switch (first) {
    case EventName::kGvlReleased:
    case EventName::kThreadExited:
    case EventName::kGcEnter:
    case EventName::kSleepEnter:
    case EventName::kMutexLockEnter:
      return ThreadPhase::kHolding;
    case EventName::kGcExit:
      return ThreadPhase::kGc;
    case EventName::kGvlAcquired:
      return ThreadPhase::kWaiting;
    case EventName::kWantsGvl:
      return ThreadPhase::kBlocked;
    default:
      return ThreadPhase::kUnseen;
  }
}

uint64_t SpanTracker::GcExitThread(uint64_t key) const {
  // The GC's own thread while it is alive; else the thread the gc_exit names.
  if (gc_open_ && gc_thread_ != 0) {
    const Thread* t = threads_.find(gc_thread_);
    if (t != nullptr && !t->exited) return gc_thread_;
  }
  return key;
}

uint64_t SpanTracker::oldest_open_wait_ns(uint64_t otherwise) const {
  uint64_t oldest = otherwise;
  for (const auto& [key, t] : threads_) {
    if (t.waiting) oldest = std::min(oldest, t.wait_start_ns);
  }
  return oldest;
}

uint64_t SpanTracker::holder(uint32_t vm) const {
  for (const Holder& h : holders_) {
    if (h.vm == vm) return h.known ? h.thread : 0;
  }
  return 0;
}

bool SpanTracker::holder_known(uint32_t vm) const {
  for (const Holder& h : holders_) {
    if (h.vm == vm) return h.known;
  }
  return false;
}

void SpanTracker::SetHolder(uint32_t vm, uint64_t thread, uint64_t t, SpanEnd end) {
  Holder& h = HolderOf(vm);
  if (h.known && h.thread == thread) return;
  if (h.known) {
    Span s;
    s.kind = SpanKind::kHolder;
    s.end = end;
    s.provenance = Provenance::kDerived;
    s.thread = h.thread;
    s.vm = vm;
    s.start_ns = h.since_ns;
    s.end_ns = std::max(t, h.since_ns);
    Emit(s);
  }
  h.known = true;
  h.thread = thread;
  h.since_ns = t;
}

void SpanTracker::LoseHolders(uint64_t t) {
  for (Holder& h : holders_) {
    if (!h.known) continue;
    Span s;
    s.kind = SpanKind::kHolder;
    s.end = SpanEnd::kGap;
    s.counted = false;
    s.provenance = Provenance::kDerived;
    s.thread = h.thread;
    s.vm = h.vm;
    s.start_ns = h.since_ns;
    s.end_ns = std::max(t, h.since_ns);
    Emit(s);
    h.known = false;
    h.thread = 0;
  }
}

uint32_t SpanTracker::WaitStack(const Thread& t) const {
  // A stack still unknown when the wait began may have been learned from a sample during it.
  return t.wait_stack != 0 ? t.wait_stack : t.last_sample_stack;
}

void SpanTracker::EndWait(uint64_t key, Thread& t, uint64_t end_ns, SpanEnd end, bool counted) {
  Span s;
  s.kind = SpanKind::kGvlWait;
  s.end = end;
  s.counted = counted;
  s.thread = key;
  s.vm = t.vm;
  s.start_ns = t.wait_start_ns;
  s.end_ns = std::max(end_ns, t.wait_start_ns);
  s.stack = WaitStack(t);
  Emit(s);
  t.waiting = false;
  t.wait_stack = 0;
}

void SpanTracker::EndHold(uint64_t key, Thread& t, uint64_t end_ns, SpanEnd end, uint32_t stack,
                          Provenance provenance, bool counted, bool release_stack) {
  Span s;
  s.kind = SpanKind::kGvlHold;
  s.end = end;
  s.counted = counted;
  s.provenance = provenance;
  s.thread = key;
  s.vm = t.vm;
  s.start_ns = t.hold_start_ns;
  s.end_ns = std::max(end_ns, t.hold_start_ns);
  s.stack = stack;
  s.release_stack = release_stack;
  Emit(s);
  t.holding = false;
  t.ready = false;
  // kTimeline: a thread that gives the lock up inside a GC no longer runs it, even once it holds the lock again.
  if (gc_open_ && gc_thread_ == key) gc_thread_left_ = true;
}

void SpanTracker::EndBlocked(uint64_t key, Thread& t, uint64_t end_ns, SpanEnd end, bool counted) {
  Span s;
  s.kind = SpanKind::kBlocked;
  s.end = end;
  s.counted = counted;
  s.thread = key;
  s.vm = t.vm;
  s.start_ns = t.blocked_start_ns;
  s.end_ns = std::max(end_ns, t.blocked_start_ns);
  s.stack = t.release_stack;
  s.reason = t.blocked_reason;
  s.reason_provenance = t.blocked_reason_provenance;
  Emit(s);
  t.blocked = false;
}

void SpanTracker::EndGc(uint64_t end_ns, SpanEnd end, bool counted) {
  Span s;
  s.kind = SpanKind::kGc;
  s.end = end;
  s.counted = counted;
  s.provenance = gc_thread_derived_ ? Provenance::kDerived : Provenance::kObserved;
  s.thread = gc_thread_;
  s.start_ns = gc_start_ns_;
  s.end_ns = std::max(end_ns, gc_start_ns_);
  s.stack = gc_stack_;
  Emit(s);
  gc_open_ = false;
  gc_thread_ = 0;
  gc_thread_derived_ = false;
  gc_stack_ = 0;
}

void SpanTracker::DiscardOpen(uint64_t t) {
  // Whatever was open may have ended, and begun again, in the events that are missing; a new thread may have
  // started at the key of an exited one (kTimeline: an exit is final).
  if (timeline_) {
    gap_seen_ = true;
  } else {
    ForgetExited();
  }
  for (auto& [key, th] : threads_) {
    if (th.exited) continue;
    if (th.waiting) EndWait(key, th, t, SpanEnd::kGap, false);
    if (th.holding) EndHold(key, th, t, SpanEnd::kGap, th.last_sample_stack, Provenance::kObserved, false);
    if (th.blocked) EndBlocked(key, th, t, SpanEnd::kGap, false);
    th.probe_reason = ReleaseReason::kUnknown;
  }
  if (gc_open_) EndGc(t, SpanEnd::kGap, false);
  LoseHolders(t);
}

SpanTracker::Thread& SpanTracker::ThreadOfHolderEvent(uint64_t key, uint32_t vm) {
  auto [t, fresh] = threads_.try_emplace(key);
  t->idle = 0;
  if (fresh) {  // PhaseBeforeFirst: kHolding or kGc for each event served here
    t->vm = vm;
    t->holding = true;
    t->hold_start_ns = 0;
  }
  return *t;
}

void SpanTracker::ResumeImplicitly(uint64_t key, Thread& t, uint64_t ts) {
  if (t.waiting) EndWait(key, t, ts, SpanEnd::kImplicit, false);
  if (t.blocked) EndBlocked(key, t, ts, SpanEnd::kImplicit, true);
  t.holding = true;
  t.hold_start_ns = ts;
  Holder& h = HolderOf(t.vm);
  if (!h.known || h.thread == 0) SetHolder(t.vm, key, ts, SpanEnd::kAcquired);
  h.seen = true;
}

void SpanTracker::Preempt(uint64_t holder, uint64_t ts) {
  Thread* v = Find(holder);
  if (v == nullptr || v->exited || !v->holding) return;
  const bool ready = v->ready;
  EndHold(holder, *v, ts, SpanEnd::kPreempted, v->last_sample_stack, Provenance::kDerived, true);
  if (ready) {
    // It asked for the lock back before giving it up (a 3.2 timeslice): it waits from here.
    v->waiting = true;
    v->wait_start_ns = ts;
    v->wait_stack = 0;
  } else {
    v->blocked = true;
    v->blocked_start_ns = ts;
    v->blocked_reason = ReleaseReason::kUnknown;
    v->blocked_reason_provenance = Provenance::kObserved;
  }
  v->probe_reason = ReleaseReason::kUnknown;
}

void SpanTracker::OnSample(uint64_t thread, uint32_t stack, bool in_gc) {
  if (thread != 0) {
    Thread& t = Touch(thread);
    if (t.exited) return;  // a dead thread's sample (a stale thread pointer) says nothing about any span
    if (stack != 0) t.last_sample_stack = stack;
  }
  // A sample inside the open GC shows where that GC was triggered: better than the thread's older sample.
  if (in_gc && gc_open_ && stack != 0 && (gc_thread_ == 0 || gc_thread_ == thread)) {
    gc_stack_ = stack;
    if (gc_thread_ == 0) gc_thread_ = thread;
  }
}

void SpanTracker::OnEvent(const TrackerEvent& e) {
  const uint64_t ts = e.t_ns;
  const uint64_t key = e.thread;
  switch (e.event) {
    case EventName::kTracingResumed:
      if (timeline_) return;  // the pause was the gap
      [[fallthrough]];
    case EventName::kEventsDropped:
    case EventName::kTracingPaused:
      DiscardOpen(ts);
      return;
    case EventName::kGcEnter: {
      if (gc_open_) return;  // a nested or repeated enter: the first one started this GC
      gc_open_ = true;
      gc_start_ns_ = ts;
      gc_thread_derived_ = key == 0;
      gc_thread_ = key != 0 ? key : holder(e.vm);  // GC runs on the thread holding the GVL
      gc_thread_left_ = false;
      gc_stack_ = 0;
      if (gc_thread_ == 0) return;
      if (timeline_) {
        // GC runs holding the lock: a thread not seen holding it was resumed unseen (or held it before its first
        // event).
        Thread& t = ThreadOfHolderEvent(gc_thread_, e.vm);
        if (!t.exited && !t.holding) ResumeImplicitly(gc_thread_, t, ts);
      }
      if (const Thread* t = Find(gc_thread_)) gc_stack_ = t->last_sample_stack;
      return;
    }
    case EventName::kGcExit:
      if (timeline_) {
        const uint64_t g = GcExitThread(key);
        if (g != 0) ThreadOfHolderEvent(g, e.vm);
      }
      if (gc_open_) EndGc(ts, SpanEnd::kGcExit, true);
      return;
    case EventName::kSleepEnter:
    case EventName::kMutexLockEnter: {
      // No exit probe exists: the reason holds for the thread's next release, until it runs again.
      if (key == 0) return;
      Thread* t = timeline_ ? &ThreadOfHolderEvent(key, e.vm) : Find(key);
      if (t == nullptr || t->exited) return;
      // A probe runs Ruby code, which needs the lock.
      if (timeline_ && !t->holding) ResumeImplicitly(key, *t, ts);
      t->probe_reason = e.event == EventName::kSleepEnter ? ReleaseReason::kSleeping : ReleaseReason::kWaitingMutex;
      return;
    }
    case EventName::kThreadStarted:
    case EventName::kWantsGvl:
    case EventName::kGvlAcquired:
    case EventName::kGvlReleased:
    case EventName::kThreadExited:
      break;
    default:
      return;
  }
  if (key == 0) return;  // a scheduler event about no known thread cannot be attributed

  // One lookup per event. A Thread& is valid until the next insertion or erase; none happens below.
  auto [found, fresh] = threads_.try_emplace(key);
  Thread& t = *found;
  t.idle = 0;
  if (timeline_) {
    if (t.exited) return;  // an exit is final
    if (fresh) {
      t.vm = e.vm;
      // Only a thread holding the lock reports a release or an exit: it held it before its first event.
      const ThreadPhase before = PhaseBeforeFirst(e.event);
      if (before == ThreadPhase::kHolding || before == ThreadPhase::kGc) {
        t.holding = true;
        t.hold_start_ns = 0;  // unknown, as ThreadOfHolderEvent's
      }
    }
  }
  if (t.exited) {
    // 3.2 reports a thread's last release after its EXITED: a dead thread's release opens nothing.
    if (e.event == EventName::kGvlReleased || e.event == EventName::kThreadExited) return;
    // Anything else is a new thread at the key (this is its thread_started, or that was not seen).
    t = Thread{};
    --exited_;
    fresh = true;
  }
  switch (e.event) {
    case EventName::kThreadStarted: {
      if (!fresh && timeline_ && (t.waiting || t.holding || t.blocked)) return;  // a repeat
      if (!fresh) {
        // A key reused after an exit that was not seen: the old thread's open spans have no end.
        if (t.waiting) EndWait(key, t, ts, SpanEnd::kRestarted, false);
        if (t.holding) EndHold(key, t, ts, SpanEnd::kRestarted, t.last_sample_stack, Provenance::kObserved, false);
        if (t.blocked) EndBlocked(key, t, ts, SpanEnd::kRestarted, false);
        t = Thread{};
      }
      t.vm = e.vm;
      // A new thread has not held the GVL yet: it is blocked, starting, until its first wants_gvl.
      t.blocked = true;
      t.blocked_start_ns = ts;
      t.blocked_reason = ReleaseReason::kStarting;
      t.blocked_reason_provenance = Provenance::kObserved;
      if (holder(e.vm) == key) SetHolder(e.vm, 0, ts, SpanEnd::kRestarted);
      return;
    }
    case EventName::kThreadExited: {
      const bool held = t.holding;
      // CRuby 3.3+ fires no SUSPENDED at exit, so a hold still open here ends by the exit.
      if (t.holding) EndHold(key, t, ts, SpanEnd::kExited, t.last_sample_stack, Provenance::kDerived, true);
      if (t.waiting) EndWait(key, t, ts, SpanEnd::kExited, false);
      if (t.blocked) EndBlocked(key, t, ts, SpanEnd::kExited, true);
      // Kept as a marker until the next PruneIdle or gap, or a new thread's event at the key, so that what the
      // thread still reports (3.2: a release after EXITED) opens nothing.
      t = Thread{};
      t.vm = e.vm;
      t.exited = true;
      ++exited_;
      if (holder(e.vm) == key) {
        SetHolder(e.vm, 0, ts, SpanEnd::kExited);
        if (timeline_) HolderOf(e.vm).seen = true;
      } else if (timeline_ && held && !holder_known(e.vm) && !holder_seen(e.vm)) {
        // The first GVL event: the thread held the lock since before it, and nobody holds it now.
        SetHolder(e.vm, 0, ts, SpanEnd::kExited);
        HolderOf(e.vm).seen = true;
      }
      return;
    }
    case EventName::kWantsGvl: {
      t.vm = e.vm;
      if (timeline_ && t.holding) {
        t.ready = true;  // it keeps the lock until another thread takes it
        return;
      }
      if (t.holding) {
        // Wanting the lock while holding it means a release that was not seen (3.2 timeslices): the hold ends here.
        EndHold(key, t, ts, SpanEnd::kWantsGvl, t.last_sample_stack, Provenance::kDerived, true);
        if (holder(e.vm) == key) SetHolder(e.vm, 0, ts, SpanEnd::kWantsGvl);
      }
      if (t.waiting) return;  // a repeated READY does not restart the wait
      if (t.blocked) EndBlocked(key, t, ts, SpanEnd::kWantsGvl, true);
      t.waiting = true;
      t.wait_start_ns = ts;
      // What the thread was doing when it gave the lock up is what it waits to continue: its own stack, else its
      // release's; 0: its latest sample's, decided when the wait ends.
      t.wait_stack = e.stack != 0 ? e.stack : t.release_stack;
      return;
    }
    case EventName::kGvlAcquired: {
      t.vm = e.vm;
      if (timeline_) {
        const uint64_t previous = holder(e.vm);
        if (previous != 0 && previous != key) Preempt(previous, ts);  // t stays valid: nothing is inserted
        HolderOf(e.vm).seen = true;
        t.ready = false;
      }
      if (t.waiting) EndWait(key, t, ts, SpanEnd::kAcquired, true);
      if (t.blocked) EndBlocked(key, t, ts, SpanEnd::kAcquired, true);
      t.release_stack = 0;  // it runs again: its last release no longer says what it waits for
      t.probe_reason = ReleaseReason::kUnknown;
      if (!t.holding) {
        t.holding = true;
        t.hold_start_ns = ts;
      }
      SetHolder(e.vm, key, ts, SpanEnd::kAcquired);
      return;
    }
    case EventName::kGvlReleased: {
      t.vm = e.vm;
      const bool held = t.holding;
      t.release_stack = e.stack;
      // Releasing the lock while waiting for it cannot happen in order: the wait's acquisition was not seen.
      if (t.waiting) EndWait(key, t, ts, SpanEnd::kReleased, false);
      if (t.holding) {
        EndHold(key, t, ts, SpanEnd::kReleased, e.stack != 0 ? e.stack : t.last_sample_stack, Provenance::kObserved,
                true, e.stack != 0);
      }
      if (holder(e.vm) == key) {
        SetHolder(e.vm, 0, ts, SpanEnd::kReleased);
      } else if (timeline_ && !holder_known(e.vm) && (held || holder_seen(e.vm))) {
        // After a gap a release says nobody holds the lock; before the first GVL event, one by a thread that held it
        // since before says so too.
        SetHolder(e.vm, 0, ts, SpanEnd::kReleased);
      }
      if (timeline_) HolderOf(e.vm).seen = true;
      if (!t.blocked) {
        // A repeated release (3.2 reports two for one sleep) continues the block the first one opened.
        t.blocked = true;
        t.blocked_start_ns = ts;
        // The reason the release carried is the one derivation (the recorder's, from the released stack): taken as
        // it is, "unknown" included. A probe entry seen earlier only says the thread entered Kernel#sleep /
        // Mutex#lock at some point (no exit is probed: nio4r locks a mutex, returns, then blocks in select), so it
        // stands in only for a release that carried no reason (no stack was taken).
        const ReleaseReason probe = held || !timeline_ ? t.probe_reason : ReleaseReason::kUnknown;
        t.blocked_reason = e.reason_carried ? e.reason : probe;
        t.blocked_reason_provenance =
            t.blocked_reason != ReleaseReason::kUnknown ? Provenance::kDerived : Provenance::kObserved;
      }
      t.probe_reason = ReleaseReason::kUnknown;
      return;
    }
    default:
      return;
  }
}

void SpanTracker::Cut(uint64_t cut_ns) {
  for (auto& [key, t] : threads_) {
    Span s;
    s.end = SpanEnd::kCut;
    s.thread = key;
    s.vm = t.vm;
    s.end_ns = cut_ns;
    if (t.waiting && cut_ns > t.wait_start_ns) {
      s.kind = SpanKind::kGvlWait;
      s.start_ns = t.wait_start_ns;
      s.stack = WaitStack(t);
      Emit(s);
      t.wait_start_ns = cut_ns;
    }
    if (t.holding && cut_ns > t.hold_start_ns) {
      // The release (and its stack) is still to come: what the thread was last seen running stands in.
      s.kind = SpanKind::kGvlHold;
      s.start_ns = t.hold_start_ns;
      s.stack = t.last_sample_stack;
      Emit(s);
      t.hold_start_ns = cut_ns;
    }
    if (t.blocked && cut_ns > t.blocked_start_ns) {
      s.kind = SpanKind::kBlocked;
      s.start_ns = t.blocked_start_ns;
      s.stack = t.release_stack;
      s.reason = t.blocked_reason;
      s.reason_provenance = t.blocked_reason_provenance;
      Emit(s);
      t.blocked_start_ns = cut_ns;
    }
  }
  if (gc_open_ && cut_ns > gc_start_ns_) {
    Span s;
    s.kind = SpanKind::kGc;
    s.end = SpanEnd::kCut;
    s.provenance = gc_thread_derived_ ? Provenance::kDerived : Provenance::kObserved;
    s.thread = gc_thread_;
    s.start_ns = gc_start_ns_;
    s.end_ns = cut_ns;
    s.stack = gc_stack_;
    Emit(s);
    gc_start_ns_ = cut_ns;
  }
  for (Holder& h : holders_) {
    if (!h.known || cut_ns <= h.since_ns) continue;
    Span s;
    s.kind = SpanKind::kHolder;
    s.end = SpanEnd::kCut;
    s.provenance = Provenance::kDerived;
    s.thread = h.thread;
    s.vm = h.vm;
    s.start_ns = h.since_ns;
    s.end_ns = cut_ns;
    Emit(s);
    h.since_ns = cut_ns;
  }
}

void SpanTracker::ForgetExited() {
  if (exited_ == 0) return;
  threads_.erase_if([](uint64_t, const Thread& t) { return t.exited; });
  exited_ = 0;
}

size_t SpanTracker::PruneIdle(uint32_t max_idle) {
  ForgetExited();
  const size_t dropped = threads_.erase_if([&](uint64_t key, Thread& t) {
    if (!t.waiting && !t.holding && t.idle >= max_idle) {
      // Its open blocked span (a long sleep) is not ended by anything seen: left out.
      if (t.blocked) EndBlocked(key, t, t.blocked_start_ns, SpanEnd::kCut, false);
      return true;
    }
    ++t.idle;
    return false;
  });
  threads_.shrink_if_sparse();
  return dropped;
}

void SpanTracker::RemapStacks(const std::function<uint32_t(uint32_t)>& map) {
  auto remap = [&map](uint32_t& id) {
    if (id != 0) id = map(id);
  };
  for (auto& [key, t] : threads_) {
    remap(t.wait_stack);
    remap(t.release_stack);
    remap(t.last_sample_stack);
  }
  remap(gc_stack_);
}

size_t SpanTracker::approx_memory_bytes() const {
  return threads_.approx_memory_bytes() + HeapChunk(holders_.capacity() * sizeof(Holder));
}

}  // namespace rvbpfd
