#include "agent/process_profile.h"

#include <algorithm>
#include <functional>

#include "common/heap_estimate.h"
#include "export/export_util.h"
#include "export/pprof.h"
#include "export/pprof_builder.h"
#include "model/endpoint.h"
#include "rvbpfd/abi.h"
#include "target/pid_namespace.h"
#include "trace/reader.h"

namespace rvbpfd {
namespace {

// Reserves room for `extra` more elements growing by a quarter (at least 256), not by doubling.
template <typename T>
void GrowByQuarter(std::vector<T>* v, size_t extra) {
  if (v->size() + extra <= v->capacity()) return;
  v->reserve(v->size() + extra + std::max<size_t>(v->capacity() / 4, 256));
}

// libstdc++'s deque allocates blocks of 512 bytes' worth of elements, plus a map of block pointers.
template <typename T>
size_t DequeHeap(const std::deque<T>& d) {
  constexpr size_t kPerBlock = sizeof(T) < 512 ? 512 / sizeof(T) : 1;
  const size_t blocks = d.size() / kPerBlock + 1;
  return blocks * HeapChunk(kPerBlock * sizeof(T)) + HeapChunk(std::max<size_t>(8, blocks + 2) * sizeof(void*));
}

// gvl_blame's sample labels.
constexpr std::string_view kHolderLabel = "holder";
constexpr std::string_view kWaiterLabel = "waiter";
constexpr std::string_view kSourceLabel = "blame_source";
// gvl_blame's, and gvl_wait's estimated samples': how the ns were known (ProvenanceString).
constexpr std::string_view kProvenanceLabel = "provenance";
// Every sample's: its stack's endpoint (model/endpoint.h).
constexpr std::string_view kEndpointLabel = "endpoint";

const FrameInfo& GcFrame() {
  static const FrameInfo* const kFrame = new FrameInfo{std::string(kGcFrameLabel), "", 0, FrameKind::kGc};
  return *kFrame;
}

}  // namespace

// --- ProfileStackTable ---------------------------------------------------------------------------------------------

ProfileStackTable::ProfileStackTable(size_t max_stacks, size_t max_bytes)
    : max_stacks_(max_stacks),
      max_bytes_(max_bytes),
      stack_offsets_{0},
      frame_index_(0, FrameIdHash{this}, FrameIdEq{this}),
      stack_index_(0, StackIdHash{this}, StackIdEq{this}) {}

size_t ProfileStackTable::FrameIdHash::operator()(const FrameInfo& f) const { return HashFrame(f); }

size_t ProfileStackTable::StackIdHash::operator()(std::span<const uint32_t> ids) const { return HashStackIds(ids); }

bool ProfileStackTable::StackIdEq::operator()(std::span<const uint32_t> s, uint32_t id) const {
  return std::ranges::equal(s, t->stack(id));
}

std::span<const uint32_t> ProfileStackTable::stack(uint32_t id) const {
  if (id == 0 || id > stack_count()) return {};
  return std::span<const uint32_t>(stack_frames_.data() + stack_offsets_[id - 1],
                                   stack_offsets_[id] - stack_offsets_[id - 1]);
}

bool ProfileStackTable::full() const {
  return stack_count() >= max_stacks_ || approx_memory_bytes() >= max_bytes_;
}

size_t ProfileStackTable::approx_memory_bytes() const {
  return DequeHeap(frames_) + frame_string_bytes_ + VectorHeap(stack_frames_) + VectorHeap(stack_offsets_) +
         HashSetHeap(frame_index_, sizeof(uint32_t), true) + HashSetHeap(stack_index_, sizeof(uint32_t), true) +
         VectorHeap(scratch_);
}

uint32_t ProfileStackTable::FrameId(const FrameInfo& f, bool may_add) {
  auto it = frame_index_.find(f);
  if (it != frame_index_.end()) return *it;
  // Also checked per frame: one stack of thousands of new frames with long labels would pass the cap by megabytes.
  if (!may_add || approx_memory_bytes() >= max_bytes_) return 0;
  frames_.push_back(f);
  frame_string_bytes_ += StringHeap(frames_.back().label) + StringHeap(frames_.back().path);
  const auto id = static_cast<uint32_t>(frames_.size());
  frame_index_.insert(id);
  return id;
}

uint32_t ProfileStackTable::InternIds(std::span<const uint32_t> ids) {
  auto it = stack_index_.find(ids);
  if (it != stack_index_.end()) return *it;
  GrowByQuarter(&stack_frames_, ids.size());
  GrowByQuarter(&stack_offsets_, 1);
  stack_frames_.insert(stack_frames_.end(), ids.begin(), ids.end());
  stack_offsets_.push_back(static_cast<uint32_t>(stack_frames_.size()));
  const auto id = static_cast<uint32_t>(stack_count());
  stack_index_.insert(id);
  return id;
}

uint32_t ProfileStackTable::Intern(std::span<const FrameInfo> frames, const FrameInfo* top) {
  // Fullness is decided once per stack, and FrameId checks the byte cap again per new frame: a stack cut short goes
  // to "[stack table full]" (its frames stay), so the cap is passed by at most one frame.
  const bool may_add = !full();
  scratch_.clear();
  if (top != nullptr) {
    const uint32_t id = FrameId(*top, may_add);
    if (id == 0) return 0;
    scratch_.push_back(id);
  }
  for (const FrameInfo& f : frames) {
    const uint32_t id = FrameId(f, may_add);
    if (id == 0) return 0;
    scratch_.push_back(id);
  }
  if (!may_add) {
    auto it = stack_index_.find(std::span<const uint32_t>(scratch_));
    return it != stack_index_.end() ? *it : 0;
  }
  return InternIds(scratch_);
}

void ProfileStackTable::ForgetSharedFrames() { ClearMemo(); }

void ProfileStackTable::ClearMemo() {
  memo_.clear();
  for (StackMemo& m : stack_memo_) m = StackMemo{};
}

uint32_t ProfileStackTable::Intern(const SharedStack& stack) {
  if (memo_.size() > kMemoSlack + 2 * frames_.size()) ClearMemo();
  if (stack_memo_.empty()) stack_memo_.resize(kStackMemoSlots);
  StackMemo* set = &stack_memo_[MixHash(reinterpret_cast<uintptr_t>(stack.get())) % (kStackMemoSlots / 2) * 2];
  // The same object: the same frames, interned before.
  if (set[0].stack == stack) return set[0].id;
  if (set[1].stack == stack) {
    std::swap(set[0], set[1]);
    return set[0].id;
  }
  const uint32_t id = InternShared(*stack);
  if (id != 0) {
    set[1] = std::move(set[0]);  // the least recently used one goes
    set[0] = StackMemo{stack, id};
  }
  return id;
}

uint32_t ProfileStackTable::InternShared(std::span<const SharedFrame> frames) {
  const bool may_add = !full();
  scratch_.clear();
  for (const SharedFrame& f : frames) {
    auto it = memo_.find(f.get());
    uint32_t id;
    if (it != memo_.end()) {
      id = it->second.second;
    } else {
      id = FrameId(*f, may_add);
      if (id == 0) return 0;
      memo_.emplace(f.get(), std::make_pair(f, id));
    }
    scratch_.push_back(id);
  }
  if (!may_add) {
    auto it = stack_index_.find(std::span<const uint32_t>(scratch_));
    return it != stack_index_.end() ? *it : 0;
  }
  return InternIds(scratch_);
}

size_t ProfileStackTable::memo_memory_bytes() const {
  size_t stacks = VectorHeap(stack_memo_);
  for (const StackMemo& m : stack_memo_) stacks += m.stack ? sizeof(*m.stack) + VectorHeap(*m.stack) : 0;
  return stacks +
         HashSetHeap(memo_, sizeof(std::pair<const FrameInfo* const, std::pair<SharedFrame, uint32_t>>), false);
}

uint32_t ProfileStackTable::InternOnTop(const FrameInfo& top, uint32_t base) {
  const bool may_add = !full();
  const uint32_t top_id = FrameId(top, may_add);
  if (top_id == 0) return 0;
  scratch_.clear();
  scratch_.push_back(top_id);
  const std::span<const uint32_t> rest = stack(base);
  scratch_.insert(scratch_.end(), rest.begin(), rest.end());
  if (!may_add) {
    auto it = stack_index_.find(std::span<const uint32_t>(scratch_));
    return it != stack_index_.end() ? *it : 0;
  }
  return InternIds(scratch_);
}

// --- ProcessProfile ------------------------------------------------------------------------------------------------

ProcessProfile::ProcessProfile(uint64_t sample_period_ns) : ProcessProfile(sample_period_ns, ProcessProfileLimits{}) {}

ProcessProfile::ProcessProfile(uint64_t sample_period_ns, ProcessProfileLimits limits)
    : sample_period_ns_(sample_period_ns),
      limits_(limits),
      tracker_([this](const Span& s) { OnSpan(s); }),
      blame_(AttributionOptions{.blame_cut_waits = true,
                                .wall = false,
                                .estimate_paused = true,
                                .sample_period_ns = std::max<uint64_t>(sample_period_ns, 1)}) {
  NewTable();
}

ProcessProfile::~ProcessProfile() = default;

void ProcessProfile::NewTable() {
  auto next = std::make_unique<ProfileStackTable>(limits_.max_stacks, limits_.max_table_bytes);
  // The stand-ins are interned first, so a full table still has them.
  const FrameInfo no_stack{std::string(kNoStackFrame), "", 0, FrameKind::kUnresolved};
  const FrameInfo full{std::string(kStackTableFullFrame), "", 0, FrameKind::kUnresolved};
  SpecialStacks s;
  s.no_stack = next->Intern(std::span<const FrameInfo>(&no_stack, 1));
  s.gc_only = next->Intern(std::span<const FrameInfo>(&GcFrame(), 1));
  s.full = next->Intern(std::span<const FrameInfo>(&full, 1));
  s.gc_full = next->InternOnTop(GcFrame(), s.full);
  const FrameInfo gvl_free{std::string(kGvlFreeFrame), "", 0, FrameKind::kUnresolved};
  const FrameInfo holder_unknown{std::string(kHolderUnknownFrame), "", 0, FrameKind::kUnresolved};
  s.gvl_free = next->Intern(std::span<const FrameInfo>(&gvl_free, 1));
  s.holder_unknown = next->Intern(std::span<const FrameInfo>(&holder_unknown, 1));

  if (table_) {
    // Only thread state and an open GC refer to stacks between intervals (the weights were just emptied).
    std::unordered_map<uint32_t, uint32_t> moved;
    std::vector<FrameInfo> frames;
    auto remap = [&](uint32_t id) -> uint32_t {
      if (id == 0) return 0;
      auto it = moved.find(id);
      if (it != moved.end()) return it->second;
      frames.clear();
      for (uint32_t f : table_->stack(id)) frames.push_back(table_->frame(f));
      uint32_t to = next->Intern(frames);
      if (to == 0) to = s.full;  // cannot happen: the new table holds at most a few stacks per thread
      moved.emplace(id, to);
      return to;
    };
    tracker_.RemapStacks(remap);
    blame_.RemapStacks(remap);
  }
  table_ = std::move(next);
  special_ = s;
  ForgetEndpoints();  // stack ids start over
}

void ProcessProfile::ForgetEndpoints() {
  std::vector<uint32_t>().swap(endpoint_of_stack_);
  endpoint_names_.assign(1, std::string(kNoEndpoint));
  endpoint_names_.shrink_to_fit();
  std::unordered_map<std::string, uint32_t>().swap(endpoint_ids_);
}

std::string_view ProcessProfile::EndpointOf(uint32_t stack) {
  if (stack == 0) return endpoint_names_[0];
  if (stack >= endpoint_of_stack_.size()) endpoint_of_stack_.resize(stack + 1, 0);
  uint32_t& slot = endpoint_of_stack_[stack];
  if (slot == 0) {
    std::vector<const FrameInfo*> frames;
    for (uint32_t f : table_->stack(stack)) frames.push_back(&table_->frame(f));
    Endpoint e = DeriveEndpoint(std::span<const FrameInfo* const>(frames));
    uint32_t index = 0;
    if (e.rule != EndpointRule::kNone) {
      if (auto it = endpoint_ids_.find(e.name); it != endpoint_ids_.end()) {
        index = it->second;
      } else if (endpoint_names_.size() <= kMaxEndpoints) {
        index = static_cast<uint32_t>(endpoint_names_.size());
        endpoint_ids_.emplace(e.name, index);
        endpoint_names_.push_back(std::move(e.name));
      } else {
        index = kOtherEndpointsIndex;
      }
    }
    slot = index + 1;
  }
  return slot - 1 == kOtherEndpointsIndex ? kOtherEndpoints : std::string_view(endpoint_names_[slot - 1]);
}

uint32_t ProcessProfile::InternOrFull(const StackInput& frames) {
  const uint32_t id = frames.shared != nullptr ? table_->Intern(*frames.shared) : table_->Intern(frames.values);
  if (id != 0) return id;
  ++stats_.stacks_over_cap;
  ++interval_over_cap_;
  return special_.full;
}

uint32_t ProcessProfile::GcStack(uint32_t base) {
  if (base == 0) return special_.gc_only;
  const uint32_t id = table_->InternOnTop(GcFrame(), base);
  if (id != 0) return id;
  ++stats_.stacks_over_cap;
  ++interval_over_cap_;
  return special_.gc_full;
}

void ProcessProfile::OnSpan(const Span& s) {
  blame_.OnSpan(s);
  uint64_t Weights::*member = nullptr;
  uint64_t* discarded = nullptr;
  switch (s.kind) {
    case SpanKind::kGvlWait:
      member = &Weights::wait_ns;
      discarded = &interval_discarded_waits_;
      break;
    case SpanKind::kGvlHold:
      member = &Weights::held_ns;
      discarded = &interval_discarded_holds_;
      break;
    case SpanKind::kGc:
      member = &Weights::gc_ns;
      discarded = &interval_discarded_gcs_;
      break;
    default:
      return;  // blocked and holder spans have no profile of their own
  }
  if (!s.counted) {
    ++*discarded;
    ++stats_.spans_discarded;
    return;
  }
  if (s.end_ns <= s.start_ns) return;
  uint32_t stack;
  if (s.kind == SpanKind::kGc) {
    stack = GcStack(s.stack);
  } else {
    stack = s.stack != 0 ? s.stack : special_.no_stack;
  }
  weights_[stack].*member += s.end_ns - s.start_ns;
}

void ProcessProfile::OnSample(uint64_t ts_ns, uint64_t th, bool in_gc, std::span<const FrameInfo> frames,
                              const GvlReading* gvl) {
  Sample(ts_ns, th, in_gc, StackInput{frames, {}}, gvl);
}

void ProcessProfile::OnSample(uint64_t ts_ns, uint64_t th, bool in_gc, const SharedStack& stack,
                              const GvlReading* gvl) {
  Sample(ts_ns, th, in_gc, StackInput{{}, &stack}, gvl);
}

void ProcessProfile::OnEvent(uint64_t ts_ns, uint64_t th, uint32_t kind, std::span<const FrameInfo> frames) {
  Event(ts_ns, th, kind, StackInput{frames, {}});
}

void ProcessProfile::OnEvent(uint64_t ts_ns, uint64_t th, uint32_t kind, const SharedStack& stack) {
  Event(ts_ns, th, kind, StackInput{{}, &stack});
}

void ProcessProfile::OnContention(uint64_t ts_ns, uint64_t holder, const SharedStack& stack) {
  if (holder == 0 || stack == nullptr || stack->empty()) return;
  const uint32_t id = InternOrFull(StackInput{{}, &stack});
  blame_.OnContention(ts_ns, holder, id);
  if (blame_.kept() >= blame_drain_at_) DrainBlame(ts_ns);
}

void ProcessProfile::Sample(uint64_t ts_ns, uint64_t th, bool in_gc, const StackInput& frames,
                            const GvlReading* gvl) {
  ++stats_.samples;
  const uint32_t base = frames.empty() ? 0 : InternOrFull(frames);
  uint32_t cpu_stack;
  if (in_gc) {
    cpu_stack = GcStack(base);
  } else {
    cpu_stack = base != 0 ? base : special_.no_stack;
  }
  ++weights_[cpu_stack].samples;
  tracker_.OnSample(th, base, in_gc);
  blame_.OnSample(ts_ns, th, base, in_gc);
  if (gvl != nullptr) {
    // The agent's thread keys are the VM's rb_thread_t pointers, which the reading names.
    blame_.OnGvlReading(GvlSample{.t_ns = ts_ns,
                                  .sampled = th,
                                  .stack = base,
                                  .in_gc = in_gc,
                                  .held = gvl->held,
                                  .holder = gvl->holder_th,
                                  .waiting = gvl->waiting,
                                  .queued = gvl->queued_th});
  }
  if (blame_.kept() >= blame_drain_at_) DrainBlame(ts_ns);
}

void ProcessProfile::DrainBlame(uint64_t now_ns) {
  ++stats_.blame_drains;
  blame_.DrainEstimate(now_ns, &interval_blame_);
  blame_.DrainBlame(tracker_.oldest_open_wait_ns(now_ns), &interval_blame_);
  // What the open waits still need stays; the next drain comes once as much again has been kept.
  blame_drain_at_ = std::max(kBlameDrainMin, 2 * blame_.kept());
}

void ProcessProfile::Event(uint64_t ts_ns, uint64_t th, uint32_t kind, const StackInput& frames) {
  ++stats_.events;
  if (!ReadsEvent(kind)) return;
  TrackerEvent e;
  e.t_ns = ts_ns;
  e.thread = th;
  switch (kind) {
    case RV_EV_GC_ENTER: e.event = EventName::kGcEnter; break;
    case RV_EV_GC_EXIT: e.event = EventName::kGcExit; break;
    case RV_EV_THREAD_STARTED:
      e.event = EventName::kThreadStarted;
      // A thread at a reused thread pointer is a new thread: it gets a number of its own.
      thread_numbers_.erase(th);
      thread_infos_.erase(th);
      std::erase(exited_threads_, th);
      break;
    case RV_EV_THREAD_READY: e.event = EventName::kWantsGvl; break;
    case RV_EV_THREAD_RESUMED: e.event = EventName::kGvlAcquired; break;
    case RV_EV_THREAD_SUSPENDED: e.event = EventName::kGvlReleased; break;
    case RV_EV_THREAD_EXITED:
      e.event = EventName::kThreadExited;
      if (th != 0) exited_threads_.push_back(th);
      break;
    default:
      return;  // not reached: ReadsEvent
  }
  // Only the stacks the tracker can attribute are interned: a gvl_released's, and a wants_gvl's that begins a wait
  // (a repeated one's is not used), of a known thread.
  if (th != 0 && !frames.empty() &&
      (kind == RV_EV_THREAD_SUSPENDED || (kind == RV_EV_THREAD_READY && !tracker_.waiting(th)))) {
    e.stack = InternOrFull(frames);
  }
  tracker_.OnEvent(e);
  blame_.OnThreadEvent(ts_ns, th, e.event);  // which thread states a pause leaves unobserved
  if (blame_.kept() >= blame_drain_at_) DrainBlame(ts_ns);
}

void ProcessProfile::Gap(EventName event, uint64_t ts_ns) {
  TrackerEvent e;
  e.t_ns = ts_ns;
  e.event = event;
  tracker_.OnEvent(e);
  if (event == EventName::kTracingPaused) blame_.OnPause(ts_ns);
  if (event == EventName::kTracingResumed) blame_.OnResume(ts_ns);
}

void ProcessProfile::OnEventsLost() { Gap(EventName::kEventsDropped, 0); }

void ProcessProfile::OnTracingPaused(uint64_t ts_ns) { Gap(EventName::kTracingPaused, ts_ns); }

void ProcessProfile::OnTracingResumed(uint64_t ts_ns) { Gap(EventName::kTracingResumed, ts_ns); }

std::string ProcessProfile::BuildOne(std::string_view type, const std::vector<uint32_t>& stacks, bool cpu,
                                     uint64_t Weights::*member, uint64_t Weights::*inferred,
                                     int64_t interval_start_unix_ns, int64_t duration_ns,
                                     const std::vector<std::string>& comments) {
  PprofBuilder b;
  if (cpu) {
    b.AddSampleType("samples", "count");
    b.AddSampleType("cpu", "nanoseconds");
    b.SetPeriod("cpu", "nanoseconds", static_cast<int64_t>(sample_period_ns_));
  } else {
    b.AddSampleType(type, "nanoseconds");
    b.SetPeriod(type, "nanoseconds", 1);  // values are ns themselves, not counts of a sampling period
  }
  b.SetDefaultSampleType(cpu ? "cpu" : type);
  b.SetTimeNanos(interval_start_unix_ns);
  b.SetDurationNanos(duration_ns);
  for (const std::string& c : comments) b.AddComment(c);

  std::vector<uint64_t> location_of_frame(table_->frame_count() + 1, 0);  // table frame id -> location id
  std::vector<uint64_t> locations;
  for (uint32_t stack : stacks) {
    const Weights& w = *weights_.find(stack);  // every id in `stacks` has weights
    const uint64_t v = w.*member;
    const uint64_t guessed = inferred != nullptr ? w.*inferred : 0;
    if (v == 0 && guessed == 0) continue;
    locations.clear();
    for (uint32_t f : table_->stack(stack)) {
      uint64_t& loc = location_of_frame[f];
      if (loc == 0) loc = b.Location(table_->frame(f));
      locations.push_back(loc);
    }
    const std::string_view endpoint = EndpointOf(stack);
    // Cannot fail: the value count matches the sample types and the ids come from Location.
    if (v > 0) {
      const int64_t values[] = {SaturatingToInt64(v), SaturatingToInt64(v * sample_period_ns_)};
      const PprofLabel labels[] = {{.key = kEndpointLabel, .str = endpoint}};
      (void)b.AddSample(std::span<const uint64_t>(locations), std::span<const int64_t>(values, cpu ? 2 : 1), labels);
    }
    if (guessed > 0) {
      const PprofLabel labels[] = {{.key = kProvenanceLabel, .str = ProvenanceString(Provenance::kInferred)},
                                   {.key = kEndpointLabel, .str = endpoint}};
      const int64_t values[] = {SaturatingToInt64(guessed)};
      (void)b.AddSample(std::span<const uint64_t>(locations), values, labels);
    }
  }
  return b.Build();
}

void ProcessProfile::SetThreadInfo(uint64_t th, const ThreadInfo& info) {
  if (th == 0) return;
  if (thread_infos_.size() >= kMaxThreadNames && !thread_infos_.contains(th)) thread_infos_.clear();
  ThreadInfo& t = thread_infos_[th];
  if (info.name) t.name = info.name;
  if (info.native_name) t.native_name = info.native_name;
  if (info.ns_tid) t.ns_tid = info.ns_tid;
}

std::string ProcessProfile::ThreadName(uint64_t th) {
  if (th == 0) return "-";
  std::string name;
  if (auto info = thread_infos_.find(th); info != thread_infos_.end()) {
    auto main = thread_infos_.find(main_th_);
    name = info->second.DisplayName(main != thread_infos_.end() ? main->second.native_name : std::nullopt);
  }
  if (th == main_th_) return ThreadLabelWithName(1, true, name);
  if (thread_numbers_.size() >= kMaxThreadNames && !thread_numbers_.contains(th)) thread_numbers_.clear();
  auto [it, fresh] = thread_numbers_.try_emplace(th, next_thread_number_);
  if (fresh) ++next_thread_number_;
  return ThreadLabelWithName(it->second, false, name);
}

std::string ProcessProfile::BuildBlame(int64_t interval_start_unix_ns, int64_t duration_ns,
                                       const std::vector<std::string>& comments) {
  PprofBuilder b;
  b.AddSampleType("gvl_blame", "nanoseconds");
  b.SetPeriod("gvl_blame", "nanoseconds", 1);
  b.SetDefaultSampleType("gvl_blame");
  b.SetTimeNanos(interval_start_unix_ns);
  b.SetDurationNanos(duration_ns);
  for (const std::string& c : comments) b.AddComment(c);
  std::unordered_map<uint32_t, uint64_t> location_of_frame;  // table frame id -> location id
  std::vector<uint64_t> locations;
  for (const auto& [key, ns] : interval_blame_.blame_ns) {
    if (ns == 0) continue;
    uint32_t stack = key.stack;
    if (stack == 0) {
      stack = key.source == BlameSource::kGvlFree         ? special_.gvl_free
              : key.source == BlameSource::kHolderUnknown ? special_.holder_unknown
                                                          : special_.no_stack;
    }
    if (key.gc) stack = GcStack(key.stack);
    const std::string_view endpoint = EndpointOf(key.stack);  // the holder's: blame its endpoint caused
    locations.clear();
    for (uint32_t f : table_->stack(stack)) {
      uint64_t& loc = location_of_frame[f];
      if (loc == 0) loc = b.Location(table_->frame(f));
      locations.push_back(loc);
    }
    const std::string holder = ThreadName(key.holder), waiter = ThreadName(key.waiter);
    const PprofLabel labels[] = {{.key = kHolderLabel, .str = holder},
                                 {.key = kWaiterLabel, .str = waiter},
                                 {.key = kSourceLabel, .str = BlameSourceName(key.source)},
                                 {.key = kProvenanceLabel, .str = ProvenanceString(key.provenance)},
                                 {.key = kEndpointLabel, .str = endpoint}};
    const int64_t values[] = {SaturatingToInt64(ns)};
    // Cannot fail: one value for the one sample type, ids from Location.
    (void)b.AddSample(std::span<const uint64_t>(locations), values, labels);
  }
  return b.Build();
}

std::vector<BuiltProfile> ProcessProfile::Cut(uint64_t cut_ns, int64_t interval_start_unix_ns,
                                              int64_t duration_ns) {
  // The parts of open spans before the cut belong to this interval; they continue from the cut.
  tracker_.Cut(cut_ns);
  blame_.DrainEstimate(cut_ns, &interval_blame_);
  blame_.DrainBlame(tracker_.oldest_open_wait_ns(cut_ns), &interval_blame_);
  // The waits estimated in paused windows, at the stacks their waiters waited with.
  for (const auto& [key, ns] : interval_blame_.estimated_wait_ns) {
    uint64_t& w = weights_[key.stack != 0 ? key.stack : special_.no_stack].estimated_wait_ns;
    w = SaturatingAdd(w, ns);
  }

  std::vector<uint32_t> stacks;
  stacks.reserve(weights_.size());
  Weights total;
  for (const auto& [id, w] : weights_) {
    stacks.push_back(static_cast<uint32_t>(id));
    total.samples += w.samples;
    total.wait_ns += w.wait_ns;
    total.held_ns += w.held_ns;
    total.gc_ns += w.gc_ns;
    total.estimated_wait_ns += w.estimated_wait_ns;
  }
  std::sort(stacks.begin(), stacks.end());  // deterministic output

  std::vector<std::string> common;
  if (interval_over_cap_ > 0) {
    common.push_back(std::to_string(interval_over_cap_) + " new stacks attributed to " +
                     std::string(kStackTableFullFrame) + ": the per-process stack table was full");
  }
  auto with = [&](uint64_t discarded, std::string_view what) {
    std::vector<std::string> c = common;
    if (discarded > 0) {
      c.push_back(std::to_string(discarded) + " " + std::string(what) +
                  " not counted: events were lost or tracing paused during them");
    }
    return c;
  };
  // Waits estimated in paused windows say so in gvl_wait's and gvl_blame's comments.
  auto with_estimate = [&](std::vector<std::string> c) {
    if (interval_blame_.estimated_gvl_wait_ns > 0) {
      c.push_back(std::to_string(interval_blame_.estimated_gvl_wait_ns / 1'000'000) +
                  " ms of GVL wait estimated from the samples' GVL readings while tracing was paused (" +
                  std::to_string(interval_blame_.paused_ns / 1'000'000) +
                  " ms paused; label provenance=inferred)");
    }
    return c;
  };
  struct Kind {
    std::string_view type;
    bool cpu;
    uint64_t Weights::*member;
    uint64_t Weights::*inferred;
    uint64_t total;
    uint64_t discarded;
    std::string_view what;
  };
  const Kind kinds[] = {
      {"cpu", true, &Weights::samples, nullptr, total.samples, 0, ""},
      {"gvl_wait", false, &Weights::wait_ns, &Weights::estimated_wait_ns,
       SaturatingAdd(total.wait_ns, total.estimated_wait_ns), interval_discarded_waits_, "GVL waits"},
      {"gvl_held", false, &Weights::held_ns, nullptr, total.held_ns, interval_discarded_holds_, "GVL holds"},
      {"gc", false, &Weights::gc_ns, nullptr, total.gc_ns, interval_discarded_gcs_, "GCs"},
  };
  const bool estimated = interval_blame_.estimated_gvl_wait_ns > 0;
  std::vector<BuiltProfile> out;
  for (const Kind& k : kinds) {
    if (k.total == 0) continue;
    std::vector<std::string> comments = with(k.discarded, k.what);
    if (k.inferred != nullptr) comments = with_estimate(std::move(comments));
    const std::string raw = BuildOne(k.type, stacks, k.cpu, k.member, k.inferred, interval_start_unix_ns,
                                     duration_ns, comments);
    Result<std::string> gz = Gzip(raw);
    if (!gz.ok()) {
      ++stats_.build_failures;
      continue;
    }
    std::vector<std::string> label_names;
    if (k.inferred != nullptr && estimated) label_names.emplace_back(kProvenanceLabel);
    label_names.emplace_back(kEndpointLabel);
    out.push_back(
        BuiltProfile{std::string(k.type), std::move(gz.value()), raw.size(), k.total, std::move(label_names)});
  }
  const uint64_t blamed = SaturatingAdd(interval_blame_.total_gvl_wait_ns, interval_blame_.estimated_gvl_wait_ns);
  if (blamed > 0) {
    const std::string raw =
        BuildBlame(interval_start_unix_ns, duration_ns, with_estimate(with(interval_discarded_waits_, "GVL waits")));
    Result<std::string> gz = Gzip(raw);
    if (gz.ok()) {
      out.push_back(BuiltProfile{"gvl_blame", std::move(gz.value()), raw.size(), blamed,
                                 {std::string(kHolderLabel), std::string(kWaiterLabel), std::string(kSourceLabel),
                                  std::string(kProvenanceLabel), std::string(kEndpointLabel)}});
    } else {
      ++stats_.build_failures;
    }
  }

  // A new interval: weights and per-interval counts start over; memory goes back to what live state needs.
  weights_ = FlatMap64<Weights>();
  interval_discarded_waits_ = interval_discarded_holds_ = interval_discarded_gcs_ = interval_over_cap_ = 0;
  interval_blame_ = AttributionResult{};
  blame_drain_at_ = std::max(kBlameDrainMin, 2 * blame_.kept());
  for (uint64_t th : exited_threads_) {
    if (th != main_th_) {
      thread_numbers_.erase(th);
      thread_infos_.erase(th);
    }
  }
  exited_threads_.clear();
  ForgetEndpoints();  // derived again per interval: only the stacks an interval uses cost memory
  stats_.threads_pruned += tracker_.PruneIdle(limits_.idle_cuts_before_prune);
  if (table_->approx_memory_bytes() > limits_.reset_above_bytes) {
    NewTable();
    ++stats_.table_resets;
  }
  return out;
}

size_t ProcessProfile::approx_memory_bytes() const {
  return sizeof(*this) + HeapChunk(sizeof(ProfileStackTable)) + table_->approx_memory_bytes() +
         table_->memo_memory_bytes() +
         tracker_.approx_memory_bytes() + blame_.approx_memory_bytes() +
         weights_.approx_memory_bytes() +
         HashSetHeap(thread_numbers_, sizeof(std::pair<const uint64_t, uint32_t>), false) +
         HashSetHeap(thread_infos_, sizeof(std::pair<const uint64_t, ThreadInfo>), false) +
         thread_infos_.size() * 2 * kMaxTaskCommBytes +
         VectorHeap(exited_threads_) + VectorHeap(endpoint_of_stack_) + VectorHeap(endpoint_names_) +
         HashSetHeap(endpoint_ids_, sizeof(std::pair<const std::string, uint32_t>), false) +
         (endpoint_names_.size() * 2) * kMaxEndpointBytes +
         interval_blame_.blame_ns.size() * HeapChunk(4 * sizeof(void*) + sizeof(std::pair<const BlameKey, uint64_t>));
}

}  // namespace rvbpfd
