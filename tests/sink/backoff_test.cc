#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>

#include "sink/delivery_worker.h"

namespace rvbpfd {
namespace {

using std::chrono::milliseconds;

TEST(SplitMix64JitterTest, MatchesTheReferenceSequence) {
  // SplitMix64 with state 0 (the reference implementation by Vigna): 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4, ...
  SplitMix64Jitter jitter(0);
  EXPECT_EQ(jitter.Next(), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(jitter.Next(), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(jitter.Next(), 0x06c45d188009454fULL);
  SplitMix64Jitter a(42), b(42), c(43);
  const uint64_t a1 = a.Next();
  EXPECT_EQ(a1, b.Next());
  EXPECT_NE(a1, c.Next());
}

TEST(BackoffDelayTest, DoublesFromMinToMaxWithEqualJitter) {
  const BackoffPolicy policy{milliseconds(500), milliseconds(30000)};
  // failures 1: base 500 -> 250 + jitter mod 251.
  EXPECT_EQ(BackoffDelay(policy, 1, 0), milliseconds(250));
  EXPECT_EQ(BackoffDelay(policy, 1, 250), milliseconds(500));
  EXPECT_EQ(BackoffDelay(policy, 1, 251), milliseconds(250));
  EXPECT_EQ(BackoffDelay(policy, 1, std::numeric_limits<uint64_t>::max()), milliseconds(250 + 68));  // 2^64-1 mod 251
  // 0 failures is treated like the first.
  EXPECT_EQ(BackoffDelay(policy, 0, 0), milliseconds(250));
  // base 1000, 2000, 4000, ..., 16000, then capped at 30000.
  EXPECT_EQ(BackoffDelay(policy, 2, 0), milliseconds(500));
  EXPECT_EQ(BackoffDelay(policy, 2, 500), milliseconds(1000));
  EXPECT_EQ(BackoffDelay(policy, 3, 0), milliseconds(1000));
  EXPECT_EQ(BackoffDelay(policy, 6, 0), milliseconds(8000));
  EXPECT_EQ(BackoffDelay(policy, 7, 0), milliseconds(15000));  // 32000 capped at 30000
  EXPECT_EQ(BackoffDelay(policy, 7, 15000), milliseconds(30000));
  // A long outage neither overflows nor exceeds the cap.
  EXPECT_EQ(BackoffDelay(policy, 1000000, 15000), milliseconds(30000));
  EXPECT_EQ(BackoffDelay(policy, std::numeric_limits<uint64_t>::max(), 0), milliseconds(15000));
}

TEST(BackoffDelayTest, DegenerateBounds) {
  EXPECT_EQ(BackoffDelay(BackoffPolicy{milliseconds(5000), milliseconds(1000)}, 1, 0), milliseconds(500));  // min>max
  EXPECT_EQ(BackoffDelay(BackoffPolicy{milliseconds(0), milliseconds(1000)}, 1, 7), milliseconds(0));
  // From 0 the doubling still reaches the cap (0 -> 1 -> 2 -> ...).
  EXPECT_EQ(BackoffDelay(BackoffPolicy{milliseconds(0), milliseconds(8)}, 5, 0), milliseconds(4));
  EXPECT_EQ(BackoffDelay(BackoffPolicy{milliseconds(1), milliseconds(8)}, 2, 1), milliseconds(2));
}

// A request's timeout is the attempt's, cut to what is left of a Flush's deadline (rounded up to whole ms, at least
// 1 ms), for the worker's attempt and for each request of a push sink's attempt alike.
TEST(DeliveryContextTest, ARequestGetsWhatIsLeftOfTheDeadline) {
  using std::chrono::milliseconds;
  const SinkClock::TimePoint now{std::chrono::seconds(100)};
  DeliveryContext c;
  c.timeout = milliseconds(10000);
  EXPECT_FALSE(c.LeftAt(now).has_value());
  EXPECT_EQ(c.RequestTimeout(now), milliseconds(10000));
  c.deadline = now + milliseconds(250);
  EXPECT_EQ(c.LeftAt(now), milliseconds(250));
  EXPECT_EQ(c.RequestTimeout(now), milliseconds(250));
  EXPECT_EQ(c.RequestTimeout(now + std::chrono::microseconds(249'500)), milliseconds(1));  // 0.5 ms left: 1 ms
  EXPECT_EQ(c.LeftAt(now + milliseconds(300)), milliseconds(-50));
  EXPECT_EQ(c.RequestTimeout(now + milliseconds(300)), milliseconds(1));  // passed: still a 1 ms try
  c.deadline = now + std::chrono::hours(1);
  EXPECT_EQ(c.RequestTimeout(now), milliseconds(10000));  // never longer than the attempt's own
}

}  // namespace
}  // namespace rvbpfd
