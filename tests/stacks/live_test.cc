// Live: a test Ruby runs coredump-testdata/programs/scenarios.rb, captures CRuby's own frames for every thread
// (tests/golden's rvgolden) and stops itself; we then walk and symbolize it through process_vm_readv, with offsets
// from its binary's DWARF, and must produce exactly the same frames. Debian's own stripped ruby3.1 (no DWARF, no
// .symtab) runs too: offsets from the table, ruby_global_symbols recovered from code.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
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

constexpr const char* kRubies = "/var/cache/rvbpfd/rubies";
// Debian 12's ruby3.1 (tools/install-deps.sh: ruby, ruby-dev), named like a test Ruby.
constexpr const char* kDebianRuby31 = "3.1-debian";

std::string RubyBinary(const std::string& name) {
  if (name == kDebianRuby31) return "/usr/bin/ruby3.1";
  return std::string(kRubies) + "/" + name + "/bin/ruby";
}

// Builds tests/golden with this Ruby's mkmf into the build tree; returns the directory or "" on failure.
std::string BuildGolden(const std::string& ruby_name, const std::string& ruby_bin) {
  const std::string dir = std::string(RVBPFD_BINARY_DIR) + "/golden-" + ruby_name;
  fs::create_directories(dir);
  const std::string cmd = "cd '" + dir + "' && '" + ruby_bin + "' '" RVBPFD_SOURCE_DIR "/tests/golden/extconf.rb' " +
                          "> build.log 2>&1 && make >> build.log 2>&1";
  if (std::system(cmd.c_str()) != 0) return "";
  return dir;
}

class LiveTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LiveTest, WalkerAndSymbolizerMatchRbProfileFramesOnALiveProcess) {
  const std::string name = GetParam();
  const std::string ruby = RubyBinary(name);
  if (access(ruby.c_str(), X_OK) != 0) {
    GTEST_SKIP() << ruby << " not installed (tools/build-test-rubies.sh, or Debian's ruby package)";
  }
  const std::string golden_dir = BuildGolden(name, ruby);
  ASSERT_FALSE(golden_dir.empty()) << "building tests/golden failed, see " << RVBPFD_BINARY_DIR << "/golden-" << name;
  const std::string out = golden_dir + "/live-" + std::to_string(getpid()) + ".json";
  fs::remove(out);

  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("RVGOLDEN_OUT", out.c_str(), 1);
    setenv("RVGOLDEN_STOP", "1", 1);
    const std::string program = std::string(RVBPFD_SOURCE_DIR) + "/coredump-testdata/programs/scenarios.rb";
    execl(ruby.c_str(), ruby.c_str(), "-I", golden_dir.c_str(), "-rrvgolden", program.c_str(), nullptr);
    _exit(127);
  }
  int status = 0;
  // The program stops itself (SIGSTOP from inside RvGolden.capture) after writing the golden frames.
  ASSERT_EQ(waitpid(pid, &status, WUNTRACED), pid);
  struct Killer {
    pid_t pid;
    ~Killer() {
      kill(pid, SIGKILL);
      int st;
      waitpid(pid, &st, 0);
    }
  } killer{pid};
  ASSERT_TRUE(WIFSTOPPED(status)) << "ruby exited with status " << status << " before capturing";

  std::ifstream in(out);
  const nlohmann::json golden = nlohmann::json::parse(in);
  fs::remove(out);

  // The VM binary: libruby.so when the process maps one, else the executable (static build); its lowest mapping
  // gives the load bias. (Target discovery proper lives in src/target; this keeps the test to the stacks module.)
  std::string vm_path;
  uint64_t lowest = UINT64_MAX;
  {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    std::string line;
    std::vector<std::pair<uint64_t, std::string>> entries;
    while (std::getline(maps, line)) {
      const size_t slash = line.find('/');
      if (slash == std::string::npos) continue;
      entries.emplace_back(std::stoull(line, nullptr, 16), line.substr(slash));
    }
    for (const auto& [start, path] : entries) {
      if (fs::path(path).filename().string().rfind("libruby", 0) == 0) vm_path = path;
    }
    if (vm_path.empty()) vm_path = fs::read_symlink("/proc/" + std::to_string(pid) + "/exe").string();
    for (const auto& [start, path] : entries) {
      if (path == vm_path) lowest = std::min(lowest, start);
    }
  }
  ASSERT_NE(lowest, UINT64_MAX) << vm_path << " not mapped";
  auto elf = ElfFile::Open(vm_path);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  int major = 0, minor = 0;
  ASSERT_EQ(std::sscanf(golden["ruby_version"].get<std::string>().c_str(), "%d.%d", &major, &minor), 2);
  OffsetsReport report;
  auto off = OffsetsForBinary(elf.value(), major, minor, &report);
  ASSERT_TRUE(off.ok()) << off.error().ToString();
  EXPECT_TRUE(report.mismatches.empty());
  auto gsym = FindGlobalSymbolsVaddr(elf.value());
  ASSERT_TRUE(gsym.ok()) << gsym.error().ToString();
  const uint64_t bias = LoadBiasFromLowestMapping(elf.value(), lowest);
  // Before 3.3 rvgolden finds rb_thread_t.ec itself (RVGOLDEN_EC_SWAP); the table must agree.
  if (golden.contains("th_ec_offset")) {
    EXPECT_EQ(golden["th_ec_offset"].get<uint32_t>(), off->thread_ec);
  }

  ProcessMemoryReader mem(pid);
  const nlohmann::json& threads = golden["threads"];
  ASSERT_GE(threads.size(), 6u);  // main, sleeper, mutex, io, deep, spinner
  for (const nlohmann::json& t : threads) {
    SCOPED_TRACE("thread " + t["name"].dump());
    std::vector<std::string> diffs = testing::CompareThread(mem, off.value(), gsym.value() + bias, t);
    std::string all;
    for (const std::string& d : diffs) all += "\n  " + d;
    EXPECT_TRUE(diffs.empty()) << all;
  }
}

INSTANTIATE_TEST_SUITE_P(Rubies, LiveTest, ::testing::Values("3.3.8-shared", "3.4.5-static", kDebianRuby31),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace rvbpfd
