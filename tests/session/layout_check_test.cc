// CheckLiveLayout: a live process whose memory does not match what the analysis of its VM binary assumed is refused
// before its events are trusted (exit 6), with one line naming the version and the failed check; LiveLayoutGate
// repeats the check while the VM is still starting (launch mode).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#include "elf/elf_fixtures.h"
#include "session/fake_vm_memory.h"
#include "session/vm_binary.h"
#include "sites/sites.h"
#include "stacks/fake_memory.h"
#include "stacks/ruby_offsets.h"
#include "target/target.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::FakeMemory;
using testing::TempDir;

constexpr uint64_t kBias = 0x7f0000000000;
constexpr int kPid = 4242;

class LayoutFakeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(CompileC("const char ruby_version[] = \"3.3.8\";", dir_.Join("libv.so"), "-shared -fPIC"));
    Result<ElfFile> elf = ElfFile::Open(dir_.Join("libv.so"));
    ASSERT_TRUE(elf.ok());
    elf_.emplace(std::move(elf.value()));
    const uint64_t version = elf_->FindSymbol("ruby_version")->value;
    sites_.ruby_version = "3.3.8";
    sites_.offsets = rv_offsets{200, testing::FakeVm::kThNt, testing::FakeVm::kNtTid, 0};
    sites_.hooks_vaddr = testing::FakeVm::kHooks;
    sites_.main_ractor_vaddr = testing::FakeVm::kMainRactor;
    sites_.ractor_main_thread = testing::FakeVm::kRactorMainThread;
    mem_ = testing::FakeVmMemory(kBias, kPid);  // ractor 0x10000, th 0x20000, nt 0x30000
    mem_.Map(kBias + version, 32);
    mem_.Put(kBias + version, "3.3.8", 6);
  }
  Result<LiveLayoutResult> Check(int ns_pid = kPid, bool vm_may_be_starting = false) {
    return CheckLiveLayout(kPid, ns_pid, LiveLayoutOf(*elf_, sites_), kBias, mem_, vm_may_be_starting);
  }
  static bool Matches(Result<LiveLayoutResult> r) { return r.ok() && r.value() == LiveLayoutResult::kMatches; }
  TempDir dir_;
  std::optional<ElfFile> elf_;
  SiteSet sites_;
  FakeMemory mem_;
};

TEST_F(LayoutFakeTest, MatchingProcessPasses) { EXPECT_TRUE(Matches(Check())); }

TEST_F(LayoutFakeTest, MainThreadOfAnotherTidIsRefused) {
  mem_.Put32(0x30000 + 24, kPid + 1);
  Result<LiveLayoutResult> st = Check();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kNoSymbols);
  EXPECT_NE(st.error().message().find("CRuby 3.3.8"), std::string::npos) << st.error().message();
  EXPECT_NE(st.error().message().find("native tid (nt->tid at +24) is 4243, not the pid"), std::string::npos)
      << st.error().message();
  EXPECT_NE(st.error().message().find("supported without debug symbols: CRuby 3.2, 3.3 and 3.4"), std::string::npos);
  EXPECT_EQ(st.error().message().find('\n'), std::string::npos) << "one line";
}

TEST_F(LayoutFakeTest, InAPidNamespaceTheMainThreadHoldsTheNamespacePid) {
  // A container's VM records the tid it sees (here 1), not the host pid.
  mem_.Put32(0x30000 + 24, 1);
  EXPECT_TRUE(Matches(Check(/*ns_pid=*/1)));
  Result<LiveLayoutResult> st = Check(/*ns_pid=*/2);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message().find("is 1, not the pid (2 in its pid namespace)"), std::string::npos)
      << st.error().message();
}

TEST_F(LayoutFakeTest, OtherVersionUnreadableHookListOrThreadAreRefused) {
  sites_.ruby_version = "3.4.5";
  EXPECT_NE(Check().error().message().find("its ruby_version is \"3.3.8\""), std::string::npos);
  sites_.ruby_version = "3.3.8";
  sites_.hooks_vaddr = 0x9000;
  EXPECT_NE(Check().error().message().find("the hook list pointer is unreadable"), std::string::npos);
  sites_.hooks_vaddr = 0x5000;
  mem_.Put64(kBias + 0x5000, 0xdead0000);
  EXPECT_NE(Check().error().message().find("the hook list points to unreadable memory"), std::string::npos);
  mem_.Put64(kBias + 0x5000, 0);
  mem_.Put64(0x20000 + 40, 0x99990000);
  EXPECT_NE(Check().error().message().find("nt->tid at +24) is unreadable"), std::string::npos);
  mem_.Put64(0x20000 + 40, 0);
  EXPECT_NE(Check().error().message().find("th->nt at +40) is unreadable"), std::string::npos);
}

