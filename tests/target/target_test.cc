#include "target/target.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <thread>

#include "elf/elf_file.h"
#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::TempDir;
using testing::WriteFile;

constexpr int kPid = 4242;

std::string VersionLib(const std::string& version) {
  return "const char ruby_version[] = \"" + version + "\";\nint ruby_vm_event_flags;\n";
}

// Builds a fake /proc/<kPid> tree: comm, maps (one line per path), exe symlink, and root/<path> files.
class FakeProc {
 public:
  FakeProc() : procfs_(dir_.path()) {}
  const ProcFs& procfs() const { return procfs_; }
  std::string PidDir() const { return dir_.Join(std::to_string(kPid)); }
  // Places a compiled fixture at root/<target_path> (as the target sees it).
  bool AddFile(const std::string& target_path, const std::string& source, const std::string& flags) {
    return CompileC(source, PidDir() + "/root" + target_path, flags);
  }
  void SetMaps(const std::vector<std::string>& paths, const std::string& suffix = "") {
    std::string text;
    uint64_t addr = 0x7f0000000000;
    for (const std::string& p : paths) {
      char line[512];
      std::snprintf(line, sizeof(line), "%lx-%lx r-xp 00000000 08:01 1234 %s%s\n", addr, addr + 0x1000, p.c_str(),
                    suffix.c_str());
      text += line;
      addr += 0x10000;
    }
    text += "7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0 [stack]\n";
    WriteFile(PidDir() + "/maps", text);
  }
  void SetComm(const std::string& comm) { WriteFile(PidDir() + "/comm", comm + "\n"); }
  void SetExe(const std::string& target_path) {
    std::filesystem::create_directories(PidDir());
    std::filesystem::create_symlink(target_path, PidDir() + "/exe");
  }
  TempDir dir_;

 private:
  ProcFs procfs_;
};

TEST(ParseNsPidTest, TheLastNsPidIsThePidInTheTargetsOwnNamespace) {
  EXPECT_EQ(ParseNsPid("Name:\truby\nPid:\t4321\nNSpid:\t4321\t7\nNStgid:\t4321\t7\n"), 7);
  EXPECT_EQ(ParseNsPid("Name:\truby\nNSpid:\t4321\n"), 4321);
  EXPECT_EQ(ParseNsPid("Name:\truby\nPid:\t4321\n"), std::nullopt);     // an old kernel: no NSpid line
  EXPECT_EQ(ParseNsPid("Name:\truby\nNSpid:\t4321\tx1\n"), std::nullopt);  // hostile or garbled
  EXPECT_EQ(ParseNsPid("Name:\truby\nNSpid:\t\n"), std::nullopt);
  EXPECT_EQ(ParseNsPid("Name:\truby\nNSpid:\t99999999999\n"), std::nullopt);
}

TEST(StatSaysExitingTest, ZombiesDeadAndExitingProcessesAreEnding) {
  // The flags field (the ninth) of a running process, and of one whose exit has begun (PF_EXITING, 0x4): its maps
  // are already empty while the state still reads R.
  EXPECT_FALSE(StatSaysExiting("4242 (ruby) S 1 4242 4242 0 -1 4194560 591 0 0 0 12 3 0 0 20 0 3 0\n"));
  EXPECT_TRUE(StatSaysExiting("4242 (ruby) R 1 4242 4242 0 -1 4194564 591 0 0 0 12 3 0 0 20 0 1 0\n"));
  EXPECT_TRUE(StatSaysExiting("4242 (ruby) Z 1 4242 4242 0 -1 4227340 591 0 0 0 12 3 0 0 20 0 1 0\n"));
  EXPECT_TRUE(StatSaysExiting("4242 (ruby) X 1 4242 4242 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0\n"));
}

TEST(StatSaysExitingTest, ACommWithSpacesAndParenthesesCannotForgeTheFields) {
  // The target names itself: fields are counted after the last ')'.
  EXPECT_FALSE(StatSaysExiting("4242 (a) Z 1 1 1 0 -1 4 (x) S 1 4242 4242 0 -1 4194560 0\n"));
  EXPECT_TRUE(StatSaysExiting("4242 (worker (idle) 1) Z 1 4242 4242 0 -1 4194560 0\n"));
  EXPECT_FALSE(StatSaysExiting("4242 (S 1 1 1 0 -1 4) S 1 4242 4242 0 -1 4194560 0\n"));
}

