// Shared helpers for the trace module's tests: a scratch directory removed at the end, file helpers, and what
// `rvbpfd inspect` / `rvbpfd stats` print for a trace file.
#ifndef RVBPFD_TESTS_TRACE_TRACE_TEST_UTIL_H_
#define RVBPFD_TESTS_TRACE_TRACE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "common/error.h"
#include "trace/inspect.h"
#include "trace/reader.h"

namespace rvbpfd::testing {

class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = ::testing::TempDir() + "rvtrace-test-XXXXXX";
    char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr) << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void WriteAll(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

// The trace part of `rvbpfd inspect FILE` / `rvbpfd stats FILE`, the way the CLI produces it: the file read with
// TraceReader::ReadFile, then PrintInspect / PrintStats. Errors are the reader's.
inline Status InspectFile(const std::string& path, std::ostream& out) {
  Result<TraceFile> trace = TraceReader::ReadFile(path);
  if (!trace.ok()) return trace.error();
  PrintInspect(*trace, out);
  return Status::Ok();
}
inline Status StatsFile(const std::string& path, std::ostream& out) {
  Result<TraceFile> trace = TraceReader::ReadFile(path);
  if (!trace.ok()) return trace.error();
  PrintStats(*trace, out);
  return Status::Ok();
}

// An event of `thread` on native thread `tid` (which also ran its probe).
inline TraceEvent Ev(uint64_t t_ns, EventName name, std::optional<uint32_t> thread, std::optional<uint32_t> tid) {
  TraceEvent e;
  e.t_ns = t_ns;
  e.event = name;
  e.ruby_thread = thread;
  e.native_tid = tid;
  e.probe_tid = tid;
  e.source = name == EventName::kGcEnter || name == EventName::kGcExit ? kSourceGcHookSite : kSourceThreadHookSite;
  return e;
}

}  // namespace rvbpfd::testing

#endif  // RVBPFD_TESTS_TRACE_TRACE_TEST_UTIL_H_
