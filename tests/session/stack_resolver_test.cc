// StackResolver's cache: a hit costs no target reads within a GC epoch, a later epoch revalidates against the
// objects' heads, and an object whose slot was reused is symbolized again (never served the stale name).
#include "session/stack_resolver.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "common/label_bound.h"
#include "stacks/fake_memory.h"
#include "stacks/synthetic_objects.h"

namespace rvbpfd {
namespace {

using testing::FakeMemory;

constexpr uint64_t kHeap = 0x800000;
constexpr uint64_t kTString = 0x05;
constexpr uint64_t kImemoIseqFlags = RV_RB_T_IMEMO | (7ull << RV_RB_IMEMO_SHIFT);

class StackResolverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto o = RubyOffsets::ForVersion(3, 4);
    ASSERT_TRUE(o.ok());
    off_ = o.value();
    auto mem = std::make_unique<FakeMemory>();
    mem_ = mem.get();
    mem_->Map(kHeap, 0x10000);
    iseq_ = MakeTopIseq("<main>", "/app/main.rb");
    resolver_ = std::make_unique<StackResolver>(std::move(mem), off_, 0);
  }
  uint64_t Alloc(size_t n) {
    uint64_t a = next_;
    next_ += (n + 15) & ~size_t{15};
    return a;
  }
  uint64_t String(const std::string& s) {
    uint64_t str = Alloc(24 + s.size() + 1);
    mem_->Put64(str, kTString);  // embedded
    mem_->Put64(str + 16, s.size());
    mem_->Put(str + 24, s.data(), s.size());
    return str;
  }
  // A top-level iseq (ISEQ_TYPE_TOP, its own local iseq) with no line table, named by the String VALUEs given
  // (testing::SyntheticObjects, on this fixture's allocator): line 0, the walker frame at its first instruction.
  rv_ruby_frame TopIseqFrame(uint64_t label, uint64_t path) {
    testing::SyntheticObjects objects(mem_, next_);
    const rv_ruby_frame f = objects.TopIseqFrame(off_, label, path);
    next_ = objects.next();
    return f;
  }
  // The same, named by the strings given; encoded_ becomes its first instruction.
  uint64_t MakeTopIseq(const std::string& label, const std::string& path) {
    const uint64_t l = String(label);
    const rv_ruby_frame f = TopIseqFrame(l, String(path));
    encoded_ = f.pc;
    return f.addr;
  }
  rv_ruby_frame Frame() const { return rv_ruby_frame{iseq_, encoded_, iseq_, RV_RB_FRAME_ISEQ, 0}; }
  // A top-level iseq of 8 words whose instructions start at word 0 (line `first`) and word 4 (line `second`): a pc
  // of encoded + 8 is at the first, encoded + 40 at the second (calc_lineno looks one word back). Its line table is
  // CRuby's succinct index, immediate part only (positions below 54).
  uint64_t MakeTwoLineIseq(const std::string& label, int first, int second, uint64_t* encoded) {
    const uint64_t iseq = MakeTopIseq(label, "/app/" + label + ".rb");
    *encoded = encoded_;
    uint64_t body = 0;
    mem_->Read(iseq + off_.iseq_body, &body, sizeof(body));
    const uint64_t info = Alloc(24), table = Alloc(48);
    mem_->Put32(info, static_cast<uint32_t>(first));
    mem_->Put32(info + 12, static_cast<uint32_t>(second));
    for (uint64_t x = 0; x < 54; ++x) {  // 7 bits per position: how many instructions start at or before it
      uint64_t w = 0;
      mem_->Read(table + (x / 9) * 8, &w, sizeof(w));
      w |= (x >= 4 ? 2ull : 1ull) << (7 * (x % 9));
      mem_->Put64(table + (x / 9) * 8, w);
    }
    mem_->Put64(body + off_.body_insns_info_body, info);
    mem_->Put32(body + off_.body_insns_info_size, 2);
    mem_->Put64(body + off_.body_succ_index_table, table);
    return iseq;
  }

