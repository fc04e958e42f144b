#include "agent/process_registry.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace rvbpfd {
namespace {

// A process with its parent's pid, started at `start_ticks` (by default after its parent: later pids, later starts).
std::unique_ptr<WatchedProcess> Proc(int pid, int parent_pid, uint64_t start_ticks = 0) {
  auto p = std::make_unique<WatchedProcess>();
  p->pid = pid;
  p->labels.pid = pid;
  p->labels.parent_pid = parent_pid;
  p->labels.start_ticks = start_ticks != 0 ? start_ticks : static_cast<uint64_t>(pid);
  return p;
}

TEST(ProcessRoleTest, AClusterIsAMasterAndItsWorkers) {
  ProcessRegistry r;
  WatchedProcess& master = r.Add(Proc(100, 1));
  WatchedProcess& w1 = r.Add(Proc(101, 100));
  WatchedProcess& w2 = r.Add(Proc(102, 100));
  WatchedProcess& alone = r.Add(Proc(200, 1));
  EXPECT_EQ(ProcessRole(r, master), kRoleMaster);
  EXPECT_EQ(ProcessRole(r, w1), kRoleWorker);
  EXPECT_EQ(ProcessRole(r, w2), kRoleWorker);
  EXPECT_EQ(ProcessRole(r, alone), "");
}

TEST(ProcessRoleTest, ComesFromTheProfiledProcessesOnly) {
  ProcessRegistry r;
  // The parent is not profiled (a shell, a process the filter excludes, one that exited): not a worker.
  WatchedProcess& orphan = r.Add(Proc(101, 100));
  EXPECT_EQ(ProcessRole(r, orphan), "");
  WatchedProcess& master = r.Add(Proc(100, 1));
  EXPECT_EQ(ProcessRole(r, orphan), kRoleWorker);
  EXPECT_EQ(ProcessRole(r, master), kRoleMaster);
  // The last worker gone: the master is a process on its own again.
  r.Remove(101);
  EXPECT_EQ(ProcessRole(r, master), "");
  // A process removed before its last cut still finds its parent.
  std::unique_ptr<WatchedProcess> finished = Proc(103, 100);
  EXPECT_EQ(ProcessRole(r, *finished), kRoleWorker);
}

TEST(ProcessRoleTest, AWorkerThatForksStaysAWorkerAndAnUnknownParentIsNoRole) {
  ProcessRegistry r;
  r.Add(Proc(100, 1));
  WatchedProcess& mold = r.Add(Proc(101, 100));  // Puma's fork_worker: worker 0 forks the others
  r.Add(Proc(102, 101));
  EXPECT_EQ(ProcessRole(r, mold), kRoleWorker);
  WatchedProcess& unknown = r.Add(Proc(300, 0));
  EXPECT_EQ(ProcessRole(r, unknown), "");
}

TEST(ProcessRoleTest, APidReusedAfterTheParentExitedIsNotTheParent) {
  ProcessRegistry r;
  // Worker 101 of master 100 (started at tick 50); the master exited and a new process got pid 100 at tick 900.
  WatchedProcess& worker = r.Add(Proc(101, 100, 50));
  WatchedProcess& newcomer = r.Add(Proc(100, 1, 900));
  EXPECT_EQ(ProcessRole(r, worker), "");
  EXPECT_EQ(ProcessRole(r, newcomer), "");
  // Unknown start times prove nothing either.
  WatchedProcess& unknown_child = r.Add(Proc(201, 200, 0));
  unknown_child.labels.start_ticks = 0;
  r.Add(Proc(200, 1, 10));
  EXPECT_EQ(ProcessRole(r, unknown_child), "");
}

TEST(AddProcessTreeLabelsTest, LabelsEveryUploadOfTheProcess) {
  ProcessRegistry r;
  WatchedProcess& master = r.Add(Proc(100, 7));
  WatchedProcess& worker = r.Add(Proc(101, 100));
  WatchedProcess& unknown = r.Add(Proc(300, 0));
  std::vector<ProfileUpload> uploads(2);
  AddProcessTreeLabels(r, worker, &uploads);
  for (const ProfileUpload& u : uploads) {
    EXPECT_EQ(u.labels.at("parent_pid"), "100");
    EXPECT_EQ(u.labels.at("process_role"), "worker");
  }
  uploads.assign(1, ProfileUpload{});
  AddProcessTreeLabels(r, master, &uploads);
  EXPECT_EQ(uploads[0].labels.at("parent_pid"), "7");
  EXPECT_EQ(uploads[0].labels.at("process_role"), "master");
  uploads.assign(1, ProfileUpload{});
  AddProcessTreeLabels(r, unknown, &uploads);
  EXPECT_TRUE(uploads[0].labels.empty());  // no parent known, no role: no label rather than a guess
}

}  // namespace
}  // namespace rvbpfd
