#include "model/attribution.h"

#include <algorithm>
#include <iterator>
#include <set>

#include "common/heap_estimate.h"

namespace rvbpfd {
namespace {

constexpr std::string_view kBlameSourceNames[] = {"sampled",  "release_stack", "last_sample",   "no_stack",
                                                  "gvl_free", "holder_unknown", "contention"};
static_assert(std::size(kBlameSourceNames) == static_cast<size_t>(BlameSource::kCount));
constexpr std::string_view kWallStateNames[] = {"running", "gc", "gvl_wait", "blocked", "unknown"};
static_assert(std::size(kWallStateNames) == static_cast<size_t>(WallState::kCount));

template <typename T>
bool ByStart(const T& a, const T& b) {
  return a.start_ns < b.start_ns;
}

// Splits `ns` over `n` shares so that they sum to ns exactly: share i gets ns / n, the first ns % n one more.
uint64_t Share(uint64_t ns, size_t n, size_t i) { return ns / n + (i < ns % n ? 1 : 0); }

}  // namespace

std::string_view BlameSourceName(BlameSource source) {
  const auto i = static_cast<size_t>(source);
  return i < std::size(kBlameSourceNames) ? kBlameSourceNames[i] : "unknown";
}

std::string_view WallStateName(WallState state) {
  const auto i = static_cast<size_t>(state);
  return i < std::size(kWallStateNames) ? kWallStateNames[i] : "unknown";
}

void Attribution::OnSpan(const Span& s) {
  std::vector<Span>* into = nullptr;
  switch (s.kind) {
    case SpanKind::kGvlWait:
      if (s.counted) into = &waits_;  // all for the wall clock; BlameWaits picks the blamed ones
      break;
    case SpanKind::kHolder:
      holders_[s.vm].push_back(Holder{s.start_ns, s.end_ns, s.thread});
      ++kept_;
      return;
    case SpanKind::kGvlHold:
      if (!s.counted) return;
      holds_[s.thread].push_back(Hold{s.start_ns, s.end_ns, s.stack, s.release_stack, s.end == SpanEnd::kReleased});
      ++kept_;
      return;
    case SpanKind::kBlocked:
      if (s.counted && options_.wall) into = &blocked_;
      break;
    case SpanKind::kGc:
      if (s.counted && s.thread != 0) into = &gcs_[s.thread];
      break;
  }
  if (into == nullptr) return;
  into->push_back(s);
  ++kept_;
}

void Attribution::OnThreadEvent(uint64_t t_ns, uint64_t thread, EventName event) {
  const bool exited = event == EventName::kThreadExited;
  if (options_.estimate_paused) NoteForEstimate(t_ns, thread, event);
  if (thread == 0 || !options_.wall) return;
  auto [it, fresh] = lives_.try_emplace(thread);
  Life& l = it->second;
  if (fresh) l.first_ns = t_ns;
  if (exited) {
    l.exited = true;
    l.exit_ns = t_ns;
  }
}

void Attribution::NoteForEstimate(uint64_t t_ns, uint64_t thread, EventName event) {
  // A sample says the thread ran, not which scheduler state it left or entered; a pause or a drop is about no thread.
  if (thread == 0 || event == EventName::kSample) return;
  const bool exited = event == EventName::kThreadExited;
  auto [seen, fresh] = seen_.try_emplace(thread);
  Seen& l = *seen;
  // A drain estimated it over the pauses while it had no event (a thread without any): its own stretches start now.
  if (fresh) carried_stacks_.erase(thread);
  if (l.unobserved && (!paused_ || exited)) {
    // Its first scheduler event since the resume (or its exit): its state is observed again from here.
    unobserved_[thread].push_back(Interval{l.unobserved_from, std::max(t_ns, l.unobserved_from),
                                           l.unobserved_from_wait, true, l.unobserved_at_reading});
    l.unobserved = false;
  } else if (!l.unobserved && paused_ && !exited) {
    // Met inside a pause (a thread started there): unobserved from this event on.
    l.unobserved = true;
    l.unobserved_from = t_ns;
    l.unobserved_from_wait = event == EventName::kWantsGvl;
    l.unobserved_at_reading = false;
  }
  l.last_event_ns = t_ns;
  // A repeated READY does not restart a wait (SpanTracker); its acquisition, a release or a restart ends it.
  l.wants = event == EventName::kWantsGvl || (l.wants && event != EventName::kGvlAcquired &&
                                              event != EventName::kGvlReleased && event != EventName::kThreadStarted);
  if (exited) {
    l.exited = true;
    l.exit_ns = t_ns;
  }
}

void Attribution::OnPause(uint64_t t_ns) {
  if (!options_.estimate_paused || paused_) return;
  paused_ = true;
  pauses_.push_back(Interval{t_ns, t_ns, false, false});
  for (auto& [thread, l] : seen_) {
    if (l.exited || l.unobserved) continue;
    // A wait it began before the pause is not counted once the pause cuts it (SpanTracker): unobserved from its
    // wants_gvl. Any other state it was seen in lasted until the pause (nothing else was seen of it).
    l.unobserved = true;
    l.unobserved_from = l.wants ? std::min(l.last_event_ns, t_ns) : t_ns;
    l.unobserved_from_wait = l.wants;
    l.unobserved_at_reading = false;
  }
}

void Attribution::OnResume(uint64_t t_ns) {
  if (!paused_) return;
  paused_ = false;
  pauses_.back().to = std::max(t_ns, pauses_.back().from);
}

void Attribution::OnGvlReading(GvlSample reading) {
  if (!options_.estimate_paused) return;
  readings_.push_back(std::move(reading));
  reading_counted_.push_back(false);
  ++kept_;
}

const Attribution::Sample* Attribution::LatestSample(uint64_t thread, uint64_t t) const {
  const std::vector<Sample>* found = samples_.find(thread);
  if (found == nullptr || found->empty()) return nullptr;
  const std::vector<Sample>& v = *found;
  auto hi = std::upper_bound(v.begin(), v.end(), t, [](uint64_t x, const Sample& s) { return x < s.t_ns; });
  if (hi == v.begin()) return nullptr;
  return &*(hi - 1);
}

void Attribution::OnSample(uint64_t t_ns, uint64_t thread, uint32_t stack, bool in_gc) {
  if (thread == 0) return;
  samples_[thread].push_back(Sample{t_ns, stack, in_gc});
  ++kept_;
}

void Attribution::OnContention(uint64_t t_ns, uint64_t holder, uint32_t stack) {
  if (holder == 0 || stack == 0) return;
  std::vector<Sample>& v = contentions_[holder];
  // Events of several waiters may reach here a little out of order (a READY on another CPU): kept sorted.
  auto at = std::upper_bound(v.begin(), v.end(), t_ns, [](uint64_t t, const Sample& s) { return t < s.t_ns; });
  v.insert(at, Sample{t_ns, stack, false});
  ++kept_;
}

std::pair<const Attribution::Sample*, const Attribution::Sample*> Attribution::TimesIn(
    const FlatMap64<std::vector<Sample>>& by_thread, uint64_t thread, uint64_t from, uint64_t to) {
  const std::vector<Sample>* found = by_thread.find(thread);
  if (found == nullptr || found->empty()) return {nullptr, nullptr};
  const std::vector<Sample>& v = *found;
  auto lo = std::lower_bound(v.begin(), v.end(), from, [](const Sample& s, uint64_t t) { return s.t_ns < t; });
  auto hi = std::lower_bound(lo, v.end(), to, [](const Sample& s, uint64_t t) { return s.t_ns < t; });
  return {v.data() + (lo - v.begin()), v.data() + (hi - v.begin())};
}

std::pair<const Attribution::Sample*, const Attribution::Sample*> Attribution::SamplesIn(uint64_t thread,
                                                                                      uint64_t from,
                                                                                      uint64_t to) const {
  return TimesIn(samples_, thread, from, to);
}

std::pair<const Attribution::Sample*, const Attribution::Sample*> Attribution::ContentionsIn(uint64_t thread,
                                                                                          uint64_t from,
                                                                                          uint64_t to) const {
  return TimesIn(contentions_, thread, from, to);
}

std::span<const Span> Attribution::GcsIn(uint64_t thread, uint64_t from, uint64_t to) const {
  const std::vector<Span>* found = gcs_.find(thread);
  if (found == nullptr) return {};
  const std::vector<Span>& v = *found;  // one GC at a time: sorted by start and by end
  auto lo = std::upper_bound(v.begin(), v.end(), from, [](uint64_t t, const Span& g) { return t < g.end_ns; });
  auto hi = std::lower_bound(lo, v.end(), to, [](const Span& g, uint64_t t) { return g.start_ns < t; });
  return {v.data() + (lo - v.begin()), static_cast<size_t>(hi - lo)};
}

uint64_t Attribution::GcOverlap(uint64_t thread, uint64_t from, uint64_t to) const {
  uint64_t ns = 0;
  for (const Span& g : GcsIn(thread, from, to)) ns += std::min(g.end_ns, to) - std::max(g.start_ns, from);
  return ns;
}

// Where one wait's blame goes: the result's blame_ns and, with per_wait, the wait's current segment.
class Attribution::PartSink {
 public:
  PartSink(AttributionResult& r, bool per_wait, uint64_t waiter) : r_(r), per_wait_(per_wait), waiter_(waiter) {}