TEST(StatSaysExitingTest, TextThatDoesNotParseSaysNothing) {
  EXPECT_FALSE(StatSaysExiting(""));
  EXPECT_FALSE(StatSaysExiting("4242 (ruby"));
  EXPECT_FALSE(StatSaysExiting("4242 (ruby) "));
  EXPECT_FALSE(StatSaysExiting("4242 (ruby) R 1 4242"));                                     // cut before the flags
  EXPECT_FALSE(StatSaysExiting("4242 (ruby) R 1 4242 4242 0 -1 4x 0\n"));                    // flags not a number
  EXPECT_FALSE(StatSaysExiting("4242 (ruby) R 1 4242 4242 0 -1 99999999999999999999 0\n"));  // too long
  EXPECT_FALSE(StatSaysExiting("4242 (ruby) RR 1 4242 4242 0 -1 4 0\n"));                    // not a state
  EXPECT_FALSE(StatSaysExiting("4242 (ruby)  R 1 4242 4242 0 -1 4 0\n"));                    // an empty field
}

TEST(ProcessEndingTest, ReadsTheStatOfTheProcRootItIsGiven) {
  FakeProc proc;
  EXPECT_TRUE(ProcessEnding(proc.procfs(), kPid));  // no such process
  WriteFile(proc.PidDir() + "/stat", "4242 (ruby) S 1 4242 4242 0 -1 4194560 0\n");
  EXPECT_FALSE(ProcessEnding(proc.procfs(), kPid));
  WriteFile(proc.PidDir() + "/stat", "4242 (ruby) R 1 4242 4242 0 -1 4194564 0\n");
  EXPECT_TRUE(ProcessEnding(proc.procfs(), kPid));
  WriteFile(proc.PidDir() + "/stat", "");
  EXPECT_TRUE(ProcessEnding(proc.procfs(), kPid));
}

TEST(ParseMapsTest, ParsesPathsWithSpacesDeletedMarkersAndAnonymousMappings) {
  std::vector<MapsEntry> maps = ParseMaps(
      "55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 42 /usr/bin/ruby\n"
      "7f00aa000000-7f00aa100000 r-xp 0004a000 08:01 77 /opt/my ruby/lib/libruby.so.3.3.8 (deleted)\n"
      "garbage line\n"
      "7ffc00000000-7ffc00021000 rw-p 00000000 00:00 0                          [stack]\n"
      "7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0\n");
  ASSERT_EQ(maps.size(), 4u);
  EXPECT_EQ(maps[0].path, "/usr/bin/ruby");
  EXPECT_EQ(maps[0].start, 0x55d0c0a00000u);
  EXPECT_EQ(maps[0].inode, 42u);
  EXPECT_FALSE(maps[0].deleted);
  EXPECT_EQ(maps[1].path, "/opt/my ruby/lib/libruby.so.3.3.8");
  EXPECT_TRUE(maps[1].deleted);
  EXPECT_EQ(maps[1].offset, 0x4a000u);
  EXPECT_EQ(maps[1].perms, "r-xp");
  EXPECT_EQ(maps[2].path, "[stack]");
  EXPECT_EQ(maps[3].path, "");
}

