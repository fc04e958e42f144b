// The coredump regression suite: every case under coredump-testdata/<ruby>/<case>.json (recorded by
// tools/record-coredump-case) is walked and symbolized from its core alone and must match CRuby's own frames exactly.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "elf/elf_file.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"
#include "stacks_test_util.h"

namespace rvbpfd {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> CaseFiles() {
  std::vector<std::string> cases;
  const fs::path root = fs::path(RVBPFD_SOURCE_DIR) / "coredump-testdata";
  if (!fs::is_directory(root)) return cases;
  for (const auto& ruby_dir : fs::directory_iterator(root)) {
    if (!ruby_dir.is_directory() || ruby_dir.path().filename() == "programs") continue;
    for (const auto& f : fs::directory_iterator(ruby_dir.path())) {
      const std::string name = f.path().filename().string();
      if (f.path().extension() == ".json" && name[0] != '.') cases.push_back(f.path().string());
    }
  }
  std::sort(cases.begin(), cases.end());
  return cases;
}

nlohmann::json LoadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::pair<int, int> MajorMinor(const std::string& version) {
  int major = 0, minor = 0;
  std::sscanf(version.c_str(), "%d.%d", &major, &minor);
  return {major, minor};
}

class CoredumpCaseTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CoredumpCaseTest, EveryThreadMatchesRbProfileFrames) {
  const nlohmann::json c = LoadJson(GetParam());
  const fs::path core = fs::path(GetParam()).parent_path() / c["core"].get<std::string>();
  // Self-contained: bytes missing from the core must not be fetched from binaries on this machine.
  CoreFileReader::Options opts;
  opts.use_original_files = false;
  auto reader = CoreFileReader::Open(core.string(), opts);
  ASSERT_TRUE(reader.ok()) << reader.error().ToString();
  auto [major, minor] = MajorMinor(c["ruby_version"].get<std::string>());
  auto off = RubyOffsets::ForVersion(major, minor);
  ASSERT_TRUE(off.ok()) << off.error().ToString();
  const uint64_t gsym = std::stoull(c["vm"]["global_symbols"].get<std::string>(), nullptr, 16);

  const nlohmann::json& threads = c["golden"]["threads"];
  ASSERT_FALSE(threads.empty());
  size_t total = 0;
  for (const nlohmann::json& t : threads) {
    SCOPED_TRACE("thread " + t["name"].dump() + " tid " + t["native_tid"].dump());
    size_t n = 0;
    std::vector<std::string> diffs = testing::CompareThread(**reader, off.value(), gsym, t, &n);
    total += n;
    std::string all;
    for (const std::string& d : diffs) all += "\n  " + d;
    EXPECT_TRUE(diffs.empty()) << all;
  }
  EXPECT_GT(total, 0u);
  EXPECT_EQ((*reader)->original_file_reads(), 0u);
}

// The comparison itself must notice a broken walker: with the control-frame stride of another Ruby version (64
// instead of 56, or the reverse) the frames cannot match.
TEST_P(CoredumpCaseTest, WrongFrameStrideIsDetected) {
  const nlohmann::json c = LoadJson(GetParam());
  const fs::path core = fs::path(GetParam()).parent_path() / c["core"].get<std::string>();
  auto reader = CoreFileReader::Open(core.string(), CoreFileReader::Options{"", false});
  ASSERT_TRUE(reader.ok()) << reader.error().ToString();
  auto [major, minor] = MajorMinor(c["ruby_version"].get<std::string>());
  auto off = RubyOffsets::ForVersion(major, minor);
  ASSERT_TRUE(off.ok());
  RubyOffsets broken = off.value();
  broken.walk.cfp_size = broken.walk.cfp_size == 56 ? 64 : 56;
  const uint64_t gsym = std::stoull(c["vm"]["global_symbols"].get<std::string>(), nullptr, 16);
  size_t differing = 0;
  for (const nlohmann::json& t : c["golden"]["threads"]) {
    if (!testing::CompareThread(**reader, broken, gsym, t).empty()) differing++;
  }
  EXPECT_EQ(differing, c["golden"]["threads"].size());
}

// When the exact VM binary the case was recorded with is on this machine, its DWARF and .symtab must agree with the
// table offsets and the recorded symbol address the suite relies on.
TEST_P(CoredumpCaseTest, TablesAgreeWithTheRecordedBinary) {
  const nlohmann::json c = LoadJson(GetParam());
  const std::string vm = c["vm"]["path"].get<std::string>();
  auto elf = ElfFile::Open(vm);
  if (!elf.ok() || elf->build_id() != c["vm"]["build_id"].get<std::string>()) {
    GTEST_SKIP() << "the recorded VM binary " << vm << " (build-id " << c["vm"]["build_id"].get<std::string>()
                 << ") is not on this machine; the table offsets are used unchecked";
  }
  auto [major, minor] = MajorMinor(c["ruby_version"].get<std::string>());
  OffsetsReport report;
  auto off = OffsetsForBinary(elf.value(), major, minor, &report);
  ASSERT_TRUE(off.ok()) << off.error().ToString();
  // The test Rubies carry DWARF: most fields must come from it, or the cross-check checks nothing.
  EXPECT_GE(report.from_dwarf, 25);
  std::string all;
  for (const std::string& m : report.mismatches) all += "\n  " + m;
  EXPECT_TRUE(report.mismatches.empty()) << all;
  auto gsym = FindGlobalSymbolsVaddr(elf.value());
  ASSERT_TRUE(gsym.ok()) << gsym.error().ToString();
  const uint64_t bias = std::stoull(c["vm"]["load_bias"].get<std::string>(), nullptr, 16);
  EXPECT_EQ(gsym.value() + bias, std::stoull(c["vm"]["global_symbols"].get<std::string>(), nullptr, 16));
}

std::string CaseName(const ::testing::TestParamInfo<std::string>& info) {
  fs::path p(info.param);
  std::string name = p.parent_path().filename().string() + "_" + p.stem().string();
  for (char& ch : name) {
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Cases, CoredumpCaseTest, ::testing::ValuesIn(CaseFiles()), CaseName);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CoredumpCaseTest);

}  // namespace
}  // namespace rvbpfd