  void Segment(uint64_t holder, uint64_t from, uint64_t to, const Hold* hold) {
    holder_ = holder;
    if (!per_wait_) return;
    BlameSegment seg{.holder = holder, .from_ns = from, .to_ns = to};
    if (hold != nullptr && hold->released) {
      seg.release_stack = hold->release_stack ? hold->stack : 0;
      seg.release_ns = hold->end_ns;
    }
    seg.first_part = static_cast<uint32_t>(r_.wait_parts.size());
    r_.wait_segments.push_back(seg);
  }
  void Add(uint32_t stack, bool gc, BlameSource source, uint64_t ns, uint32_t samples) {
    r_.blame_ns[BlameKey{.waiter = waiter_, .holder = holder_, .stack = stack, .gc = gc, .source = source}] += ns;
    if (!per_wait_) return;
    BlameSegment& seg = r_.wait_segments.back();
    for (size_t i = seg.first_part; i < r_.wait_parts.size(); ++i) {
      BlamePart& p = r_.wait_parts[i];
      if (p.stack == stack && p.gc == gc && p.source == source) {
        p.ns += ns;
        p.samples += samples;
        return;
      }
    }
    r_.wait_parts.push_back(BlamePart{.stack = stack, .gc = gc, .source = source, .ns = ns, .samples = samples});
    ++seg.parts;
  }

