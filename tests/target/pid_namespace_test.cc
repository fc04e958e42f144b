#include "target/pid_namespace.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using testing::TempDir;
using testing::WriteFile;

constexpr int kPid = 4242;

// A /proc tree with self/ns/pid and <kPid>/ns/pid (a hard link for the same namespace, a file of its own for another).
class PidNamespaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(dir_.Join("self/ns"));
    std::filesystem::create_directories(dir_.Join(std::to_string(kPid) + "/ns"));
    WriteFile(dir_.Join("self/ns/pid"), "");
  }
  std::string PidDir() const { return dir_.Join(std::to_string(kPid)); }
  void AddTask(int tid, const std::string& status) {
    std::filesystem::create_directories(PidDir() + "/task/" + std::to_string(tid));
    WriteFile(PidDir() + "/task/" + std::to_string(tid) + "/status", status);
  }
  TempDir dir_;
  ProcFs procfs_{dir_.path()};
};

TEST_F(PidNamespaceTest, TheHostsNamespaceNeedsNoTranslation) {
  std::filesystem::create_hard_link(dir_.Join("self/ns/pid"), PidDir() + "/ns/pid");
  AddTask(kPid, "NSpid:\t4242\t1\n");  // never read: the namespace is rvbpfd's own
  Result<TargetPidNamespace> ns = ReadPidNamespace(kPid, procfs_);
  ASSERT_TRUE(ns.ok()) << ns.error().message();
  EXPECT_FALSE(ns->own_namespace());
  EXPECT_EQ(ns->ns.dev, 0u);
  EXPECT_TRUE(ns->threads.empty());
}

TEST_F(PidNamespaceTest, AnotherNamespaceGivesItsInodeKernelDeviceAndEveryThreadsPair) {
  WriteFile(PidDir() + "/ns/pid", "");
  AddTask(kPid, "Name:\truby\nNSpid:\t4242\t1\n");
  AddTask(4250, "Name:\truby\nNSpid:\t4250\t9\n");
  AddTask(4251, "Name:\truby\nNSpid:\t4251\tx\n");     // malformed: left out
  AddTask(4252, "Name:\truby\nPid:\t4252\n");           // no NSpid line: left out
  std::filesystem::create_directories(PidDir() + "/task/4253");  // exited while listed: no status
  std::filesystem::create_directories(PidDir() + "/task/junk");
  Result<TargetPidNamespace> ns = ReadPidNamespace(kPid, procfs_);
  ASSERT_TRUE(ns.ok()) << ns.error().message();
  ASSERT_TRUE(ns->own_namespace());
  struct stat st{};
  ASSERT_EQ(stat((PidDir() + "/ns/pid").c_str(), &st), 0);
  EXPECT_EQ(ns->ns.ino, st.st_ino);
  EXPECT_EQ(ns->ns.dev, (static_cast<uint64_t>(major(st.st_dev)) << 20) | minor(st.st_dev));
  std::vector<std::pair<uint32_t, uint32_t>> threads = ns->threads;
  std::sort(threads.begin(), threads.end());
  EXPECT_EQ(threads, (std::vector<std::pair<uint32_t, uint32_t>>{{1, 4242}, {9, 4250}}));
}

TEST_F(PidNamespaceTest, AGoneProcessIsNoSuchProcess) {
  Result<TargetPidNamespace> ns = ReadPidNamespace(kPid + 1, procfs_);
  ASSERT_FALSE(ns.ok());
  EXPECT_EQ(ns.error().code(), ErrorCode::kNoSuchProcess);
}

TEST(PidNamespaceRealTest, ThisProcessSharesItsOwnNamespace) {
  Result<TargetPidNamespace> ns = ReadPidNamespace(getpid(), ProcFs());
  ASSERT_TRUE(ns.ok()) << ns.error().message();
  EXPECT_FALSE(ns->own_namespace());
}

}  // namespace
}  // namespace rvbpfd

namespace rvbpfd {
namespace {

// One task's files under an injected /proc.
class TaskFilesTest : public ::testing::Test {
 protected:
  void AddTaskFile(int tid, const std::string& name, const std::string& text) {
    const std::string task = dir_.Join(std::to_string(kPid) + "/task/" + std::to_string(tid));
    std::filesystem::create_directories(task);
    testing::WriteFile(task + "/" + name, text);
  }
  testing::TempDir dir_;
  ProcFs procfs_{dir_.path()};
};

TEST_F(TaskFilesTest, NsTidIsTheLastNSpidFieldOfTheTasksStatus) {
  AddTaskFile(4250, "status", "Name:\tpuma srv tp 001\nTgid:\t4242\nPid:\t4250\nNSpid:\t4250\t31\t9\nNSpgid:\t1\n");
  EXPECT_EQ(ReadTaskNsTid(procfs_, kPid, 4250), std::optional<uint32_t>(9));
  AddTaskFile(4251, "status", "Name:\truby\nPid:\t4251\n");  // a kernel without NSpid
  EXPECT_EQ(ReadTaskNsTid(procfs_, kPid, 4251), std::nullopt);
  EXPECT_EQ(ReadTaskNsTid(procfs_, kPid, 4299), std::nullopt);  // the thread is gone
}

TEST_F(TaskFilesTest, HostileStatusTextGivesNoNsTid) {
  AddTaskFile(1, "status", "Name:\tx\nNSpid:\t4250\t99999999999999999999\n");  // too large
  AddTaskFile(2, "status", "Name:\tx\nNSpid:\t4250\t-3\n");
  AddTaskFile(3, "status", "Name:\tx\nNSpid:\t\n");
  AddTaskFile(4, "status", "Name:\tx\nNSpid:\t0\n");
  // The line past the 16 KiB read: not found rather than read without bound.
  AddTaskFile(5, "status", "Name:\t" + std::string(20000, 'a') + "\nNSpid:\t4250\t7\n");
  // A name that spells an NSpid line is on the Name line, not a line of its own.
  AddTaskFile(6, "status", "Name:\tNSpid:\t5\nPid:\t6\n");
  for (int tid = 1; tid <= 6; ++tid) EXPECT_EQ(ReadTaskNsTid(procfs_, kPid, tid), std::nullopt) << tid;
}

TEST_F(TaskFilesTest, CommIsTheFirstLineCutToItsBound) {
  AddTaskFile(4250, "comm", "puma srv tp 001\n");
  EXPECT_EQ(ReadTaskComm(procfs_, kPid, 4250), std::optional<std::string>("puma srv tp 001"));
  AddTaskFile(4251, "comm", std::string(100000, 'n') + "\nsecond line");
  std::optional<std::string> big = ReadTaskComm(procfs_, kPid, 4251);
  ASSERT_TRUE(big.has_value());
  EXPECT_EQ(*big, std::string(kMaxTaskCommBytes, 'n'));
  AddTaskFile(4252, "comm", "\n");
  EXPECT_EQ(ReadTaskComm(procfs_, kPid, 4252), std::nullopt);
  EXPECT_EQ(ReadTaskComm(procfs_, kPid, 4299), std::nullopt);
  EXPECT_EQ(ParseTaskComm("a\nb"), std::optional<std::string>("a"));
}

}  // namespace
}  // namespace rvbpfd
