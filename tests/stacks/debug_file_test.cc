// A stripped test Ruby with its split debug file found by build-id must give exactly what the unstripped binary
// gives: the same probe sites (th locations included), struct offsets from DWARF, ruby_global_symbols and EC route.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "elf/debug_lookup.h"
#include "elf/elf_fixtures.h"
#include "sites/sites.h"
#include "stacks/ec_route.h"
#include "stacks/ruby_offsets.h"

namespace rvbpfd {
namespace {

using testing::TempDir;
using testing::TestRuby;

bool RunCommand(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()) == 0; }

struct Case {
  const char* ruby;
  const char* vm;  // relative to the Ruby's prefix
  const char* version;
  const char* objcopy_flags;  // how the debug file is made
};

class DebugFileTest : public ::testing::TestWithParam<Case> {};

TEST_P(DebugFileTest, StrippedPlusDebugFileEqualsUnstripped) {
  const Case& c = GetParam();
  const std::string dir = TestRuby(c.ruby);
  if (dir.empty()) GTEST_SKIP() << "test Ruby " << c.ruby << " not built (tools/build-test-rubies.sh)";
  TempDir tmp;
  const std::string full_path = dir + "/" + c.vm;
  const std::string stripped_path = tmp.Join("vm");
  const std::string debug_path = tmp.Join("vm.debug");
  ASSERT_TRUE(RunCommand(std::string("objcopy --only-keep-debug ") + c.objcopy_flags + " '" + full_path + "' '" +
                         debug_path + "'"));
  ASSERT_TRUE(RunCommand("strip -o '" + stripped_path + "' '" + full_path + "'"));

  Result<ElfFile> full = ElfFile::Open(full_path);
  ASSERT_TRUE(full.ok()) << full.error().message();
  Result<ElfFile> stripped = ElfFile::Open(stripped_path);
  ASSERT_TRUE(stripped.ok()) << stripped.error().message();
  ASSERT_FALSE(stripped->has_symtab());
  DebugLookupConfig config;
  config.debug_dir = tmp.Join("debug");
  config.debuginfod_timeout_s = 0;
  const std::string installed = BuildIdDebugPath("", config.debug_dir, full->build_id());
  ASSERT_TRUE(RunCommand("mkdir -p \"$(dirname '" + installed + "')\" && cp '" + debug_path + "' '" + installed + "'"));
  DebugLookupResult r = AttachDebugInfo(&stripped.value(), config);
  ASSERT_TRUE(r.attached) << r.Summary();

  Result<SiteSet> want = FindSites(*full, c.version);
  ASSERT_TRUE(want.ok()) << want.error().message();
  Result<SiteSet> got = FindSites(*stripped, c.version);
  ASSERT_TRUE(got.ok()) << got.error().message();
  EXPECT_EQ(want->symbols_source, "binary");
  EXPECT_EQ(got->symbols_source, "build-id directory " + installed);
  got->symbols_source = want->symbols_source;
  EXPECT_EQ(SiteSetToJson(*got), SiteSetToJson(*want));
  EXPECT_EQ(got->offsets_source, "dwarf");
  size_t dwarf_th = 0;
  for (const ProbeSite& s : got->sites) dwarf_th += s.th_source == "dwarf";
  EXPECT_GT(dwarf_th, 0u) << "no site's th came from DWARF";

  int major = 0, minor = 0, teeny = 0;
  ASSERT_TRUE(ParseRubyVersion(c.version, &major, &minor, &teeny));
  OffsetsReport want_report, got_report;
  Result<RubyOffsets> want_off = OffsetsForBinary(*full, major, minor, &want_report);
  Result<RubyOffsets> got_off = OffsetsForBinary(*stripped, major, minor, &got_report);
  ASSERT_TRUE(want_off.ok() && got_off.ok());
  EXPECT_GT(got_report.from_dwarf, 0);
  EXPECT_EQ(got_report.from_dwarf, want_report.from_dwarf);
  EXPECT_EQ(got_report.mismatches, want_report.mismatches);
  EXPECT_EQ(std::memcmp(&got_off->walk, &want_off->walk, sizeof(want_off->walk)), 0);
  EXPECT_EQ(got_off->thread_ec, want_off->thread_ec);
  EXPECT_EQ(got_off->ractor_running_ec, want_off->ractor_running_ec);
  EXPECT_EQ(got_off->klass_classpath, want_off->klass_classpath);

  Result<uint64_t> want_gsym = FindGlobalSymbolsVaddr(*full);
  Result<uint64_t> got_gsym = FindGlobalSymbolsVaddr(*stripped);
  ASSERT_TRUE(want_gsym.ok() && got_gsym.ok());
  EXPECT_EQ(*got_gsym, *want_gsym);
  EXPECT_EQ(DescribeEcRoute(ComputeEcRoute(*stripped, *got_off)), DescribeEcRoute(ComputeEcRoute(*full, *want_off)));
}

INSTANTIATE_TEST_SUITE_P(
    TestRubies, DebugFileTest,
    ::testing::Values(Case{"3.4.5-static", "bin/ruby", "3.4.5", ""},
                      Case{"3.3.8-shared", "lib/libruby.so.3.3.8", "3.3.8", ""},
                      // Debian's debug packages hold compressed DWARF (dh_strip).
                      Case{"3.3.8-shared", "lib/libruby.so.3.3.8", "3.3.8", "--compress-debug-sections"}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string n = std::string(info.param.ruby) + (info.param.objcopy_flags[0] ? "_compressed" : "");
      for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return n;
    });

}  // namespace
}  // namespace rvbpfd
