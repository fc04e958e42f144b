// `inspect` and `stats` of multi-process traces (export/inspect_views.h): each process gets its own views, computed
// from its own events only.
#include "export/inspect_views.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "model/model.h"
#include "trace/multi_process_trace.h"
#include "trace/processes.h"

namespace rvbpfd {
namespace {

using ::rvbpfd::testing::kMultiProcessTrace;

TraceFile MultiProcess() {
  Result<TraceFile> f = TraceReader::Parse(kMultiProcessTrace, "multi");
  EXPECT_TRUE(f.ok());
  return f.ok() ? std::move(f).value() : TraceFile{};
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(InspectViews, SummaryListsProcessesThenEachTracedProcess) {
  std::ostringstream out;
  ASSERT_TRUE(PrintInspectSummary(MultiProcess(), out).ok());
  const std::string text = out.str();
  EXPECT_NE(text.find("processes: 4 (3 traced, 1 skipped), 4 threads"), std::string::npos) << text;
  EXPECT_NE(text.find("skipped: not Ruby: /bin/sh"), std::string::npos) << text;
  EXPECT_NE(text.find("(exit 3)"), std::string::npos) << text;
  EXPECT_NE(text.find("(exec)"), std::string::npos) << text;
  EXPECT_NE(text.find("== process 2: pid 4243 (ruby app.rb) =="), std::string::npos) << text;
  EXPECT_NE(text.find("== process 4: pid 4243 (ruby other.rb) =="), std::string::npos) << text;
  EXPECT_EQ(text.find("== process 3"), std::string::npos) << text;  // skipped: no threads
  EXPECT_NE(text.find("run: pid 4243, ruby 3.4.5"), std::string::npos) << text;
  EXPECT_EQ(Count(text, "run: pid "), 3u) << text;
}

TEST(InspectViews, EventsTableHasAPidColumnAndThreadsByProcess) {
  std::ostringstream out;
  ASSERT_TRUE(PrintInspectEvents(MultiProcess(), {}, out).ok());
  const std::string text = out.str();
  EXPECT_NE(text.find("pid      ruby_thread"), std::string::npos) << text;
  EXPECT_NE(text.find(" pid 4242 (ruby app.rb):\n  main id=1"), std::string::npos) << text;
  EXPECT_NE(text.find(" pid 4243 (ruby app.rb):\n  main id=2"), std::string::npos) << text;
  EXPECT_NE(text.find("Thread #3 (worker) id=3"), std::string::npos) << text;
}

TEST(InspectViews, StatsCountTheWholeFileAndBlamePerProcess) {
  std::ostringstream out;
  ASSERT_TRUE(PrintTraceStats(MultiProcess(), out).ok());
  const std::string text = out.str();
  // The event counts are the whole file's (every line that is an event).
  const size_t events = Count(std::string(kMultiProcessTrace), "\n{\"t_ns\"");
  EXPECT_NE(text.find("events: " + std::to_string(events) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("processes: 4"), std::string::npos) << text;
  EXPECT_EQ(Count(text, "gvl blame by holder"), 3u) << text;
}

// Why each process is modelled apart: the root's main thread holds its GVL from 1.0 to 3.0 ms while the child's
// threads take theirs; one model of the whole trace would see another thread take "the" GVL from it.
TEST(InspectViews, EachProcessHasItsOwnGvl) {
  const std::vector<ProcessTrace> parts = SplitByProcess(MultiProcess());
  ASSERT_EQ(parts.size(), 3u);
  Result<Model> root = Model::FromTrace(parts[0].trace);
  ASSERT_TRUE(root.ok());
  const RubyThread* main = root->FindThread(1);
  ASSERT_NE(main, nullptr);
  bool ran_whole = false;
  for (const StateBlock& b : main->blocks) {
    if (b.state == ThreadState::kRunning && b.start_ns == 1'000'000 && b.end_ns == 3'000'000) ran_whole = true;
    EXPECT_EQ(b.rule == ModelRule::kOwnerReplaced || b.rule == ModelRule::kPreemptedByResume, false);
  }
  EXPECT_TRUE(ran_whole);
  Result<Model> child = Model::FromTrace(parts[1].trace);
  ASSERT_TRUE(child.ok());
  const RubyThread* worker = child->FindThread(3);
  ASSERT_NE(worker, nullptr);
  bool waited = false;
  for (const StateBlock& b : worker->blocks) {
    if (b.state == ThreadState::kWantsGvl && b.start_ns == 1'800'000 && b.end_ns == 2'500'000) waited = true;
  }
  EXPECT_TRUE(waited);
}

}  // namespace
}  // namespace rvbpfd
