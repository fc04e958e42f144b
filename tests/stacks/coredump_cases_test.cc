// The coredump regression suite: every case under coredump-testdata/<ruby>/<case>.json (recorded by
// tools/record-coredump-case) is walked and symbolized from its core alone and must match its expectation exactly:
// CRuby's own golden frames, or the case's `expected` frames (written by --rebase --write) whose every deviation from
// the golden frames is named by a rule this file documents (kDeviationRules).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
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

// Why a case's expected frames may differ from CRuby's golden ones, per frame kind. Empty: every recorded case
// (3.1 Debian, 3.3.8, 3.4.5, YJIT, M:N) matches rb_profile_frames exactly. A rule is added here, with the CRuby
// behaviour it stands for, before `expected.deviations` may name it; "unexplained" (what --rebase --write puts on a
// new deviation) is never one.
const std::map<std::string, std::string> kDeviationRules = {};

// The frames the walker must produce for golden thread `index`: the case's expectation when it has one.
nlohmann::json ExpectedThread(const nlohmann::json& c, size_t index) {
  nlohmann::json t = c["golden"]["threads"][index];
  if (c.contains("expected")) t["frames"] = c["expected"]["threads"][index]["frames"];
  return t;
}

class CoredumpCaseTest : public ::testing::TestWithParam<std::string> {};

// Problems with a case's `expected` section: it may only differ from the golden frames where expected.deviations
// says so, each with a documented rule, and the listed deviations must be exactly the differences. Empty when the case
// has no `expected` (the golden frames are the expectation).
std::vector<std::string> DeviationProblems(const nlohmann::json& c) {
  std::vector<std::string> problems;
  if (!c.contains("expected")) return problems;
  const nlohmann::json& golden = c["golden"]["threads"];
  const nlohmann::json& expected = c["expected"]["threads"];
  if (expected.size() != golden.size()) return {"expected has " + std::to_string(expected.size()) + " threads"};
  std::map<std::pair<size_t, size_t>, std::string> listed;
  for (const nlohmann::json& d : c["expected"]["deviations"]) {
    listed[{d["thread"].get<size_t>(), d["frame"].get<size_t>()}] = d["rule"].get<std::string>();
  }
  for (size_t i = 0; i < golden.size(); i++) {
    const nlohmann::json& g = golden[i]["frames"];
    const nlohmann::json& e = expected[i]["frames"];
    // An incomplete expected walk deviates at its end (frame index = its frame count).
    const bool complete = expected[i].value("complete", true) && expected[i].value("ec_readable", true);
    for (size_t j = 0; j < std::max(g.size(), e.size()) + (complete ? 0 : 1); j++) {
      const std::string where = "thread " + std::to_string(i) + " frame " + std::to_string(j);
      const bool differs = j >= g.size() || j >= e.size() || g[j] != e[j];
      auto it = listed.find({i, j});
      if (!differs) {
        if (it != listed.end()) problems.push_back(where + " is listed as a deviation but matches CRuby");
        continue;
      }
      if (it == listed.end()) {
        problems.push_back(where + " differs from CRuby's golden frame and is not listed in expected.deviations");
        continue;
      }
      if (!kDeviationRules.count(it->second)) {
        problems.push_back(where + ": rule \"" + it->second +
                           "\" is not documented in kDeviationRules (an unexplained difference from CRuby)");
      }
      listed.erase(it);
    }
  }
  for (const auto& [key, rule] : listed) {
    problems.push_back("deviation at thread " + std::to_string(key.first) + " frame " + std::to_string(key.second) +
                       " points at no differing frame");
  }
  return problems;
}

TEST_P(CoredumpCaseTest, ExpectationDeviatesFromGoldenOnlyByDocumentedRules) {
  std::string all;
  for (const std::string& p : DeviationProblems(LoadJson(GetParam()))) all += "\n  " + p;
  EXPECT_TRUE(all.empty()) << all;
}

