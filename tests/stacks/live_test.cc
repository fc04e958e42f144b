// Live: a test Ruby runs coredump-testdata/programs/scenarios.rb, captures CRuby's own frames for every thread
// (tests/golden's rvgolden) and stops itself; we then walk and symbolize it through process_vm_readv, with offsets
// from its binary's DWARF, and must produce exactly the same frames. The YJIT test Ruby runs with every method
// JIT-compiled (live_golden.h). Debian's own stripped ruby3.1 (no DWARF, no .symtab) runs too: offsets from the
// table, ruby_global_symbols recovered from code.
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
#include "live_golden.h"
#include "stacks_test_util.h"

namespace rvbpfd {
namespace {

namespace fs = std::filesystem;

// Debian 12's ruby3.1 (tools/install-deps.sh: ruby, ruby-dev), named like a test Ruby.
constexpr const char* kDebianRuby31 = "3.1-debian";

std::string RubyBinary(const std::string& name) {
  if (name == kDebianRuby31) return "/usr/bin/ruby3.1";
  return std::string(testing::kTestRubies) + "/" + name + "/bin/ruby";
}

class LiveTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LiveTest, WalkerAndSymbolizerMatchRbProfileFramesOnALiveProcess) {
  const std::string name = GetParam();
  const std::string ruby = RubyBinary(name);
  if (access(ruby.c_str(), X_OK) != 0) {
    GTEST_SKIP() << ruby << " not installed (tools/build-test-rubies.sh, or Debian's ruby package)";
  }
  testing::StoppedGoldenRuby proc;
  const std::string why = proc.Start(name, ruby, "live");
  ASSERT_TRUE(why.empty()) << why;
  const pid_t pid = proc.pid();
  const nlohmann::json& golden = proc.golden();
  const std::string& vm_path = proc.vm_path();
  const uint64_t lowest = proc.lowest_mapping();
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
  if (name.ends_with("-yjit")) {
    // The spinner's loop runs JIT code: CRuby reports its topmost frame's line as 0 (cfp->jit_return set), which is
    // what shows the comparison below covers JIT frames.
    bool spinner = false;
    for (const nlohmann::json& t : threads) {
      if (t["name"] != "spinner") continue;
      spinner = true;
      ASSERT_FALSE(t["frames"].empty());
      EXPECT_EQ(t["frames"][0]["line"].get<int>(), 0) << t["frames"][0].dump();
    }
    EXPECT_TRUE(spinner);
  }
  for (const nlohmann::json& t : threads) {
    SCOPED_TRACE("thread " + t["name"].dump());
    std::vector<std::string> diffs = testing::CompareThread(mem, off.value(), gsym.value() + bias, t);
    std::string all;
    for (const std::string& d : diffs) all += "\n  " + d;
    EXPECT_TRUE(diffs.empty()) << all;
  }
}

INSTANTIATE_TEST_SUITE_P(Rubies, LiveTest,
                         ::testing::Values("3.3.8-shared", "3.4.5-static", "3.4.5-shared-yjit", kDebianRuby31),
                         testing::RubyParamName);

}  // namespace
}  // namespace rvbpfd
