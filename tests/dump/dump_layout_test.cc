// The dump's built-in layout table (DumpLayoutTable) is what a VM binary without DWARF is dumped with, so each field
// it has must equal the DWARF layout of every test Ruby of its release line; and with DWARF every field a dump reads
// is known. A failure names the field.
#include "dump/dump_layout.h"

#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "elf/elf_fixtures.h"
#include "sites/sites.h"

namespace rvbpfd {
namespace {

struct LayoutCase {
  const char* ruby;
  const char* elf;
  const char* version;
};

class DumpLayoutTableTest : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(DumpLayoutTableTest, TableEqualsDwarfAndDwarfGivesEveryField) {
  const LayoutCase& c = GetParam();
  const std::string dir = testing::TestRuby(c.ruby);
  if (dir.empty()) GTEST_SKIP() << "test Ruby " << c.ruby << " not built (tools/build-test-rubies.sh)";
  Result<ElfFile> elf = ElfFile::Open(dir + "/" + c.elf);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  int major = 0, minor = 0, teeny = 0;
  ASSERT_TRUE(ParseRubyVersion(c.version, &major, &minor, &teeny));
  Result<RubyOffsets> off = OffsetsForBinary(*elf, major, minor, nullptr);
  ASSERT_TRUE(off.ok()) << off.error().ToString();
  Result<DumpLayout> l = DumpLayoutForBinary(*elf, major, minor, *off);
  ASSERT_TRUE(l.ok()) << l.error().ToString();
  for (const std::string& m : l->report.mismatches) ADD_FAILURE() << c.ruby << " dump table field " << m;
  EXPECT_GE(l->report.dwarf_fields.size(), 24u) << c.ruby << ": too little DWARF for the table check";  // below
  const DumpLayout table = DumpLayoutTable(major, minor, *off);
  const std::pair<const char*, uint32_t DumpLayout::*> fields[] = {
      {"vm_main_ractor", &DumpLayout::vm_main_ractor},     {"vm_ractor_set", &DumpLayout::vm_ractor_set},
      {"vm_ractor_cnt", &DumpLayout::vm_ractor_cnt},       {"ractor_vmlr_node", &DumpLayout::ractor_vmlr_node},
      {"ractor_threads_set", &DumpLayout::ractor_threads_set},
      {"ractor_threads_cnt", &DumpLayout::ractor_threads_cnt},
      {"th_lt_node", &DumpLayout::th_lt_node},             {"th_ractor", &DumpLayout::th_ractor},
      {"th_self", &DumpLayout::th_self},
      {"th_nt", &DumpLayout::th_nt},                       {"th_ec", &DumpLayout::th_ec},
      {"th_status_bit", &DumpLayout::th_status_bit},       {"th_locking_mutex", &DumpLayout::th_locking_mutex},
      {"th_join_list", &DumpLayout::th_join_list},         {"th_name", &DumpLayout::th_name},
      {"nt_tid", &DumpLayout::nt_tid},                     {"ec_cfp", &DumpLayout::ec_cfp},
      {"ec_fiber_ptr", &DumpLayout::ec_fiber_ptr},         {"ec_thread_ptr", &DumpLayout::ec_thread_ptr},
      {"mutex_fiber", &DumpLayout::mutex_fiber},           {"typed_type", &DumpLayout::typed_type},
      {"typed_flag", &DumpLayout::typed_flag},             {"typed_data", &DumpLayout::typed_data},
      {"waiting_next", &DumpLayout::waiting_next},         {"waiting_thread", &DumpLayout::waiting_thread},
      {"cfp_self", &DumpLayout::cfp_self},                 {"waiter_th", &DumpLayout::waiter_th},
      {"waiter_node", &DumpLayout::waiter_node},           {"queue_waitq", &DumpLayout::queue_waitq},
      {"szqueue_pushq", &DumpLayout::szqueue_pushq},       {"condvar_waitq", &DumpLayout::condvar_waitq},
  };
  for (const auto& [name, field] : fields) {
    EXPECT_NE((*l).*field, DumpLayout::kNoField) << c.ruby << ": DWARF gives no " << name;
    // The table is partial (dump_layout.cc): what it has must be right.
    if (table.*field != DumpLayout::kNoField) EXPECT_EQ(table.*field, (*l).*field) << c.ruby << ": table field " << name;
  }
}

TEST(DumpLayoutTest, OtherVersionsHaveNoThreadListWithoutDwarf) {
  Result<RubyOffsets> off = RubyOffsets::ForVersion(3, 2);
  ASSERT_TRUE(off.ok());
  const DumpLayout l = DumpLayoutTable(3, 2, *off);
  EXPECT_EQ(l.ractor_threads_set, DumpLayout::kNoField);
  Result<RubyOffsets> off34 = RubyOffsets::ForVersion(3, 4);
  ASSERT_TRUE(off34.ok());
  EXPECT_NE(DumpLayoutTable(3, 4, *off34).ractor_threads_set, DumpLayout::kNoField);
}

INSTANTIATE_TEST_SUITE_P(TestRubies, DumpLayoutTableTest,
                         ::testing::Values(LayoutCase{"3.3.8-shared", "lib/libruby.so.3.3.8", "3.3.8"},
                                           LayoutCase{"3.4.5-static", "bin/ruby", "3.4.5"},
                                           LayoutCase{"3.4.5-shared-yjit", "lib/libruby.so.3.4.5", "3.4.5"}),
                         [](const ::testing::TestParamInfo<LayoutCase>& info) {
                           std::string n = info.param.ruby;
                           std::erase_if(n, [](char ch) { return ch == '.' || ch == '-'; });
                           return "Ruby" + n;
                         });

// The layout DWARF gave is cached under <cache_dir>/<key>.dump.json: the second call is served from the entry (a
// marked field comes back), an entry out of range or of another key is recomputed, and every field round-trips.
TEST(DumpLayoutCacheTest, TheDwarfLayoutIsCachedAndABadEntryRecomputed) {
  const std::string dir = testing::TestRuby("3.3.8-shared");
  if (dir.empty()) GTEST_SKIP() << "test Ruby 3.3.8-shared not built (tools/build-test-rubies.sh)";
  Result<ElfFile> elf = ElfFile::Open(dir + "/lib/libruby.so.3.3");
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  Result<RubyOffsets> off = OffsetsForBinary(*elf, 3, 3, nullptr);
  ASSERT_TRUE(off.ok());
  testing::TempDir tmp;
  const std::string cache = tmp.Join("cache"), key = "k1", entry = cache + "/k1.dump.json";
  auto text = [](Result<DumpLayout> l) { return l ? DumpLayoutCacheEntry(l.value(), 3, 3, "x") : std::string(); };
  Result<DumpLayout> fresh = DumpLayoutForBinary(*elf, 3, 3, *off);
  ASSERT_TRUE(fresh.ok());
  ASSERT_FALSE(fresh->report.dwarf_fields.empty());
  EXPECT_EQ(text(DumpLayoutForBinary(*elf, 3, 3, *off, key, cache)), text(fresh));
  ASSERT_TRUE(testing::FileExists(entry));

  nlohmann::json doc = nlohmann::json::parse(testing::ReadFile(entry));
  doc["layout"]["th_name"] = 4242;
  testing::WriteFile(entry, doc.dump());
  Result<DumpLayout> marked = DumpLayoutForBinary(*elf, 3, 3, *off, key, cache);
  ASSERT_TRUE(marked.ok());
  EXPECT_EQ(marked->th_name, 4242u);
  marked->th_name = fresh->th_name;
  EXPECT_EQ(text(marked), text(fresh)) << "a field other than the mark did not round-trip";
  EXPECT_EQ(marked->gvl.holder, fresh->gvl.holder);

  doc["layout"]["th_name"] = 70000;
  testing::WriteFile(entry, doc.dump());
  EXPECT_EQ(text(DumpLayoutForBinary(*elf, 3, 3, *off, key, cache)), text(fresh));
  EXPECT_FALSE(ParseDumpLayoutCacheEntry(testing::ReadFile(entry), "k2", 3, 3, *off).ok()) << "another key";
  EXPECT_FALSE(ParseDumpLayoutCacheEntry(testing::ReadFile(entry), key, 3, 4, *off).ok()) << "another version";
  doc["layout"].erase("th_nt");
  EXPECT_FALSE(ParseDumpLayoutCacheEntry(doc.dump(), key, 3, 3, *off).ok()) << "a missing field";
}

}  // namespace
}  // namespace rvbpfd