TEST(MappedFileOffsetTest, TellsLdSosFirstReservationFromTheSegmentMappedOverIt) {
  TempDir dir;
  const std::string lib = dir.Join("libruby.so");
  WriteFile(lib, "x");
  struct stat st{};
  ASSERT_EQ(stat(lib.c_str(), &st), 0);
  const std::string pid_dir = dir.Join(std::to_string(kPid));
  std::filesystem::create_directories(pid_dir);
  auto set_maps = [&](const std::string& lines) { WriteFile(pid_dir + "/maps", lines); };
  char line[512];
  // ld.so's first mmap: the whole span from file offset 0 (the data segment's addresses show other bytes).
  std::snprintf(line, sizeof(line), "7f0000000000-7f00005f4000 r--p 00000000 08:01 %llu %s\n",
                static_cast<unsigned long long>(st.st_ino), lib.c_str());
  const std::string reservation = line;
  set_maps(reservation);
  EXPECT_EQ(MappedFileOffset(kPid, lib, 0x7f00005da788, dir.path()), 0x5da788u);
  // The data segment (vaddr 0x5c59e8, file offset 0x5c49e8) mapped over it at its own offset.
  std::snprintf(line, sizeof(line), "7f00005c5000-7f00005f4000 rw-p 005c4000 08:01 %llu %s\n",
                static_cast<unsigned long long>(st.st_ino), lib.c_str());
  set_maps("7f0000000000-7f00005c5000 r--p 00000000 08:01 " + std::to_string(st.st_ino) + " " + lib + "\n" + line);
  EXPECT_EQ(MappedFileOffset(kPid, lib, 0x7f00005da788, dir.path()), 0x5d9788u);
  // Another file's mapping, or none, holds no offset of this one.
  set_maps("7f0000000000-7f00005f4000 r--p 00000000 08:01 " + std::to_string(st.st_ino + 1) + " /other\n");
  EXPECT_EQ(MappedFileOffset(kPid, lib, 0x7f00005da788, dir.path()), std::nullopt);
  EXPECT_EQ(MappedFileOffset(kPid + 1, lib, 0x7f00005da788, dir.path()), std::nullopt);
}

TEST(DiscoverTargetTest, MissingPidIsNoSuchProcess) {
  FakeProc proc;
  Result<RubyTarget> t = DiscoverTarget(kPid, proc.procfs());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code(), ErrorCode::kNoSuchProcess);
  EXPECT_EQ(t.error().message(), "no process with pid 4242");
  EXPECT_EQ(DiscoverTarget(0, proc.procfs()).error().code(), ErrorCode::kNoSuchProcess);
  EXPECT_EQ(DiscoverTarget(-7, proc.procfs()).error().code(), ErrorCode::kNoSuchProcess);
}

// Root can read any file, so permission errors are injected rather than provoked with chmod.
class DenyingProcFs : public ProcFs {
 public:
  using ProcFs::ProcFs;
  int OpenFile(const std::string& path, int flags) const override {
    if (path.ends_with("/maps")) {
      errno = EACCES;
      return -1;
    }
    return ProcFs::OpenFile(path, flags);
  }
};

TEST(DiscoverTargetTest, UnreadableMapsIsNoPrivilegeWithTheFix) {
  FakeProc proc;
  proc.SetComm("ruby");
  proc.SetMaps({"/usr/lib/libruby.so.3.3.8"});
  DenyingProcFs denying(proc.dir_.path());
  Result<RubyTarget> t = DiscoverTarget(kPid, denying);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code(), ErrorCode::kNoPrivilege);
  EXPECT_NE(t.error().message().find("errno 13"), std::string::npos) << t.error().message();
  EXPECT_NE(t.error().message().find("CAP_SYS_PTRACE"), std::string::npos) << t.error().message();
  EXPECT_NE(t.error().message().find("root"), std::string::npos) << t.error().message();
}

TEST(DiscoverTargetTest, ProcessWithoutVmIsNotRuby) {
  FakeProc proc;
  proc.SetComm("python3");
  ASSERT_TRUE(proc.AddFile("/usr/bin/python3", "int main(void) { return 0; }\n", "-O1"));
  ASSERT_TRUE(proc.AddFile("/usr/lib/libc.so.6", "int not_ruby;\n", "-shared -fPIC"));
  proc.SetMaps({"/usr/bin/python3", "/usr/lib/libc.so.6"});
  proc.SetExe("/usr/bin/python3");
  Result<RubyTarget> t = DiscoverTarget(kPid, proc.procfs());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code(), ErrorCode::kNotRuby);
  EXPECT_EQ(t.error().message(),
            "pid 4242 (python3) maps no CRuby VM: no libruby.so and its executable defines no ruby_version");
}

