// The top blockers (model/blockers.h) on hand-made blame: rows by the holders' innermost Ruby method.
#include "model/blockers.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

namespace rvbpfd {
namespace {

constexpr uint64_t kMs = 1'000'000;

class BlockersTest : public ::testing::Test {
 protected:
  // Frames leaf first; returns the stack id.
  uint32_t Stack(std::vector<FrameInfo> leaf_first) {
    std::vector<uint32_t> ids;
    for (FrameInfo& f : leaf_first) {
      const uint32_t id = static_cast<uint32_t>(frames_.size()) + 1;
      frames_[id] = std::move(f);
      ids.push_back(id);
    }
    const uint32_t sid = static_cast<uint32_t>(stacks_.size()) + 1;
    stacks_[sid] = ids;
    return sid;
  }
  void Blame(uint64_t holder, uint32_t stack, uint64_t ns, BlameSource source = BlameSource::kSampled,
             bool gc = false, uint64_t waiter = 99) {
    a_.blame_ns[BlameKey{.waiter = waiter, .holder = holder, .stack = stack, .gc = gc, .source = source}] += ns;
  }
  std::vector<Blocker> Rows() { return GroupBlockers(a_, frames_, stacks_); }

  static FrameInfo C(const char* l) { return FrameInfo{l, "<cfunc>", 0, FrameKind::kCfunc}; }
  static FrameInfo R(const char* l) { return FrameInfo{l, "/app/ledger.rb", 7, FrameKind::kRuby}; }

  AttributionResult a_;
  std::unordered_map<uint32_t, FrameInfo> frames_;
  std::unordered_map<uint32_t, std::vector<uint32_t>> stacks_;
};

TEST_F(BlockersTest, OneMethodAcrossThreadsIsOneRowWithItsThreads) {
  // Five threads run LedgerCruncher.reconcile (each its own stack, different lines); one more method elsewhere.
  for (uint64_t holder = 2; holder <= 6; ++holder) {
    FrameInfo reconcile = R("LedgerCruncher.reconcile");
    reconcile.line = static_cast<int32_t>(holder);
    Blame(holder, Stack({reconcile, R("block in <main>")}), holder * kMs);
  }
  Blame(7, Stack({R("Other#work")}), 3 * kMs);
  const std::vector<Blocker> rows = Rows();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].method, "LedgerCruncher.reconcile");
  EXPECT_EQ(rows[0].ns, (2 + 3 + 4 + 5 + 6) * kMs);
  ASSERT_EQ(rows[0].holders.size(), 5u);
  EXPECT_EQ(rows[0].holders[0].key, 6u);  // heaviest first
  EXPECT_EQ(rows[0].holders[0].ns, 6 * kMs);
  EXPECT_TRUE(rows[0].calls.empty());     // its own Ruby code
  EXPECT_EQ(rows[1].method, "Other#work");
}

TEST_F(BlockersTest, TheCFunctionIsBeneathTheRubyMethodNotARowOfItsOwn) {
  // Object#burn and its Process.clock_gettime are one row; <internal:...> builtins count as library code too.
  Blame(2, Stack({C("Process.clock_gettime"), R("Object#burn"), R("<main>")}), 4 * kMs);
  Blame(2, Stack({R("Object#burn"), R("<main>")}), 5 * kMs, BlameSource::kReleaseStack);
  Blame(3, Stack({C("Integer#+"), FrameInfo{"Integer#times", "<internal:numeric>", 3, FrameKind::kRuby},
                  R("Object#burn")}),
        2 * kMs);
  Blame(3, Stack({C("Process.clock_gettime"), R("Object#burn")}), 1 * kMs, BlameSource::kSampled, false, 98);
  const std::vector<Blocker> rows = Rows();
  ASSERT_EQ(rows.size(), 1u);
  const Blocker& b = rows[0];
  EXPECT_EQ(b.method, "Object#burn");
  EXPECT_EQ(b.ns, 12 * kMs);
  ASSERT_EQ(b.holders.size(), 2u);
  EXPECT_EQ(b.holders[0].key, 2u);
  EXPECT_EQ(b.holders[0].ns, 9 * kMs);
  ASSERT_EQ(b.calls.size(), 2u);
  EXPECT_EQ(b.calls[0].label, "Process.clock_gettime");
  EXPECT_EQ(b.calls[0].ns, 5 * kMs);
  EXPECT_EQ(b.calls[1].label, "Integer#+");  // the leaf library function, not the builtin under it
  EXPECT_EQ(b.by_source.at("sampled"), 7 * kMs);
  EXPECT_EQ(b.by_source.at("release_stack"), 5 * kMs);
}

TEST_F(BlockersTest, GcStandInsAndStacksWithoutProgramFrames) {
  const uint32_t burn = Stack({R("Object#burn")});
  Blame(2, burn, 3 * kMs, BlameSource::kSampled, /*gc=*/true);
  Blame(0, 0, 2 * kMs, BlameSource::kGvlFree);
  Blame(2, 0, 1 * kMs, BlameSource::kNoStack);
  Blame(4, Stack({C("Kernel#require")}), 4 * kMs);  // no program frame: the leaf names it
  Blame(5, 12345, 1 * kMs);                         // a stack the dictionary does not define
  a_.blame_ns[BlameKey{.waiter = 1, .holder = 2, .stack = burn, .source = BlameSource::kSampled,
                       .provenance = Provenance::kInferred}] += 6 * kMs;
  std::map<std::string, const Blocker*> by;
  const std::vector<Blocker> rows = Rows();
  for (const Blocker& b : rows) by[b.method] = &b;
  ASSERT_TRUE(by.count("[GC]"));
  EXPECT_EQ(by["[GC]"]->ns, 3 * kMs);
  ASSERT_TRUE(by.count("[GVL not held]"));
  EXPECT_EQ(by["[GVL not held]"]->holders.at(0).key, 0u);
  ASSERT_TRUE(by.count("[no stack]"));
  EXPECT_EQ(by["[no stack]"]->ns, 2 * kMs);  // no stack and an undefined stack
  ASSERT_TRUE(by.count("Kernel#require"));
  EXPECT_TRUE(by["Kernel#require"]->calls.empty());
  ASSERT_TRUE(by.count("Object#burn"));
  EXPECT_EQ(by["Object#burn"]->by_source.at("inferred"), 6 * kMs);
  EXPECT_EQ(rows[0].method, "Object#burn");  // heaviest first
}

}  // namespace
}  // namespace rvbpfd