TEST_F(LayoutFakeTest, SeveralRactorsSkipTheMainThreadCheck) {
  mem_.Put64(kBias + 0x5008, 0);  // ruby_single_main_ractor is NULL once a second ractor exists
  mem_.Put32(0x30000 + 24, 1);
  EXPECT_TRUE(Matches(Check()));
  // ... unless the caller cannot tell that from a VM that has not reached ruby_setup yet.
  Result<LiveLayoutResult> r = Check(kPid, /*vm_may_be_starting=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value(), LiveLayoutResult::kNotStarted);
}

TEST_F(LayoutFakeTest, AMainRactorWithoutMainThreadIsNotStartedYet) {
  mem_.Put64(0x10000 + 0x188, 0);  // ruby_setup has allocated the main ractor, not yet given it its main thread
  Result<LiveLayoutResult> r = Check();
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r.value(), LiveLayoutResult::kNotStarted);
}

// The gate of a launched command: pending while the VM starts (checked at most once per kRetryNs), then passed.
TEST_F(LayoutFakeTest, GatePassesOnceTheMainThreadIsSetUp) {
  LiveLayoutGate gate(kPid, kPid, LiveLayoutOf(*elf_, sites_));
  int scans = 0;
  auto lowest = [&]() -> std::optional<uint64_t> {
    ++scans;
    return kBias + LowestLoadVaddr(*elf_);
  };
  mem_.Put64(0x10000 + 0x188, 0);
  uint64_t t = 1'000;
  EXPECT_EQ(gate.Poll(t, lowest, mem_), LiveLayoutGate::State::kPending);
  EXPECT_EQ(gate.Poll(t + LiveLayoutGate::kRetryNs / 2, lowest, mem_), LiveLayoutGate::State::kPending);
  EXPECT_EQ(scans, 1) << "an attempt at most once per kRetryNs";
  mem_.Put64(0x10000 + 0x188, 0x20000);
  EXPECT_EQ(gate.Poll(t + LiveLayoutGate::kRetryNs, lowest, mem_), LiveLayoutGate::State::kPassed);
  EXPECT_EQ(scans, 2);
}

// A launched command whose memory rvbpfd cannot read (under sudo, another user): asked once the VM is mapped; the
// binary's own DWARF layout stands without the check, a table layout is refused with kNoPrivilege; a readable
// process is checked as usual.
TEST_F(LayoutFakeTest, GateDecidesAnUnreadableCommandByWhereItsLayoutCameFrom) {
  std::optional<uint64_t> mapped;
  auto lowest = [&]() { return mapped; };
  int asked = 0;
  auto denied = [&](uint64_t addr) {
    ++asked;
    EXPECT_EQ(addr, kBias + LowestLoadVaddr(*elf_));
    return EPERM;
  };
  {
    LiveLayoutGate gate(kPid, kPid, LiveLayoutOf(*elf_, sites_), LiveLayoutGate::Unreadable{true, denied});
    EXPECT_EQ(gate.Poll(0, lowest, mem_), LiveLayoutGate::State::kPending);
    EXPECT_EQ(asked, 0) << "not asked before the VM is mapped";
    mapped = kBias + LowestLoadVaddr(*elf_);
    mem_.Put32(0x30000 + 24, 77);  // a mismatch it cannot see: the memory is unreadable
    EXPECT_EQ(gate.Poll(LiveLayoutGate::kRetryNs, lowest, mem_), LiveLayoutGate::State::kSkipped);
    EXPECT_EQ(asked, 1);
  }
  {
    LiveLayoutGate gate(kPid, kPid, LiveLayoutOf(*elf_, sites_), LiveLayoutGate::Unreadable{false, denied});
    ASSERT_EQ(gate.Poll(0, lowest, mem_), LiveLayoutGate::State::kFailed);
    EXPECT_EQ(gate.error().code(), ErrorCode::kNoPrivilege);
    EXPECT_NE(gate.error().message().find("CAP_SYS_PTRACE"), std::string::npos) << gate.error().message();
    EXPECT_NE(gate.error().message().find("debug symbols"), std::string::npos) << gate.error().message();
  }
  {
    mem_.Put32(0x30000 + 24, kPid);
    LiveLayoutGate gate(kPid, kPid, LiveLayoutOf(*elf_, sites_),
                        LiveLayoutGate::Unreadable{false, [](uint64_t) { return 0; }});
    EXPECT_EQ(gate.Poll(0, lowest, mem_), LiveLayoutGate::State::kPassed);
  }
}

TEST_F(LayoutFakeTest, GateRefusesAMismatchAtOnce) {
  LiveLayoutGate gate(kPid, kPid, LiveLayoutOf(*elf_, sites_));
  mem_.Put32(0x30000 + 24, 77);
  auto lowest = [&]() -> std::optional<uint64_t> { return kBias + LowestLoadVaddr(*elf_); };
  ASSERT_EQ(gate.Poll(0, lowest, mem_), LiveLayoutGate::State::kFailed);
  EXPECT_EQ(gate.error().code(), ErrorCode::kNoSymbols);
  EXPECT_NE(gate.error().message().find("is 77, not the pid"), std::string::npos) << gate.error().message();
}

TEST_F(LayoutFakeTest, GateRefusesAVmThatNeverSetsUpItsMainThread) {
  LiveLayoutGate gate(kPid, kPid, LiveLayoutOf(*elf_, sites_));
  mem_.Put64(0x10000 + 0x188, 0);  // e.g. a wrong threads.main offset that reads a field that stays 0
  auto lowest = [&]() -> std::optional<uint64_t> { return kBias + LowestLoadVaddr(*elf_); };
  EXPECT_EQ(gate.Poll(0, lowest, mem_), LiveLayoutGate::State::kPending);
  EXPECT_EQ(gate.Poll(LiveLayoutGate::kGiveUpNs - LiveLayoutGate::kRetryNs, lowest, mem_),
            LiveLayoutGate::State::kPending);
  ASSERT_EQ(gate.Poll(LiveLayoutGate::kGiveUpNs, lowest, mem_), LiveLayoutGate::State::kFailed);
  EXPECT_EQ(gate.error().code(), ErrorCode::kNoSymbols);
  EXPECT_NE(gate.error().message().find("threads.main at +392 stays NULL) 5 s after it started"), std::string::npos)
      << gate.error().message();
  EXPECT_EQ(gate.error().message().find('\n'), std::string::npos) << "one line";
}

// A real test Ruby whose libruby copy is patched so the main thread's route (rb_thread_main's threads.main load)
// points elsewhere: the analysis of the copy then disagrees with the live process, which is refused; the unpatched
// copy passes.
TEST(LayoutLiveTest, PatchedCopyOfLibrubyIsRefusedUnpatchedCopyPasses) {
  const std::string dir = testing::TestRuby("3.3.8-shared");
  if (dir.empty()) GTEST_SKIP() << "test Ruby 3.3.8-shared not built";
  const std::string original = dir + "/lib/libruby.so.3.3.8";
  Result<ElfFile> orig = ElfFile::Open(original);
  ASSERT_TRUE(orig.ok());
  Result<SiteSet> want = FindSites(*orig, "3.3.8");
  ASSERT_TRUE(want.ok());
  ASSERT_NE(want->ractor_main_thread, 0u) << "rb_thread_main's route not recovered";
  std::optional<ElfSymbol> fn = orig->FindSymbol("rb_thread_main");
  ASSERT_TRUE(fn.has_value());
  std::ifstream in(original, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const uint64_t off = *orig->VaddrToFileOffset(fn->value);
  const uint32_t disp = want->ractor_main_thread;
  size_t at = bytes.find(std::string(reinterpret_cast<const char*>(&disp), 4), off);
  ASSERT_NE(at, std::string::npos);
  ASSERT_LT(at, off + fn->size);

  for (bool patch : {false, true}) {
    SCOPED_TRACE(patch ? "patched" : "unpatched");
    TempDir tmp;
    std::string copy = bytes;
    const uint32_t moved = disp + 8;
    if (patch) std::memcpy(copy.data() + at, &moved, 4);
    const std::string lib = tmp.Join("libruby.so.3.3");
    { std::ofstream(lib, std::ios::binary) << copy; }
    Result<ElfFile> elf = ElfFile::Open(lib);
    ASSERT_TRUE(elf.ok());
    Result<SiteSet> sites = FindSites(*elf, "3.3.8");
    ASSERT_TRUE(sites.ok());
    EXPECT_EQ(sites->ractor_main_thread, patch ? moved : disp);
    int to_child[2];
    ASSERT_EQ(pipe(to_child), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      dup2(to_child[0], 0);
      close(to_child[1]);
      setenv("LD_LIBRARY_PATH", tmp.path().c_str(), 1);
      const std::string ruby = dir + "/bin/ruby";
      execl(ruby.c_str(), ruby.c_str(), "-e", "STDIN.read", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to_child[0]);
    std::optional<uint64_t> lowest;
    for (int i = 0; i < 200; ++i) {  // until the VM is mapped and Ruby is running (main thread set up)
      lowest = LowestMappingOf(pid, lib);
      if (lowest && i > 50) break;
      usleep(10000);
    }
    ASSERT_TRUE(lowest.has_value()) << "the child never mapped " << lib;
    ProcessMemoryReader mem(pid);
    Result<LiveLayoutResult> st =
        CheckLiveLayout(pid, pid, LiveLayoutOf(*elf, *sites), LoadBiasFromLowestMapping(*elf, *lowest), mem);
    close(to_child[1]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (patch) {
      ASSERT_FALSE(st.ok());
      EXPECT_EQ(st.error().code(), ErrorCode::kNoSymbols);
      EXPECT_NE(st.error().message().find("main thread"), std::string::npos) << st.error().message();
      std::printf("refused: %s\n", st.error().ToString().c_str());
    } else {
      ASSERT_TRUE(st.ok()) << st.error().ToString();
      EXPECT_EQ(st.value(), LiveLayoutResult::kMatches);
    }
  }
}

}  // namespace
}  // namespace rvbpfd
