// CRuby 3.1 object layouts in the symbolizer, on synthetic memory: strings with their length in the flags, class
// paths in the hidden ivars of classext->iv_tbl (an st_table with deleted entries), Fixnum first_lineno, and the
// ruby_global_symbols check that guards an address recovered from code. (The end-to-end check is the 3.1-debian
// coredump case and the live test against Debian's ruby3.1.)
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "fake_memory.h"
#include "synthetic_objects.h"
#include "stacks/symbolizer.h"

namespace rvbpfd {
namespace {

using testing::FakeMemory;
using testing::SyntheticObjects;

constexpr uint64_t kHeap = 0x900000;
constexpr uint64_t kTClass = 0x02;

class Symbolizer31Test : public ::testing::Test {
 protected:
  void SetUp() override {
    auto o = RubyOffsets::ForVersion(3, 1);
    ASSERT_TRUE(o.ok()) << o.error().ToString();
    off_ = o.value();
    mem_.Map(kHeap, 0x100000);
    gsym_ = Alloc(32);
    BuildIdTable();
  }
  uint64_t Alloc(size_t n) { return obj_.Alloc(n); }
  // 3.1 strings: embedded up to 23 bytes (length in FL_USER2..6), else on the heap.
  uint64_t String(const std::string& s) {
    uint64_t str = Alloc(40);
    if (s.size() <= 23) {
      mem_.Put64(str, 0x05 | (uint64_t{s.size()} << 14));
      if (!s.empty()) mem_.Put(str + 16, s.data(), s.size());
    } else {
      uint64_t bytes = Alloc(s.size() + 1);
      mem_.Put(bytes, s.data(), s.size());
      mem_.Put64(str, 0x05 | 0x2000);
      mem_.Put64(str + 16, s.size());
      mem_.Put64(str + 24, bytes);
    }
    return str;
  }
  // Serial -> name for a few IDs, '+' (43) among them; last_id 600 (two chunks).
  void BuildIdTable() {
    ids_ = obj_.IdTable(off_, gsym_,
                        {{'+', "+"},
                         {kSerialClasspath, "__classpath__"},
                         {kSerialTmpClasspath, "__tmp_classpath__"},
                         {kSerialAttached, "__attached__"},
                         {kSerialIvar, "@count"},
                         {kSerialMethod, "work"}},
                        [&](const std::string& name) { return String(name); });
  }
  static uint64_t Id(uint64_t serial) { return SyntheticObjects::Id(serial); }
  // An st_table {hash, key, record} x n, with entries_start = 0.
  uint64_t StTable(const std::vector<std::array<uint64_t, 3>>& entries) {
    uint64_t t = Alloc(56), e = Alloc(24 * entries.size() + 24);
    uint8_t power = 3;
    mem_.Put(t, &power, 1);
    mem_.Put64(t + 32, 0);               // entries_start
    mem_.Put64(t + 40, entries.size());  // entries_bound
    mem_.Put64(t + 48, e);
    for (size_t i = 0; i < entries.size(); i++) {
      for (size_t k = 0; k < 3; k++) mem_.Put64(e + 24 * i + 8 * k, entries[i][k]);
    }
    return t;
  }
  uint64_t Class(uint64_t iv_tbl) {
    uint64_t klass = Alloc(40), ext = Alloc(128);
    mem_.Put64(klass, kTClass);
    mem_.Put64(klass + off_.klass_ext_ptr, ext);
    mem_.Put64(ext + off_.classext_iv_tbl, iv_tbl);
    return klass;
  }
  // A C method entry defined on `klass`, named `work`.
  rv_ruby_frame CfuncFrame(uint64_t klass) { return obj_.CfuncFrame(off_, klass, Id(kSerialMethod)); }