TEST_P(CoredumpCaseTest, EveryThreadMatchesItsExpectation) {
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
  for (size_t i = 0; i < threads.size(); i++) {
    const nlohmann::json t = ExpectedThread(c, i);
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
  for (size_t i = 0; i < c["golden"]["threads"].size(); i++) {
    if (!testing::CompareThread(**reader, broken, gsym, ExpectedThread(c, i)).empty()) differing++;
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
  if (elf->has_symtab()) {
    // The test Rubies carry DWARF: most fields must come from it, or the cross-check checks nothing.
    EXPECT_GE(report.from_dwarf, 25);
    std::string all;
    for (const std::string& m : report.mismatches) all += "\n  " + m;
    EXPECT_TRUE(report.mismatches.empty()) << all;
  } else {
    // A distro-stripped binary (Debian's libruby-3.1): no DWARF to check the table against (the frames matching
    // CRuby's is the check), and ruby_global_symbols comes from rb_id2str's code.
    EXPECT_EQ(report.from_dwarf, 0);
    EXPECT_EQ(c["vm"].value("global_symbols_source", ""), "code");
  }
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

// tools/record-coredump-case --rebase, on a copy of a stored case (through rvbpfd_coredump_tool, built with this
// binary). Exit status and output of one run.
struct ToolRun {
  int status = -1;
  std::string output;
};

ToolRun RunRebase(const fs::path& cases_dir, bool write) {
  const std::string cmd = "python3 '" RVBPFD_SOURCE_DIR "/tools/record-coredump-case' --rebase --tool '" +
                          std::string(RVBPFD_BINARY_DIR) + "/rvbpfd_coredump_tool' --out-dir '" + cases_dir.string() +
                          "'" + (write ? " --write" : "") + " 2>&1";
  ToolRun r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

void SaveJson(const fs::path& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(1) << "\n";
}

class RebaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The smallest stored case; any would do.
    const fs::path src = fs::path(RVBPFD_SOURCE_DIR) / "coredump-testdata" / "3.1-debian";
    dir_ = fs::path(::testing::TempDir()) / ("rvbpfd-rebase-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "3.1-debian");
    case_ = dir_ / "3.1-debian" / "scenarios.json";
    fs::copy_file(src / "scenarios.json", case_);
    fs::copy_file(src / "scenarios.core.gz", dir_ / "3.1-debian" / "scenarios.core.gz");
    original_ = LoadJson(case_.string());
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_, case_;
  nlohmann::json original_;
};

// A wrong expectation (one label altered) is reported as a unified diff; --write restores the golden frames as the
// expectation and leaves `golden` as it was.
TEST_F(RebaseTest, ReportsAnAlteredExpectationAndWriteFixesIt) {
  nlohmann::json c = original_;
  nlohmann::json threads = nlohmann::json::array();
  for (const nlohmann::json& t : c["golden"]["threads"]) {
    threads.push_back({{"frames", t["frames"]}, {"ec_readable", true}, {"complete", true}, {"status", 0}});
  }
  ASSERT_EQ(threads[0]["frames"][1]["label"], "Object#capture_now");
  threads[0]["frames"][1]["label"] = "Object#altered_on_purpose";
  c["expected"] = {{"threads", threads}, {"deviations", {{{"thread", 0}, {"frame", 1}, {"rule", "unexplained"}}}}};
  SaveJson(case_, c);
  EXPECT_FALSE(DeviationProblems(c).empty());  // the suite would refuse this case

  ToolRun check = RunRebase(dir_, false);
  EXPECT_EQ(check.status, 1) << check.output;
  EXPECT_NE(check.output.find("-thread 0 (main) #1: \"Object#altered_on_purpose\""), std::string::npos) << check.output;
  EXPECT_NE(check.output.find("+thread 0 (main) #1: \"Object#capture_now\""), std::string::npos) << check.output;
  EXPECT_EQ(LoadJson(case_.string()), c);  // without --write nothing changes

  ToolRun write = RunRebase(dir_, true);
  EXPECT_EQ(write.status, 0) << write.output;
  const nlohmann::json rebased = LoadJson(case_.string());
  EXPECT_FALSE(rebased.contains("expected")) << "the walker matches CRuby again: the golden frames are the expectation";
  EXPECT_EQ(rebased["golden"], original_["golden"]);
  EXPECT_TRUE(DeviationProblems(rebased).empty());

  ToolRun again = RunRebase(dir_, false);
  EXPECT_EQ(again.status, 0) << again.output;
  EXPECT_NE(again.output.find("3.1-debian/scenarios: no differences"), std::string::npos) << again.output;
}

// When the walker disagrees with CRuby (simulated by altering the golden frame), --write records the walker's frames
// as the expectation and lists the deviation as "unexplained": the golden frame is kept and the suite still fails.
TEST_F(RebaseTest, WriteNeverOverwritesGoldenFrames) {
  nlohmann::json c = original_;
  c["golden"]["threads"][0]["frames"][1]["label"] = "Object#what_cruby_said";
  SaveJson(case_, c);

  ToolRun check = RunRebase(dir_, false);
  EXPECT_EQ(check.status, 1) << check.output;
  EXPECT_NE(check.output.find("-thread 0 (main) #1: \"Object#what_cruby_said\""), std::string::npos) << check.output;

  ToolRun write = RunRebase(dir_, true);
  EXPECT_EQ(write.status, 0) << write.output;
  EXPECT_NE(write.output.find("1 unexplained"), std::string::npos) << write.output;
  const nlohmann::json rebased = LoadJson(case_.string());
  EXPECT_EQ(rebased["golden"], c["golden"]);
  ASSERT_TRUE(rebased.contains("expected"));
  EXPECT_EQ(rebased["expected"]["threads"][0]["frames"][1]["label"], "Object#capture_now");
  ASSERT_EQ(rebased["expected"]["deviations"].size(), 1u);
  EXPECT_EQ(rebased["expected"]["deviations"][0]["rule"], "unexplained");
  const std::vector<std::string> problems = DeviationProblems(rebased);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("unexplained"), std::string::npos) << problems[0];

  // The expectation now matches the walker: a second rebase finds nothing to change.
  ToolRun again = RunRebase(dir_, false);
  EXPECT_EQ(again.status, 0) << again.output;
}

}  // namespace
}  // namespace rvbpfd
