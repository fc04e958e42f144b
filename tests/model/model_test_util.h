// Hand-written event sequences for the model's tests (and the exporters'): a small builder that numbers events as
// they are added, so tests can assert which event opened or closed a block.
#ifndef RVBPFD_TESTS_MODEL_MODEL_TEST_UTIL_H_
#define RVBPFD_TESTS_MODEL_MODEL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model.h"
#include "trace/event.h"

namespace rvbpfd::testing {

inline constexpr uint64_t kUs = 1000;        // ns per microsecond
inline constexpr uint64_t kMs = 1000 * kUs;  // ns per millisecond

class EventSeq {
 public:
  // Returns the index the event will have in Model::events() (events are added in time order).
  size_t Add(uint64_t t_ns, EventName event, std::optional<uint32_t> thread = std::nullopt,
             std::optional<uint32_t> native_tid = std::nullopt) {
    TraceEvent e;
    e.t_ns = t_ns;
    e.event = event;
    e.ruby_thread = thread;
    e.native_tid = native_tid;
    e.probe_tid = native_tid;
    e.source = event == EventName::kGcEnter || event == EventName::kGcExit ? kSourceGcHookSite
               : event == EventName::kSleepEnter || event == EventName::kMutexLockEnter ? kSourceProbe
               : thread ? kSourceThreadHookSite
                        : kSourceDaemon;
    events_.push_back(e);
    return events_.size() - 1;
  }
  // A gvl_released carrying a reason the recorder derived from the thread's stack.
  size_t ReleasedWithReason(uint64_t t_ns, uint32_t thread, uint32_t native_tid, const std::string& reason) {
    const size_t i = Add(t_ns, EventName::kGvlReleased, thread, native_tid);
    events_[i].reason = reason;
    events_[i].reason_provenance = Provenance::kDerived;
    return i;
  }
  size_t Dropped(uint64_t t_ns, uint64_t count) {
    const size_t i = Add(t_ns, EventName::kEventsDropped);
    events_[i].count = count;
    return i;
  }
  const std::vector<TraceEvent>& events() const { return events_; }

  Model Build(const std::string& ruby_version = "3.4.8", std::optional<uint32_t> main_thread = 1) const {
    ModelOptions options;
    options.ruby_version = ruby_version;
    options.main_thread = main_thread;
    options.pid = 4242;
    Result<Model> model = Model::Build(events_, options);
    EXPECT_TRUE(model.ok()) << (model.ok() ? "" : model.error().ToString());
    return std::move(model).value();
  }

 private:
  std::vector<TraceEvent> events_;
};

// Every lane covers [start, end] without holes or overlaps.
template <typename Block>
void ExpectContiguous(const std::vector<Block>& blocks, const Model& model, const std::string& what) {
  ASSERT_FALSE(blocks.empty()) << what;
  EXPECT_EQ(blocks.front().start_ns, model.start_ns()) << what;
  EXPECT_EQ(blocks.back().end_ns, model.end_ns()) << what;
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_LE(blocks[i].start_ns, blocks[i].end_ns) << what << " block " << i;
    if (i > 0) {
      EXPECT_EQ(blocks[i - 1].end_ns, blocks[i].start_ns) << what << " between blocks " << i - 1 << " and " << i;
    }
  }
}

inline void ExpectAllLanesContiguous(const Model& model) {
  for (const RubyThread& t : model.threads()) ExpectContiguous(t.blocks, model, model.ThreadLabel(t.ruby_thread));
  ExpectContiguous(model.owner_lane(), model, "owner lane");
}

// The block of `thread` covering `t_ns` (the later one at a boundary).
inline const StateBlock* BlockAt(const Model& model, uint32_t thread, uint64_t t_ns) {
  const RubyThread* lane = model.FindThread(thread);
  if (lane == nullptr) return nullptr;
  for (auto it = lane->blocks.rbegin(); it != lane->blocks.rend(); ++it) {
    if (it->start_ns <= t_ns) return &*it;
  }
  return nullptr;
}

inline const OwnerBlock* OwnerAt(const Model& model, uint64_t t_ns) {
  const auto& lane = model.owner_lane();
  for (auto it = lane.rbegin(); it != lane.rend(); ++it) {
    if (it->start_ns <= t_ns) return &*it;
  }
  return nullptr;
}


// A 3.2 trace touching every rule: main hands over, a timeslice preemption, a double SUSPENDED sleep, a mutex wait,
// GC on the owner, M:N-style sharing of one native tid, lost events, a pause, and an exit.
inline EventSeq EveryRuleSequence() {
  EventSeq s;
  s.Add(0, EventName::kTracingStarted);
  s.Add(383 * kUs, EventName::kThreadStarted, 2, 100);
  s.Add(420 * kUs, EventName::kThreadStarted, 3, 100);
  s.Add(531 * kUs, EventName::kWantsGvl, 2, 100);
  s.Add(560 * kUs, EventName::kWantsGvl, 3, 100);
  s.Add(607 * kUs, EventName::kGvlReleased, 0, 100);
  s.Add(733 * kUs, EventName::kGvlAcquired, 2, 135);
  s.Add(50 * kMs, EventName::kGcEnter);
  s.Add(52 * kMs, EventName::kGcExit);
  s.Add(100 * kMs, EventName::kWantsGvl, 2, 135);
  s.Add(100 * kMs + 150 * kUs, EventName::kGvlAcquired, 3, 135);  // shares T2's native thread
  s.Add(150 * kMs, EventName::kMutexLockEnter, 3, 135);
  s.Add(150 * kMs + 5 * kUs, EventName::kGvlReleased, 3, 135);
  s.Add(150 * kMs + 20 * kUs, EventName::kGvlAcquired, 2, 135);
  s.Add(200 * kMs, EventName::kSleepEnter, 2, 135);
  s.Add(200 * kMs + 7 * kUs, EventName::kGvlReleased, 2, 135);
  s.Add(200 * kMs + 9 * kUs, EventName::kGvlReleased, 2, 135);
  s.Dropped(210 * kMs, 12);
  s.Add(220 * kMs, EventName::kWantsGvl, 3, 136);
  s.Add(221 * kMs, EventName::kGvlAcquired, 3, 136);
  s.Add(230 * kMs, EventName::kTracingPaused);
  s.Add(260 * kMs, EventName::kTracingResumed);
  s.Add(270 * kMs, EventName::kWantsGvl, 2, 135);
  s.Add(280 * kMs, EventName::kGvlAcquired, 2, 135);
  s.Add(290 * kMs, EventName::kThreadExited, 2, 135);
  s.Add(290 * kMs + 1 * kUs, EventName::kGvlReleased, 2, 135);
  s.Add(300 * kMs, EventName::kTracingStopped);
  return s;
}

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_MODEL_MODEL_TEST_UTIL_H_
