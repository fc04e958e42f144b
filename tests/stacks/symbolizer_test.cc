// Symbolizer pieces on synthetic memory: the succinct-bitvector line table against a brute-force rank, strings, and
// "<unresolved ...>" for objects of the wrong type.
#include "stacks/symbolizer.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/label_bound.h"
#include "fake_memory.h"
#include "synthetic_objects.h"

namespace rvbpfd {
namespace {

using testing::FakeMemory;

constexpr uint64_t kHeap = 0x800000;

class SymbolizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto o = RubyOffsets::ForVersion(3, 3);
    ASSERT_TRUE(o.ok());
    off_ = o.value();
    mem_.Map(kHeap, 0x200000);
  }
  uint64_t Alloc(size_t n) {
    uint64_t a = next_;
    next_ += (n + 15) & ~size_t{15};
    return a;
  }
  uint64_t String(const std::string& s, bool embedded) {
    uint64_t str = Alloc(24 + s.size() + 1);
    mem_.Put64(str, 0x05 | (embedded ? 0 : 0x2000));
    mem_.Put64(str + 16, s.size());
    uint64_t bytes = str + 24;
    if (!embedded) {
      bytes = Alloc(s.size() + 1);
      mem_.Put64(str + 24, bytes);
    }
    if (!s.empty()) mem_.Put(bytes, s.data(), s.size());
    return str;
  }
  // An iseq whose instructions start at the given positions (in VALUE words) with the given lines, encoded in CRuby's
  // succinct bitvector; iseq_size words long.
  uint64_t Iseq(const std::vector<uint64_t>& starts, const std::vector<int>& lines, uint64_t iseq_size,
                uint64_t* encoded_out) {
    uint64_t iseq = Alloc(64), body = Alloc(400), encoded = Alloc(iseq_size * 8);
    mem_.Put64(iseq, RV_RB_T_IMEMO | (7 << RV_RB_IMEMO_SHIFT));
    mem_.Put64(iseq + off_.iseq_body, body);
    mem_.Put64(body + off_.body_iseq_encoded, encoded);
    mem_.Put32(body + off_.body_iseq_size, static_cast<uint32_t>(iseq_size));
    uint64_t info = Alloc(12 * lines.size());
    for (size_t i = 0; i < lines.size(); i++) mem_.Put32(info + 12 * i, static_cast<uint32_t>(lines[i]));
    mem_.Put64(body + off_.body_insns_info_body, info);
    mem_.Put32(body + off_.body_insns_info_size, static_cast<uint32_t>(lines.size()));
    // Encode: imm_part[6] holds rank(x) = #starts <= x for x < 54 (9 x 7 bits per word); then 512-bit blocks.
    std::set<uint64_t> set(starts.begin(), starts.end());
    auto rank = [&](uint64_t x) {  // starts in [0, x)
      uint64_t r = 0;
      for (uint64_t s : starts) r += s < x;
      return r;
    };
    const uint64_t blocks = iseq_size > 54 ? (iseq_size - 54 + 511) / 512 : 0;
    uint64_t table = Alloc(48 + 80 * blocks);
    for (uint64_t x = 0; x < 54; x++) {
      uint64_t w = 0;
      mem_.Read(table + (x / 9) * 8, &w, 8);
      w |= (rank(x + 1) & 0x7f) << (7 * (x % 9));
      mem_.Put64(table + (x / 9) * 8, w);
    }
    for (uint64_t b = 0; b < blocks; b++) {
      const uint64_t base = 54 + 512 * b, blk = table + 48 + 80 * b;
      mem_.Put32(blk, static_cast<uint32_t>(rank(base)));
      uint64_t small = 0;
      for (uint64_t s = 1; s < 8; s++) small |= (rank(base + 64 * s) - rank(base)) << (9 * (s - 1));
      mem_.Put64(blk + 8, small);
      for (uint64_t s = 0; s < 8; s++) {
        uint64_t bits = 0;
        for (uint64_t k = 0; k < 64; k++) bits |= uint64_t{set.count(base + 64 * s + k)} << k;
        mem_.Put64(blk + 16 + 8 * s, bits);
      }
    }
    mem_.Put64(body + off_.body_succ_index_table, table);
    *encoded_out = encoded;
    return iseq;
  }

  FakeMemory mem_;
  RubyOffsets off_;
  uint64_t next_ = kHeap + 0x10;
};

