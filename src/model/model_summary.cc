#include "model/model_summary.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

namespace rvbpfd {
namespace {

std::string Ms(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", static_cast<double>(ns) / 1e6);
  return buf;
}

std::string PadLeft(std::string_view s, size_t width) {
  std::string out;
  if (s.size() < width) out.append(width - s.size(), ' ');
  out.append(s);
  return out;
}

std::string Pad(std::string_view s, size_t width) {
  std::string out(s);
  if (out.size() < width) out.append(width - out.size(), ' ');
  return out;
}

// Reasons that only a rule can give are flagged so nobody mistakes them for something the VM said.
bool IsDerivedReason(ReleaseReason reason) {
  return reason != ReleaseReason::kUnknown && reason != ReleaseReason::kStarting;
}

}  // namespace

void PrintModelSummary(const Model& model, std::ostream& out) {
  constexpr size_t kNumWidth = 12, kWaitsWidth = 7;
  size_t thread_width = 13;  // widened to the longest label of a named thread
  for (const RubyThread& thread : model.threads()) {
    thread_width = std::max(thread_width, model.ThreadLabel(thread.ruby_thread).size() + 2);
  }
  out << "thread states (ms):\n";
  out << Pad("thread", thread_width) << PadLeft("running", kNumWidth) << PadLeft("wants_gvl", kNumWidth)
      << PadLeft("released", kNumWidth) << PadLeft("gc", kNumWidth) << PadLeft("unknown", kNumWidth)
      << PadLeft("waits", kWaitsWidth) << PadLeft("longest", kNumWidth) << "  top release reasons\n";
  for (const RubyThread& thread : model.threads()) {
    const ThreadTotals& t = thread.totals;
    out << Pad(model.ThreadLabel(thread.ruby_thread), thread_width) << PadLeft(Ms(t.ns(ThreadState::kRunning)), kNumWidth)
        << PadLeft(Ms(t.wait_total_ns), kNumWidth) << PadLeft(Ms(t.ns(ThreadState::kReleased)), kNumWidth)
        << PadLeft(Ms(t.ns(ThreadState::kGc)), kNumWidth) << PadLeft(Ms(t.ns(ThreadState::kUnknown)), kNumWidth)
        << PadLeft(std::to_string(t.waits), kWaitsWidth) << PadLeft(Ms(t.wait_longest_ns), kNumWidth) << "  ";
    const size_t n = std::min(kTopReleaseReasons, t.release_reasons.size());
    if (n == 0) out << "-";
    for (size_t i = 0; i < n; ++i) {
      const ReasonTotal& r = t.release_reasons[i];
      if (i > 0) out << ", ";
      out << ReleaseReasonName(r.reason) << (IsDerivedReason(r.reason) ? "*" : "") << " " << Ms(r.ns) << " ms ("
          << r.count << "x)";
    }
    out << '\n';
  }
  uint64_t idle_ns = 0, unknown_owner_ns = 0;
  for (const OwnerBlock& b : model.owner_lane()) {
    if (b.kind == OwnerKind::kIdle) idle_ns += b.duration_ns();
    if (b.kind == OwnerKind::kUnknown) unknown_owner_ns += b.duration_ns();
  }
  out << "wants_gvl = GVL contention: time waiting for the lock; longest = longest single wait.\n";
  out << "* derived (from the released stack, a Kernel#sleep / Mutex#lock probe when no stack was taken, or a 3.2 "
         "timeslice), not reported by the VM.\n";
  out << "gvl: idle " << Ms(idle_ns) << " ms, owner unknown " << Ms(unknown_owner_ns) << " ms\n";
  uint64_t dropped = 0, paused_ns = 0;
  size_t drop_windows = 0, pauses = 0;
  for (const UnknownWindow& w : model.unknown_windows()) {
    if (w.cause == ModelRule::kEventsDropped) {
      dropped += w.dropped;
      ++drop_windows;
    } else {
      paused_ns += w.end_ns - w.start_ns;
      ++pauses;
    }
  }
  if (drop_windows > 0 || pauses > 0) {
    out << "unknown spans: " << drop_windows << " with dropped events (" << dropped << " events lost), " << pauses
        << " tracing pauses (" << Ms(paused_ns) << " ms); states there are shown as unknown\n";
  }
}

void PrintContentionSummary(const Model& model, std::ostream& out) {
  uint64_t wait_ns = 0, longest_ns = 0, waits = 0;
  std::optional<uint32_t> longest_thread;
  for (const RubyThread& t : model.threads()) {
    wait_ns += t.totals.wait_total_ns;
    waits += t.totals.waits;
    if (t.totals.wait_longest_ns > longest_ns) {
      longest_ns = t.totals.wait_longest_ns;
      longest_thread = t.ruby_thread;
    }
  }
  uint64_t owned_ns = 0, idle_ns = 0, unknown_ns = 0;
  for (const OwnerBlock& b : model.owner_lane()) {
    const uint64_t d = b.end_ns - b.start_ns;
    (b.kind == OwnerKind::kOwned ? owned_ns : b.kind == OwnerKind::kIdle ? idle_ns : unknown_ns) += d;
  }
  char line[256];
  snprintf(line, sizeof(line), "gvl contention: %.3f ms waiting in %llu waits, longest %.3f ms", wait_ns / 1e6,
           static_cast<unsigned long long>(waits), longest_ns / 1e6);
  out << line;
  if (longest_thread) out << " (" << model.ThreadLabel(*longest_thread) << ")";
  snprintf(line, sizeof(line), "\ngvl: held %.3f ms, idle %.3f ms, unknown %.3f ms\n", owned_ns / 1e6,
           idle_ns / 1e6, unknown_ns / 1e6);
  out << line;
}

}  // namespace rvbpfd
