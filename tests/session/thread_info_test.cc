#include "session/thread_info.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/label_bound.h"
#include "stacks/fake_memory.h"

namespace rvbpfd {
namespace {

TraceEvent Ev(uint64_t t_ns, EventName name, uint32_t thread, uint32_t tid, uint32_t probe_tid, uint64_t th = 0x1000) {
  TraceEvent e;
  e.t_ns = t_ns;
  e.event = name;
  e.ruby_thread = thread;
  e.native_tid = tid;
  e.probe_tid = probe_tid;
  e.th = th;
  return e;
}

// Sources that answer from maps and count what they were asked.
struct FakeSources {
  std::string ruby_name = "worker-1", comm = "worker-1";
  uint32_t ns_tid = 9;
  int ruby_reads = 0, comm_reads = 0, ns_reads = 0;
  ThreadInfoTracker::Sources Make() {
    ThreadInfoTracker::Sources s;
    s.ruby_name = [this](uint64_t) -> std::optional<std::string> { ++ruby_reads; return ruby_name; };
    s.native_name = [this](uint32_t) -> std::optional<std::string> { ++comm_reads; return comm; };
    s.ns_tid = [this](uint32_t) -> std::optional<uint32_t> { ++ns_reads; return ns_tid; };
    return s;
  }
};

TEST(ThreadInfoTracker, ReadsAtTheFirstEventTheThreadRunsThenAtMostOncePerSecond) {
  FakeSources f;
  ThreadInfoTracker tracker(f.Make());
  // STARTED and READY run on other threads: they say nothing of the thread's own native thread.
  EXPECT_FALSE(tracker.Observe(Ev(0, EventName::kThreadStarted, 2, 11, 10)).has_value());
  EXPECT_FALSE(tracker.Observe(Ev(1, EventName::kWantsGvl, 2, 11, 10)).has_value());
  std::optional<ThreadInfo> first = tracker.Observe(Ev(2, EventName::kGvlAcquired, 2, 11, 11));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->name, std::optional<std::string>("worker-1"));
  EXPECT_EQ(first->native_name, std::optional<std::string>("worker-1"));
  EXPECT_EQ(first->ns_tid, std::optional<uint32_t>(9));
  // Every event within the second: nothing read.
  for (uint64_t t = 3; t < 2 + ThreadInfoTracker::kRefreshNs; t += 50'000'000) {
    EXPECT_FALSE(tracker.Observe(Ev(t, EventName::kGvlReleased, 2, 11, 11)).has_value());
  }
  EXPECT_EQ(f.comm_reads, 1);
  f.ruby_name = f.comm = "renamed";
  std::optional<ThreadInfo> again = tracker.Observe(Ev(2 + ThreadInfoTracker::kRefreshNs, EventName::kSample, 2, 11, 11));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->name, std::optional<std::string>("renamed"));
  EXPECT_EQ(again->native_name, std::optional<std::string>("renamed"));
  // The namespace tid of a native thread is read once.
  EXPECT_FALSE(again->ns_tid.has_value());
  EXPECT_EQ(f.ns_reads, 1);
  EXPECT_EQ(f.ruby_reads, 2);
}

TEST(ThreadInfoTracker, ANewNativeThreadGetsItsNsTidAndAnExitForgetsTheThread) {
  FakeSources f;
  ThreadInfoTracker tracker(f.Make());
  ASSERT_TRUE(tracker.Observe(Ev(0, EventName::kGvlAcquired, 2, 11, 11)).has_value());
  // M:N threads: the Ruby thread moved to another native thread.
  std::optional<ThreadInfo> moved = tracker.Observe(Ev(2'000'000'000, EventName::kGvlAcquired, 2, 12, 12));
  ASSERT_TRUE(moved.has_value());
  EXPECT_TRUE(moved->ns_tid.has_value());
  EXPECT_EQ(f.ns_reads, 2);
  EXPECT_EQ(tracker.tracked(), 1u);
  EXPECT_FALSE(tracker.Observe(Ev(2'000'000'001, EventName::kThreadExited, 2, 12, 12)).has_value());
  EXPECT_EQ(tracker.tracked(), 0u);
  // No th (the main thread's first events): no Thread#name read, the native parts still are.
  std::optional<ThreadInfo> main = tracker.Observe(Ev(5, EventName::kGvlAcquired, 1, 10, 10, /*th=*/0));
  ASSERT_TRUE(main.has_value());
  EXPECT_FALSE(main->name.has_value());
  EXPECT_TRUE(main->native_name.has_value());
}

// An rb_thread_t whose name is an embedded String (3.3's layout) in fake memory.
class RubyThreadNameTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kTh = 0x20000, kStr = 0x30000;
  void SetUp() override {
    Result<RubyOffsets> o = RubyOffsets::ForVersion(3, 3);
    ASSERT_TRUE(o.ok());
    off_ = *o;
    off_.thread_name = 0x60;
    mem_.Map(kTh, 0x100);
    mem_.Map(kStr, 0x2000);
  }
  void PutString(const std::string& s) {
    mem_.Put64(kStr, 0x05);  // T_STRING, embedded
    mem_.Put64(kStr + 16, s.size());
    mem_.Put(kStr + off_.string_embed_bytes, s.data(), s.size());
    mem_.Put64(kTh + off_.thread_name, kStr);
  }
  RubyOffsets off_;
  testing::FakeMemory mem_;
};

TEST_F(RubyThreadNameTest, ReadsTheNameString) {
  PutString("puma srv tp 001");
  EXPECT_EQ(ReadRubyThreadName(mem_, off_, kTh), std::optional<std::string>("puma srv tp 001"));
}

TEST_F(RubyThreadNameTest, NilAnotherTypeOrNoLayoutGiveNothing) {
  mem_.Put64(kTh + off_.thread_name, 0x08);  // nil
  EXPECT_EQ(ReadRubyThreadName(mem_, off_, kTh), std::nullopt);
  PutString("x");
  mem_.Put64(kStr, 0x07);  // T_ARRAY
  EXPECT_EQ(ReadRubyThreadName(mem_, off_, kTh), std::nullopt);
  PutString("x");
  mem_.Put64(kTh + off_.thread_name, 0xdead0000);  // unmapped
  EXPECT_EQ(ReadRubyThreadName(mem_, off_, kTh), std::nullopt);
  PutString("x");
  off_.thread_name = RubyOffsets::kNoThreadName;
  EXPECT_EQ(ReadRubyThreadName(mem_, off_, kTh), std::nullopt);
}

TEST_F(RubyThreadNameTest, ALongNameIsCutToTheLabelBound) {
  PutString(std::string(4000, 'n'));
  std::optional<std::string> name = ReadRubyThreadName(mem_, off_, kTh);
  ASSERT_TRUE(name.has_value());
  EXPECT_LE(name->size(), kMaxLabelBytes);
  EXPECT_TRUE(name->ends_with(kTruncatedMark));
}

}  // namespace
}  // namespace rvbpfd