TEST_F(SymbolizerTest, LineNumbersFollowTheSuccinctTable) {
  // Instruction starts spread over the immediate part, the first block and later small blocks of later blocks.
  const std::vector<uint64_t> starts = {0, 3, 53, 54, 60, 117, 600, 1100, 1165, 1500, 2047};
  std::vector<int> lines;
  for (size_t i = 0; i < starts.size(); i++) lines.push_back(100 + static_cast<int>(i) * 7);
  uint64_t encoded = 0;
  const uint64_t iseq = Iseq(starts, lines, 2048, &encoded);
  Symbolizer sym(&mem_, off_, 0);
  for (uint64_t n = 0; n <= 2048; n++) {
    // calc_lineno: pc points past the current instruction, so position n-1 (0 stays 0).
    const uint64_t pos = n ? n - 1 : 0;
    size_t idx = 0;
    for (size_t i = 0; i < starts.size(); i++) {
      if (starts[i] <= pos) idx = i;
    }
    std::optional<int> line = sym.LineNumber(iseq, encoded + 8 * n);
    ASSERT_TRUE(line.has_value()) << n;
    ASSERT_EQ(*line, lines[idx]) << "pc at word " << n;
  }
  // A pc outside the iseq is not decoded.
  EXPECT_FALSE(sym.LineNumber(iseq, encoded + 8 * 2049).has_value());
  EXPECT_FALSE(sym.LineNumber(iseq, encoded - 8).has_value());
}

TEST_F(SymbolizerTest, SingleEntryTablesNeedNoSuccinctTable) {
  uint64_t encoded = 0;
  const uint64_t iseq = Iseq({0}, {42}, 10, &encoded);
  Symbolizer sym(&mem_, off_, 0);
  EXPECT_EQ(sym.LineNumber(iseq, encoded + 40), 42);
}

TEST_F(SymbolizerTest, ALineTableReadOnceGivesEveryPcTheLineLineNumberGives) {
  // Tables with no entry, one entry (no succinct index), an immediate part only, and blocks past the first.
  struct Case {
    std::vector<uint64_t> starts;
    uint32_t iseq_size;
  };
  const std::vector<Case> cases = {
      {{}, 12}, {{0}, 10}, {{0, 5, 20}, 40}, {{0, 3, 53, 54, 60, 117, 600, 1100, 1165, 1500, 2047}, 2048}};
  Symbolizer sym(&mem_, off_, 0);
  for (const Case& c : cases) {
    std::vector<int> lines;
    for (size_t i = 0; i < c.starts.size(); i++) lines.push_back(7 + static_cast<int>(i) * 3);
    uint64_t encoded = 0;
    const uint64_t iseq = Iseq(c.starts, lines, c.iseq_size, &encoded);
    std::optional<Symbolizer::LineTable> table = sym.ReadLineTable(iseq);
    ASSERT_TRUE(table.has_value()) << c.iseq_size;
    EXPECT_EQ(table->lines.size(), c.starts.size());
    // Every pc of the iseq, and pcs just outside it or off a word.
    for (uint64_t pc = encoded - 16; pc <= encoded + 8 * (c.iseq_size + 2); pc += 4) {
      if (pc == 0) continue;
      ASSERT_EQ(Symbolizer::LineAt(*table, pc), sym.LineNumber(iseq, pc)) << c.iseq_size << " pc +" << pc - encoded;
    }
  }
}

TEST_F(SymbolizerTest, ALineTableIsNotReadWhenTooLargeOrUnreadable) {
  Symbolizer sym(&mem_, off_, 0);
  uint64_t encoded = 0;
  // 6,000 entries of 12 bytes: over kMaxLineTableReadBytes, so LineNumber serves each pc.
  std::vector<uint64_t> starts;
  std::vector<int> lines;
  for (uint64_t i = 0; i < 6000; i++) {
    starts.push_back(i);
    lines.push_back(static_cast<int>(i));
  }
  const uint64_t big = Iseq(starts, lines, 6000, &encoded);
  EXPECT_FALSE(sym.ReadLineTable(big).has_value());
  EXPECT_EQ(sym.LineNumber(big, encoded + 8 * 100), 99);
  // insns_info.body pointing at unmapped memory, or not an iseq at all.
  const uint64_t iseq = Iseq({0, 4}, {1, 2}, 10, &encoded);
  uint64_t body = 0;
  ASSERT_TRUE(mem_.Read(iseq + off_.iseq_body, &body, 8));
  mem_.Put64(body + off_.body_insns_info_body, 0xdead0000);
  EXPECT_FALSE(sym.ReadLineTable(iseq).has_value());
  EXPECT_FALSE(sym.ReadLineTable(String("not an iseq", true)).has_value());
  // A table not made by ReadLineTable, shorter than its iseq_size says, is checked rather than read past its end.
  Symbolizer::LineTable short_table{
      .encoded = 0x1000, .iseq_size = 2000, .size = 3, .succ = {0, 0, 0}, .lines = {1, 2, 3}};
  EXPECT_FALSE(Symbolizer::LineAt(short_table, 0x1000 + 8 * 40).has_value());
  EXPECT_FALSE(Symbolizer::LineAt(short_table, 0x1000 + 8 * 1000).has_value());
  // The same for lines: position 0's index is 2, past the one line given.
  Symbolizer::LineTable few_lines{
      .encoded = 0x1000, .iseq_size = 10, .size = 3, .succ = {2, 0, 0, 0, 0, 0}, .lines = {1}};
  EXPECT_FALSE(Symbolizer::LineAt(few_lines, 0x1000 + 8).has_value());
  few_lines.lines = {1, 5, 9};
  EXPECT_EQ(Symbolizer::LineAt(few_lines, 0x1000 + 8), 5);
}