TEST(DiscoverTargetTest, FindsSharedLibrubyThroughTheTargetRoot) {
  FakeProc proc;
  proc.SetComm("ruby");
  ASSERT_TRUE(proc.AddFile("/usr/bin/ruby", "int main(void) { return 0; }\n", "-O1"));
  ASSERT_TRUE(proc.AddFile("/usr/lib/libruby.so.3.3.8", VersionLib("3.3.8"),
                           "-shared -fPIC -Wl,--build-id=0xfeedface00112233"));
  proc.SetMaps({"/usr/bin/ruby", "/usr/lib/libruby.so.3.3.8"});
  proc.SetExe("/usr/bin/ruby");
  Result<RubyTarget> t = DiscoverTarget(kPid, proc.procfs());
  ASSERT_TRUE(t.ok()) << t.error().ToString();
  EXPECT_EQ(t->pid, kPid);
  EXPECT_EQ(t->comm, "ruby");
  EXPECT_EQ(t->vm_path, "/usr/lib/libruby.so.3.3.8");
  EXPECT_EQ(t->vm_host_path, proc.PidDir() + "/root/usr/lib/libruby.so.3.3.8");
  EXPECT_TRUE(t->vm_is_shared_library);
  EXPECT_EQ(t->build_id, "feedface00112233");
  EXPECT_EQ(t->ruby_version, "3.3.8");
  EXPECT_EQ(t->major, 3);
  EXPECT_EQ(t->minor, 3);
  EXPECT_EQ(t->teeny, 8);
  EXPECT_EQ(t->vm_load_start, 0x7f0000010000u);
}

// The file discovery parsed is the file every later step reads and probes: vm_fd names that inode even after the
// path is replaced (a target swapping its libruby for another after discovery changes nothing).
TEST(DiscoverTargetTest, TheDescriptorKeepsTheParsedFileWhenThePathIsSwapped) {
  FakeProc proc;
  proc.SetComm("ruby");
  ASSERT_TRUE(proc.AddFile("/usr/lib/libruby.so.3.3.8", VersionLib("3.3.8"),
                           "-shared -fPIC -Wl,--build-id=0xfeedface00112233"));
  proc.SetMaps({"/usr/lib/libruby.so.3.3.8"});
  Result<RubyTarget> t = DiscoverTarget(kPid, proc.procfs());
  ASSERT_TRUE(t.ok()) << t.error().ToString();
  ASSERT_NE(t->vm_fd, nullptr);
  EXPECT_EQ(t->vm_fd_path(), "/proc/self/fd/" + std::to_string(t->vm_fd->get()));
  // Messages and the debug-file lookup name the path as found, never the descriptor.
  EXPECT_EQ(t->vm_elf->path(), t->vm_host_path);
  EXPECT_EQ(t->vm_elf->origin_path(), t->vm_host_path);

  const std::string swapped = proc.PidDir() + "/root/usr/lib/libruby.so.3.3.8";
  ASSERT_TRUE(CompileC(VersionLib("3.3.9"), swapped + ".new", "-shared -fPIC -Wl,--build-id=0x0badc0de"));
  std::filesystem::rename(swapped + ".new", swapped);
  Result<ElfFile> reread = ElfFile::Open(t->vm_fd_path());
  ASSERT_TRUE(reread.ok()) << reread.error().ToString();
  EXPECT_EQ(reread->build_id(), "feedface00112233");
  EXPECT_EQ(ElfFile::Open(swapped)->build_id(), "0badc0de");
}

// A FIFO where the VM should be: refused from its descriptor's type, without ever opening it for reading (which would
// wait for a writer).
TEST(DiscoverTargetTest, FifoInPlaceOfTheVmIsRefusedWithoutBlocking) {
  FakeProc proc;
  proc.SetComm("ruby");
  std::filesystem::create_directories(proc.PidDir() + "/root/usr/lib");
  ASSERT_EQ(mkfifo((proc.PidDir() + "/root/usr/lib/libruby.so.3.3.8").c_str(), 0600), 0);
  proc.SetMaps({"/usr/lib/libruby.so.3.3.8"});
  Result<RubyTarget> t = DiscoverTarget(kPid, proc.procfs());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message().find("is a FIFO"), std::string::npos) << t.error().message();
  EXPECT_NE(t.error().message().find(proc.PidDir() + "/root/usr/lib/libruby.so.3.3.8"), std::string::npos)
      << t.error().message();
}