  // MakeTwoLineIseq("work", 10, 20) and a frame at each line; `second` is what a full symbolization (a resolver over
  // a copy of the memory, with an empty cache) names the frame at the second line.
  struct TwoLines {
    uint64_t iseq = 0, encoded = 0;
    rv_ruby_frame at_first{}, at_second{};
    FrameInfo second;
  };
  TwoLines MakeWork() {
    TwoLines w;
    w.iseq = MakeTwoLineIseq("work", 10, 20, &w.encoded);
    w.at_first = {w.iseq, w.encoded + 8, w.iseq, RV_RB_FRAME_ISEQ, 0};
    w.at_second = {w.iseq, w.encoded + 40, w.iseq, RV_RB_FRAME_ISEQ, 0};
    StackResolver fresh(std::make_unique<FakeMemory>(*mem_), off_, 0);
    w.second = fresh.ResolveFrame(w.at_second);
    return w;
  }

  // After a GC (epoch `epoch`) that reused the iseq's slot no entry of it is valid: a third pc is symbolized in full
  // (unresolved: the slot is no iseq now), never named from the old entries.
  void ExpectAReusedSlotIsSymbolizedInFull(const TwoLines& w, uint64_t epoch) {
    const uint64_t line_only = resolver_->line_only_misses();
    mem_->Put64(w.iseq, kTString);
    resolver_->set_epoch(epoch);
    const rv_ruby_frame at_third{w.iseq, w.encoded + 16, w.iseq, RV_RB_FRAME_ISEQ, 0};
    EXPECT_EQ(resolver_->ResolveFrame(at_third).kind, FrameKind::kUnresolved);
    EXPECT_EQ(resolver_->line_only_misses(), line_only);
  }

  RubyOffsets off_;
  FakeMemory* mem_ = nullptr;
  std::unique_ptr<StackResolver> resolver_;
  uint64_t next_ = kHeap;
  uint64_t iseq_ = 0, encoded_ = 0;
};

TEST_F(StackResolverTest, ResolvesAndCachesWithinAnEpoch) {
  FrameInfo f = resolver_->ResolveFrame(Frame());
  EXPECT_EQ(f.label, "<main>");
  EXPECT_EQ(f.path, "/app/main.rb");
  EXPECT_EQ(f.kind, FrameKind::kRuby);
  const uint64_t reads = mem_->reads();
  FrameInfo again = resolver_->ResolveFrame(Frame());
  EXPECT_EQ(again, f);
  EXPECT_EQ(mem_->reads(), reads) << "a hit in the same GC epoch must not read the target";
  EXPECT_EQ(resolver_->cache_hits(), 1u);
}

TEST_F(StackResolverTest, LaterEpochRevalidatesCheaply) {
  FrameInfo f = resolver_->ResolveFrame(Frame());
  resolver_->set_epoch(1);
  const uint64_t reads = mem_->reads();
  EXPECT_EQ(resolver_->ResolveFrame(Frame()), f);
  EXPECT_EQ(resolver_->revalidations(), 1u);
  EXPECT_EQ(mem_->reads() - reads, 1u)
      << "revalidation reads only the object head (an ISEQ frame's cfp_iseq is the iseq itself)";
}

TEST_F(StackResolverTest, ReusedSlotIsNeverServedFromTheCache) {
  EXPECT_EQ(resolver_->ResolveFrame(Frame()).label, "<main>");
  // GC freed the iseq and the slot now holds a String: the frame's addr no longer names an iseq.
  mem_->Put64(iseq_, kTString);
  resolver_->set_epoch(1);
  FrameInfo f = resolver_->ResolveFrame(Frame());
  EXPECT_EQ(f.kind, FrameKind::kUnresolved);
  EXPECT_NE(f.label, "<main>");
  // And a new iseq in the same slot with another name is symbolized again, not served the old one.
  mem_->Put64(iseq_, kImemoIseqFlags);
  const uint64_t body = Alloc(400);
  mem_->Put64(iseq_ + off_.iseq_body, body);
  mem_->Put32(body + off_.body_type, 0);
  mem_->Put64(body + off_.body_iseq_encoded, encoded_);
  mem_->Put32(body + off_.body_iseq_size, 8);
  const uint64_t l = String("<top (required)>");
  mem_->Put64(body + off_.body_location + off_.loc_label, l);
  mem_->Put64(body + off_.body_location + off_.loc_base_label, l);
  mem_->Put64(body + off_.body_location + off_.loc_pathobj, String("/app/lib.rb"));
  mem_->Put64(body + off_.body_local_iseq, iseq_);
  resolver_->set_epoch(2);
  FrameInfo g = resolver_->ResolveFrame(Frame());
  EXPECT_EQ(g.label, "<top (required)>");
  EXPECT_EQ(g.path, "/app/lib.rb");
}

