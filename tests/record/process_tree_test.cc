#include "record/process_tree.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "probe/fake_probe_backend.h"
#include "rvbpfd/abi.h"
#include "trace/event.h"

namespace rvbpfd {
namespace {

// Pids no test host has (above the kernel's pid_max limit of 2^22): every /proc read of them fails, as for a process
// that has exited, so what the follower decides rests on the records alone.
constexpr uint32_t kRoot = 5'000'001;
constexpr uint32_t kChild = 5'000'002;
constexpr uint64_t kOrigin = 1'000'000;

// What the follower wrote, one string per line, in order.
class LineSink : public RecordSink {
 public:
  uint32_t InternFrame(const FrameInfo&) override { return 0; }
  uint32_t InternStack(std::span<const uint32_t>) override { return 0; }
  Status Write(const TraceEvent& e) override {
    lines.push_back("event t=" + std::to_string(e.t_ns) + " thread=" + std::to_string(e.ruby_thread.value_or(0)) +
                    " process=" + std::to_string(e.process));
    return Status::Ok();
  }
  void SetThreadInfo(uint32_t, const ThreadInfo&, uint64_t) override {}
  void WriteProcess(const ProcessInfo& p, std::optional<uint32_t> main) override {
    std::string s = "process " + std::to_string(p.id) + " pid=" + std::to_string(p.pid) +
                    " parent=" + (p.parent ? std::to_string(*p.parent) : "-") + " cause=" + p.cause +
                    " t=" + std::to_string(p.t_ns) + " main=" + (main ? std::to_string(*main) : "-");
    if (!p.skipped.empty()) s += " skipped=" + p.skipped;
    if (!p.ruby_version.empty()) s += " ruby=" + p.ruby_version;
    lines.push_back(s);
  }
  void WriteProcessEnd(const ProcessEnd& e) override {
    lines.push_back("end " + std::to_string(e.id) + " " + e.how + " t=" + std::to_string(e.t_ns) +
                    (e.exit_code ? " code=" + std::to_string(*e.exit_code) : "") +
                    (e.signal ? " signal=" + std::to_string(*e.signal) : ""));
  }
  Status Tick(std::chrono::steady_clock::time_point, uint64_t) override { return Status::Ok(); }
  Status Finish(const FinishInfo&) override { return Status::Ok(); }
  void Abandon() override {}
  const std::string& output_path() const override { return none_; }

  std::vector<std::string> lines;

 private:
  const std::string none_;
};

rv_record ProcRecord(uint16_t kind, uint32_t pid, uint64_t t_ns, uint32_t parent = 0, const char* comm = "") {
  rv_record r{};
  r.kind = kind;
  r.pid = pid;
  r.ts_ns = kOrigin + t_ns;
  r.serial = parent;
  if (kind == RV_EV_PROC_EXEC) {
    char buf[12] = {};
    std::strncpy(buf, comm, sizeof(buf));
    std::memcpy(&r.th, buf, 8);
    std::memcpy(&r.serial, buf + 8, 4);
  }
  return r;
}

// An exit record carrying the leader's wait status (BPF read task_struct.exit_code).
rv_record ExitRecord(uint32_t pid, uint64_t t_ns, uint32_t wait_status) {
  rv_record r = ProcRecord(RV_EV_PROC_EXIT, pid, t_ns);
  r.serial = wait_status;
  r.flags |= RV_REC_EXIT_STATUS;
  return r;
}

TraceEvent Event(uint64_t t_ns, uint32_t process, uint32_t tid, uint64_t th) {
  TraceEvent e;
  e.t_ns = t_ns;
  e.event = EventName::kGvlAcquired;
  e.process = process;
  e.native_tid = tid;
  e.probe_tid = tid;
  e.th = th;
  return e;
}

class ProcessFollowerTest : public ::testing::Test {
 protected:
  ProcessFollowerTest() {
    FollowContext ctx;
    ctx.vm_open_path = "/nonexistent/libruby.so";
    ctx.ruby_version = "3.3.8";
    ctx.quiet = true;
    ctx.backend = &backend_;
    ctx.sink = &sink_;
    ctx.root_wait_status = [] { return std::optional<int>(7 << 8); };  // reaped: exit(7)
    ctx.origin_ns = kOrigin;
    ProcessInfo root;
    root.pid = kRoot;
    root.command = {"ruby", "app.rb"};
    root.ruby_version = "3.3.8";
    follower_.emplace(std::move(ctx), std::move(root));
  }