TEST(DiscoverTargetTest, FindsStaticRubyExecutable) {
  FakeProc proc;
  proc.SetComm("ruby");
  ASSERT_TRUE(proc.AddFile("/opt/ruby/bin/ruby", VersionLib("3.4.5") + "int main(void) { return 0; }\n", "-O1"));
  proc.SetMaps({"/opt/ruby/bin/ruby", "/usr/lib/x86_64-linux-gnu/libc.so.6"});
  proc.SetExe("/opt/ruby/bin/ruby");
  Result<RubyTarget> t = DiscoverTarget(kPid, proc.procfs());
  ASSERT_TRUE(t.ok()) << t.error().ToString();
  EXPECT_EQ(t->vm_path, "/opt/ruby/bin/ruby");
  EXPECT_FALSE(t->vm_is_shared_library);
  EXPECT_EQ(t->ruby_version, "3.4.5");
  EXPECT_EQ(t->minor, 4);
}

TEST(DiscoverTargetTest, RubyOlderThan32IsUnsupported) {
  FakeProc proc;
  proc.SetComm("ruby3.1");
  ASSERT_TRUE(proc.AddFile("/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1", VersionLib("3.1.2"), "-shared -fPIC"));
  proc.SetMaps({"/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1"});
  Result<RubyTarget> t = DiscoverTarget(kPid, proc.procfs());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code(), ErrorCode::kUnsupportedVersion);
  EXPECT_EQ(t.error().message(),
            "CRuby 3.1.2 has no thread scheduler events (they were added in 3.2); use Ruby >= 3.2");
}

TEST(DiscoverTargetTest, DeletedLibraryIsOpenedThroughMapFiles) {
  FakeProc proc;
  proc.SetComm("ruby");
  // The file is gone from the target's root (upgraded away) but still mapped: map_files/<range> reaches it.
  ASSERT_TRUE(CompileC(VersionLib("3.3.8"), proc.PidDir() + "/map_files/7f0000000000-7f0000001000",
                       "-shared -fPIC"));
  proc.SetMaps({"/usr/lib/libruby.so.3.3.8"}, " (deleted)");
  Result<RubyTarget> t = DiscoverTarget(kPid, proc.procfs());
  ASSERT_TRUE(t.ok()) << t.error().ToString();
  EXPECT_EQ(t->vm_path, "/usr/lib/libruby.so.3.3.8");
  EXPECT_EQ(t->vm_host_path, proc.PidDir() + "/map_files/7f0000000000-7f0000001000");
  EXPECT_EQ(t->ruby_version, "3.3.8");
}

// A process caught in exec: its old image's name until the moment its maps are read, the new image's after.
class ExecDuringMapsProcFs : public ProcFs {
 public:
  ExecDuringMapsProcFs(std::string root, std::string comm_path)
      : ProcFs(std::move(root)), comm_path_(std::move(comm_path)) {}
  int OpenFile(const std::string& path, int flags) const override {
    if (path.ends_with("/maps")) WriteFile(comm_path_, "ruby\n");
    return ProcFs::OpenFile(path, flags);
  }

 private:
  std::string comm_path_;
};

TEST(DiscoverTargetTest, TheNameIsReadWithTheMappingsItIsReportedWith) {
  FakeProc proc;
  proc.SetComm("rvbpfd_target_t");  // the forked parent's name, before exec renames the process
  ASSERT_TRUE(proc.AddFile("/usr/lib/libruby.so.3.3.8", VersionLib("3.3.8"), "-shared -fPIC"));
  proc.SetMaps({"/usr/lib/libruby.so.3.3.8"});
  ExecDuringMapsProcFs procfs(proc.dir_.path(), proc.PidDir() + "/comm");
  Result<RubyTarget> t = DiscoverTarget(kPid, procfs);
  ASSERT_TRUE(t.ok()) << t.error().ToString();
  EXPECT_EQ(t->comm, "ruby");
}

TEST(DiscoverTargetTest, LibrubyWithoutVersionStringIsNotRuby) {
  FakeProc proc;
  proc.SetComm("fake");
  ASSERT_TRUE(proc.AddFile("/usr/lib/libruby.so.9", "int something_else;\n", "-shared -fPIC"));
  proc.SetMaps({"/usr/lib/libruby.so.9"});
  Result<RubyTarget> t = DiscoverTarget(kPid, proc.procfs());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code(), ErrorCode::kNotRuby);
  EXPECT_NE(t.error().message().find("ruby_version"), std::string::npos);
}

