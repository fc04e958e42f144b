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

TEST(Reorderer, StragglersMergeWithInOrderItemsStably) {
  // 500 and 600 arrive in order; the second 500 is older than the last item, so it is a straggler, and must come out
  // after the first 500 (pushed earlier) and before 600; the second 600 is in order again.
  Reorderer<TraceEvent> reorderer(10);
  reorderer.Push(At(500, 1));
  reorderer.Push(At(600, 2));
  reorderer.Push(At(500, 3));
  reorderer.Push(At(600, 4));
  reorderer.Push(At(550, 5));
  EXPECT_EQ(reorderer.held(), 5u);
  std::vector<uint32_t> tags;
  reorderer.PopThrough(550, [&](TraceEvent&& e) { tags.push_back(*e.ruby_thread); });
  EXPECT_EQ(tags, (std::vector<uint32_t>{1, 3, 5}));
  reorderer.Push(At(590, 6));  // older than the queue's 600s: a straggler again
  std::vector<TraceEvent> out;
  reorderer.Drain(&out);
  for (const TraceEvent& e : out) tags.push_back(*e.ruby_thread);
  EXPECT_EQ(tags, (std::vector<uint32_t>{1, 3, 5, 6, 2, 4}));
  EXPECT_EQ(reorderer.late(), 0u);
}

TEST(Reorderer, InterleavedCpuStreamsComeOutAsAStableSort) {
  // Two "CPUs", each producing in order, interleaved with small skews and equal timestamps, released at random
  // points (the agent's PopThrough by the clock) with the queue growing past its first capacity: the output must be
  // exactly a stable sort by time of the input, whichever side held each item.
  std::mt19937_64 rng(7);
  Reorderer<TraceEvent> reorderer(50);
  std::vector<TraceEvent> pushed, out;
  uint64_t now = 1000, cpu_t[2] = {1000, 1000};
  for (uint32_t i = 0; i < 20000; ++i) {
    const int cpu = static_cast<int>(rng() % 2);
    now += rng() % 3;  // equal timestamps are common
    cpu_t[cpu] = std::max(cpu_t[cpu], now + rng() % 20);  // each CPU in order, up to 20 ns apart
    pushed.push_back(At(cpu_t[cpu], i));
    reorderer.Push(pushed.back());
    if (rng() % 100 == 0) {
      const uint64_t newest = std::max(cpu_t[0], cpu_t[1]);
      reorderer.PopThrough(newest - std::min<uint64_t>(newest, 60),
                           [&](TraceEvent&& e) { out.push_back(std::move(e)); });
    }
  }
  reorderer.Drain(&out);
  std::stable_sort(pushed.begin(), pushed.end(), [](const TraceEvent& a, const TraceEvent& b) { return a.t_ns < b.t_ns; });
  ASSERT_EQ(out.size(), pushed.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < out.size(); ++i) mismatches += out[i].ruby_thread != pushed[i].ruby_thread;
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(reorderer.late(), 0u) << "skews stay inside the window";
  EXPECT_EQ(reorderer.held(), 0u);
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
