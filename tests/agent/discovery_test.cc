#include "agent/discovery.h"

#include <sys/stat.h>

#include <filesystem>
#include <future>
#include <thread>

#include <gtest/gtest.h>

#include "agent_fakes.h"
#include "common/deadline.h"

namespace rvbpfd {
namespace {

using agent_testing::FakeProc;

constexpr uint64_t kMs = 1'000'000;

TEST(ExecRetryScheduleTest, InspectsAt20Ms100Ms500Ms2SThenGivesUp) {
  ExecRetrySchedule s;
  const uint64_t exec = 5'000 * kMs;
  s.Add(42, exec);
  EXPECT_TRUE(s.TakeDue(exec + 19 * kMs).empty());
  std::vector<uint64_t> seen_at;
  for (uint64_t t = exec; t <= exec + 3000 * kMs; t += kMs) {
    for (const ExecRetrySchedule::Due& d : s.TakeDue(t)) {
      EXPECT_EQ(d.pid, 42);
      EXPECT_EQ(d.attempt, static_cast<int>(seen_at.size()));
      seen_at.push_back(t - exec);
      s.Retry(d);  // still not Ruby
    }
  }
  EXPECT_EQ(seen_at, (std::vector<uint64_t>{20 * kMs, 100 * kMs, 500 * kMs, 2000 * kMs}));
  EXPECT_EQ(s.size(), 0u);
  EXPECT_EQ(s.given_up(), 1u);
}

TEST(ExecRetryScheduleTest, ANewExecRestartsTheScheduleAndRemoveForgets) {
  ExecRetrySchedule s;
  s.Add(7, 0);
  ASSERT_EQ(s.TakeDue(20 * kMs).size(), 1u);  // attempt 0 taken and not retried: done
  s.Add(7, 1000 * kMs);
  s.Add(8, 1000 * kMs);
  EXPECT_EQ(s.next_due_ns(), 1020 * kMs);
  s.Remove(8);
  std::vector<ExecRetrySchedule::Due> due = s.TakeDue(1020 * kMs);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].pid, 7);
  EXPECT_EQ(due[0].attempt, 0);
}

TEST(ExecRetryScheduleTest, DueEntriesComeOldestExecFirst) {
  ExecRetrySchedule s;
  s.Add(30, 2 * kMs);
  s.Add(10, 5 * kMs);
  s.Add(20, 1 * kMs);
  std::vector<ExecRetrySchedule::Due> due = s.TakeDue(100 * kMs);
  ASSERT_EQ(due.size(), 3u);
  EXPECT_EQ(due[0].pid, 20);
  EXPECT_EQ(due[1].pid, 30);
  EXPECT_EQ(due[2].pid, 10);
}

TEST(ProcessInspectorTest, DynamicRubyIsFoundOnceLibrubyIsMapped) {
  FakeProc proc;
  const std::string exe = proc.AddExe("host", "ruby");
  const std::string lib = proc.AddLibruby("host", "3.3.8");
  proc.AddProcess(100, "ruby", "host", exe, {});  // at exec: the loader has not mapped libruby yet
  ProcessInspector insp(proc.root());
  EXPECT_EQ(insp.Inspect(100).outcome, InspectOutcome::kNotRuby);
  proc.SetMaps(100, exe, {lib});
  Inspection i = insp.Inspect(100);
  ASSERT_EQ(i.outcome, InspectOutcome::kRuby);
  EXPECT_EQ(i.target.ruby_version, "3.3.8");
  EXPECT_EQ(i.target.vm_path, lib);
  EXPECT_EQ(i.target.vm_host_path, proc.PidDir(100) + "/root" + lib);
}

TEST(ProcessInspectorTest, AKnownNonRubyExecutableIsDecidedFromMapsAlone) {
  FakeProc proc;
  const std::string ls = proc.AddExe("host", "ls");
  proc.AddProcess(200, "ls", "host", ls, {"/usr/lib/libc.so.6"});
  proc.AddProcess(201, "ls", "host", ls, {"/usr/lib/libc.so.6"});
  ProcessInspector insp(proc.root());
  EXPECT_EQ(insp.Inspect(200).outcome, InspectOutcome::kNotRuby);
  EXPECT_EQ(insp.full_inspections(), 1u);
  EXPECT_EQ(insp.Inspect(201).outcome, InspectOutcome::kNotRuby);
  EXPECT_EQ(insp.Inspect(200).outcome, InspectOutcome::kNotRuby);
  EXPECT_EQ(insp.full_inspections(), 1u);  // the ELF was opened once
}

