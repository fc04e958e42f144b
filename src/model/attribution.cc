#include "model/attribution.h"

#include <algorithm>

namespace rvbpfd {
namespace {

constexpr std::string_view kBlameSourceNames[] = {"sampled",  "release_stack", "last_sample",
                                                  "no_stack", "gvl_free",      "holder_unknown"};
static_assert(std::size(kBlameSourceNames) == static_cast<size_t>(BlameSource::kCount));
constexpr std::string_view kWallStateNames[] = {"running", "gc", "gvl_wait", "blocked", "unknown"};
static_assert(std::size(kWallStateNames) == static_cast<size_t>(WallState::kCount));

bool ByStart(const Span& a, const Span& b) { return a.start_ns < b.start_ns; }

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
  switch (s.kind) {
    case SpanKind::kGvlWait:
      if (s.counted) waits_.push_back(s);
      break;
    case SpanKind::kHolder:
      holders_.push_back(s);
      break;
    case SpanKind::kGvlHold:
      if (s.counted) holds_.push_back(s);
      break;
    case SpanKind::kBlocked:
      if (s.counted) blocked_.push_back(s);
      break;
    case SpanKind::kGc:
      if (s.counted && s.thread != 0) gcs_.push_back(s);
      break;
  }
}

void Attribution::OnThreadEvent(uint64_t t_ns, uint64_t thread, bool exited) {
  if (thread == 0) return;
  auto [it, fresh] = lives_.try_emplace(thread);
  Life& l = it->second;
  if (fresh) l.first_ns = t_ns;
  if (exited) {
    l.exited = true;
    l.exit_ns = t_ns;
  }
}

void Attribution::OnSample(uint64_t t_ns, uint64_t thread, uint32_t stack, bool in_gc) {
  if (thread == 0) return;
  samples_[thread].push_back(Sample{t_ns, stack, in_gc});
}

std::pair<const Attribution::Sample*, const Attribution::Sample*> Attribution::SamplesIn(uint64_t thread,
                                                                                      uint64_t from,
                                                                                      uint64_t to) const {
  auto it = samples_.find(thread);
  if (it == samples_.end() || it->second.empty()) return {nullptr, nullptr};
  const std::vector<Sample>& v = it->second;
  auto lo = std::lower_bound(v.begin(), v.end(), from, [](const Sample& s, uint64_t t) { return s.t_ns < t; });
  auto hi = std::lower_bound(lo, v.end(), to, [](const Sample& s, uint64_t t) { return s.t_ns < t; });
  return {v.data() + (lo - v.begin()), v.data() + (hi - v.begin())};
}

uint64_t Attribution::GcOverlap(uint64_t thread, uint64_t from, uint64_t to) const {
  uint64_t ns = 0;
  for (const Span& g : gcs_) {  // few: one per GC run
    if (g.thread != thread || g.end_ns <= from || g.start_ns >= to) continue;
    ns += std::min(g.end_ns, to) - std::max(g.start_ns, from);
  }
  return ns;
}

void Attribution::AttributeHolder(AttributionResult& r, const Span& wait, uint64_t holder, uint64_t from,
                                  uint64_t to) const {
  BlameKey key{.waiter = wait.thread, .holder = holder};
  // GC the holder ran inside the overlap: attributed to the GC's stack.
  uint64_t gc_ns = 0;
  for (const Span& g : gcs_) {
    if (g.thread != holder || g.end_ns <= from || g.start_ns >= to) continue;
    const uint64_t ns = std::min(g.end_ns, to) - std::max(g.start_ns, from);
    BlameKey k = key;
    k.gc = true;
    k.stack = g.stack;
    k.source = g.stack != 0 ? BlameSource::kLastSample : BlameSource::kNoStack;
    r.blame_ns[k] += ns;
    gc_ns += ns;
  }
  const uint64_t rest = to - from - std::min(gc_ns, to - from);
  if (rest == 0) return;
  std::vector<uint32_t> stacks;
  auto [b, e] = SamplesIn(holder, from, to);
  for (const Sample* s = b; s != e; ++s) {
    if (!s->in_gc && (gc_ns == 0 || GcOverlap(holder, s->t_ns, s->t_ns + 1) == 0)) stacks.push_back(s->stack);
  }
  if (!stacks.empty()) {
    key.source = BlameSource::kSampled;
    for (size_t i = 0; i < stacks.size(); ++i) {
      key.stack = stacks[i];
      r.blame_ns[key] += Share(rest, stacks.size(), i);
    }
    return;
  }
  // No sample: the hold of `holder` that covers `from`.
  key.source = BlameSource::kNoStack;
  for (const Span& h : holds_) {
    if (h.thread != holder || h.start_ns > from || h.end_ns <= from) continue;
    if (h.stack != 0) {
      key.stack = h.stack;
      key.source = h.end == SpanEnd::kReleased ? BlameSource::kReleaseStack : BlameSource::kLastSample;
    }
    break;
  }
  r.blame_ns[key] += rest;
}

void Attribution::AttributeRunning(AttributionResult& r, uint64_t thread, const Span& hold) const {
  uint64_t gc_ns = 0;
  for (const Span& g : gcs_) {
    if (g.thread != thread || g.end_ns <= hold.start_ns || g.start_ns >= hold.end_ns) continue;
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

AttributionResult Attribution::Compute(uint64_t end_ns) const {
  AttributionResult r;
  std::vector<Span> holders = holders_;
  std::sort(holders.begin(), holders.end(), ByStart);

  // Blame: each wait against the holder spans of its VM, in time order; a cursor keeps a ns from being blamed twice.
  for (const Span& w : waits_) {
    if (w.end != SpanEnd::kAcquired || w.end_ns <= w.start_ns) continue;
    r.total_gvl_wait_ns += w.duration_ns();
    ++r.waits;
    uint64_t cursor = w.start_ns;
    auto unknown_until = [&](uint64_t t) {
      if (t <= cursor) return;
      r.blame_ns[BlameKey{.waiter = w.thread, .source = BlameSource::kHolderUnknown}] += t - cursor;
      cursor = t;
    };
    // Holder spans ending after the wait began: the first is found by the latest start <= w.start_ns.
    auto it = std::upper_bound(holders.begin(), holders.end(), w.start_ns,
                               [](uint64_t t, const Span& h) { return t < h.start_ns; });
    if (it != holders.begin()) --it;
    for (; it != holders.end() && it->start_ns < w.end_ns && cursor < w.end_ns; ++it) {
      const Span& h = *it;
      if (h.vm != w.vm || h.end_ns <= cursor) continue;
      const uint64_t from = std::max(h.start_ns, cursor);
      const uint64_t to = std::min(h.end_ns, w.end_ns);
      if (to <= from) continue;
      unknown_until(from);
      if (h.thread == 0) {
        r.blame_ns[BlameKey{.waiter = w.thread, .source = BlameSource::kGvlFree}] += to - from;
      } else if (h.thread == w.thread) {
        // The waiter itself is named holder (its own release was lost): who made it wait is not known.
        r.blame_ns[BlameKey{.waiter = w.thread, .source = BlameSource::kHolderUnknown}] += to - from;
      } else {
        AttributeHolder(r, w, h.thread, from, to);
      }
      cursor = to;
    }
    unknown_until(w.end_ns);
  }

  // Wall clock: every counted span of each thread, then what none covers.
  std::map<uint64_t, uint64_t> covered;
  for (const Span& h : holds_) {
    AttributeRunning(r, h.thread, h);
    covered[h.thread] += h.duration_ns();
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
  return r;
}

}  // namespace rvbpfd
