#include "top/top_state.h"

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <vector>

#include "model/blockers.h"
#include "model/endpoint.h"
#include "trace/release_reason.h"

namespace rvbpfd {
namespace {

// Rows of the blocker and blocked-stack tables kept per interval (the renderer shows what fits).
constexpr size_t kMaxRows = 20;

std::string FrameWhere(const FrameInfo& f) {
  if (f.line > 0 && !f.path.empty()) return f.label + " (" + f.path + ":" + std::to_string(f.line) + ")";
  return f.label;
}

std::string PhaseState(ThreadPhase phase) {
  switch (phase) {
    case ThreadPhase::kHolding: return "running";
    case ThreadPhase::kGc: return "gc";
    case ThreadPhase::kWaiting: return "gvl_wait";
    case ThreadPhase::kBlocked: return "blocked";
    case ThreadPhase::kExited: return "exited";
    case ThreadPhase::kUnseen:
    case ThreadPhase::kUnknown: break;
  }
  return "unknown";
}

}  // namespace

bool TopThreadOrder(const TopThread& a, const TopThread& b) {
  if (a.gvl_wait_ns != b.gvl_wait_ns) return a.gvl_wait_ns > b.gvl_wait_ns;
  const uint64_t ab = a.blocked_total_ns(), bb = b.blocked_total_ns();
  if (ab != bb) return ab > bb;
  return a.ruby_thread < b.ruby_thread;
}

std::string StackWhere(const StackTable& stacks, uint32_t stack) {
  const std::vector<uint32_t>* ids = stack != 0 ? stacks.stack(stack) : nullptr;
  if (ids == nullptr) return "";
  const FrameInfo* call = nullptr;  // the leaf library function above the program's innermost frame
  for (uint32_t id : *ids) {
    const FrameInfo* f = stacks.frame(id);
    if (f == nullptr) continue;
    if (f->kind == FrameKind::kRuby && !IsVmLibraryFrame(*f)) {
      return call != nullptr ? call->label + " in " + FrameWhere(*f) : FrameWhere(*f);
    }
    if (call == nullptr) call = f;
  }
  return call != nullptr ? FrameWhere(*call) : "";
}

std::string StackEndpoint(const StackTable& stacks, uint32_t stack) {
  const std::vector<uint32_t>* ids = stack != 0 ? stacks.stack(stack) : nullptr;
  if (ids == nullptr) return std::string(kNoEndpoint);
  std::vector<const FrameInfo*> frames;
  frames.reserve(ids->size());
  for (uint32_t id : *ids) frames.push_back(stacks.frame(id));  // an unknown frame (null) matches no rule
  return DeriveEndpoint(std::span<const FrameInfo* const>(frames)).name;
}

TopState::TopState(int pid, std::string ruby_version, const StackTable* stacks)
    : pid_(pid),
      ruby_version_(std::move(ruby_version)),
      stacks_(stacks),
      tracker_([this](const Span& s) { OnSpan(s); }),
      blame_(AttributionOptions{.blame_cut_waits = true, .wall = false}) {}

void TopState::Start(uint64_t t_ns) {
  const uint64_t start = std::max(t_ns, last_event_ns_);
  // What the events before the start opened continues from there; their earlier parts are not shown.
  tracker_.Cut(start);
  AttributionResult before;
  blame_.DrainBlame(tracker_.oldest_open_wait_ns(start), &before);
  started_ = true;
  interval_start_ns_ = start;
  events_ = dropped_ = 0;
}

bool TopState::InGc(uint32_t stack) const {
  const std::vector<uint32_t>* ids = stack != 0 ? stacks_->stack(stack) : nullptr;
  if (ids == nullptr || ids->empty()) return false;
  const FrameInfo* leaf = stacks_->frame(ids->front());
  return leaf != nullptr && leaf->kind == FrameKind::kGc;
}

void TopState::OnEvent(const TraceEvent& e) {
  last_event_ns_ = std::max(last_event_ns_, e.t_ns);
  ++events_;
  const uint64_t key = TraceThreadKey(e.ruby_thread);
  const uint32_t stack = e.stack.value_or(0);
  if (key != 0) {
    ThreadSeen& seen = threads_[key];
    if (e.native_tid) seen.native_tid = e.native_tid;
    if (e.event == EventName::kThreadStarted) seen.exited = false;
    if (e.event == EventName::kThreadExited) seen.exited = true;
    if (stack != 0 && (e.event == EventName::kSample || e.event == EventName::kGvlReleased)) seen.last_stack = stack;
  }
  switch (e.event) {
    case EventName::kSample: {
      const bool in_gc = InGc(stack);
      tracker_.OnSample(key, stack, in_gc);
      blame_.OnSample(e.t_ns, key, stack, in_gc);
      return;
    }
    case EventName::kEventsDropped: dropped_ += e.count; break;
    case EventName::kTracingPaused: blame_.OnPause(e.t_ns); break;
    case EventName::kTracingResumed: blame_.OnResume(e.t_ns); break;
    default: break;
  }
  OnTraceContention(blame_, e);  // a wants_gvl's holder stack
  tracker_.OnEvent(TrackerEventOf(e, key, stack));
  blame_.OnThreadEvent(e.t_ns, key, e.event);
}

void TopState::AddBlockedStack(const std::string& state, uint32_t stack, uint64_t thread, uint64_t ns) {
  auto& [total, threads] = where_[{state, stack}];
  total += ns;
  threads[thread] += ns;
}

void TopState::OnSpan(const Span& s) {
  blame_.OnSpan(s);
  if (!started_ || !s.counted || s.thread == 0) return;
  // Every span emitted lies inside the interval: Cut ended the previous one's spans and continues them from there.
  const uint64_t ns = s.duration_ns();
  if (ns == 0) return;
  ThreadSums& sums = sums_[s.thread];
  switch (s.kind) {
    case SpanKind::kGvlHold: sums.running_ns += ns; break;
    case SpanKind::kGc: sums.gc_ns += ns; break;
    case SpanKind::kGvlWait:
      sums.gvl_wait_ns += ns;
      AddBlockedStack("gvl_wait", s.stack, s.thread, ns);
      break;
    case SpanKind::kBlocked: {
      const std::string reason(ReleaseReasonTraceName(s.reason));
      sums.blocked_ns[reason] += ns;
      AddBlockedStack(reason, s.stack, s.thread, ns);
      break;
    }
    case SpanKind::kHolder: break;
  }
}

void TopState::SetThreadInfo(uint32_t ruby_thread, const ThreadInfo& info) { infos_[ruby_thread] = info; }

TopThread TopState::ThreadRow(uint64_t key, const ThreadSeen& info, uint64_t interval_ns) const {
  TopThread row;
  row.ruby_thread = TraceRubyThread(key).value_or(0);
  row.native_tid = info.native_tid;
  if (auto it = infos_.find(row.ruby_thread); it != infos_.end()) {
    // Unnamed threads inherit the process's name natively: the main thread's native name is not a thread's name.
    auto main = infos_.find(1);
    row.name = it->second.DisplayName(main != infos_.end() ? main->second.native_name : std::nullopt);
  }
  const ThreadPhase phase = info.exited ? ThreadPhase::kExited : tracker_.phase(key);
  row.state = PhaseState(phase);
  if (phase == ThreadPhase::kBlocked) row.reason = std::string(ReleaseReasonTraceName(tracker_.blocked_reason(key)));
  row.holds_gvl = !info.exited && tracker_.holder_known(0) && tracker_.holder(0) == key;
  if (auto it = sums_.find(key); it != sums_.end()) {
    const ThreadSums& s = it->second;
    row.gc_ns = std::min(s.gc_ns, interval_ns);
    row.running_ns = s.running_ns > row.gc_ns ? s.running_ns - row.gc_ns : 0;
    row.gvl_wait_ns = s.gvl_wait_ns;
    row.blocked_ns.assign(s.blocked_ns.begin(), s.blocked_ns.end());
    std::stable_sort(row.blocked_ns.begin(), row.blocked_ns.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
  }
  const uint64_t known = row.running_ns + row.gc_ns + row.gvl_wait_ns + row.blocked_total_ns();
  row.idle_ns = interval_ns > known ? interval_ns - known : 0;
  row.where = StackWhere(*stacks_, info.last_stack);
  row.endpoint = StackEndpoint(*stacks_, info.last_stack);
  return row;
}

std::vector<TopBlocker> TopState::Blockers(const AttributionResult& blame) const {
  std::unordered_map<uint32_t, FrameInfo> frames;
  std::unordered_map<uint32_t, std::vector<uint32_t>> stacks;
  for (const auto& [key, ns] : blame.blame_ns) {
    const std::vector<uint32_t>* ids = key.stack != 0 ? stacks_->stack(key.stack) : nullptr;
    if (ids == nullptr || !stacks.try_emplace(key.stack, *ids).second) continue;
    for (uint32_t id : *ids) {
      if (const FrameInfo* f = stacks_->frame(id)) frames.try_emplace(id, *f);
    }
  }
  std::vector<TopBlocker> out;
  for (const Blocker& b : GroupBlockers(blame, frames, stacks)) {
    if (out.size() == kMaxRows) break;
    TopBlocker row{b.method, b.ns, {}};
    for (const BlockerHolder& h : b.holders) {
      if (std::optional<uint32_t> t = TraceRubyThread(h.key)) row.holders.push_back(*t);
    }
    out.push_back(std::move(row));
  }
  return out;
}

std::vector<TopBlockedStack> TopState::BlockedStacks() const {
  std::vector<TopBlockedStack> out;
  for (const auto& [state_stack, sums] : where_) {
    TopBlockedStack row{state_stack.first, StackWhere(*stacks_, state_stack.second), sums.first, {}};
    for (const auto& [key, ns] : sums.second) row.threads.push_back(TraceRubyThread(key).value_or(0));
    out.push_back(std::move(row));
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.ns > b.ns; });
  if (out.size() > kMaxRows) out.resize(kMaxRows);
  return out;
}

TopSnapshot TopState::Cut(uint64_t cut_ns) {
  if (!started_) Start(cut_ns);
  cut_ns = std::max({cut_ns, last_event_ns_, interval_start_ns_});
  tracker_.Cut(cut_ns);
  AttributionResult blame;
  blame_.DrainBlame(tracker_.oldest_open_wait_ns(cut_ns), &blame);

  TopSnapshot snap;
  snap.pid = pid_;
  snap.ruby_version = ruby_version_;
  snap.number = ++number_;
  snap.start_ns = interval_start_ns_;
  snap.end_ns = cut_ns;
  if (tracker_.holder_known(0) && tracker_.holder(0) != 0) snap.gvl_holder = TraceRubyThread(tracker_.holder(0));
  snap.events = events_;
  snap.dropped = dropped_;
  for (const auto& [key, info] : threads_) {
    if (info.exited && sums_.count(key) == 0) continue;
    snap.threads.push_back(ThreadRow(key, info, snap.interval_ns()));
  }
  std::stable_sort(snap.threads.begin(), snap.threads.end(), TopThreadOrder);
  snap.blockers = Blockers(blame);
  snap.blocked_stacks = BlockedStacks();

  // Memory stays that of the live threads: exited ones are forgotten here and in the tracker (which would keep their
  // markers otherwise); no live thread's state is dropped however long it stays blocked.
  for (const auto& [key, seen] : threads_) {
    if (seen.exited && key != TraceThreadKey(1)) infos_.erase(TraceRubyThread(key).value_or(0));
  }
  std::erase_if(threads_, [](const auto& kv) { return kv.second.exited; });
  tracker_.PruneIdle(std::numeric_limits<uint32_t>::max());
  sums_.clear();
  where_.clear();
  events_ = dropped_ = 0;
  interval_start_ns_ = cut_ns;
  return snap;
}

}  // namespace rvbpfd