// --- Against real processes (the test Rubies and Debian's ruby), skipped when absent -------------------------------

// Runs `ruby -e 'sleep 5'` and kills it on destruction.
class RubyChild {
 public:
  explicit RubyChild(const std::string& ruby) {
    pid_ = fork();
    if (pid_ == 0) {
      int devnull = open("/dev/null", O_RDWR);
      dup2(devnull, 1);
      dup2(devnull, 2);
      execl(ruby.c_str(), ruby.c_str(), "-e", "sleep 5", static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~RubyChild() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  int pid() const { return pid_; }

 private:
  int pid_ = -1;
};

// Polls until the child has exec'd and loaded the VM (its comm becomes "ruby"), at most 5 s.
Result<RubyTarget> DiscoverWhenReady(int pid) {
  Result<RubyTarget> t = Error(ErrorCode::kInternal, "not tried");
  for (int i = 0; i < 100; ++i) {
    t = DiscoverTarget(pid, ProcFs());
    if (t.ok() || t.error().code() == ErrorCode::kUnsupportedVersion) return t;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return t;
}

TEST(DiscoverTargetRealTest, SharedRuby338) {
  std::string dir = testing::TestRuby("3.3.8-shared");
  if (dir.empty()) GTEST_SKIP() << "test Ruby 3.3.8-shared not built (tools/build-test-rubies.sh)";
  RubyChild child(dir + "/bin/ruby");
  Result<RubyTarget> t = DiscoverWhenReady(child.pid());
  ASSERT_TRUE(t.ok()) << t.error().ToString();
  EXPECT_EQ(t->ruby_version, "3.3.8");
  EXPECT_TRUE(t->vm_is_shared_library);
  EXPECT_EQ(t->vm_path, dir + "/lib/libruby.so.3.3.8");
  EXPECT_EQ(t->vm_host_path, "/proc/" + std::to_string(child.pid()) + "/root" + dir + "/lib/libruby.so.3.3.8");
  Result<ElfFile> direct = ElfFile::Open(dir + "/lib/libruby.so.3.3.8");
  ASSERT_TRUE(direct.ok());
  EXPECT_EQ(t->build_id, direct->build_id());
  EXPECT_EQ(t->comm, "ruby");
}

TEST(DiscoverTargetRealTest, StaticRuby345) {
  std::string dir = testing::TestRuby("3.4.5-static");
  if (dir.empty()) GTEST_SKIP() << "test Ruby 3.4.5-static not built (tools/build-test-rubies.sh)";
  RubyChild child(dir + "/bin/ruby");
  Result<RubyTarget> t = DiscoverWhenReady(child.pid());
  ASSERT_TRUE(t.ok()) << t.error().ToString();
  EXPECT_EQ(t->ruby_version, "3.4.5");
  EXPECT_FALSE(t->vm_is_shared_library);
  EXPECT_EQ(t->vm_path, dir + "/bin/ruby");
  EXPECT_FALSE(t->build_id.empty());
}

TEST(DiscoverTargetRealTest, DebianRuby31IsUnsupported) {
  if (!testing::FileExists("/usr/bin/ruby") ||
      !testing::FileExists("/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1")) {
    GTEST_SKIP() << "Debian's ruby 3.1 is not installed";
  }
  RubyChild child("/usr/bin/ruby");
  Result<RubyTarget> t = DiscoverWhenReady(child.pid());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code(), ErrorCode::kUnsupportedVersion);
  EXPECT_NE(t.error().message().find("CRuby 3.1."), std::string::npos) << t.error().message();
}

TEST(DiscoverTargetRealTest, NonRubyProcessIsNotRuby) {
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sleep", "sleep", "5", static_cast<char*>(nullptr));
    _exit(127);
  }
  Result<RubyTarget> t = Error(ErrorCode::kInternal, "not tried");
  for (int i = 0; i < 100; ++i) {  // until exec has replaced the forked test binary
    t = DiscoverTarget(pid, ProcFs());
    if (!t.ok() && t.error().message().find("(sleep)") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code(), ErrorCode::kNotRuby) << t.error().ToString();
}

}  // namespace
}  // namespace rvbpfd
