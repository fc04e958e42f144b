#include "session/reorder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "trace/event.h"

namespace rvbpfd {
namespace {

TraceEvent At(uint64_t t_ns, uint32_t tag) {
  TraceEvent e;
  e.t_ns = t_ns;
  e.event = EventName::kGvlAcquired;
  e.ruby_thread = tag;  // identifies the event in the output
  return e;
}

TEST(Reorderer, ShuffledWithinWindowComesOutSorted) {
  constexpr uint64_t kWindow = 1000;
  std::mt19937_64 rng(42);
  // Arrival order: timestamps 0, 10, 20, ... each delayed by a random skew below the window.
  std::vector<std::pair<uint64_t, TraceEvent>> arrivals;
  for (uint32_t i = 0; i < 5000; ++i) {
    const uint64_t t = i * 10ull;
    arrivals.emplace_back(t + rng() % kWindow, At(t, i));
  }
  std::stable_sort(arrivals.begin(), arrivals.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  bool shuffled = false;
  for (size_t i = 1; i < arrivals.size(); ++i) shuffled |= arrivals[i].second.t_ns < arrivals[i - 1].second.t_ns;
  ASSERT_TRUE(shuffled) << "the input must actually be out of order";

  Reorderer<TraceEvent> reorderer(kWindow);
  std::vector<TraceEvent> out;
  size_t released_before_drain = 0;
  for (auto& [arrival, event] : arrivals) {
    reorderer.Push(std::move(event));
    reorderer.PopReady(&out);
  }
  released_before_drain = out.size();
  reorderer.Drain(&out);

  ASSERT_EQ(out.size(), 5000u);
  EXPECT_GT(released_before_drain, 4000u) << "events must be released while recording, not only at the end";
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].t_ns, i * 10ull);
    EXPECT_EQ(out[i].ruby_thread, std::optional<uint32_t>(static_cast<uint32_t>(i)));
  }
  EXPECT_EQ(reorderer.late(), 0u);
  EXPECT_EQ(reorderer.held(), 0u);
}

TEST(Reorderer, HoldsEventsInsideTheWindow) {
  Reorderer<TraceEvent> reorderer(100);
  std::vector<TraceEvent> out;
  reorderer.Push(At(1000, 1));
  reorderer.Push(At(1050, 2));
  reorderer.PopReady(&out);
  EXPECT_TRUE(out.empty()) << "1000 is not older than 1050 - 100";
  reorderer.Push(At(1101, 3));
  reorderer.PopReady(&out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].t_ns, 1000u);
  EXPECT_EQ(reorderer.held(), 2u);
}

TEST(Reorderer, EqualTimestampsKeepPushOrder) {
  Reorderer<TraceEvent> reorderer(10);
  for (uint32_t i = 0; i < 100; ++i) reorderer.Push(At(500, i));
  std::vector<TraceEvent> out;
  reorderer.Drain(&out);
  ASSERT_EQ(out.size(), 100u);
  for (uint32_t i = 0; i < 100; ++i) EXPECT_EQ(out[i].ruby_thread, std::optional<uint32_t>(i));
}

TEST(Reorderer, LateEventsAreKeptAndCounted) {
  Reorderer<TraceEvent> reorderer(100);
  std::vector<TraceEvent> out;
  reorderer.Push(At(1000, 1));
  reorderer.Push(At(2000, 2));
  reorderer.PopReady(&out);  // releases 1000
  ASSERT_EQ(out.size(), 1u);
  reorderer.Push(At(900, 3));   // older than the released 1000: late
  reorderer.Push(At(1500, 4));  // newer than everything released: not late
  reorderer.Push(At(999, 5));   // late
  EXPECT_EQ(reorderer.late(), 2u);
  reorderer.Drain(&out);
  ASSERT_EQ(out.size(), 5u);
  std::vector<uint32_t> tags;
  for (const TraceEvent& e : out) tags.push_back(*e.ruby_thread);
  EXPECT_EQ(tags, (std::vector<uint32_t>{1, 3, 5, 4, 2}));
}

TEST(Reorderer, ZeroWindowReleasesEverythingOlderThanNewest) {
  Reorderer<TraceEvent> reorderer(0);
  std::vector<TraceEvent> out;
  reorderer.Push(At(5, 1));
  reorderer.Push(At(7, 2));
  reorderer.PopReady(&out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].t_ns, 5u);
}

TEST(Reorderer, MovesOwnedFieldsThrough) {
  Reorderer<TraceEvent> reorderer(0);
  TraceEvent e = At(1, 1);
  e.event = EventName::kTracingPaused;
  e.reason = std::string(100, 'x');  // beyond small-string storage
  e.overhead_pct = 7.5;
  reorderer.Push(e);
  std::vector<TraceEvent> out;
  reorderer.Drain(&out);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].reason, e.reason);
  EXPECT_EQ(out[0].overhead_pct, 7.5);
}

}  // namespace
}  // namespace rvbpfd
