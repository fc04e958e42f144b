#include "export/run_summary.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "model/blockers.h"
#include "model/endpoint.h"
#include "trace/inspect.h"

namespace rvbpfd {
namespace {

std::string Ms(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(ns) / 1e6);
  return buf;
}

std::string Pct(uint64_t part, uint64_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / whole);
  return buf;
}

// The label of frame `depth` (0 = leaf) of a stack; "" when the stack has no such frame.
std::string FrameLabel(const TraceFile& trace, uint32_t stack, size_t depth) {
  const std::vector<uint32_t>* frames = stack != 0 ? trace.Stack(stack) : nullptr;
  if (frames == nullptr || frames->size() <= depth) return "";
  const FrameInfo* f = trace.Frame((*frames)[depth]);
  return f != nullptr ? f->label : "<unresolved frame " + std::to_string((*frames)[depth]) + ">";
}

std::string ThreadName(const TraceFile& trace, uint64_t key) {
  if (key == 0) return "-";
  std::optional<uint32_t> serial = TraceRubyThread(key);
  return serial ? RubyThreadLabel(trace, *serial) : std::string("-");
}

// Who held the lock while a blocker ran: the thread's name when one did, else how many.
std::string Holders(const TraceFile& trace, const Blocker& b) {
  if (b.holders.size() == 1) return ThreadName(trace, b.holders[0].key);
  return std::to_string(b.holders.size()) + " threads";
}

// "sampled 95%, release_stack 5%": how the blamed stacks were known, largest share first.
std::string SourceShares(const std::map<std::string_view, uint64_t>& by_source, uint64_t total) {
  std::vector<std::pair<uint64_t, std::string_view>> v;
  for (const auto& [s, ns] : by_source) v.emplace_back(ns, s);
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string out;
  for (const auto& [ns, s] : v) {
    if (!out.empty()) out += ", ";
    out += std::string(s) + " " + Pct(ns, total);
  }
  return out;
}

// The endpoints section: per endpoint (model/endpoint.h) its threads' time running (GC included), waiting for the
// GVL, blocked (its top three reasons, idle included), and the GVL wait it caused to others (blame on its holders'
// stacks); the heaviest kSummaryEndpoints, then "-". Printed only when some stack names an endpoint.
void PrintEndpoints(const TraceFile& trace, const AttributionResult& a, std::ostream& out) {
  struct Row {
    uint64_t running_ns = 0, gvl_wait_ns = 0, blocked_ns = 0, blamed_ns = 0;
    std::map<ReleaseReason, uint64_t> blocked_by_reason;
  };
  TraceEndpoints endpoints(trace);
  std::map<uint32_t, Row> rows;  // by endpoint id
  for (const auto& [key, ns] : a.wall_ns) {
    Row& r = rows[endpoints.Of(key.stack)];
    if (key.state == WallState::kRunning || key.state == WallState::kGc) r.running_ns += ns;
    if (key.state == WallState::kGvlWait) r.gvl_wait_ns += ns;
    if (key.state == WallState::kBlocked) {
      r.blocked_ns += ns;
      r.blocked_by_reason[key.reason] += ns;
    }
  }
  for (const auto& [key, ns] : a.blame_ns) rows[endpoints.Of(key.stack)].blamed_ns += ns;
  if (endpoints.size() <= 1) return;  // nothing named: no section
  std::vector<std::pair<uint32_t, Row>> v;
  for (auto& [id, r] : rows) {
    if (id != 0) v.emplace_back(id, std::move(r));
  }
  std::stable_sort(v.begin(), v.end(), [](const auto& x, const auto& y) {
    return x.second.running_ns + x.second.gvl_wait_ns + x.second.blamed_ns >
           y.second.running_ns + y.second.gvl_wait_ns + y.second.blamed_ns;
  });
  size_t width = 24;
  for (size_t i = 0; i < v.size() && i < kSummaryEndpoints; ++i) {
    width = std::max(width, std::min<size_t>(endpoints.endpoint(v[i].first).name.size() + 2, 60));
  }
  constexpr size_t kNumWidth = 10;
  out << "\nendpoints (derived from the stacks: Rails action, job class, Sinatra route; '-' outside\n  any; ms; "
         "blamed: the GVL wait others had while it held the lock):\n  "
      << Pad("endpoint", width) << PadLeft("running", kNumWidth) << PadLeft("gvl_wait", kNumWidth)
      << PadLeft("blocked", kNumWidth) << PadLeft("blamed", kNumWidth) << "  blocked by reason\n";
  auto row = [&](std::string_view name, const Row& r) {
    std::vector<std::pair<uint64_t, ReleaseReason>> reasons;
    for (const auto& [reason, ns] : r.blocked_by_reason) reasons.emplace_back(ns, reason);
    std::stable_sort(reasons.begin(), reasons.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
    std::string by;
    for (size_t i = 0; i < reasons.size() && i < 3; ++i) {
      by += (by.empty() ? "" : ", ") + std::string(ReleaseReasonName(reasons[i].second)) + " " + Ms(reasons[i].first);
    }
    out << "  " << Pad(name, width) << PadLeft(Ms(r.running_ns), kNumWidth) << PadLeft(Ms(r.gvl_wait_ns), kNumWidth)
        << PadLeft(Ms(r.blocked_ns), kNumWidth) << PadLeft(Ms(r.blamed_ns), kNumWidth) << "  "
        << (by.empty() ? "-" : by) << '\n';
  };
  for (size_t i = 0; i < v.size() && i < kSummaryEndpoints; ++i) row(endpoints.endpoint(v[i].first).name, v[i].second);
  if (v.size() > kSummaryEndpoints) {
    out << "  ... " << v.size() - kSummaryEndpoints << " more endpoints (rvbpfd export --pprof, label endpoint)\n";
  }
  row(kNoEndpoint, rows[0]);
}

}  // namespace