  testing::FakeProbeBackend backend_;
  LineSink sink_;
  std::optional<ProcessFollower> follower_;
};

TEST_F(ProcessFollowerTest, ForkedChildIsTracedWithItsOwnMainAndEndsAfterItsEvents) {
  ProcessFollower& f = *follower_;
  f.WriteRootLine();
  f.OnProcRecord(ProcRecord(RV_EV_PROC_FORK, kChild, 100, kRoot));
  EXPECT_EQ(f.ProcessOf(kRoot), 1u);
  const uint32_t child = f.ProcessOf(kChild);
  EXPECT_EQ(child, 2u);
  EXPECT_EQ(f.ProcessOf(kChild + 5), 0u);  // not followed
  // The child's main thread has its parent's rb_thread_t pointer (a copy of its memory): it is the child's main.
  TraceEvent e = Event(150, child, kChild, 0xa0);
  f.WriteLinesBefore(e.t_ns, e.process);
  ASSERT_TRUE(f.Write(e).ok());
  f.OnProcRecord(ExitRecord(kChild, 200, 3 << 8));  // exit(3)
  EXPECT_TRUE(f.OthersEnded());
  // The root's exit record says exit(0); its reaped status (7) is the one its parent saw, and wins.
  f.OnProcRecord(ExitRecord(kRoot, 300, 0));
  f.Finish();
  const std::vector<std::string> want = {
      "process 1 pid=5000001 parent=- cause= t=0 main=1 ruby=3.3.8",
      "process 2 pid=5000002 parent=1 cause=fork t=100 main=2 ruby=3.3.8",
      "event t=150 thread=2 process=2",
      "end 2 exit t=200 code=3",
      "end 1 exit t=300 code=7",
  };
  EXPECT_EQ(sink_.lines, want);
}

TEST_F(ProcessFollowerTest, ExecEndsTheProcessAndANonRubyImageIsSkippedAndNamed) {
  ProcessFollower& f = *follower_;
  f.OnProcRecord(ProcRecord(RV_EV_PROC_FORK, kChild, 100, kRoot));
  f.OnProcRecord(ProcRecord(RV_EV_PROC_EXEC, kChild, 120, 0, "true"));
  // (No record of it: a record would prove it runs the traced VM.)
  EXPECT_FALSE(f.OthersEnded());
  f.OnProcRecord(ExitRecord(kChild, 130, 9));  // killed by SIGKILL
  EXPECT_TRUE(f.OthersEnded());
  f.Finish();
  const std::vector<std::string> want = {
      "process 2 pid=5000002 parent=1 cause=fork t=100 main=2 ruby=3.3.8",
      "end 2 exec t=120",
      "process 3 pid=5000002 parent=2 cause=exec t=120 main=- skipped=not Ruby (exited before it could be "
      "inspected): true",
      "end 3 exit t=130 signal=9",
  };
  EXPECT_EQ(sink_.lines, want);
}

TEST_F(ProcessFollowerTest, ARecordOfANewImageProvesItRunsTheTracedVm) {
  ProcessFollower& f = *follower_;
  f.OnProcRecord(ProcRecord(RV_EV_PROC_EXEC, kRoot, 50, 0, "ruby"));
  // Events of the new image are a new process with new threads, even on the same tid and rb_thread_t pointer.
  const uint32_t image = f.ProcessOf(kRoot);
  EXPECT_EQ(image, 2u);
  TraceEvent e = Event(60, image, kRoot, 0xa0);
  f.WriteLinesBefore(e.t_ns, e.process);
  ASSERT_TRUE(f.Write(e).ok());
  f.Finish();
  const std::vector<std::string> want = {
      "end 1 exec t=50",
      "process 2 pid=5000001 parent=1 cause=exec t=50 main=2 ruby=3.3.8",
      "event t=60 thread=2 process=2",
  };
  EXPECT_EQ(sink_.lines, want);
  EXPECT_FALSE(f.OthersEnded());
}

TEST_F(ProcessFollowerTest, ChildrenOfASkippedProcessAreSkippedForTheSameReason) {
  ProcessFollower& f = *follower_;
  f.OnProcRecord(ProcRecord(RV_EV_PROC_FORK, kChild, 100, kRoot));
  f.OnProcRecord(ProcRecord(RV_EV_PROC_EXEC, kChild, 110, 0, "sh"));
  f.Poll(111);  // still pending: it may yet map the VM
  f.OnProcRecord(ProcRecord(RV_EV_PROC_FORK, kChild + 1, 120, kChild));
  f.OnProcRecord(ProcRecord(RV_EV_PROC_EXIT, kChild, 130));  // decides process 3 (and so its pending child)
  f.OnProcRecord(ProcRecord(RV_EV_PROC_EXIT, kChild + 1, 140));
  f.Finish();
  int skipped = 0;
  for (const std::string& l : sink_.lines) skipped += l.find("skipped=not Ruby") != std::string::npos ? 1 : 0;
  EXPECT_EQ(skipped, 2) << ::testing::PrintToString(sink_.lines);
  EXPECT_TRUE(f.OthersEnded());
}

}  // namespace
}  // namespace rvbpfd
