// The exports of a trace of several processes (docs/rvtrace.md, "Process lines"): each process aggregated on its own
// and named. One-process traces are covered (byte for byte) by the other tests of this directory.
#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "export/folded.h"
#include "export/format_checks.h"
#include "export/perfetto.h"
#include "export/pprof.h"
#include "export/speedscope.h"
#include "pprof_test_util.h"
#include "trace/multi_process_trace.h"
#include "trace/processes.h"

namespace rvbpfd {
namespace {

using nlohmann::json;
using ::rvbpfd::testing::kMultiProcessTrace;

TraceFile MultiProcess() {
  Result<TraceFile> f = TraceReader::Parse(kMultiProcessTrace, "multi");
  EXPECT_TRUE(f.ok());
  return f.ok() ? std::move(f).value() : TraceFile{};
}

TEST(MultiProcessExport, PprofSamplesCarryTheirProcessPid) {
  const testing::DecodedProfile p = testing::DecodeProfile(BuildPprofProfile(MultiProcess()));
  ASSERT_TRUE(p.errors.empty()) << p.errors.front();
  ASSERT_FALSE(p.samples.empty());
  std::map<int64_t, int64_t> cpu_samples_by_pid;
  for (const testing::DecodedSample& s : p.samples) {
    ASSERT_TRUE(s.num_labels.contains("pid")) << "every sample names its process";
    cpu_samples_by_pid[s.num_labels.at("pid")] += s.values[0];
  }
  // One sample in the root, two in the forked child, one in its exec'd image (the same pid).
  EXPECT_EQ(cpu_samples_by_pid, (std::map<int64_t, int64_t>{{4242, 1}, {4243, 3}}));
  bool names_process = false;
  for (const std::string& c : p.comments) names_process |= c == "process 4: pid 4243 (ruby other.rb) (label pid)";
  EXPECT_TRUE(names_process);
}

TEST(MultiProcessExport, FoldedLinesStartWithTheirProcess) {
  std::ostringstream out;
  ASSERT_TRUE(ExportFolded(MultiProcess(), out).ok());
  EXPECT_EQ(out.str(),
            "pid 4242 (ruby app.rb);<main> 1\n"
            "pid 4243 (ruby app.rb);<main>;Worker#run 2\n"
            "pid 4243 (ruby other.rb);<main> 1\n");
}

TEST(MultiProcessExport, PerfettoHasTracksPerProcess) {
  const TraceFile trace = MultiProcess();
  const std::vector<ProcessTrace> parts = SplitByProcess(trace);
  std::vector<Model> models;
  for (const ProcessTrace& part : parts) models.push_back(Model::FromTrace(part.trace).value());
  std::vector<PerfettoProcessModel> processes;
  for (size_t i = 0; i < parts.size(); ++i) processes.push_back({.label = parts[i].label, .model = &models[i]});
  std::ostringstream out;
  ASSERT_TRUE(ExportPerfetto(processes, out).ok());
  const json doc = json::parse(out.str());
  const std::vector<std::string> errors = testing::CheckTraceEventFormat(doc);
  EXPECT_TRUE(errors.empty()) << errors.front();
  std::map<int, std::string> process_names;
  std::map<uint64_t, int> pid_of_thread_track;  // Ruby thread track (tid >= 1000) -> its JSON pid
  for (const json& e : doc["traceEvents"]) {
    if (e["name"] == "process_name") process_names[e["pid"].get<int>()] = e["args"]["name"].get<std::string>();
    // Ruby thread tracks are on the odd JSON pids (the even ones are native threads, by tid).
    if (e["name"] == "thread_name" && e["pid"].get<int>() % 2 == 1 &&
        e["tid"].get<uint64_t>() >= kPerfettoThreadTidBase) {
      pid_of_thread_track[e["tid"].get<uint64_t>() - kPerfettoThreadTidBase] = e["pid"].get<int>();
    }
  }
  EXPECT_EQ(process_names, (std::map<int, std::string>{{1, "pid 4242 (ruby app.rb): Ruby threads"},
                                                        {2, "pid 4242 (ruby app.rb): native threads"},
                                                        {3, "pid 4243 (ruby app.rb): Ruby threads"},
                                                        {4, "pid 4243 (ruby app.rb): native threads"},
                                                        {5, "pid 4243 (ruby other.rb): Ruby threads"},
                                                        {6, "pid 4243 (ruby other.rb): native threads"}}));
  EXPECT_EQ(pid_of_thread_track, (std::map<uint64_t, int>{{1, 1}, {2, 3}, {3, 3}, {4, 5}}));
  // Each process's own GVL owner track: the root's main thread and the child's threads own theirs at once.
  std::set<int> owner_pids;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && e["tid"] == kPerfettoOwnerTid && e["name"] != "idle" && e["name"] != "unknown") {
      owner_pids.insert(e["pid"].get<int>());
    }
  }
  EXPECT_EQ(owner_pids, (std::set<int>{1, 3, 5}));
}

TEST(MultiProcessExport, SpeedscopeProfileNamesCarryTheProcess) {
  std::ostringstream out;
  ASSERT_TRUE(ExportSpeedscope(MultiProcess(), out).ok());
  const json doc = json::parse(out.str());
  const std::vector<std::string> errors = testing::CheckSpeedscope(doc);
  EXPECT_TRUE(errors.empty()) << errors.front();
  std::vector<std::string> names;
  for (const json& p : doc["profiles"]) names.push_back(p["name"].get<std::string>());
  ASSERT_GE(names.size(), 4u);
  EXPECT_EQ(names[0], "pid 4242 (ruby app.rb): main");
  EXPECT_EQ(names[1], "pid 4243 (ruby app.rb): main");
  EXPECT_EQ(names[2], "pid 4243 (ruby app.rb): Thread #3 (worker)");
  EXPECT_EQ(names[3], "pid 4243 (ruby other.rb): main");
  size_t blame_profiles = 0;
  for (const std::string& n : names) blame_profiles += n.find(": GVL blame") != std::string::npos ? 1 : 0;
  EXPECT_EQ(blame_profiles, 3u);
}

}  // namespace
}  // namespace rvbpfd