TEST_F(StackResolverTest, SharedStacksAreReusedWithinAnEpochAndNeverServeAReusedSlot) {
  const rv_ruby_frame frames[] = {Frame(), Frame()};
  const SharedStack a = resolver_->ResolveStack(frames);
  ASSERT_EQ(a->size(), 2u);
  EXPECT_EQ((*a)[0]->label, "<main>");
  EXPECT_EQ((*a)[0], (*a)[1]) << "one cached frame is shared, not copied";
  const uint64_t reads = mem_->reads();
  SharedStack b = resolver_->ResolveStack(frames);
  EXPECT_EQ(a, b) << "a repeated stack in the same GC epoch is the same object";
  EXPECT_EQ(mem_->reads(), reads) << "a repeated stack in the same GC epoch must not read the target";
  // GC freed the iseq and reused its slot: the next epoch must not be served the remembered stack.
  mem_->Put64(iseq_, kTString);
  resolver_->set_epoch(1);
  b = resolver_->ResolveStack(frames);
  ASSERT_EQ(b->size(), 2u);
  EXPECT_EQ((*b)[0]->kind, FrameKind::kUnresolved);
  EXPECT_EQ((*a)[0]->label, "<main>") << "a stack handed out is never changed";
  // Unresolved frames are never remembered: once the iseq is back, it is named again in the same epoch.
  mem_->Put64(iseq_, kImemoIseqFlags);
  b = resolver_->ResolveStack(frames);
  EXPECT_EQ((*b)[0]->label, "<main>");
  EXPECT_NE(a, b) << "renamed frames are new objects, so a new stack";
  EXPECT_EQ(resolver_->ResolveFrame(Frame()).label, "<main>");
}

TEST_F(StackResolverTest, AStackCutShortEndsWithOneSharedMarkerAndIsReusedPerEnd) {
  rv_stack_header h{};
  h.walk_status = RV_WALK_OK;
  EXPECT_EQ(StackEndOf(h), StackEnd::kWhole);
  EXPECT_EQ(StackEndFrame(StackEnd::kWhole), nullptr);
  h.flags = RV_STACK_F_NO_EC;
  EXPECT_EQ(StackEndOf(h), StackEnd::kIncomplete);
  h.flags = RV_STACK_F_TRUNCATED;
  EXPECT_EQ(StackEndOf(h), StackEnd::kTruncated) << "a cut stack is truncated even when its walk also failed";
  h.flags = 0;
  h.walk_status = RV_WALK_OK + 1;
  EXPECT_EQ(StackEndOf(h), StackEnd::kIncomplete);
  std::vector<FrameInfo> values;
  AppendStackEndMarker(h, &values);
  ASSERT_EQ(values.size(), 1u);
  EXPECT_EQ(values[0].label, "<incomplete stack>");
  EXPECT_EQ(values[0].kind, FrameKind::kUnresolved);

  const rv_ruby_frame frames[] = {Frame(), Frame()};
  const SharedStack whole = resolver_->ResolveStack(frames);
  const SharedStack cut = resolver_->ResolveStack(frames, StackEnd::kTruncated);
  ASSERT_EQ(whole->size(), 2u) << "the whole stack is never given the marker";
  ASSERT_EQ(cut->size(), 3u);
  EXPECT_EQ((*cut)[0], (*whole)[0]);
  EXPECT_EQ((*cut)[2], StackEndFrame(StackEnd::kTruncated)) << "the marker is at the oldest end";
  EXPECT_EQ((*cut)[2]->label, "<truncated>");
  EXPECT_EQ(resolver_->ResolveStack(frames, StackEnd::kTruncated), cut) << "a repeated cut stack is one object";
  const SharedStack incomplete = resolver_->ResolveStack(frames, StackEnd::kIncomplete);
  EXPECT_NE(incomplete, cut);
  EXPECT_EQ(incomplete->back(), StackEndFrame(StackEnd::kIncomplete));
  EXPECT_EQ(resolver_->ResolveStack(frames), whole);
  // After a GC the frames revalidate to the same objects: the marked stack is served again.
  resolver_->set_epoch(1);
  EXPECT_EQ(resolver_->ResolveStack(frames, StackEnd::kIncomplete), incomplete);
  // A frame renamed after its slot was reused: a new whole stack, so a new marked one.
  mem_->Put64(iseq_, kTString);
  resolver_->set_epoch(2);
  const SharedStack renamed = resolver_->ResolveStack(frames, StackEnd::kIncomplete);
  ASSERT_EQ(renamed->size(), 3u);
  EXPECT_NE(renamed, incomplete);
  EXPECT_EQ((*renamed)[0]->kind, FrameKind::kUnresolved);
  EXPECT_EQ(renamed->back(), StackEndFrame(StackEnd::kIncomplete));
  EXPECT_EQ((*incomplete)[0]->label, "<main>") << "a stack handed out is never changed";
}