TEST_F(SymbolizerTest, StringsEmbeddedAndOnTheHeap) {
  Symbolizer sym(&mem_, off_, 0);
  EXPECT_EQ(sym.ReadString(String("block in <main>", true)), "block in <main>");
  EXPECT_EQ(sym.ReadString(String(std::string(300, 'x'), false)), std::string(300, 'x'));
  EXPECT_EQ(sym.ReadString(String("", true)), "");
  // Not a string, a special constant, an absurd length.
  uint64_t ary = Alloc(40);
  mem_.Put64(ary, 0x07);
  EXPECT_FALSE(sym.ReadString(ary).has_value());
  EXPECT_FALSE(sym.ReadString(0x08).has_value());
  uint64_t huge = String("abc", true);
  mem_.Put64(huge + 16, uint64_t{1} << 40);
  EXPECT_FALSE(sym.ReadString(huge).has_value());
}

TEST_F(SymbolizerTest, WrongObjectsBecomeVisibleUnresolvedFrames) {
  Symbolizer sym(&mem_, off_, 0);
  const uint64_t not_an_iseq = String("I am a string", true);
  for (uint32_t kind : {RV_RB_FRAME_ISEQ, RV_RB_FRAME_CME_ISEQ, RV_RB_FRAME_CME_CFUNC, RV_RB_FRAME_UNRESOLVED}) {
    SymbolizedFrame f = sym.Symbolize({not_an_iseq, 0, 0, kind, 0});
    EXPECT_FALSE(f.resolved);
    ASSERT_TRUE(f.full_label.has_value());
    EXPECT_EQ(f.full_label->rfind("<unresolved ", 0), 0u) << *f.full_label;
  }
  // Unmapped addresses as well.
  EXPECT_FALSE(sym.Symbolize({0xdead0000, 0, 0, RV_RB_FRAME_CME_ISEQ, 0}).resolved);
}

TEST_F(SymbolizerTest, LabelsAndPathsAreCutToTheLabelBoundAndMarked) {
  // A target names a method and its file with 60 KB each (within kMaxStringBytes, so they are read): what comes
  // back is at most kMaxLabelBytes, the start of the text and the mark; a short name is left as it is.
  const std::string long_label = "Deep#" + std::string(60000, 'r');
  const std::string long_path = "/app/" + std::string(60000, 'p') + ".rb";
  const uint64_t label = String(long_label, false), path = String(long_path, false);
  const uint64_t short_label = String("<main>", true), short_path = String("/app/a.rb", true);
  testing::SyntheticObjects objects(&mem_, next_);
  const rv_ruby_frame f = objects.TopIseqFrame(off_, label, path);
  const rv_ruby_frame short_frame = objects.TopIseqFrame(off_, short_label, short_path);
  next_ = objects.next();
  Symbolizer sym(&mem_, off_, 0);
  const SymbolizedFrame s = sym.Symbolize(f);
  ASSERT_TRUE(s.resolved) << s.full_label.value_or("");
  EXPECT_TRUE(s.truncated);
  for (const std::optional<std::string>* text : {&s.full_label, &s.path, &s.absolute_path}) {
    ASSERT_TRUE(text->has_value());
    EXPECT_EQ((*text)->size(), kMaxLabelBytes);
    EXPECT_TRUE((*text)->ends_with(kTruncatedMark)) << **text;
  }
  EXPECT_EQ(*s.full_label, long_label.substr(0, kMaxLabelBytes - kTruncatedMark.size()) + std::string(kTruncatedMark));
  EXPECT_EQ(*s.path, long_path.substr(0, kMaxLabelBytes - kTruncatedMark.size()) + std::string(kTruncatedMark));
  const SymbolizedFrame short_s = sym.Symbolize(short_frame);
  EXPECT_FALSE(short_s.truncated);
  EXPECT_EQ(short_s.full_label, "<main>");
  EXPECT_EQ(short_s.path, "/app/a.rb");
}

TEST(RubyPointerString, MatchesRbSprintfPercentP) {
  EXPECT_EQ(RubyPointerString(0x7fffdc2eeb70), "0x00007fffdc2eeb70");
  EXPECT_EQ(RubyPointerString(0), "0x0000000000000000");
}

}  // namespace
}  // namespace rvbpfd