void PrintRunSummary(const TraceFile& trace, const StackProfile& agg, const Model& model, std::ostream& out) {
  const AttributionResult& a = agg.attribution;
  const TraceHeader& h = trace.header;
  uint64_t samples = 0;
  for (const TraceEvent& e : trace.events) samples += e.event == EventName::kSample ? 1 : 0;
  out << "run: pid " << h.pid << ", ruby " << (h.ruby_version.empty() ? "?" : h.ruby_version) << ", "
      << Ms(model.end_ns() - model.start_ns()) << " ms, " << a.lifetime_ns.size() << " threads, "
      << trace.events.size() << " events, " << samples << " samples";
  if (h.sample_hz) out << " at " << *h.sample_hz << " Hz";
  out << " (recorded by " << h.recorder << ")\n";

  // Per thread: wall clock by state.
  struct Row {
    uint64_t state_ns[static_cast<size_t>(WallState::kCount)] = {};
    std::map<ReleaseReason, uint64_t> blocked_by_reason;
  };
  std::map<uint64_t, Row> rows;
  for (const auto& [thread, life] : a.lifetime_ns) rows[thread];
  for (const auto& [key, ns] : a.wall_ns) {
    Row& r = rows[key.thread];
    r.state_ns[static_cast<size_t>(key.state)] += ns;
    if (key.state == WallState::kBlocked) r.blocked_by_reason[key.reason] += ns;
  }
  uint64_t lifetimes = 0;
  for (const auto& [thread, life] : a.lifetime_ns) lifetimes += life;
  constexpr size_t kThreadWidth = 12, kNativeWidth = 10, kNumWidth = 10;
  // Named threads ("Thread #2 (puma srv tp 001)") widen the first column to their longest label.
  size_t thread_width = kThreadWidth;
  size_t counted = 0;
  for (const auto& [thread, r] : rows) {
    if (counted++ == kSummaryThreads) break;
    thread_width = std::max(thread_width, ThreadName(trace, thread).size() + 2);
  }
  out << "\nwall clock by thread (ms; the states sum to the lifetime):\n  " << Pad("thread", thread_width)
      << Pad("native", kNativeWidth) << PadLeft("lifetime", kNumWidth);
  for (size_t s = 0; s < static_cast<size_t>(WallState::kCount); ++s) {
    out << PadLeft(WallStateName(static_cast<WallState>(s)), kNumWidth);
  }
  out << "  most blocked on\n";
  size_t shown = 0;
  for (const auto& [thread, r] : rows) {
    if (shown++ == kSummaryThreads) break;
    std::string natives;
    if (std::optional<uint32_t> serial = TraceRubyThread(thread)) {
      if (const RubyThread* t = model.FindThread(*serial)) {
        for (uint32_t tid : t->native_tids) natives += (natives.empty() ? "" : ",") + std::to_string(tid);
      }
    }
    auto life = a.lifetime_ns.find(thread);
    out << "  " << Pad(ThreadName(trace, thread), thread_width) << Pad(natives.empty() ? "-" : natives, kNativeWidth)
        << PadLeft(Ms(life != a.lifetime_ns.end() ? life->second : 0), kNumWidth);
    for (uint64_t ns : r.state_ns) out << PadLeft(Ms(ns), kNumWidth);
    const auto top = std::max_element(r.blocked_by_reason.begin(), r.blocked_by_reason.end(),
                                      [](const auto& x, const auto& y) { return x.second < y.second; });
    out << "  " << (top == r.blocked_by_reason.end() ? "-" : std::string(ReleaseReasonName(top->first))) << '\n';
  }
  if (rows.size() > kSummaryThreads) {
    out << "  ... " << rows.size() - kSummaryThreads << " more threads (rvbpfd export --pprof, -sample_index=wall)\n";
  }

  const uint64_t all_wait_ns = a.total_gvl_wait_ns + a.estimated_gvl_wait_ns;
  out << "\ngvl contention: " << Ms(a.total_gvl_wait_ns) << " ms waiting for the GVL in " << a.waits << " waits ("
      << Pct(a.total_gvl_wait_ns, lifetimes) << " of all threads' lifetime)";
  if (agg.waits_skipped > 0) out << "; " << agg.waits_skipped << " waits not counted (lost events or a pause)";
  if (a.estimated_gvl_wait_ns > 0) {
    out << "; while paused, " << Ms(a.estimated_gvl_wait_ns) << " ms more estimated from " << a.estimate_readings
        << " samples' GVL readings (inferred)";
  }
  out << '\n';

  const std::vector<Blocker> blockers = GroupBlockers(a, trace.frames, trace.stacks);
  if (!blockers.empty()) {
    out << "top blockers (the holders' innermost Ruby method while others waited, across threads; beneath it the C "
           "function it was in):\n";
    for (size_t i = 0; i < blockers.size() && i < kSummaryBlockers; ++i) {
      const Blocker& b = blockers[i];
      out << "  " << Pad(b.method, 36) << " " << Pad(Holders(trace, b), kThreadWidth)
          << PadLeft(Pct(b.ns, all_wait_ns), 7) << PadLeft(Ms(b.ns), kNumWidth) << " ms  ("
          << SourceShares(b.by_source, b.ns) << ")\n";
      // The heaviest C function, one line, so the summary keeps its length.
      if (!b.calls.empty()) {
        out << "      in " << Pad(b.calls[0].label, 30) << PadLeft(Pct(b.calls[0].ns, all_wait_ns), 7)
            << PadLeft(Ms(b.calls[0].ns), kNumWidth) << " ms";
        if (b.calls.size() > 1) out << "  (+" << b.calls.size() - 1 << " more)";
        out << '\n';
      }
    }
  }

  // Blocked time by (reason, stack) over all threads.
  struct Blocked {
    uint64_t ns = 0;
    std::set<uint64_t> threads;
  };
  std::map<std::pair<ReleaseReason, uint32_t>, Blocked> blocked;
  Blocked idle;  // waiting for work is no blocking: summed apart
  for (const auto& [key, ns] : a.wall_ns) {
    if (key.state != WallState::kBlocked || ns == 0) continue;
    if (key.reason == ReleaseReason::kIdle) {
      idle.ns += ns;
      idle.threads.insert(key.thread);
      continue;
    }
    Blocked& b = blocked[{key.reason, key.stack}];
    b.ns += ns;
    b.threads.insert(key.thread);
  }
  std::vector<std::pair<std::pair<ReleaseReason, uint32_t>, Blocked>> by_ns(blocked.begin(), blocked.end());
  std::stable_sort(by_ns.begin(), by_ns.end(), [](const auto& x, const auto& y) { return x.second.ns > y.second.ns; });
  if (!by_ns.empty()) {
    out << "top blocked stacks (time off the GVL by release reason, leaf < caller):\n";
    for (size_t i = 0; i < by_ns.size() && i < kSummaryBlockedStacks; ++i) {
      const auto& [k, b] = by_ns[i];
      std::string where = FrameLabel(trace, k.second, 0);
      if (where.empty()) where = std::string(kNoStackFrame);
      if (std::string caller = FrameLabel(trace, k.second, 1); !caller.empty()) where += " < " + caller;
      out << "  " << Pad(ReleaseReasonName(k.first), kThreadWidth) << PadLeft(Ms(b.ns), kNumWidth) << " ms  "
          << PadLeft(std::to_string(b.threads.size()), 3) << (b.threads.size() == 1 ? " thread   " : " threads  ")
          << where << '\n';
    }
  }

  if (idle.ns > 0) {
    out << "idle (waiting for work, not contention): " << Ms(idle.ns) << " ms in " << idle.threads.size()
        << (idle.threads.size() == 1 ? " thread" : " threads") << ", not among the blocked stacks\n";
  }

  PrintEndpoints(trace, a, out);

  uint64_t dropped = 0, paused_ns = 0;
  size_t drop_records = 0, pauses = 0;
  for (const UnknownWindow& w : model.unknown_windows()) {
    if (w.cause == ModelRule::kEventsDropped) {
      dropped += w.dropped;
      ++drop_records;
    } else {
      paused_ns += w.end_ns - w.start_ns;
      ++pauses;
    }
  }
  out << "\nlost: " << dropped << " events dropped (" << drop_records << " records), tracing paused " << pauses
      << " times for " << Ms(paused_ns) << " ms; time there is counted as unknown"
      << (a.estimated_gvl_wait_ns > 0 ? " but for the GVL waits estimated from the samples' readings (in gvl_wait)"
                                      : "")
      << '\n';
  out << "more: --events for the event table (--thread N, --from MS, --to MS, --limit N); rvbpfd report for the "
         "timeline; rvbpfd export --pprof for gvl_blame and wall by stack\n";
}