TEST_F(StackResolverTest, ALaterEpochRevalidatesAWholeStackInOneBatch) {
  const rv_ruby_frame main_frame = Frame();
  const uint64_t other = MakeTopIseq("<top (required)>", "/app/lib.rb");
  const uint64_t other_pc = encoded_;
  const rv_ruby_frame frames[] = {main_frame, {other, other_pc, other, RV_RB_FRAME_ISEQ, 0}, main_frame};
  const SharedStack a = resolver_->ResolveStack(frames);
  ASSERT_EQ(a->size(), 3u);
  resolver_->set_epoch(1);
  const uint64_t batches = mem_->read_many_calls();
  SharedStack b = resolver_->ResolveStack(frames);
  EXPECT_EQ(a, b) << "unchanged heads: the cached frames are served, and the remembered stack object with them";
  EXPECT_EQ(mem_->read_many_calls() - batches, 1u) << "all stale frames of a stack revalidate in one batch";
  EXPECT_EQ(resolver_->revalidations(), 2u) << "two distinct frames (one repeated)";

  // Next GC: `other` was freed and its slot reused by a String. The batch sees the changed head, so that frame is
  // symbolized again (and is no iseq now), while the unchanged one is still served from the cache.
  mem_->Put64(other, kTString);
  resolver_->set_epoch(2);
  const uint64_t misses = resolver_->cache_misses();
  b = resolver_->ResolveStack(frames);
  ASSERT_EQ(b->size(), 3u);
  EXPECT_NE(a, b) << "one frame changed: a new stack";
  EXPECT_EQ((*b)[0], (*a)[0]);
  EXPECT_EQ((*b)[2], (*a)[0]);
  EXPECT_EQ((*b)[1]->kind, FrameKind::kUnresolved);
  EXPECT_EQ((*a)[1]->kind, FrameKind::kRuby) << "a stack handed out is never changed";
  EXPECT_EQ(resolver_->cache_misses() - misses, 1u);
}

TEST_F(StackResolverTest, AGcRevalidatesTheFramesOfTheLastEpochInOneBatch) {
  const rv_ruby_frame main_frame = Frame();
  const uint64_t other = MakeTopIseq("<top (required)>", "/app/lib.rb");
  const rv_ruby_frame other_frame{other, encoded_, other, RV_RB_FRAME_ISEQ, 0};
  const rv_ruby_frame first[] = {main_frame};
  const rv_ruby_frame second[] = {other_frame, main_frame};
  const SharedStack a = resolver_->ResolveStack(first);
  const SharedStack b = resolver_->ResolveStack(second);
  resolver_->set_epoch(1);
  const uint64_t batches = mem_->read_many_calls();
  const uint64_t reads = mem_->reads();
  EXPECT_EQ(resolver_->ResolveStack(first), a);
  EXPECT_EQ(resolver_->ResolveStack(second), b);
  EXPECT_EQ(mem_->read_many_calls() - batches, 1u) << "the two stacks' frames revalidate in one batch, at the first";
  EXPECT_EQ(mem_->reads() - reads, 2u) << "one head per distinct frame, nothing else";
  EXPECT_EQ(resolver_->revalidations(), 2u);

  // A frame whose object changed in a GC is left stale by the batch and named again.
  mem_->Put64(other, kTString);
  resolver_->set_epoch(2);
  EXPECT_EQ(resolver_->ResolveStack(first), a);
  const SharedStack renamed = resolver_->ResolveStack(second);
  EXPECT_EQ((*renamed)[0]->kind, FrameKind::kUnresolved);
  EXPECT_EQ((*renamed)[1], (*a)[0]);
}

