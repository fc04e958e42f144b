// The sampler's EC lookup (bpf/ruby_ec.h, run here through its host build) on a live test Ruby: the process runs
// coredump-testdata/programs/scenarios.rb, records CRuby's own view of its threads (tests/golden's rvgolden: each
// thread's rb_thread_t and native tid) and stops itself. Each thread's thread pointer (fs_base) is read with ptrace,
// the route is computed from the VM binary and resolved in the process like the daemon does, and then:
//   - TLS: every thread's own ruby_current_ec leads to exactly its own rb_thread_t (3.3.8 shared: through the DTV;
//     3.4.5 static: local-exec);
//   - ractor: with the TLS route switched off, main (which holds the GVL while it captures) is found on main's native
//     thread only; every other thread gets no EC rather than main's.
#include <dirent.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "elf/elf_file.h"
#include "sites/dwarf_info.h"
#include "stacks/ec_route.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"
#include "live_golden.h"

namespace rvbpfd {
namespace {

namespace fs = std::filesystem;


// fs_base of every thread of a stopped child, through ptrace (seize + interrupt keeps it stopped; detach returns each
// thread to the group stop). Empty with *why set when ptrace is refused.
std::map<int, uint64_t> ThreadPointers(pid_t pid, std::string* why) {
  std::map<int, uint64_t> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    *why = "cannot list " + dir;
    return out;
  }
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const pid_t tid = std::atoi(e->d_name);
    if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
      *why = std::string("PTRACE_SEIZE: ") + std::strerror(errno);
      out.clear();
      break;
    }
    ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
    int st = 0;
    waitpid(tid, &st, __WALL);
    user_regs_struct regs{};
    if (ptrace(PTRACE_GETREGS, tid, nullptr, &regs) == 0) out[tid] = regs.fs_base;
    ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
  }
  closedir(d);
  return out;
}

class EcRouteLiveTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EcRouteLiveTest, EveryThreadFindsItsOwnThreadThroughTls) {
  const std::string name = GetParam();
  const std::string ruby = std::string(testing::kTestRubies) + "/" + name + "/bin/ruby";
  if (access(ruby.c_str(), X_OK) != 0) GTEST_SKIP() << ruby << " not installed (tools/build-test-rubies.sh)";
  testing::StoppedGoldenRuby stopped;
  const std::string why_not = stopped.Start(name, ruby, "ec-live");
  ASSERT_TRUE(why_not.empty()) << why_not;
  const pid_t pid = stopped.pid();
  const nlohmann::json& golden = stopped.golden();
  const std::string& vm_path = stopped.vm_path();
  const uint64_t lowest = stopped.lowest_mapping();
  Result<ElfFile> elf = ElfFile::Open(vm_path);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  int major = 0, minor = 0;
  ASSERT_EQ(std::sscanf(golden["ruby_version"].get<std::string>().c_str(), "%d.%d", &major, &minor), 2);
  Result<RubyOffsets> off = OffsetsForBinary(*elf, major, minor, nullptr);
  ASSERT_TRUE(off.ok()) << off.error().ToString();
  const EcRoute route = ComputeEcRoute(*elf, *off);
  ASSERT_NE(route.kind, EcTlsKind::kNone) << route.why_none;
  std::printf("  %s: EC route %s\n", name.c_str(), DescribeEcRoute(route).c_str());

  // rb_thread_t.nt and rb_native_thread.tid for the ractor route's holder check (the sites module's job in rvbpfd).
  std::unique_ptr<DwarfInfo> dwarf = DwarfInfo::Open(*elf);
  ASSERT_NE(dwarf, nullptr);
  std::optional<ElfSymbol> anchor = elf->FindSymbol("rb_current_ec_noinline");
  ASSERT_TRUE(anchor.has_value());
  std::optional<uint32_t> th_nt = dwarf->MemberOffset(anchor->value, "rb_thread_struct", "nt");
  std::optional<uint32_t> nt_tid = dwarf->MemberOffset(anchor->value, "rb_native_thread", "tid");
  ASSERT_TRUE(th_nt && nt_tid);

  ProcessMemoryReader mem(pid);
  Result<std::optional<rv_proc_ec>> pe = ResolveProcessEc(route, 0, EcRouteLoadBias(route, lowest), mem);
  ASSERT_TRUE(pe.ok()) << pe.error().ToString();
  ASSERT_TRUE(pe->has_value()) << "the VM of a running process is relocated";
  const rv_proc_ec proc = **pe;
  EXPECT_EQ(proc.mode, route.kind == EcTlsKind::kLocalExec ? uint32_t{RV_EC_TLS_TP_OFFSET} : uint32_t{RV_EC_TLS_DTV});
  rv_walk_config wc{};
  wc.walk = off->walk;
  wc.thread_ec = off->thread_ec;
  ApplyEcRoute(route, &wc);
  wc.valid = 1;

  std::string why;
  const std::map<int, uint64_t> tps = ThreadPointers(pid, &why);
  if (tps.empty()) GTEST_SKIP() << "cannot read the threads' fs_base: " << why;