void PrintBlameTotals(const TraceFile& trace, const StackProfile& agg, std::ostream& out) {
  const AttributionResult& a = agg.attribution;
  struct Holder {
    uint64_t ns = 0;
    std::map<std::string, uint64_t> methods;
  };
  std::map<uint64_t, Holder> holders;
  for (const Blocker& b : GroupBlockers(a, trace.frames, trace.stacks)) {
    for (const BlockerHolder& bh : b.holders) {
      Holder& h = holders[bh.key];
      h.ns += bh.ns;
      h.methods[b.method] += bh.ns;
    }
  }
  std::vector<std::pair<uint64_t, Holder>> v(holders.begin(), holders.end());
  std::stable_sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.second.ns > y.second.ns; });
  const uint64_t all_wait_ns = a.total_gvl_wait_ns + a.estimated_gvl_wait_ns;
  out << "gvl blame by holder: " << Ms(a.total_gvl_wait_ns) << " ms of GVL waiting in " << a.waits << " waits";
  if (a.estimated_gvl_wait_ns > 0) {
    out << ", " << Ms(a.estimated_gvl_wait_ns) << " ms more estimated while tracing was paused (inferred)";
  }
  out << '\n';
  for (size_t i = 0; i < v.size() && i < kStatsHolders; ++i) {
    const auto& [holder, h] = v[i];
    const auto top = std::max_element(h.methods.begin(), h.methods.end(),
                                      [](const auto& x, const auto& y) { return x.second < y.second; });
    out << "  " << Pad(ThreadName(trace, holder), 12) << PadLeft(Ms(h.ns), 10) << " ms "
        << PadLeft(Pct(h.ns, all_wait_ns), 7) << "  top: " << top->first << '\n';
  }
  if (v.size() > kStatsHolders) {
    uint64_t rest = 0;
    for (size_t i = kStatsHolders; i < v.size(); ++i) rest += v[i].second.ns;
    out << "  ... " << v.size() - kStatsHolders << " more holders, " << Ms(rest) << " ms\n";
  }
}

}  // namespace rvbpfd
