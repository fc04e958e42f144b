// A test Ruby stopped inside tests/golden's capture: it runs coredump-testdata/programs/scenarios.rb, records CRuby's
// own view of its threads and frames (rvgolden, RVGOLDEN_OUT) and stops itself (RVGOLDEN_STOP), so the live tests
// can read its memory while it holds still and compare with what it wrote just before. Shared by live_test.cc and
// ec_route_live_test.cc.
#ifndef RVBPFD_TESTS_STACKS_LIVE_GOLDEN_H_
#define RVBPFD_TESTS_STACKS_LIVE_GOLDEN_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/target_file.h"

namespace rvbpfd::testing {

// tools/build-test-rubies.sh installs the test Rubies here.
inline constexpr const char* kTestRubies = "/var/cache/rvbpfd/rubies";

// Builds tests/golden with this Ruby's mkmf into the build tree; returns the directory or "" on failure. ctest runs
// the live tests of one Ruby in parallel (ctest -j), and extconf.rb rewriting the Makefile under another test's make
// fails that build: an exclusive lock on the directory makes them take turns (a later one finds it built).
inline std::string BuildGolden(const std::string& ruby_name, const std::string& ruby_bin) {
  const std::string dir = std::string(RVBPFD_BINARY_DIR) + "/golden-" + ruby_name;
  std::filesystem::create_directories(dir);
  const FileFd lock(open((dir + "/.build-lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));  // closing unlocks
  if (!lock.ok() || flock(lock.get(), LOCK_EX) != 0) return "";
  const std::string cmd = "cd '" + dir + "' && '" + ruby_bin + "' '" RVBPFD_SOURCE_DIR "/tests/golden/extconf.rb' " +
                          "> build.log 2>&1 && make >> build.log 2>&1";
  if (std::system(cmd.c_str()) != 0) return "";
  return dir;
}

// gtest parameter names for test Ruby names ("3.4.5-static" -> "3_4_5_static").
inline std::string RubyParamName(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& c : n) {
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return n;
}

// The stopped process: SIGKILLed and reaped when this goes away.
class StoppedGoldenRuby {
 public:
  StoppedGoldenRuby() = default;
  StoppedGoldenRuby(const StoppedGoldenRuby&) = delete;
  StoppedGoldenRuby& operator=(const StoppedGoldenRuby&) = delete;
  ~StoppedGoldenRuby() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st = 0;
      waitpid(pid_, &st, 0);
    }
  }

  // Builds tests/golden for `ruby_bin`, runs the scenarios until the capture stopped the process, and reads the
  // capture and the process's VM mapping. "" on success, else what failed.
  std::string Start(const std::string& ruby_name, const std::string& ruby_bin, const std::string& tag) {
    const std::string golden_dir = BuildGolden(ruby_name, ruby_bin);
    if (golden_dir.empty()) {
      return "building tests/golden failed, see " + std::string(RVBPFD_BINARY_DIR) + "/golden-" + ruby_name;
    }
    const std::string out = golden_dir + "/" + tag + "-" + std::to_string(getpid()) + ".json";
    std::filesystem::remove(out);
    const pid_t pid = fork();
    if (pid < 0) return "fork failed";
    if (pid == 0) {
      setenv("RVGOLDEN_OUT", out.c_str(), 1);
      setenv("RVGOLDEN_STOP", "1", 1);
      if (ruby_name.ends_with("-yjit")) {
        // The YJIT test Ruby runs with YJIT on, compiling every method and block at its first call, so the frames
        // compared are those of JIT code (as tests/e2e/rvlib.py runs it).
        setenv("RUBY_YJIT_ENABLE", "1", 1);
        setenv("RUBYOPT", "--yjit-call-threshold=1", 1);
      }
      const std::string program = std::string(RVBPFD_SOURCE_DIR) + "/coredump-testdata/programs/scenarios.rb";
      execl(ruby_bin.c_str(), ruby_bin.c_str(), "-I", golden_dir.c_str(), "-rrvgolden", program.c_str(), nullptr);
      _exit(127);
    }
    pid_ = pid;
    int status = 0;
    // The program stops itself (SIGSTOP from inside RvGolden.capture) after writing the golden frames.
    if (waitpid(pid, &status, WUNTRACED) != pid) return "waitpid failed";
    if (!WIFSTOPPED(status)) {
      pid_ = -1;  // reaped already
      return "ruby exited with status " + std::to_string(status) + " before capturing";
    }
    {
      std::ifstream in(out);
      golden_ = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    }
    std::filesystem::remove(out);
    if (golden_.is_discarded()) return out + ": not the JSON rvgolden writes";
    // The VM binary: libruby.so when the process maps one, else the executable (static build); its lowest mapping
    // gives the load bias. (Target discovery proper lives in src/target; this keeps the tests to the stacks module.)
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    std::string line;
    std::vector<std::pair<uint64_t, std::string>> entries;
    while (std::getline(maps, line)) {
      const size_t slash = line.find('/');
      if (slash != std::string::npos) entries.emplace_back(std::stoull(line, nullptr, 16), line.substr(slash));
    }
    for (const auto& [start, path] : entries) {
      if (std::filesystem::path(path).filename().string().rfind("libruby", 0) == 0) vm_path_ = path;
    }
    if (vm_path_.empty()) vm_path_ = std::filesystem::read_symlink("/proc/" + std::to_string(pid) + "/exe").string();
    lowest_mapping_ = UINT64_MAX;
    for (const auto& [start, path] : entries) {
      if (path == vm_path_) lowest_mapping_ = std::min(lowest_mapping_, start);
    }
    if (lowest_mapping_ == UINT64_MAX) return vm_path_ + " not mapped";
    return "";
  }

  pid_t pid() const { return pid_; }
  const nlohmann::json& golden() const { return golden_; }
  const std::string& vm_path() const { return vm_path_; }
  uint64_t lowest_mapping() const { return lowest_mapping_; }

 private:
  pid_t pid_ = -1;
  nlohmann::json golden_;
  std::string vm_path_;
  uint64_t lowest_mapping_ = 0;
};

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_STACKS_LIVE_GOLDEN_H_