 private:
  AttributionResult& r_;
  bool per_wait_;
  uint64_t waiter_;
  uint64_t holder_ = 0;
};

const Attribution::Hold* Attribution::HoldAt(uint64_t thread, uint64_t t) const {
  const std::vector<Hold>* found = holds_.find(thread);
  if (found == nullptr) return nullptr;
  const std::vector<Hold>& v = *found;  // one thread's holds do not overlap: sorted by start and by end
  auto after = std::upper_bound(v.begin(), v.end(), t, [](uint64_t x, const Hold& h) { return x < h.start_ns; });
  if (after == v.begin()) return nullptr;
  const Hold& h = *(after - 1);
  return h.end_ns > t ? &h : nullptr;
}

uint64_t Attribution::AttributeGcs(PartSink& out, uint64_t holder, uint64_t from, uint64_t to) const {
  // GC the holder ran inside the overlap: attributed to the GC's stack.
  uint64_t gc_ns = 0;
  for (const Span& g : GcsIn(holder, from, to)) {
    const uint64_t ns = std::min(g.end_ns, to) - std::max(g.start_ns, from);
    out.Add(g.stack, true, g.stack != 0 ? BlameSource::kLastSample : BlameSource::kNoStack, ns, 0);
    gc_ns += ns;
  }
  return gc_ns;
}

void Attribution::AttributeHolder(PartSink& out, uint64_t holder, uint64_t from, uint64_t to) const {
  auto [c, ce] = ContentionsIn(holder, from, to);
  if (c == ce) {
    AttributeSampled(out, holder, from, to);
    return;
  }
  // Before the first contention observation (a wait queued before the holder took the lock, observed by a later
  // READY): the holder's samples there, else that observation, the nearest thing seen of what it ran (its release
  // lies further away, after it).
  if (c->t_ns > from) {
    auto [sb, se] = SamplesIn(holder, from, c->t_ns);
    if (sb != se) {
      AttributeSampled(out, holder, from, c->t_ns);
    } else {
      AttributeObserved(out, holder, from, c->t_ns, c->stack);
    }
  }
  for (; c != ce; ++c) {
    // This observation stands for the time up to the holder's next sample; from that sample on, the samples until
    // the next observation (or the end) share it.
    const uint64_t end = c + 1 != ce ? (c + 1)->t_ns : to;
    auto [sb, se] = SamplesIn(holder, c->t_ns, end);
    const uint64_t observed_to = sb != se ? sb->t_ns : end;
    if (observed_to > c->t_ns) AttributeObserved(out, holder, c->t_ns, observed_to, c->stack);
    if (observed_to < end) AttributeSampled(out, holder, observed_to, end);
  }
}

void Attribution::AttributeObserved(PartSink& out, uint64_t holder, uint64_t from, uint64_t to,
                                    uint32_t stack) const {
  const uint64_t gc_ns = AttributeGcs(out, holder, from, to);
  const uint64_t rest = to - from - std::min(gc_ns, to - from);
  if (rest > 0) out.Add(stack, false, BlameSource::kContention, rest, 0);
}

void Attribution::AttributeSampled(PartSink& out, uint64_t holder, uint64_t from, uint64_t to) const {
  const uint64_t gc_ns = AttributeGcs(out, holder, from, to);
  const uint64_t rest = to - from - std::min(gc_ns, to - from);
  if (rest == 0) return;
  std::vector<uint32_t> stacks;
  auto [b, e] = SamplesIn(holder, from, to);
  for (const Sample* s = b; s != e; ++s) {
    if (!s->in_gc && (gc_ns == 0 || GcOverlap(holder, s->t_ns, s->t_ns + 1) == 0)) stacks.push_back(s->stack);
  }
  if (!stacks.empty()) {
    for (size_t i = 0; i < stacks.size(); ++i) {
      out.Add(stacks[i], false, BlameSource::kSampled, Share(rest, stacks.size(), i), 1);
    }
    return;
  }
  // No sample: the hold of `holder` that covers `from`.
  const Hold* h = HoldAt(holder, from);
  if (h != nullptr && h->stack != 0) {
    out.Add(h->stack, false, h->release_stack ? BlameSource::kReleaseStack : BlameSource::kLastSample, rest, 0);
  } else {
    out.Add(0, false, BlameSource::kNoStack, rest, 0);
  }
}

void Attribution::AttributeRunning(AttributionResult& r, uint64_t thread, const Hold& hold) const {
  uint64_t gc_ns = 0;
  for (const Span& g : GcsIn(thread, hold.start_ns, hold.end_ns)) {
    const uint64_t ns = std::min(g.end_ns, hold.end_ns) - std::max(g.start_ns, hold.start_ns);
    r.wall_ns[WallKey{.thread = thread, .state = WallState::kGc, .stack = g.stack}] += ns;
    gc_ns += ns;
  }
  const uint64_t dur = hold.duration_ns();
  const uint64_t running = dur - std::min(gc_ns, dur);
  if (running == 0) return;
  std::vector<uint32_t> stacks;
  auto [b, e] = SamplesIn(thread, hold.start_ns, hold.end_ns);
  for (const Sample* s = b; s != e; ++s) {
    if (!s->in_gc && (gc_ns == 0 || GcOverlap(thread, s->t_ns, s->t_ns + 1) == 0)) stacks.push_back(s->stack);
  }
  WallKey key{.thread = thread, .state = WallState::kRunning, .stack = hold.stack};
  if (stacks.empty()) {
    r.wall_ns[key] += running;
    return;
  }
  for (size_t i = 0; i < stacks.size(); ++i) {
    key.stack = stacks[i];
    r.wall_ns[key] += Share(running, stacks.size(), i);
  }
}

void Attribution::BlameWait(AttributionResult& r, const Span& w, std::span<const Holder> holders) const {
  r.total_gvl_wait_ns += w.duration_ns();
  ++r.waits;
  if (options_.per_wait) {
    r.wait_blame.push_back(WaitBlame{.waiter = w.thread, .vm = w.vm, .start_ns = w.start_ns, .end_ns = w.end_ns,
                                     .first_segment = static_cast<uint32_t>(r.wait_segments.size())});
  }
  PartSink out(r, options_.per_wait, w.thread);
  // A cursor keeps a ns from being blamed twice.
  uint64_t cursor = w.start_ns;
  auto segment = [&](uint64_t holder, uint64_t to, const Hold* hold) {
    out.Segment(holder, cursor, to, hold);
    if (options_.per_wait) ++r.wait_blame.back().segments;
  };
  auto unknown_until = [&](uint64_t t) {
    if (t <= cursor) return;
    segment(0, t, nullptr);
    out.Add(0, false, BlameSource::kHolderUnknown, t - cursor, 0);
    cursor = t;
  };
  // The VM's holder spans ending after the wait began (they do not overlap): the first is the one with the latest
  // start <= w.start_ns.
  auto it = std::upper_bound(holders.begin(), holders.end(), w.start_ns,
                             [](uint64_t t, const Holder& h) { return t < h.start_ns; });
  if (it != holders.begin()) --it;
  for (; it != holders.end() && it->start_ns < w.end_ns && cursor < w.end_ns; ++it) {
    const Holder& h = *it;
    if (h.end_ns <= cursor) continue;
    const uint64_t from = std::max(h.start_ns, cursor);
    const uint64_t to = std::min(h.end_ns, w.end_ns);
    if (to <= from) continue;
    unknown_until(from);
    if (h.thread == 0) {
      segment(0, to, nullptr);
      out.Add(0, false, BlameSource::kGvlFree, to - from, 0);
    } else if (h.thread == w.thread) {
      // The waiter itself is named holder (its own release was lost): who made it wait is not known.
      segment(0, to, nullptr);
      out.Add(0, false, BlameSource::kHolderUnknown, to - from, 0);
    } else {
      segment(h.thread, to, HoldAt(h.thread, to - 1));
      AttributeHolder(out, h.thread, from, to);
    }
    cursor = to;
  }
  unknown_until(w.end_ns);
}

void Attribution::BlameWaits(AttributionResult& r) const {
  // A VM's holder spans close in time order, so a sorted copy is only made for a foreign order. Each VM's list is
  // looked at once per call, not once per wait (that was quadratic in the agent's intervals).
  std::map<uint32_t, std::vector<Holder>> sorted;
  std::map<uint32_t, std::span<const Holder>> by_vm;
  auto holders_of = [&](uint32_t vm) -> std::span<const Holder> {
    auto [known, fresh] = by_vm.try_emplace(vm);
    if (!fresh) return known->second;
    auto it = holders_.find(vm);
    if (it == holders_.end()) return known->second;
    if (std::is_sorted(it->second.begin(), it->second.end(), ByStart<Holder>)) return known->second = it->second;
    std::vector<Holder>& copy = sorted[vm];
    copy = it->second;
    std::stable_sort(copy.begin(), copy.end(), ByStart<Holder>);
    return known->second = copy;
  };
  for (const Span& w : waits_) {
    const bool blamed = w.end == SpanEnd::kAcquired || (options_.blame_cut_waits && w.end == SpanEnd::kCut);
    if (blamed && w.end_ns > w.start_ns) BlameWait(r, w, holders_of(w.vm));
  }
}

void Attribution::AttributeWall(AttributionResult& r, uint64_t end_ns) const {
  // Every counted span of each thread, then what none covers.
  std::map<uint64_t, uint64_t> covered;
  for (const auto& [thread, holds] : holds_) {
    for (const Hold& h : holds) {
      AttributeRunning(r, thread, h);
      covered[thread] += h.duration_ns();
    }
  }
  for (const Span& w : waits_) {
    r.wall_ns[WallKey{.thread = w.thread, .state = WallState::kGvlWait, .stack = w.stack}] += w.duration_ns();
    covered[w.thread] += w.duration_ns();
  }
  for (const Span& b : blocked_) {
    r.wall_ns[WallKey{.thread = b.thread, .state = WallState::kBlocked, .reason = b.reason, .stack = b.stack}] +=
        b.duration_ns();
    covered[b.thread] += b.duration_ns();
  }
  for (const auto& [thread, life] : lives_) {
    const uint64_t until = life.exited ? life.exit_ns : std::max(end_ns, life.first_ns);
    const uint64_t lifetime = until - std::min(life.first_ns, until);
    r.lifetime_ns[thread] = lifetime;
    const uint64_t c = covered[thread];
    if (lifetime > c) r.wall_ns[WallKey{.thread = thread, .state = WallState::kUnknown}] += lifetime - c;
  }
}

BlameKey Attribution::EstimateKey(const GvlSample& g) const {
  BlameKey key{.provenance = Provenance::kInferred};
  if (!g.held) {
    key.source = BlameSource::kGvlFree;
  } else if (g.holder == 0) {
    key.source = BlameSource::kHolderUnknown;
  } else {
    key.holder = g.holder;
    if (g.sampled == g.holder) {
      key.stack = g.stack;
      key.gc = g.in_gc;
      key.source = g.stack != 0 ? BlameSource::kSampled : BlameSource::kNoStack;
    } else if (const Sample* s = LatestSample(g.holder, g.t_ns); s != nullptr && s->stack != 0) {
      key.stack = s->stack;
      key.source = BlameSource::kLastSample;
    }
  }
  return key;
}

uint32_t Attribution::Lists(uint64_t waiter, const GvlSample& g) {
  // A reading that lists its own holder as queued is torn: no wait of the holder's to estimate.
  return waiter != g.holder && std::find(g.queued.begin(), g.queued.end(), waiter) != g.queued.end() ? 1 : 0;
}

uint32_t Attribution::Unnamed(const GvlSample& g) {
  return g.waiting > g.queued.size() ? static_cast<uint32_t>(g.waiting - g.queued.size()) : 0;
}

std::set<uint64_t> Attribution::ListedWaiters(size_t readings_end) const {
  std::set<uint64_t> waiters;
  for (size_t i = 0; i < readings_end; ++i) waiters.insert(readings_[i].queued.begin(), readings_[i].queued.end());
  waiters.erase(0);
  return waiters;
}

const std::vector<Attribution::Interval>& Attribution::StretchesOf(
    uint64_t waiter, const std::unordered_map<uint64_t, std::vector<Interval>>& closed,
    const std::vector<Interval>& pauses) const {
  static const std::vector<Interval> kNone;
  if (auto it = closed.find(waiter); it != closed.end()) return it->second;
  // One with no scheduler event at all is unobserved exactly during the pauses.
  return seen_.contains(waiter) ? kNone : pauses;
}

std::optional<uint64_t> Attribution::EstimateStretch(AttributionResult& r, uint64_t waiter, const Interval& st,
                                                     size_t readings_end, bool open,
                                                     const std::function<uint32_t(const GvlSample&)>& count,
                                                     std::vector<bool>& used, WaiterStack& ws) const {
  const auto begin = readings_.begin(), end = readings_.begin() + static_cast<ptrdiff_t>(readings_end);
  auto by_time = [](const GvlSample& g, uint64_t t) { return g.t_ns < t; };
  // A stretch that goes on from a drain's last reading starts at that reading (the last one at its time).
  auto lo = std::lower_bound(begin, end, st.from, by_time);
  if (st.at_reading) {
    auto after = std::upper_bound(begin, end, st.from, [](uint64_t t, const GvlSample& g) { return t < g.t_ns; });
    if (after != begin && (after - 1)->t_ns == st.from) lo = after - 1;
  }
  auto hi = open ? end : std::lower_bound(lo, end, st.to, by_time);
  if (lo >= hi) return std::nullopt;  // no reading while it was unobserved: nothing is known
  const uint64_t cap = kMaxReadingPeriods * std::max<uint64_t>(options_.sample_period_ns, 1);
  auto add = [&](const GvlSample& by, uint64_t ns, uint32_t n) {
    if (ns == 0 || n == 0) return;
    if (!ws.known) {
      // The first reading that lists it: what it waited with is its latest sample by then.
      const Sample* own = waiter != 0 ? LatestSample(waiter, by.t_ns) : nullptr;
      ws = WaiterStack{true, own != nullptr ? own->stack : 0};
    }
    BlameKey key = EstimateKey(by);
    key.waiter = waiter;
    const uint64_t total = ns * n;
    r.blame_ns[key] += total;
    r.estimated_wait_ns[WaitKey{waiter, ws.stack}] += total;
    r.estimated_gvl_wait_ns += total;
  };
  auto half = [&](uint64_t gap) { return std::min(gap / 2, cap); };
  // Before the first reading: an exact wait start counts whole; else it joined the queue somewhere in between.
  if (!st.at_reading) add(*lo, st.exact_from ? lo->t_ns - st.from : half(lo->t_ns - st.from), count(*lo));
  for (auto it = lo; it != hi; ++it) {
    const uint32_t now = count(*it);
    if (now > 0) used[static_cast<size_t>(it - begin)] = true;
    auto next = it + 1;
    if (next == hi) {
      if (open) return it->t_ns;  // the gap after it belongs to the next drain
      // After the last reading: up to the thread's own next event it waited whole (that event ends the wait).
      add(*it, st.exact_to ? st.to - it->t_ns : half(st.to - it->t_ns), now);
      break;
    }
    const uint32_t then = count(*next);
    const uint64_t gap = next->t_ns - it->t_ns;
    const uint32_t both = std::min(now, then);
    add(*it, gap / 2, both);  // queued at both: the whole gap, each half blamed on its reading's holder
    add(*next, gap - gap / 2, both);
    add(*it, half(gap), now - both);     // left the queue in between
    add(*next, half(gap), then - both);  // joined it in between
  }
  return std::nullopt;
}

void Attribution::Estimate(AttributionResult& r, uint64_t end_ns) const {
  if (pauses_.empty()) return;  // every wait was observable: nothing to estimate
  std::vector<Interval> pauses = pauses_;
  if (paused_) pauses.back().to = std::max(end_ns, pauses.back().from);  // still paused at the end of the trace
  for (const Interval& p : pauses) r.paused_ns += p.to - p.from;
  // Each thread's unobserved stretches, the open one ending at its exit or the end of the trace.
  std::unordered_map<uint64_t, std::vector<Interval>> unobserved = unobserved_;
  for (const auto& [thread, l] : seen_) {
    if (!l.unobserved) continue;
    const uint64_t until = l.exited ? l.exit_ns : std::max(end_ns, l.unobserved_from);
    unobserved[thread].push_back(Interval{l.unobserved_from, until, l.unobserved_from_wait, l.exited});
  }
  const size_t n = readings_.size();
  std::vector<bool> used(n, false);
  for (uint64_t w : ListedWaiters(n)) {
    for (const Interval& st : StretchesOf(w, unobserved, pauses)) {
      WaiterStack ws;
      EstimateStretch(r, w, st, n, false, [w](const GvlSample& g) { return Lists(w, g); }, used, ws);
    }
  }
  for (const Interval& p : pauses) {
    WaiterStack ws{true, 0};
    EstimateStretch(r, 0, p, n, false, Unnamed, used, ws);
  }
  r.estimate_readings = static_cast<uint64_t>(std::count(used.begin(), used.end(), true));
}

void Attribution::DrainEstimate(uint64_t now_ns, AttributionResult* into) {
  if (!options_.estimate_paused) return;
  AttributionResult& r = *into;
  // The open stretches are estimated from the readings before now; the closed ones from all of theirs (their ends
  // are events already fed, so every reading before them is here).
  const size_t all = readings_.size();
  const size_t n = static_cast<size_t>(
      std::lower_bound(readings_.begin(), readings_.end(), now_ns,
                       [](const GvlSample& g, uint64_t t) { return g.t_ns < t; }) -
      readings_.begin());
  std::vector<bool> used(all, false);
  // The paused windows: the closed ones whole, the open one up to now.
  std::vector<Interval> pauses = pauses_;
  if (paused_) pauses.back().to = std::max(now_ns, pauses.back().from);
  for (const Interval& p : pauses) {
    const uint64_t from = std::max(p.from, paused_counted_to_), to = std::max(p.to, from);
    r.paused_ns += to - from;
  }
  paused_counted_to_ = std::max(paused_counted_to_, now_ns);

  // The stacks of the stretches the last drain left open; those still open after this one are carried again.
  std::unordered_map<uint64_t, WaiterStack> carried;
  carried.swap(carried_stacks_);
  auto estimate = [&](uint64_t w, const Interval& st, bool open) {
    WaiterStack ws{w == 0, 0};
    if (w != 0 && st.at_reading) {
      if (auto it = carried.find(w); it != carried.end()) ws = it->second;
    }
    auto count = [w](const GvlSample& g) { return w == 0 ? Unnamed(g) : Lists(w, g); };
    const std::optional<uint64_t> at = EstimateStretch(r, w, st, open ? n : all, open, count, used, ws);
    // A stack not known yet stays unknown: nothing listed the waiter so far.
    if (w != 0 && open && at) carried_stacks_[w] = ws;
  };
  const std::set<uint64_t> listed = ListedWaiters(all);
  // A waiter no reading lists now whose stretch goes on from the last drain's cut keeps its stack.
  for (const auto& [w, ws] : carried) {
    if (listed.contains(w)) continue;
    const Seen* l = seen_.find(w);
    const bool goes_on = l != nullptr ? l->unobserved && l->unobserved_at_reading && !unobserved_.contains(w)
                                      : paused_ && pauses_.size() == 1 && pauses_.back().at_reading;
    if (goes_on) carried_stacks_[w] = ws;
  }
  const std::vector<Interval> no_pauses;
  for (uint64_t w : listed) {
    // Its closed stretches whole, then an open one up to now.
    for (const Interval& st : StretchesOf(w, unobserved_, paused_ ? no_pauses : pauses)) estimate(w, st, false);
    if (const Seen* found = seen_.find(w); found != nullptr && found->unobserved) {
      const Seen& l = *found;
      estimate(w, Interval{l.unobserved_from, now_ns, l.unobserved_from_wait, false, l.unobserved_at_reading}, true);
    } else if (!seen_.contains(w)) {
      if (paused_) {
        for (size_t i = 0; i + 1 < pauses.size(); ++i) estimate(w, pauses[i], false);
        estimate(w, pauses.back(), true);
      }
    }
  }
  for (size_t i = 0; i < pauses.size(); ++i) estimate(0, pauses[i], paused_ && i + 1 == pauses.size());
  for (size_t i = 0; i < all; ++i) {
    if (used[i] && !reading_counted_[i]) ++r.estimate_readings;
    if (used[i]) reading_counted_[i] = true;
  }

  // Every open stretch goes on from the last reading before now (a stretch with nothing read yet from where it is).
  std::optional<uint64_t> cut;
  if (n > 0) cut = readings_[n - 1].t_ns;
  unobserved_.clear();
  pauses_.erase(pauses_.begin(), pauses_.end() - (paused_ ? 1 : 0));
  if (paused_ && cut && pauses_.back().from <= *cut) {
    pauses_.back().from = *cut;
    pauses_.back().at_reading = true;
  }
  seen_.erase_if([&](uint64_t, Seen& l) {
    // An exited thread is remembered a while: a reading listing its pointer then is stale, not a thread without
    // events (StretchesOf).
    if (l.exited && !l.unobserved && l.exit_ns + kForgetExitedNs < now_ns) return true;
    if (l.unobserved && cut && l.unobserved_from <= *cut) {
      l.unobserved_from = *cut;
      l.unobserved_at_reading = true;
    }
    return false;
  });
  seen_.shrink_if_sparse();
  // Kept: from the reading an open stretch goes on from (or the time it starts at), and every reading since the
  // oldest wait a pause could still cut (its stretch would start at the wants_gvl).
  uint64_t keep_from = now_ns;
  for (const auto& [thread, l] : seen_) {
    if (l.unobserved) {
      keep_from = std::min(keep_from, l.unobserved_from);
    } else if (l.wants && !l.exited) {
      keep_from = std::min(keep_from, l.last_event_ns);
    }
  }
  if (paused_) keep_from = std::min(keep_from, pauses_.back().from);
  size_t drop = static_cast<size_t>(std::lower_bound(readings_.begin(), readings_.end(), keep_from,
                                                     [](const GvlSample& g, uint64_t t) { return g.t_ns < t; }) -
                                    readings_.begin());
  if (readings_.size() - drop > kMaxKeptReadings) drop = readings_.size() - kMaxKeptReadings;
  kept_ -= std::min(kept_, drop);
  readings_.erase(readings_.begin(), readings_.begin() + static_cast<ptrdiff_t>(drop));
  reading_counted_.erase(reading_counted_.begin(), reading_counted_.begin() + static_cast<ptrdiff_t>(drop));
  if (readings_.capacity() > 64 && readings_.capacity() > 4 * readings_.size()) readings_.shrink_to_fit();
}

AttributionResult Attribution::Compute(uint64_t end_ns) const {
  AttributionResult r;
  BlameWaits(r);
  if (options_.wall) AttributeWall(r, end_ns);
  if (options_.estimate_paused) Estimate(r, end_ns);
  if (options_.wall && options_.estimate_paused) {
    // Each thread's estimated wait comes out of its unknown time (never more than there is of it).
    for (const auto& [key, ns] : r.estimated_wait_ns) {
      auto unknown = r.wall_ns.find(WallKey{.thread = key.thread, .state = WallState::kUnknown});
      if (key.thread == 0 || unknown == r.wall_ns.end()) continue;
      const uint64_t moved = std::min(ns, unknown->second);
      if (moved == 0) continue;
      unknown->second -= moved;
      if (unknown->second == 0) r.wall_ns.erase(unknown);
      r.wall_ns[WallKey{.thread = key.thread,
                        .state = WallState::kGvlWait,
                        .stack = key.stack,
                        .provenance = Provenance::kInferred}] += moved;
    }
  }
  return r;
}

void Attribution::DrainBlame(uint64_t keep_from_ns, AttributionResult* into) {
  BlameWaits(*into);
  // Vectors keep their memory from drain to drain: a live thread (or VM) refills its vector at once, where growing it
  // again from nothing after every drain (the agent drains every few hundred spans) took a chain of reallocations
  // each time. A vector that held far less than its capacity since the last drain (after a burst) gives the rest
  // back, and a thread's vector that stayed empty for a whole drain period (an idle or exited thread) is dropped.
  auto trim = [](auto& v, size_t used) {
    if (v.capacity() <= 64 || v.capacity() <= 4 * used) return;
    std::remove_reference_t<decltype(v)> fitted;
    fitted.reserve(std::max(v.size(), used));
    fitted.assign(std::make_move_iterator(v.begin()), std::make_move_iterator(v.end()));
    v.swap(fitted);
  };
  trim(waits_, waits_.size());
  waits_.clear();
  // What a wait starting at or after keep_from_ns can read: holder spans, holds and GCs ending after it, samples
  // from it on.
  auto ended = [keep_from_ns](const auto& s) { return s.end_ns <= keep_from_ns; };
  auto drop_ended = [&ended, &trim](uint64_t, auto& v) {
    const size_t used = v.size();
    std::erase_if(v, ended);
    trim(v, used);
    return used == 0;
  };
  for (auto it = holders_.begin(); it != holders_.end();) {
    it = drop_ended(it->first, it->second) ? holders_.erase(it) : std::next(it);
  }
  holds_.erase_if(drop_ended);
  gcs_.erase_if(drop_ended);
  // The estimate (DrainEstimate) looks up each thread's latest sample at or before every reading it keeps: those
  // samples stay, with each live thread's latest before them.
  uint64_t samples_from = keep_from_ns;
  if (options_.estimate_paused && !readings_.empty()) samples_from = std::min(samples_from, readings_.front().t_ns);
  samples_.erase_if([&](uint64_t thread, std::vector<Sample>& v) {
    const size_t used = v.size();
    auto first = std::lower_bound(v.begin(), v.end(), samples_from,
                                  [](const Sample& s, uint64_t t) { return s.t_ns < t; });
    if (options_.estimate_paused && first != v.begin()) {
      const Seen* seen = seen_.find(thread);
      if (seen == nullptr || !seen->exited) --first;
    }
    v.erase(v.begin(), first);
    trim(v, used);
    return used == 0;
  });
  contentions_.erase_if([&](uint64_t, std::vector<Sample>& v) {
    const size_t used = v.size();
    std::erase_if(v, [keep_from_ns](const Sample& s) { return s.t_ns < keep_from_ns; });
    trim(v, used);
    return used == 0;
  });
  holds_.shrink_if_sparse();
  gcs_.shrink_if_sparse();
  samples_.shrink_if_sparse();
  contentions_.shrink_if_sparse();
  kept_ = blocked_.size() + readings_.size();
  for (const auto& [thread, v] : gcs_) kept_ += v.size();
  for (const auto& [vm, v] : holders_) kept_ += v.size();
  for (const auto& [thread, v] : holds_) kept_ += v.size();
  for (const auto& [thread, v] : samples_) kept_ += v.size();
  for (const auto& [thread, v] : contentions_) kept_ += v.size();
}

void Attribution::RemapStacks(const std::function<uint32_t(uint32_t)>& map) {
  auto remap = [&map](uint32_t& id) {
    if (id != 0) id = map(id);
  };
  for (std::vector<Span>* v : {&waits_, &blocked_}) {
    for (Span& s : *v) remap(s.stack);
  }
  for (auto& [thread, v] : holds_) {
    for (Hold& h : v) remap(h.stack);
  }
  for (auto& [thread, v] : gcs_) {
    for (Span& s : v) remap(s.stack);
  }
  for (auto* by_thread : {&samples_, &contentions_}) {
    for (auto& [thread, v] : *by_thread) {
      for (Sample& s : v) remap(s.stack);
    }
  }
  for (GvlSample& g : readings_) remap(g.stack);
  for (auto& [waiter, ws] : carried_stacks_) remap(ws.stack);
}

size_t Attribution::approx_memory_bytes() const {
  size_t n = VectorHeap(waits_) + VectorHeap(blocked_) +
             gcs_.approx_memory_bytes() +
             holders_.size() * HeapChunk(4 * sizeof(void*) + sizeof(std::pair<const uint32_t, std::vector<Holder>>)) +
             holds_.approx_memory_bytes() + samples_.approx_memory_bytes() + contentions_.approx_memory_bytes() +
             lives_.size() * HeapChunk(4 * sizeof(void*) + sizeof(std::pair<const uint64_t, Life>));  // tree nodes
  for (const auto& [vm, v] : holders_) n += VectorHeap(v);
  for (const auto& [thread, v] : holds_) n += VectorHeap(v);
  for (const auto& [thread, v] : gcs_) n += VectorHeap(v);
  for (const auto& [thread, v] : samples_) n += VectorHeap(v);
  for (const auto& [thread, v] : contentions_) n += VectorHeap(v);
  n += VectorHeap(readings_) + reading_counted_.capacity() / 8 +
       seen_.approx_memory_bytes() +
       HashSetHeap(carried_stacks_, sizeof(std::pair<const uint64_t, WaiterStack>), false) + VectorHeap(pauses_);
  for (const GvlSample& g : readings_) n += VectorHeap(g.queued);
  return n;
}

GvlSample GvlSampleOf(uint64_t t_ns, uint64_t key, uint32_t stack, bool in_gc, const GvlReading& reading) {
  GvlSample g{.t_ns = t_ns,
              .sampled = key,
              .stack = stack,
              .in_gc = in_gc,
              .held = reading.held,
              .holder = TraceThreadKey(reading.holder),
              .waiting = reading.waiting};
  g.queued.reserve(reading.queued.size());
  for (uint32_t q : reading.queued) g.queued.push_back(TraceThreadKey(q));
  return g;
}

void OnTraceContention(Attribution& a, const TraceEvent& e, const std::function<bool(uint32_t stack)>& stack_ok) {
  if (e.event != EventName::kWantsGvl || !e.gvl || !e.gvl->holder || !e.holder_stack) return;
  if (*e.holder_stack == 0 || (stack_ok && !stack_ok(*e.holder_stack))) return;
  a.OnContention(e.t_ns, TraceThreadKey(e.gvl->holder), *e.holder_stack);
}

AttributionResult AttributeTrace(std::span<const Span> spans, std::span<const TraceEvent> events, uint64_t end_ns,
                                 AttributionOptions options, const std::function<bool(uint32_t stack)>& stack_in_gc) {
  Attribution a(options);
  for (const Span& s : spans) a.OnSpan(s);
  for (const TraceEvent& e : events) {
    const uint64_t key = TraceThreadKey(e.ruby_thread);
    a.OnThreadEvent(e.t_ns, key, e.event);
    if (e.event == EventName::kTracingPaused) a.OnPause(e.t_ns);
    if (e.event == EventName::kTracingResumed) a.OnResume(e.t_ns);
    OnTraceContention(a, e);
    if (e.event != EventName::kSample) continue;
    const uint32_t stack = e.stack.value_or(0);
    a.OnSample(e.t_ns, key, stack, false);
    if (e.gvl) a.OnGvlReading(GvlSampleOf(e.t_ns, key, stack, stack_in_gc && stack != 0 && stack_in_gc(stack), *e.gvl));
  }
  return a.Compute(end_ns);
}

}  // namespace rvbpfd