TEST_F(StackResolverTest, AStackWhoseFramesTheBatchFoundUnchangedIsServedWholeAfterAGc) {
  const rv_ruby_frame main_frame = Frame();
  const uint64_t other = MakeTopIseq("<top (required)>", "/app/lib.rb");
  const rv_ruby_frame frames[] = {{other, encoded_, other, RV_RB_FRAME_ISEQ, 0}, main_frame};
  const SharedStack a = resolver_->ResolveStack(frames);
  for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
    resolver_->set_epoch(epoch);
    const uint64_t batches = mem_->read_many_calls();
    const uint64_t reads = mem_->reads();
    EXPECT_EQ(resolver_->ResolveStack(frames), a) << "epoch " << epoch;
    EXPECT_EQ(resolver_->stacks_kept_across_gc(), epoch) << "served whole, not frame by frame";
    // Its frames stay in use: each GC's batch re-reads their heads (and only those), so a change is still seen.
    EXPECT_EQ(mem_->read_many_calls() - batches, 1u) << "epoch " << epoch;
    EXPECT_EQ(mem_->reads() - reads, 2u) << "epoch " << epoch;
  }
  mem_->Put64(other, kTString);
  resolver_->set_epoch(4);
  const SharedStack renamed = resolver_->ResolveStack(frames);
  EXPECT_EQ(resolver_->stacks_kept_across_gc(), 3u) << "a changed frame is never served from the remembered stack";
  EXPECT_EQ((*renamed)[0]->kind, FrameKind::kUnresolved);
  EXPECT_EQ((*renamed)[1], (*a)[1]);
}

TEST_F(StackResolverTest, ARememberedStackForgetsAnEntryErasedWhileNamingAnotherStack) {
  // Stack `both` is remembered with the entries of its two frames. After a GC in which `other`'s slot was reused, a
  // stack of `other` alone (resolved first) erases that entry; `both` must then go frame by frame (under ASan, a
  // remembered pointer to the erased entry would be a use after free).
  const rv_ruby_frame main_frame = Frame();
  const uint64_t other = MakeTopIseq("<top (required)>", "/app/lib.rb");
  const rv_ruby_frame other_frame{other, encoded_, other, RV_RB_FRAME_ISEQ, 0};
  const rv_ruby_frame both[] = {other_frame, main_frame};
  const rv_ruby_frame alone[] = {other_frame};
  const SharedStack a = resolver_->ResolveStack(both);
  resolver_->set_epoch(1);  // the batch finds both entries unchanged: `both` is served whole and stays remembered
  ASSERT_EQ(resolver_->ResolveStack(both), a);
  mem_->Put64(other, kTString);
  resolver_->set_epoch(2);
  EXPECT_EQ((*resolver_->ResolveStack(alone))[0]->kind, FrameKind::kUnresolved);
  const SharedStack b = resolver_->ResolveStack(both);
  EXPECT_NE(b, a);
  EXPECT_EQ((*b)[0]->kind, FrameKind::kUnresolved);
  EXPECT_EQ((*b)[1], (*a)[1]);
  EXPECT_EQ(resolver_->stacks_kept_across_gc(), 1u);
}

TEST_F(StackResolverTest, TheBatchCarriesOnlyTheFramesUsedInTheLastEpoch) {
  const rv_ruby_frame only_main[] = {Frame()};
  const uint64_t other = MakeTopIseq("<top (required)>", "/app/lib.rb");
  const rv_ruby_frame only_other[] = {{other, encoded_, other, RV_RB_FRAME_ISEQ, 0}};
  resolver_->ResolveStack(only_main);
  resolver_->ResolveStack(only_other);
  resolver_->set_epoch(1);
  resolver_->ResolveStack(only_main);  // the batch: both heads; `other` is not used in epoch 1
  resolver_->set_epoch(2);
  const uint64_t reads = mem_->reads();
  resolver_->ResolveStack(only_main);
  EXPECT_EQ(mem_->reads() - reads, 1u) << "a frame unused for a whole epoch leaves the batch";
  resolver_->ResolveStack(only_other);  // still cached: revalidated on its own when it comes back
  EXPECT_EQ(mem_->reads() - reads, 2u);
  EXPECT_EQ(resolver_->cache_misses(), 2u);
}