  static constexpr uint64_t kSerialClasspath = 200, kSerialTmpClasspath = 201, kSerialAttached = 202;
  static constexpr uint64_t kSerialIvar = 300, kSerialMethod = 550;
  FakeMemory mem_;
  RubyOffsets off_;
  SyntheticObjects obj_{&mem_, kHeap + 0x10};
  uint64_t gsym_ = 0, ids_ = 0;
};

TEST_F(Symbolizer31Test, ClassPathFromHiddenIvarsSkippingDeletedEntries) {
  // A deleted __classpath__ entry (hash ~0) must not count; the temporary path does.
  const uint64_t tbl = StTable({{~uint64_t{0}, Id(kSerialClasspath), String("Stale")},
                                {7, Id(kSerialIvar), 0x01},
                                {9, Id(kSerialTmpClasspath), String("#<Class:0x0000000000001000>::Inner")}});
  Symbolizer sym(&mem_, off_, gsym_);
  SymbolizedFrame s = sym.Symbolize(CfuncFrame(Class(tbl)));
  EXPECT_EQ(s.full_label, "#<Class:0x0000000000001000>::Inner#work");
  EXPECT_EQ(s.absolute_path, "<cfunc>");
  // A permanent path wins over the temporary one.
  const uint64_t named =
      StTable({{9, Id(kSerialTmpClasspath), String("Tmp")}, {5, Id(kSerialClasspath), String("Foo")}});
  EXPECT_EQ(sym.Symbolize(CfuncFrame(Class(named))).full_label, "Foo#work");
}

TEST_F(Symbolizer31Test, AnonymousClassWithoutIvarTable) {
  Symbolizer sym(&mem_, off_, gsym_);
  const uint64_t klass = Class(0);
  EXPECT_EQ(sym.Symbolize(CfuncFrame(klass)).full_label, "#<Class:" + RubyPointerString(klass) + ">#work");
}

TEST_F(Symbolizer31Test, CorruptIvarTablesAreUnresolvedNotFollowed) {
  Symbolizer sym(&mem_, off_, gsym_);
  // entries_bound beyond the table's 2^entry_power entries.
  uint64_t tbl = StTable({{5, Id(kSerialClasspath), String("Foo")}});
  mem_.Put64(tbl + 40, 1 << 20);
  SymbolizedFrame s = sym.Symbolize(CfuncFrame(Class(tbl)));
  EXPECT_FALSE(s.resolved);
  EXPECT_EQ(s.full_label->rfind("<unresolved cfunc class", 0), 0u) << *s.full_label;
  // entries pointing at unmapped memory.
  tbl = StTable({{5, Id(kSerialClasspath), String("Foo")}});
  mem_.Put64(tbl + 48, 0x10);
  EXPECT_FALSE(sym.Symbolize(CfuncFrame(Class(tbl))).resolved);
}

TEST_F(Symbolizer31Test, GlobalSymbolsAreCheckedBeforeUse) {
  const uint64_t tbl = StTable({{5, Id(kSerialClasspath), String("Foo")}});
  const rv_ruby_frame f = CfuncFrame(Class(tbl));
  {
    // An address that is not the table (e.g. a wrong disassembly guess): names stay unresolved.
    Symbolizer sym(&mem_, off_, gsym_ + 8);
    EXPECT_FALSE(sym.GlobalSymbolsUsable());
    EXPECT_FALSE(sym.Symbolize(f).resolved);
  }
  {
    // The right table shape but ID '+' does not name "+".
    Symbolizer sym(&mem_, off_, gsym_);
    uint64_t chunk0 = 0, ptr = 0, plus_slot = 0;
    mem_.Read(ids_ + 32, &ptr, 8);
    mem_.Read(ptr, &chunk0, 8);
    mem_.Read(chunk0 + 32, &plus_slot, 8);
    uint64_t saved = 0;
    mem_.Read(plus_slot + '+' * 16, &saved, 8);
    mem_.Put64(plus_slot + '+' * 16, String("-"));
    EXPECT_FALSE(sym.GlobalSymbolsUsable());
    mem_.Put64(plus_slot + '+' * 16, saved);
    EXPECT_TRUE(sym.GlobalSymbolsUsable());  // re-checked until it passes (the VM may still be booting)
    EXPECT_EQ(sym.Symbolize(f).full_label, "Foo#work");
  }
  {
    // last_id claiming more chunks than ids holds.
    Symbolizer sym(&mem_, off_, gsym_);
    mem_.Put32(gsym_ + off_.symbols_last_id, 5000);
    EXPECT_FALSE(sym.GlobalSymbolsUsable());
    mem_.Put32(gsym_ + off_.symbols_last_id, 600);
  }
}

TEST_F(Symbolizer31Test, FixnumFirstLineno) {
  // An iseq frame: label/base_label/path strings, first_lineno INT2FIX(42), a TOP local iseq.
  uint64_t iseq = Alloc(40), body = Alloc(320);
  mem_.Put64(iseq, RV_RB_T_IMEMO | (7 << RV_RB_IMEMO_SHIFT));
  mem_.Put64(iseq + off_.iseq_body, body);
  mem_.Put32(body + off_.body_type, 0);  // ISEQ_TYPE_TOP
  const uint64_t loc = body + off_.body_location;
  mem_.Put64(loc + off_.loc_pathobj, String("a.rb"));
  mem_.Put64(loc + off_.loc_label, String("<main>"));
  mem_.Put64(loc + off_.loc_base_label, String("<main>"));
  mem_.Put64(loc + off_.loc_first_lineno, (42 << 1) | 1);
  mem_.Put64(body + off_.body_local_iseq, iseq);
  rv_ruby_frame f{};
  f.kind = RV_RB_FRAME_ISEQ;
  f.addr = iseq;
  f.cfp_iseq = iseq;
  f.pc = 0;  // 3.1: a TOP frame without pc reports line 0
  Symbolizer sym(&mem_, off_, gsym_);
  SymbolizedFrame s = sym.Symbolize(f);
  ASSERT_TRUE(s.resolved) << *s.full_label;
  EXPECT_EQ(s.full_label, "<main>");
  EXPECT_EQ(s.path, "a.rb");
  EXPECT_EQ(s.first_lineno, 42);
  EXPECT_EQ(s.line, 0);
  // Not a Fixnum: corrupt, unresolved.
  mem_.Put64(loc + off_.loc_first_lineno, 42);
  EXPECT_FALSE(sym.Symbolize(f).resolved);
}

}  // namespace
}  // namespace rvbpfd
