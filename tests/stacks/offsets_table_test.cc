// The built-in struct-offset tables (RubyOffsets::ForVersion, TableOffsets) are what a VM binary without DWARF is
// walked with, so each must equal the DWARF layout of every test Ruby of its release line. A failure names the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "elf/elf_fixtures.h"
#include "sites/sites.h"
#include "stacks/ruby_offsets.h"

namespace rvbpfd {
namespace {

struct TableCase {
  const char* ruby;
  const char* elf;
  const char* version;
};

class OffsetsTableTest : public ::testing::TestWithParam<TableCase> {};

TEST_P(OffsetsTableTest, TableEqualsDwarfFieldByField) {
  const TableCase& c = GetParam();
  const std::string dir = testing::TestRuby(c.ruby);
  if (dir.empty()) GTEST_SKIP() << "test Ruby " << c.ruby << " not built (tools/build-test-rubies.sh)";
  Result<ElfFile> elf = ElfFile::Open(dir + "/" + c.elf);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  int major = 0, minor = 0, teeny = 0;
  ASSERT_TRUE(ParseRubyVersion(c.version, &major, &minor, &teeny));
  OffsetsReport report;
  Result<RubyOffsets> off = OffsetsForBinary(*elf, major, minor, &report);
  ASSERT_TRUE(off.ok()) << off.error().ToString();
  // Without enough DWARF-backed fields the comparison would check nothing.
  EXPECT_GE(report.from_dwarf, 25) << c.ruby << " has too little DWARF for the table check";
  for (const std::string& m : report.mismatches) ADD_FAILURE() << c.ruby << " walker table field " << m;
  // The sampler's GVL reading: every field the table gives came from DWARF too (so the comparison above covered it),
  // and the table has them all for this release line.
  for (const char* field : {"thread.ractor", "ractor.threads.sched.running", "ractor.threads.sched.readyq",
                            "ractor.threads.sched.readyq_cnt", "thread.sched.node.readyq"}) {
    EXPECT_NE(std::find(report.dwarf_fields.begin(), report.dwarf_fields.end(), field), report.dwarf_fields.end())
        << c.ruby << ": DWARF has no " << field << ", so the GVL table entry went unchecked";
  }
  Result<RubyOffsets> table_only = RubyOffsets::ForVersion(major, minor);
  ASSERT_TRUE(table_only.ok());
  EXPECT_EQ(table_only->gvl.base, uint32_t{RV_GVL_BASE_THREAD_RACTOR}) << c.ruby << ": no GVL table entry";
  EXPECT_EQ(off->gvl.base, uint32_t{RV_GVL_BASE_THREAD_RACTOR});

  // The scheduler's thread offsets (th->nt, nt->tid, th->serial): DWARF of the binary against TableOffsets.
  Result<SiteSet> sites = FindSites(*elf, c.version);
  ASSERT_TRUE(sites.ok()) << sites.error().ToString();
  ASSERT_EQ(sites->offsets_source, "dwarf");
  rv_offsets table{};
  uint32_t main_serial = 0;
  ASSERT_TRUE(TableOffsets(major, minor, &table, &main_serial));
  EXPECT_EQ(table.th_nt, sites->offsets.th_nt) << c.ruby << " thread table field rb_thread_t.nt";
  EXPECT_EQ(table.nt_tid, sites->offsets.nt_tid) << c.ruby << " thread table field rb_native_thread.tid";
  EXPECT_EQ(table.th_serial, sites->offsets.th_serial) << c.ruby << " thread table field rb_thread_t.serial";
}

INSTANTIATE_TEST_SUITE_P(TestRubies, OffsetsTableTest,
                         ::testing::Values(TableCase{"3.3.8-shared", "lib/libruby.so.3.3.8", "3.3.8"},
                                           TableCase{"3.4.5-static", "bin/ruby", "3.4.5"},
                                           TableCase{"3.4.5-shared-yjit", "lib/libruby.so.3.4.5", "3.4.5"}),
                         [](const ::testing::TestParamInfo<TableCase>& info) {
                           std::string n = info.param.ruby;
                           std::erase_if(n, [](char ch) { return ch == '.' || ch == '-'; });
                           return "Ruby" + n;
                         });

}  // namespace
}  // namespace rvbpfd