TEST_F(StackResolverTest, ANewPcOfAnIseqNamedInThisEpochReadsOnlyItsLine) {
  const TwoLines w = MakeWork();
  const rv_ruby_frame &at_first = w.at_first, &at_second = w.at_second;
  const FrameInfo& expected = w.second;
  ASSERT_EQ(expected.line, 20);

  uint64_t reads = mem_->reads();
  const FrameInfo first = resolver_->ResolveFrame(at_first);
  const uint64_t full_reads = mem_->reads() - reads;
  EXPECT_EQ(first.label, "work");
  EXPECT_EQ(first.line, 10);
  reads = mem_->reads();
  EXPECT_EQ(resolver_->ResolveFrame(at_second), expected);
  EXPECT_EQ(resolver_->line_only_misses(), 1u);
  EXPECT_LT(mem_->reads() - reads, full_reads / 2) << "label and path come from the entry of the first pc";
  reads = mem_->reads();
  EXPECT_EQ(resolver_->ResolveFrame(at_second), expected);
  EXPECT_EQ(mem_->reads(), reads) << "the new pc is cached like any miss";

  // The second pc read the iseq's line table; every further pc of it is named from that table, without a read.
  EXPECT_EQ(resolver_->line_tables_read(), 1u);
  reads = mem_->reads();
  const rv_ruby_frame at_pos2{w.iseq, w.encoded + 24, w.iseq, RV_RB_FRAME_ISEQ, 0};
  const rv_ruby_frame at_pos6{w.iseq, w.encoded + 56, w.iseq, RV_RB_FRAME_ISEQ, 0};
  EXPECT_EQ(resolver_->ResolveFrame(at_pos2).line, 10);
  EXPECT_EQ(resolver_->ResolveFrame(at_pos6).line, 20);
  EXPECT_EQ(resolver_->ResolveFrame(at_pos6).label, "work");
  EXPECT_EQ(mem_->reads(), reads);
  EXPECT_EQ(resolver_->line_only_misses(), 3u);
  EXPECT_EQ(resolver_->line_tables_read(), 1u);

  ExpectAReusedSlotIsSymbolizedInFull(w, 1);
}

// A sample's new pc often comes epochs after the iseq was last named (not in the batch the last GC revalidated): the
// old entry is revalidated by its heads and gives label and path, so the frame costs its heads and its line, not a
// full symbolization.
TEST_F(StackResolverTest, ANewPcAfterAGcRevalidatesTheIseqsEntryAndReadsOnlyItsLine) {
  const rv_ruby_frame main = Frame();  // before MakeWork, which moves encoded_ to its own iseq
  const TwoLines w = MakeWork();
  const rv_ruby_frame &at_first = w.at_first, &at_second = w.at_second;
  const FrameInfo& expected = w.second;
  ASSERT_EQ(expected.line, 20);
  uint64_t reads = mem_->reads();
  ASSERT_EQ(resolver_->ResolveFrame(at_first).line, 10);
  const uint64_t full_reads = mem_->reads() - reads;

  // An epoch in which the method is not used (so its entry leaves the batch a GC revalidates), then another.
  resolver_->set_epoch(1);
  ASSERT_EQ(resolver_->ResolveFrame(main).label, "<main>");
  resolver_->set_epoch(2);
  ASSERT_EQ(resolver_->ResolveFrame(main).label, "<main>");  // the batch of the epoch's first use is done
  const uint64_t revalidations = resolver_->revalidations();
  reads = mem_->reads();
  EXPECT_EQ(resolver_->ResolveFrame(at_second), expected);
  EXPECT_EQ(resolver_->line_only_misses(), 1u);
  EXPECT_EQ(resolver_->revalidations() - revalidations, 1u) << "the first pc's entry is valid again";
  EXPECT_LT(mem_->reads() - reads, full_reads / 2) << "label and path come from the revalidated entry";
  reads = mem_->reads();
  EXPECT_EQ(resolver_->ResolveFrame(at_first).line, 10);
  EXPECT_EQ(mem_->reads(), reads) << "the revalidated entry is a hit for the rest of the epoch";

  // The heads differ after a GC that reused the slot, so the revalidation fails and nothing is named from the entry.
  ExpectAReusedSlotIsSymbolizedInFull(w, 3);
}