  size_t checked = 0;
  uint64_t main_th = 0;
  for (const nlohmann::json& t : golden["threads"]) {
    if (t["main"].get<bool>()) main_th = std::stoull(t["th"].get<std::string>(), nullptr, 16);
  }
  ASSERT_NE(main_th, 0u);
  rv_proc_ec no_tls = proc;
  no_tls.mode = RV_EC_TLS_NONE;
  for (const nlohmann::json& t : golden["threads"]) {
    SCOPED_TRACE("thread " + t["name"].dump());
    ASSERT_TRUE(t["native_tid"].is_number()) << "1:1 threads have their own native thread";
    const int tid = t["native_tid"].get<int>();
    const uint64_t th = std::stoull(t["th"].get<std::string>(), nullptr, 16);
    auto it = tps.find(tid);
    ASSERT_NE(it, tps.end()) << "no thread pointer for tid " << tid;
    EcLookup got = FindEcForThread(mem, proc, wc, *th_nt, *nt_tid, it->second, static_cast<uint32_t>(tid));
    EXPECT_EQ(got.route, uint32_t{RV_EC_ROUTE_TLS});
    EXPECT_EQ(got.th, th) << "TLS gave another thread's EC";
    // Without TLS, only the GVL holder's own native thread gets an EC (main, which is capturing).
    EcLookup ractor = FindEcForThread(mem, no_tls, wc, *th_nt, *nt_tid, it->second, static_cast<uint32_t>(tid));
    EXPECT_TRUE(ractor.tls_unavailable);
    if (th == main_th) {
      EXPECT_EQ(ractor.route, uint32_t{RV_EC_ROUTE_RACTOR});
      EXPECT_EQ(ractor.th, main_th);
    } else {
      EXPECT_EQ(ractor.route, uint32_t{RV_EC_ROUTE_NONE}) << "a non-holder thread was given the holder's EC";
    }
    ++checked;
  }
  EXPECT_GE(checked, 6u);  // main, sleeper, mutex, io, deep, spinner
  // Native threads that run no Ruby (the timer thread, when there is one) read an empty TLS slot: no EC at all.
  for (const auto& [tid, tp] : tps) {
    bool ruby_thread = false;
    for (const nlohmann::json& t : golden["threads"]) ruby_thread |= t["native_tid"].get<int>() == tid;
    if (ruby_thread) continue;
    SCOPED_TRACE("native thread " + std::to_string(tid) + " (no Ruby thread)");
    EcLookup got = FindEcForThread(mem, proc, wc, *th_nt, *nt_tid, tp, static_cast<uint32_t>(tid));
    EXPECT_EQ(got.route, uint32_t{RV_EC_ROUTE_NONE});
  }
}

// The sampler's GVL reading (bpf/ruby_gvl.h) in the same stopped process, with the offsets OffsetsForBinary gives
// (DWARF over the table): main holds the GVL while it captures, and the spinner, a CPU-bound thread that main's
// wake-up preempted, is the one thread queued for it; the sleeping, locking and reading threads are not queued. Read
// from each Ruby thread's side (every thread of the process is in the main ractor), the answer is the same.
TEST_P(EcRouteLiveTest, GvlReadingNamesTheHolderAndTheQueuedThread) {
  const std::string name = GetParam();
  const std::string ruby = std::string(testing::kTestRubies) + "/" + name + "/bin/ruby";
  if (access(ruby.c_str(), X_OK) != 0) GTEST_SKIP() << ruby << " not installed (tools/build-test-rubies.sh)";
  testing::StoppedGoldenRuby stopped;
  const std::string why_not = stopped.Start(name, ruby, "gvl-live");
  ASSERT_TRUE(why_not.empty()) << why_not;
  const nlohmann::json& golden = stopped.golden();
  Result<ElfFile> elf = ElfFile::Open(stopped.vm_path());
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  int major = 0, minor = 0;
  ASSERT_EQ(std::sscanf(golden["ruby_version"].get<std::string>().c_str(), "%d.%d", &major, &minor), 2);
  Result<RubyOffsets> off = OffsetsForBinary(*elf, major, minor, nullptr);
  ASSERT_TRUE(off.ok()) << off.error().ToString();
  ASSERT_EQ(off->gvl.base, uint32_t{RV_GVL_BASE_THREAD_RACTOR});
  std::map<std::string, uint64_t> th_of;
  uint64_t main_th = 0;
  for (const nlohmann::json& t : golden["threads"]) {
    const uint64_t th = std::stoull(t["th"].get<std::string>(), nullptr, 16);
    if (t["main"].get<bool>()) main_th = th;
    if (t["name"].is_string()) th_of[t["name"].get<std::string>()] = th;
  }
  ASSERT_NE(main_th, 0u);
  ASSERT_TRUE(th_of.count("spinner")) << golden.dump();
  ProcessMemoryReader mem(stopped.pid());
  size_t readers = 0;
  for (const nlohmann::json& t : golden["threads"]) {
    SCOPED_TRACE("read from thread " + t["name"].dump());
    const uint64_t th = std::stoull(t["th"].get<std::string>(), nullptr, 16);
    std::optional<rv_gvl_reading> r = ReadGvlForThread(mem, off->gvl, 0, th);
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->holder, main_th) << "main holds the GVL while it captures";
    EXPECT_EQ(r->waiting, 1u);
    ASSERT_EQ(r->nqueued, 1u);
    EXPECT_EQ(r->queued[0], th_of["spinner"]);
    EXPECT_EQ(r->flags, 0u);
    ++readers;
  }
  EXPECT_GE(readers, 6u);
}

INSTANTIATE_TEST_SUITE_P(Rubies, EcRouteLiveTest, ::testing::Values("3.3.8-shared", "3.4.5-static"),
                         testing::RubyParamName);

}  // namespace
}  // namespace rvbpfd