TEST(ProcessInspectorTest, TheNextProcessOfAKnownVmBinaryIsDescribedWithoutReadingItsElfAgain) {
  FakeProc proc;
  const std::string exe = proc.AddExe("host", "ruby");
  const std::string lib = proc.AddLibruby("host", "3.3.8");
  proc.AddProcess(100, "ruby", "host", exe, {lib});
  proc.AddProcess(101, "puma", "host", exe, {lib});
  proc.AddProcess(102, "ruby", "other", proc.AddExe("other", "ruby"), {proc.AddLibruby("other", "3.3.8")});
  ProcessInspector insp(proc.root());
  Inspection a = insp.Inspect(100);
  ASSERT_EQ(a.outcome, InspectOutcome::kRuby);
  EXPECT_EQ(insp.full_inspections(), 1u);
  Inspection b = insp.Inspect(101);
  ASSERT_EQ(b.outcome, InspectOutcome::kRuby);
  EXPECT_EQ(insp.full_inspections(), 1u);
  EXPECT_EQ(b.target.pid, 101);
  EXPECT_EQ(b.target.comm, "puma");
  EXPECT_EQ(b.target.vm_path, a.target.vm_path);
  EXPECT_EQ(b.target.vm_host_path, proc.PidDir(101) + "/root" + lib);
  EXPECT_EQ(b.target.build_id, a.target.build_id);
  EXPECT_EQ(b.target.ruby_version, "3.3.8");
  EXPECT_EQ(b.target.vm_is_shared_library, true);
  EXPECT_EQ(b.target.vm_load_start, a.target.vm_load_start);
  EXPECT_EQ(a.target.ns_pid, 100);  // no NSpid line: the pid itself
  EXPECT_EQ(b.target.ns_pid, 101);
  // The pid as a process in its own pid namespace sees it (its main thread's tid there) comes from its status too.
  agent_testing::WriteFile(proc.PidDir(101) + "/status", "Name:\tpuma\nNSpid:\t101\t7\n");
  EXPECT_EQ(insp.Inspect(101).target.ns_pid, 7);
  EXPECT_EQ(insp.full_inspections(), 1u);
  // Another file (a container's own copy) is read.
  ASSERT_EQ(insp.Inspect(102).outcome, InspectOutcome::kRuby);
  EXPECT_EQ(insp.full_inspections(), 2u);
}

TEST(ProcessInspectorTest, GoneZombieAndUnsupportedVersion) {
  FakeProc proc;
  ProcessInspector insp(proc.root());
  EXPECT_EQ(insp.Inspect(300).outcome, InspectOutcome::kGone);
  const std::string exe = proc.AddExe("host", "ruby");
  const std::string old = proc.AddLibruby("host", "3.1.2");
  proc.AddProcess(301, "ruby", "host", exe, {old});
  Inspection i = insp.Inspect(301);
  EXPECT_EQ(i.outcome, InspectOutcome::kSkip);
  ASSERT_TRUE(i.error.has_value());
  EXPECT_EQ(i.error->code(), ErrorCode::kUnsupportedVersion);
  proc.Zombie(301, "ruby");
  EXPECT_EQ(insp.Inspect(301).outcome, InspectOutcome::kGone);
  EXPECT_FALSE(ProcessAlive(proc.root(), 301));
}

// A /proc that shows one pid's exit as begun (PF_EXITING in its stat) while the files on disk say it runs.
class ExitingProcFs : public ProcFs {
 public:
  ExitingProcFs(std::string root, int pid, std::string exiting_stat)
      : ProcFs(std::move(root)), stat_(PidPath(pid, "stat")), exiting_stat_(std::move(exiting_stat)) {}
  int OpenFile(const std::string& path, int flags) const override {
    return ProcFs::OpenFile(path == stat_ ? exiting_stat_ : path, flags);
  }

 private:
  std::string stat_;
  std::string exiting_stat_;
};

TEST(ProcessInspectorTest, WhetherAProcessEndedIsReadThroughTheInspectorsOwnProc) {
  FakeProc proc;
  const std::string exe = proc.AddExe("host", "ruby");
  proc.AddProcess(301, "ruby", "host", exe, {proc.AddLibruby("host", "3.1.2")});
  const std::string exiting = proc.root() + "/exiting-stat";
  testing::WriteFile(exiting, "301 (ruby) R 1 1 1 0 -1 4194564 0\n");
  ProcessInspector insp(std::make_shared<ExitingProcFs>(proc.root(), 301, exiting), ProcessInspector::kDefaultTimeout);
  EXPECT_EQ(insp.Inspect(301).outcome, InspectOutcome::kGone);
  EXPECT_EQ(ProcessInspector(proc.root()).Inspect(301).outcome, InspectOutcome::kSkip);  // on disk: still running
}

// A /proc whose reads of one pid's files stall until released (a FUSE server that never answers).
class StallingProcFs : public ProcFs {
 public:
  StallingProcFs(std::string root, int stalled_pid, std::shared_future<void> gate)
      : ProcFs(std::move(root)), stalled_(PidPath(stalled_pid, "")), gate_(std::move(gate)) {}
  int OpenFile(const std::string& path, int flags) const override {
    if (path.rfind(stalled_, 0) == 0) gate_.wait();
    return ProcFs::OpenFile(path, flags);
  }

 private:
  std::string stalled_;
  std::shared_future<void> gate_;
};

