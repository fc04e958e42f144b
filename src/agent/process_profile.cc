#include "agent/process_profile.h"

#include <algorithm>
#include <functional>

#include "export/pprof.h"
#include "export/pprof_builder.h"
#include "rvbpfd/abi.h"

namespace rvbpfd {
namespace {

// Bytes glibc's malloc takes for a request of n bytes: n plus its 8-byte header, rounded up to 16, at least 32.
constexpr size_t HeapChunk(size_t n) {
  return n == 0 ? 0 : std::max<size_t>(32, (n + 8 + 15) & ~size_t{15});
}
size_t StringHeap(const std::string& s) {
  // libstdc++ keeps strings of up to 15 chars inside the object.
  return s.capacity() > 15 ? HeapChunk(s.capacity() + 1) : 0;
}
template <typename T>
size_t VectorHeap(const std::vector<T>& v) {
  return HeapChunk(v.capacity() * sizeof(T));
}
// Buckets plus one node per element (next pointer, the value, and the cached hash libstdc++ keeps for hashers that
// may throw, as ours may).
template <typename Set>
size_t HashSetHeap(const Set& s, size_t value_bytes, bool cached_hash) {
  const size_t buckets = s.bucket_count() > 1 ? HeapChunk(s.bucket_count() * sizeof(void*)) : 0;
  const size_t node = HeapChunk(sizeof(void*) + ((value_bytes + 7) & ~size_t{7}) + (cached_hash ? sizeof(size_t) : 0));
  return buckets + s.size() * node;
}

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
  if (!may_add) return 0;
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
  // Fullness is decided once per stack: a stack begun is finished, so the cap is passed by at most one stack.
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

void ProfileStackTable::ClearMemo() {
  memo_.clear();
  for (StackMemo& m : stack_memo_) m.frames.clear();
}

uint32_t ProfileStackTable::Intern(std::span<const SharedFrame> frames) {
  if (memo_.size() > kMemoSlack + 2 * frames_.size()) ClearMemo();
  if (stack_memo_.empty()) stack_memo_.resize(kStackMemoSlots);
  uint64_t h = frames.size();
  for (const SharedFrame& f : frames) h = MixHash(h ^ reinterpret_cast<uintptr_t>(f.get()));
  StackMemo& sm = stack_memo_[h % kStackMemoSlots];
  if (sm.id != 0 && sm.frames.size() == frames.size() &&
      std::equal(frames.begin(), frames.end(), sm.frames.begin(),
                 [](const SharedFrame& a, const FrameInfo* b) { return a.get() == b; })) {
    return sm.id;  // what interning these values again would return: the stack exists
  }
  const uint32_t id = InternShared(frames);
  if (id != 0) {
    sm.frames.clear();
    for (const SharedFrame& f : frames) sm.frames.push_back(f.get());
    sm.id = id;
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
  for (const StackMemo& m : stack_memo_) stacks += VectorHeap(m.frames);
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
    : sample_period_ns_(sample_period_ns), limits_(limits) {
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
    for (auto& [th, t] : threads_) {
      t.wait_stack = remap(t.wait_stack);
      t.release_stack = remap(t.release_stack);
      t.last_sample_stack = remap(t.last_sample_stack);
    }
    gc_base_stack_ = remap(gc_base_stack_);
  }
  table_ = std::move(next);
  special_ = s;
}

ProcessProfile::ThreadState& ProcessProfile::Thread(uint64_t th) {
  // Consecutive events are mostly about one thread (READY, RESUMED, SUSPENDED of one hand-off): one compare instead
  // of a hash lookup. Node-based map: the pointer stays valid until that element is erased (exit, pruning in Cut),
  // where it is reset.
  if (th != cached_th_ || cached_thread_ == nullptr) {
    cached_thread_ = &threads_[th];
    cached_th_ = th;
  }
  cached_thread_->idle_cuts = 0;
  return *cached_thread_;
}

uint32_t ProcessProfile::InternOrFull(const StackInput& frames) {
  const uint32_t id = frames.shared.empty() ? table_->Intern(frames.values) : table_->Intern(frames.shared);
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

uint32_t ProcessProfile::WaitStack(const ThreadState& t) const {
  // A stack still unknown when the wait began may have been learned from a sample during it.
  if (t.wait_stack != 0) return t.wait_stack;
  if (t.last_sample_stack != 0) return t.last_sample_stack;
  return special_.no_stack;
}

void ProcessProfile::EndWait(ThreadState& t, uint64_t end_ns) {
  if (end_ns > t.wait_start_ns) weights_[WaitStack(t)].wait_ns += end_ns - t.wait_start_ns;
  t.waiting = false;
  t.wait_stack = 0;
}

void ProcessProfile::EndHold(ThreadState& t, uint64_t end_ns, uint32_t stack) {
  if (stack == 0) stack = special_.no_stack;
  if (end_ns > t.hold_start_ns) weights_[stack].held_ns += end_ns - t.hold_start_ns;
  t.holding = false;
}

void ProcessProfile::EndGc(uint64_t end_ns) {
  if (end_ns > gc_start_ns_) weights_[GcStack(gc_base_stack_)].gc_ns += end_ns - gc_start_ns_;
  gc_open_ = false;
  gc_th_ = 0;
  gc_base_stack_ = 0;
}

void ProcessProfile::DiscardOpenSpans() {
  for (auto& [th, t] : threads_) {
    if (t.waiting) {
      ++interval_discarded_waits_;
      ++stats_.spans_discarded;
      t.waiting = false;
      t.wait_stack = 0;
    }
    if (t.holding) {
      ++interval_discarded_holds_;
      ++stats_.spans_discarded;
      t.holding = false;
    }
  }
  if (gc_open_) {
    ++interval_discarded_gcs_;
    ++stats_.spans_discarded;
    gc_open_ = false;
    gc_th_ = 0;
    gc_base_stack_ = 0;
  }
  owner_th_ = 0;  // whoever held the lock may have released it in the lost events
}

void ProcessProfile::OnSample(uint64_t /*ts_ns*/, uint64_t th, bool in_gc, std::span<const FrameInfo> frames) {
  Sample(th, in_gc, StackInput{frames, {}});
}

void ProcessProfile::OnSample(uint64_t /*ts_ns*/, uint64_t th, bool in_gc, std::span<const SharedFrame> frames) {
  Sample(th, in_gc, StackInput{{}, frames});
}

void ProcessProfile::OnEvent(uint64_t ts_ns, uint64_t th, uint32_t kind, std::span<const FrameInfo> frames) {
  Event(ts_ns, th, kind, StackInput{frames, {}});
}

void ProcessProfile::OnEvent(uint64_t ts_ns, uint64_t th, uint32_t kind, std::span<const SharedFrame> frames) {
  Event(ts_ns, th, kind, StackInput{{}, frames});
}

void ProcessProfile::Sample(uint64_t th, bool in_gc, const StackInput& frames) {
  ++stats_.samples;
  const uint32_t base = frames.empty() ? 0 : InternOrFull(frames);
  uint32_t cpu_stack;
  if (in_gc) {
    cpu_stack = GcStack(base);
  } else {
    cpu_stack = base != 0 ? base : special_.no_stack;
  }
  ++weights_[cpu_stack].samples;
  if (th != 0) {
    ThreadState& t = Thread(th);
    if (base != 0) t.last_sample_stack = base;
  }
  // A sample inside the open GC shows where that GC was triggered: better than the thread's older sample.
  if (in_gc && gc_open_ && base != 0 && (gc_th_ == 0 || gc_th_ == th)) {
    gc_base_stack_ = base;
    if (gc_th_ == 0) gc_th_ = th;
  }
}

void ProcessProfile::Event(uint64_t ts_ns, uint64_t th, uint32_t kind, const StackInput& frames) {
  ++stats_.events;
  switch (kind) {
    case RV_EV_GC_ENTER: {
      if (gc_open_) return;  // a nested or repeated enter: the first one started this GC
      gc_open_ = true;
      gc_start_ns_ = ts_ns;
      gc_th_ = th != 0 ? th : owner_th_;  // GC runs on the thread holding the GVL
      gc_base_stack_ = 0;
      if (gc_th_ != 0) {
        auto it = threads_.find(gc_th_);
        if (it != threads_.end()) gc_base_stack_ = it->second.last_sample_stack;
      }
      return;
    }
    case RV_EV_GC_EXIT:
      if (gc_open_) EndGc(ts_ns);
      return;
    case RV_EV_THREAD_STARTED:
    case RV_EV_THREAD_READY:
    case RV_EV_THREAD_RESUMED:
    case RV_EV_THREAD_SUSPENDED:
    case RV_EV_THREAD_EXITED:
      break;
    default:
      return;  // sleep/mutex probes and unknown kinds carry nothing these profiles count
  }
  if (th == 0) return;  // a scheduler event about no known thread cannot be attributed

  switch (kind) {
    case RV_EV_THREAD_STARTED: {
      auto [it, inserted] = threads_.try_emplace(th);
      if (!inserted) {
        // A th reused after an exit we did not see: the old thread's open spans have no end.
        ThreadState& old = it->second;
        if (old.waiting) {
          ++interval_discarded_waits_;
          ++stats_.spans_discarded;
        }
        if (old.holding) {
          ++interval_discarded_holds_;
          ++stats_.spans_discarded;
        }
        old = ThreadState{};
      }
      if (owner_th_ == th) owner_th_ = 0;
      return;
    }
    case RV_EV_THREAD_EXITED: {
      auto it = threads_.find(th);
      if (it != threads_.end()) {
        ThreadState& t = it->second;
        // CRuby 3.3+ fires SUSPENDED before EXITED, so a hold still open here lost its release: it ended by the exit.
        if (t.holding) EndHold(t, ts_ns, t.last_sample_stack);
        if (t.waiting) {
          ++interval_discarded_waits_;
          ++stats_.spans_discarded;
        }
        if (cached_thread_ == &it->second) cached_thread_ = nullptr;
        threads_.erase(it);
      }
      if (owner_th_ == th) owner_th_ = 0;
      return;
    }
    case RV_EV_THREAD_READY: {
      ThreadState& t = Thread(th);
      if (t.holding) {
        // Wanting the lock while holding it means a release we did not see (3.2 timeslices): the hold ends here.
        EndHold(t, ts_ns, t.last_sample_stack);
        if (owner_th_ == th) owner_th_ = 0;
      }
      if (t.waiting) return;  // a repeated READY does not restart the wait
      t.waiting = true;
      t.wait_start_ns = ts_ns;
      if (!frames.empty()) {
        t.wait_stack = InternOrFull(frames);
      } else {
        t.wait_stack = t.release_stack;  // 0 when it ran since: decided at the end (latest sample, else no stack)
      }
      return;
    }
    case RV_EV_THREAD_RESUMED: {
      ThreadState& t = Thread(th);
      if (t.waiting) EndWait(t, ts_ns);
      t.release_stack = 0;  // it runs again: its last release no longer says what it waits for
      if (!t.holding) {
        t.holding = true;
        t.hold_start_ns = ts_ns;
      }
      owner_th_ = th;
      return;
    }
    case RV_EV_THREAD_SUSPENDED: {
      ThreadState& t = Thread(th);
      const uint32_t released_in = frames.empty() ? 0 : InternOrFull(frames);
      t.release_stack = released_in;
      if (t.waiting) {
        // Releasing the lock while waiting for it cannot happen in order: the wait's acquisition was not seen.
        ++interval_discarded_waits_;
        ++stats_.spans_discarded;
        t.waiting = false;
        t.wait_stack = 0;
      }
      if (t.holding) EndHold(t, ts_ns, released_in != 0 ? released_in : t.last_sample_stack);
      if (owner_th_ == th) owner_th_ = 0;
      return;
    }
    default:
      return;
  }
}

void ProcessProfile::OnEventsLost() { DiscardOpenSpans(); }

void ProcessProfile::OnTracingPaused(uint64_t /*ts_ns*/) { DiscardOpenSpans(); }

void ProcessProfile::OnTracingResumed(uint64_t /*ts_ns*/) { DiscardOpenSpans(); }

std::string ProcessProfile::BuildOne(std::string_view type, const std::vector<uint32_t>& stacks, bool cpu,
                                     uint64_t Weights::*member, int64_t interval_start_unix_ns, int64_t duration_ns,
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
    const Weights& w = weights_.at(stack);
    const uint64_t v = w.*member;
    if (v == 0) continue;
    locations.clear();
    for (uint32_t f : table_->stack(stack)) {
      uint64_t& loc = location_of_frame[f];
      if (loc == 0) loc = b.Location(table_->frame(f));
      locations.push_back(loc);
    }
    std::vector<int64_t> values;
    if (cpu) {
      values = {static_cast<int64_t>(v), static_cast<int64_t>(v * sample_period_ns_)};
    } else {
      values = {static_cast<int64_t>(v)};
    }
    // Cannot fail: the value count matches the sample types and the ids come from Location.
    (void)b.AddSample(std::span<const uint64_t>(locations), values);
  }
  return b.Build();
}

std::vector<BuiltProfile> ProcessProfile::Cut(uint64_t cut_ns, int64_t interval_start_unix_ns,
                                              int64_t duration_ns) {
  // The parts of open spans before the cut belong to this interval; they continue from the cut.
  for (auto& [th, t] : threads_) {
    if (t.waiting && cut_ns > t.wait_start_ns) {
      weights_[WaitStack(t)].wait_ns += cut_ns - t.wait_start_ns;
      t.wait_start_ns = cut_ns;
    }
    if (t.holding && cut_ns > t.hold_start_ns) {
      // The release (and its stack) is still to come: what the thread was last seen running stands in.
      weights_[t.last_sample_stack != 0 ? t.last_sample_stack : special_.no_stack].held_ns +=
          cut_ns - t.hold_start_ns;
      t.hold_start_ns = cut_ns;
    }
  }
  if (gc_open_ && cut_ns > gc_start_ns_) {
    weights_[GcStack(gc_base_stack_)].gc_ns += cut_ns - gc_start_ns_;
    gc_start_ns_ = cut_ns;
  }

  std::vector<uint32_t> stacks;
  stacks.reserve(weights_.size());
  Weights total;
  for (const auto& [id, w] : weights_) {
    stacks.push_back(id);
    total.samples += w.samples;
    total.wait_ns += w.wait_ns;
    total.held_ns += w.held_ns;
    total.gc_ns += w.gc_ns;
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
  struct Kind {
    std::string_view type;
    bool cpu;
    uint64_t Weights::*member;
    uint64_t total;
    uint64_t discarded;
    std::string_view what;
  };
  const Kind kinds[] = {
      {"cpu", true, &Weights::samples, total.samples, 0, ""},
      {"gvl_wait", false, &Weights::wait_ns, total.wait_ns, interval_discarded_waits_, "GVL waits"},
      {"gvl_held", false, &Weights::held_ns, total.held_ns, interval_discarded_holds_, "GVL holds"},
      {"gc", false, &Weights::gc_ns, total.gc_ns, interval_discarded_gcs_, "GCs"},
  };
  std::vector<BuiltProfile> out;
  for (const Kind& k : kinds) {
    if (k.total == 0) continue;
    const std::string raw =
        BuildOne(k.type, stacks, k.cpu, k.member, interval_start_unix_ns, duration_ns, with(k.discarded, k.what));
    Result<std::string> gz = Gzip(raw);
    if (!gz.ok()) {
      ++stats_.build_failures;
      continue;
    }
    out.push_back(BuiltProfile{std::string(k.type), std::move(gz.value()), k.total});
  }

  // A new interval: weights and per-interval counts start over; memory goes back to what live state needs.
  std::unordered_map<uint32_t, Weights>().swap(weights_);
  interval_discarded_waits_ = interval_discarded_holds_ = interval_discarded_gcs_ = interval_over_cap_ = 0;
  for (auto it = threads_.begin(); it != threads_.end();) {
    ThreadState& t = it->second;
    if (!t.waiting && !t.holding && t.idle_cuts >= limits_.idle_cuts_before_prune) {
      if (cached_thread_ == &it->second) cached_thread_ = nullptr;
      it = threads_.erase(it);
      ++stats_.threads_pruned;
    } else {
      ++t.idle_cuts;
      ++it;
    }
  }
  if (threads_.bucket_count() > 64 && threads_.bucket_count() > 4 * threads_.size()) threads_.rehash(0);
  if (table_->approx_memory_bytes() > limits_.reset_above_bytes) {
    NewTable();
    ++stats_.table_resets;
  }
  return out;
}

size_t ProcessProfile::approx_memory_bytes() const {
  return sizeof(*this) + HeapChunk(sizeof(ProfileStackTable)) + table_->approx_memory_bytes() +
         table_->memo_memory_bytes() +
         HashSetHeap(threads_, sizeof(std::pair<const uint64_t, ThreadState>), false) +
         HashSetHeap(weights_, sizeof(std::pair<const uint32_t, Weights>), false);
}

}  // namespace rvbpfd
