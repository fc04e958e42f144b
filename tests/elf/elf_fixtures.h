// Test helpers shared by the elf, target and sites tests: a self-deleting temp directory and tiny ELF fixtures
// compiled at test time with the system C compiler (so the fixtures are real ELF files, and no binary is checked in).
#ifndef RVBPFD_TESTS_ELF_ELF_FIXTURES_H_
#define RVBPFD_TESTS_ELF_ELF_FIXTURES_H_

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace rvbpfd::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "rvbpfd-test-XXXXXX").string();
    char* p = mkdtemp(tmpl.data());
    path_ = p != nullptr ? p : "";
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string Join(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

inline void WriteFile(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Compiles `source` (C) into `out_path` with `flags` (e.g. "-shared -fPIC -O2 -g"). Returns false (and records a
// test failure with the compiler output) when the compiler is missing or the compile fails.
inline bool CompileC(const std::string& source, const std::string& out_path, const std::string& flags) {
  std::filesystem::create_directories(std::filesystem::path(out_path).parent_path());
  std::string src = out_path + ".c";
  WriteFile(src, source);
  std::string log = out_path + ".log";
  std::string cmd = "cc " + flags + " -o '" + out_path + "' '" + src + "' >'" + log + "' 2>&1";
  int rc = std::system(cmd.c_str());
  if (rc != 0) {
    ADD_FAILURE() << "fixture compile failed (" << cmd << "):\n" << ReadFile(log);
    return false;
  }
  return true;
}

inline bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Paths of the test Rubies built by tools/build-test-rubies.sh; a directory counts once its .complete marker exists.
constexpr const char* kRubies = "/var/cache/rvbpfd/rubies";
inline std::string TestRuby(const std::string& name) {
  std::string dir = std::string(kRubies) + "/" + name;
  return FileExists(dir + "/.complete") ? dir : "";
}

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_ELF_ELF_FIXTURES_H_