TEST(ProcessInspectorTest, AStallingProcessCostsAtMostTheBoundAndIsACountedSkip) {
  FakeProc proc;
  const std::string exe = proc.AddExe("host", "ruby");
  const std::string lib = proc.AddLibruby("host", "3.3.8");
  proc.AddProcess(100, "ruby", "host", exe, {lib});
  proc.AddProcess(101, "ruby", "other", proc.AddExe("other", "ruby"), {proc.AddLibruby("other", "3.3.8")});
  std::promise<void> release;
  auto procfs = std::make_shared<StallingProcFs>(proc.root(), 100, release.get_future().share());
  ProcessInspector insp(procfs, std::chrono::milliseconds(50));
  const int stuck_before = StuckDeadlineThreads().load();
  Inspection stalled = insp.Inspect(100);
  EXPECT_EQ(stalled.outcome, InspectOutcome::kSkip);
  ASSERT_TRUE(stalled.error.has_value());
  EXPECT_NE(stalled.error->message().find("pid 100 took more than 50 ms"), std::string::npos)
      << stalled.error->message();
  EXPECT_EQ(insp.timed_out(), 1u);
  // The next process is inspected as usual while the first is still stuck.
  EXPECT_EQ(insp.Inspect(101).outcome, InspectOutcome::kRuby);
  // The stalled read ends late: its result is dropped, and the inspector is unharmed.
  release.set_value();
  for (int i = 0; i < 1000 && StuckDeadlineThreads().load() > stuck_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(StuckDeadlineThreads().load(), stuck_before);
  EXPECT_EQ(insp.Inspect(100).outcome, InspectOutcome::kRuby);
  EXPECT_EQ(insp.timed_out(), 1u);
}

// The agent's stop signal arrives while an inspection is stuck: the wait ends on the flag, not at the bound, and the
// process is a skip without an error (nothing to log while the agent stops) and not a timeout.
TEST(ProcessInspectorTest, AStopFlagEndsTheWaitForAStalledInspection) {
  FakeProc proc;
  proc.AddProcess(100, "ruby", "host", proc.AddExe("host", "ruby"), {proc.AddLibruby("host", "3.3.8")});
  auto stop = std::make_shared<std::atomic<bool>>(false);
  std::promise<void> release;
  // The stalled read sets the flag (as SIGTERM would while it waits) and then waits for the test.
  class StoppingProcFs : public StallingProcFs {
   public:
    StoppingProcFs(std::string root, std::shared_future<void> gate, std::shared_ptr<std::atomic<bool>> stop)
        : StallingProcFs(std::move(root), 100, std::move(gate)), stop_(std::move(stop)) {}
    int OpenFile(const std::string& path, int flags) const override {
      stop_->store(true);
      return StallingProcFs::OpenFile(path, flags);
    }

   private:
    std::shared_ptr<std::atomic<bool>> stop_;
  };
  auto procfs = std::make_shared<StoppingProcFs>(proc.root(), release.get_future().share(), stop);
  ProcessInspector insp(procfs, std::chrono::milliseconds(60'000));
  insp.set_cancel(stop.get());
  const int stuck_before = StuckDeadlineThreads().load();
  Inspection stopped = insp.Inspect(100);
  EXPECT_EQ(stopped.outcome, InspectOutcome::kSkip);
  EXPECT_FALSE(stopped.error.has_value()) << stopped.error->message();
  EXPECT_EQ(insp.timed_out(), 0u);
  release.set_value();
  for (int i = 0; i < 1000 && StuckDeadlineThreads().load() > stuck_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(StuckDeadlineThreads().load(), stuck_before);
}

TEST(ProcessInspectorTest, FifoInPlaceOfTheVmBinaryIsASkipWithoutBlocking) {
  FakeProc proc;
  const std::string exe = proc.AddExe("host", "ruby");
  // The process maps a libruby path whose file is now a FIFO (replaced in its own mount namespace).
  const std::string lib = "/usr/lib/libruby.so.3.3.8";
  std::filesystem::create_directories(proc.RootFs("host") + "/usr/lib");
  ASSERT_EQ(mkfifo((proc.RootFs("host") + lib).c_str(), 0600), 0);
  proc.AddProcess(100, "ruby", "host", exe, {lib});
  ProcessInspector insp(proc.root());
  Inspection i = insp.Inspect(100);
  EXPECT_EQ(i.outcome, InspectOutcome::kSkip);
  ASSERT_TRUE(i.error.has_value());
  EXPECT_NE(i.error->message().find("is a FIFO"), std::string::npos) << i.error->message();
  EXPECT_EQ(insp.timed_out(), 0u) << "refused at once, not by the time bound";
}

TEST(ListPidsTest, OnlyNumericEntriesAscending) {
  FakeProc proc;
  const std::string exe = proc.AddExe("host", "x");
  proc.AddProcess(12, "x", "host", exe, {});
  proc.AddProcess(3, "x", "host", exe, {});
  agent_testing::WriteFile(proc.root() + "/self/stat", "");
  agent_testing::WriteFile(proc.root() + "/12abc/stat", "");
  EXPECT_EQ(ListPids(proc.root()), (std::vector<int>{3, 12}));
}

}  // namespace
}  // namespace rvbpfd