TEST_F(StackResolverTest, UnreadableFrameIsUnresolvedAndNotCached) {
  rv_ruby_frame bad{0x10, 0, 0, RV_RB_FRAME_CME_ISEQ, 0};
  EXPECT_EQ(resolver_->ResolveFrame(bad).kind, FrameKind::kUnresolved);
  EXPECT_EQ(resolver_->ResolveFrame(bad).kind, FrameKind::kUnresolved);
  EXPECT_EQ(resolver_->cache_hits(), 0u);
  rv_ruby_frame walker_unresolved{0x900000, 0, 0, RV_RB_FRAME_UNRESOLVED, 0};
  EXPECT_EQ(resolver_->ResolveFrame(walker_unresolved).kind, FrameKind::kUnresolved);
}

}  // namespace
}  // namespace rvbpfd

namespace rvbpfd {
namespace {

TEST_F(StackResolverTest, CacheIsBoundedByBytesNotOnlyEntries) {
  // A target's labels are up to kMaxLabelBytes each once symbolized: frames with such labels must not fill the
  // cache with GBs before the entry bound is reached. Many iseqs share one label string in the target; each cached
  // frame holds its own copy.
  constexpr uint64_t kBig = 0x4000000;
  const size_t frames = 2 * StackResolver::kMaxCacheBytes / kMaxLabelBytes;  // twice what fits
  ASSERT_LT(frames, StackResolver::kMaxCacheEntries);
  mem_->Map(kBig, 0x20000 + frames * 1024);
  next_ = kBig;
  const uint64_t label = String(std::string(kMaxLabelBytes, 'L'));
  const uint64_t path = String("/app/big.rb");
  size_t resolved = 0;
  for (size_t i = 0; i < frames; ++i) {
    const rv_ruby_frame f = TopIseqFrame(label, path);
    resolved += resolver_->ResolveFrame(f).kind != FrameKind::kUnresolved ? 1 : 0;
    ASSERT_LE(resolver_->cache_bytes(), StackResolver::kMaxCacheBytes);
  }
  EXPECT_EQ(resolved, frames);
  EXPECT_GE(resolver_->cache_clears(), 1u);
  EXPECT_GT(resolver_->cache_bytes(), 0u);
}

}  // namespace
}  // namespace rvbpfd

namespace rvbpfd {
namespace {

TEST_F(StackResolverTest, AMemoryAccountBoundsTheCacheAndEvictedFramesAreNamedAgain) {
  // The cache charges its entries to a budget's account instead of kMaxCacheBytes: it never holds more than the
  // account's share, it is cleared (the account's evictor) or does without when refused, and every frame is named
  // as the target names it whichever happened.
  constexpr uint64_t kBig = 0x4000000;
  constexpr size_t kFrames = 400;
  mem_->Map(kBig, 0x20000 + kFrames * (2 * kMaxLabelBytes + 1024));
  next_ = kBig;
  std::vector<rv_ruby_frame> frames;
  std::vector<std::string> labels;
  for (size_t i = 0; i < kFrames; ++i) {
    labels.push_back("m" + std::to_string(i) + std::string(2 * kMaxLabelBytes, 'L'));
    frames.push_back(TopIseqFrame(String(labels.back()), String("/app/big.rb")));
  }
  MemoryBudget budget(256 << 10);  // ~100 entries of ~2.2 KB
  std::unique_ptr<MemoryBudget::Account> account = budget.Open();
  account->set_evictor([this] { resolver_->ClearCache(); });
  resolver_->set_memory_account(account.get());
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < kFrames; ++i) {
      const FrameInfo f = resolver_->ResolveFrame(frames[i]);
      ASSERT_EQ(f.label.substr(0, labels[i].find('L')), labels[i].substr(0, labels[i].find('L'))) << i;
      ASSERT_TRUE(f.label.ends_with(kTruncatedMark));
      ASSERT_LE(resolver_->cache_bytes(), budget.budget());
      ASSERT_EQ(resolver_->cache_bytes(), account->held());
    }
  }
  EXPECT_GT(budget.evictions(), 0u);
  EXPECT_GT(resolver_->cache_clears(), 0u);
  EXPECT_GT(resolver_->cache_bytes(), 0u);
}

}  // namespace
}  // namespace rvbpfd
