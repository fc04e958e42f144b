// BpfSession against the test binary itself: uprobes on a local function, the cookie -> site mapping, th location
// decoding (register and memory), the pid filter, the ring buffer, and drop counting with a tiny ring.
// Needs root (BPF + uprobes); skips, saying why, only when the kernel or privileges forbid BPF.
#include "probe/bpf_session.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "elf/elf_file.h"

namespace rvbpfd {
namespace {

struct FakeThread {
  uint64_t pad;     // th->serial lives at offset 8 in this fake layout
  uint32_t serial;
  uint32_t pad2;
};

// The probed functions: noinline and with a side effect so the call survives optimization.
volatile uint64_t g_sink;
extern "C" __attribute__((noinline)) void RvProbeTargetReg(FakeThread* th) { g_sink = g_sink + th->serial; }
extern "C" __attribute__((noinline)) void RvProbeTargetMem(FakeThread** slot) { g_sink = g_sink + (*slot)->serial; }
// Calls the probed function from a caller whose hits the site excludes by return address.
extern "C" __attribute__((noinline)) void RvProbeExcludedCaller(FakeThread* th) {
  RvProbeTargetReg(th);
  g_sink = g_sink + 1;  // keeps the call from becoming a tail jump (the return address must point in here)
}

std::string SkipReason() {
  if (geteuid() != 0) return "not root: BPF and uprobes need root (or CAP_BPF+CAP_PERFMON)";
  if (access("/sys/kernel/btf/vmlinux", R_OK) != 0) return "kernel has no BTF (/sys/kernel/btf/vmlinux)";
  return "";
}

ElfSymbol SymbolOf(const char* name) {
  Result<ElfFile> self = ElfFile::Open("/proc/self/exe");
  EXPECT_TRUE(self.ok());
  auto sym = self->FindSymbol(name);
  EXPECT_TRUE(sym.has_value()) << name;
  return sym.value_or(ElfSymbol{});
}

uint64_t FileOffsetOf(const char* name) {
  Result<ElfFile> self = ElfFile::Open("/proc/self/exe");
  EXPECT_TRUE(self.ok());
  auto sym = self->FindSymbol(name);
  EXPECT_TRUE(sym.has_value()) << name;
  auto off = self->VaddrToFileOffset(sym->value);
  EXPECT_TRUE(off.has_value());
  return *off;
}

std::string SelfPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// The binary index AddBinary gives the fake thread layout in every session of these tests (the first one added).
constexpr uint8_t kBin = 0;

class BpfSessionTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    std::string why = SkipReason();
    if (!why.empty()) GTEST_SKIP() << why;
  }

  // A session in this parameter's link mode (true: one link per site), with the fake thread layout as binary kBin and
  // this process in its pid filter; on_record gets every record. nullptr, with a test failure, when any step fails.
  std::unique_ptr<BpfSession> OpenOnSelf(BpfSession::RecordCallback on_record, SessionOptions opts = {}) {
    opts.force_single_links = GetParam();
    Result<std::unique_ptr<BpfSession>> session = BpfSession::Open(opts, std::move(on_record));
    if (!session.ok()) {
      ADD_FAILURE() << session.error().ToString();
      return nullptr;
    }
    Result<uint8_t> bin = (*session)->AddBinary(rv_offsets{8, 0, 0, RV_OFF_HAS_SERIAL});
    if (!bin.ok() || *bin != kBin) {
      ADD_FAILURE() << "AddBinary did not give binary " << int{kBin};
      return nullptr;
    }
    if (Status st = (*session)->AddPid(static_cast<uint32_t>(getpid())); !st) {
      ADD_FAILURE() << st.error().ToString();
      return nullptr;
    }
    return std::move(*session);
  }
};

TEST_P(BpfSessionTest, RecordsEveryHitWithThFromRegisterAndMemory) {
  std::vector<rv_record> got;
  std::unique_ptr<BpfSession> session = OpenOnSelf([&](const rv_record& r) { got.push_back(r); });
  ASSERT_NE(session, nullptr);
  std::vector<SiteSpec> sites = {
      {FileOffsetOf("RvProbeTargetReg"), rv_site{RV_EV_THREAD_RESUMED, RV_LOC_REG, RV_REG_RDI, kBin, 0}},
      {FileOffsetOf("RvProbeTargetMem"), rv_site{RV_EV_THREAD_SUSPENDED, RV_LOC_MEM, RV_REG_RDI, kBin, 0}},
  };
  auto group = session->Attach(SelfPath(), sites, getpid());
  ASSERT_TRUE(group.ok()) << group.error().ToString();

  FakeThread th{0, 4242, 0};
  FakeThread* slot = &th;
  constexpr int kCalls = 100;
  for (int i = 0; i < kCalls; ++i) {
    RvProbeTargetReg(&th);
    RvProbeTargetMem(&slot);
  }
  for (int i = 0; i < 10 && got.size() < 2 * kCalls; ++i) ASSERT_TRUE(session->Poll(100).ok());
  ASSERT_EQ(got.size(), 2u * kCalls);
  int resumed = 0, suspended = 0;
  const uint32_t me = static_cast<uint32_t>(gettid());
  for (const rv_record& r : got) {
    EXPECT_EQ(r.th, reinterpret_cast<uint64_t>(&th));
    EXPECT_EQ(r.serial, 4242u);
    EXPECT_EQ(r.pid, static_cast<uint32_t>(getpid()));
    EXPECT_EQ(r.probe_tid, me);
    EXPECT_EQ(r.tid, me);
    EXPECT_EQ(r.flags, 0u);
    resumed += r.kind == RV_EV_THREAD_RESUMED;
    suspended += r.kind == RV_EV_THREAD_SUSPENDED;
  }
  EXPECT_EQ(resumed, kCalls);
  EXPECT_EQ(suspended, kCalls);
  EXPECT_EQ(session->ReadCounters().events, 2u * kCalls);
  EXPECT_EQ(session->ReadCounters().dropped, 0u);

  // Detached sites cost nothing and record nothing; reattached ones record again.
  session->Detach(**group);
  RvProbeTargetReg(&th);
  ASSERT_TRUE(session->Poll(50).ok());
  EXPECT_EQ(got.size(), 2u * kCalls);
  ASSERT_TRUE(session->Reattach(**group).ok());
  RvProbeTargetReg(&th);
  ASSERT_TRUE(session->Poll(50).ok());
  EXPECT_EQ(got.size(), 2u * kCalls + 1);
}

TEST_P(BpfSessionTest, OtherProcessesAreFilteredOut) {
  std::vector<rv_record> got;
  std::unique_ptr<BpfSession> session = OpenOnSelf([&](const rv_record& r) { got.push_back(r); });
  ASSERT_NE(session, nullptr);
  std::vector<SiteSpec> sites = {
      {FileOffsetOf("RvProbeTargetReg"), rv_site{RV_EV_THREAD_RESUMED, RV_LOC_REG, RV_REG_RDI, kBin, 0}}};
  // pid -1: attached for every process mapping the file; only the BPF pid filter keeps the child out.
  auto group = session->Attach(SelfPath(), sites, -1);
  ASSERT_TRUE(group.ok()) << group.error().ToString();
  pid_t child = fork();
  if (child == 0) {
    FakeThread th{0, 1, 0};
    for (int i = 0; i < 50; ++i) RvProbeTargetReg(&th);
    _exit(0);
  }
  int status;
  waitpid(child, &status, 0);
  FakeThread th{0, 7, 0};
  RvProbeTargetReg(&th);
  ASSERT_TRUE(session->Poll(100).ok());
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].serial, 7u);
}

TEST_P(BpfSessionTest, FullRingCountsDropsInsteadOfBlocking) {
  uint64_t received = 0;
  SessionOptions opts;
  opts.ring_buffer_bytes = 4096;  // one page: ~85 records
  std::unique_ptr<BpfSession> session = OpenOnSelf([&](const rv_record&) { ++received; }, opts);
  ASSERT_NE(session, nullptr);
  std::vector<SiteSpec> sites = {
      {FileOffsetOf("RvProbeTargetReg"), rv_site{RV_EV_THREAD_RESUMED, RV_LOC_REG, RV_REG_RDI, kBin, 0}}};
  auto group = session->Attach(SelfPath(), sites, getpid());
  ASSERT_TRUE(group.ok()) << group.error().ToString();
  FakeThread th{0, 1, 0};
  constexpr uint64_t kCalls = 1000;
  for (uint64_t i = 0; i < kCalls; ++i) RvProbeTargetReg(&th);  // nobody drains meanwhile
  while (true) {
    auto n = session->Poll(0);
    ASSERT_TRUE(n.ok());
    if (*n == 0) break;
  }
  rv_counters c = session->ReadCounters();
  EXPECT_GT(c.dropped, 0u);
  EXPECT_EQ(received + c.dropped, kCalls);
  EXPECT_TRUE(session->drop_count_mapped()) << "the drop count is read from its shared page, without a syscall";
  EXPECT_EQ(session->EventsDropped(), c.dropped) << "the shared drop count agrees with the per-CPU counters";
  EXPECT_EQ(c.events, received);
  EXPECT_GT(c.ring_high_water, 0u);
  EXPECT_LE(c.ring_high_water, 4096u);
}

TEST_P(BpfSessionTest, CallsFromAnExcludedCallerAreNotEvents) {
  std::vector<rv_record> got;
  std::unique_ptr<BpfSession> session = OpenOnSelf([&](const rv_record& r) { got.push_back(r); });
  ASSERT_NE(session, nullptr);
  const ElfSymbol target = SymbolOf("RvProbeTargetReg");
  const ElfSymbol caller = SymbolOf("RvProbeExcludedCaller");
  ASSERT_GT(caller.size, 0u);
  rv_site site{RV_EV_MUTEX_LOCK_ENTER, RV_LOC_REG, RV_REG_RDI, kBin, 0, target.value, caller.value,
               caller.value + caller.size};
  auto group = session->Attach(SelfPath(), {{FileOffsetOf("RvProbeTargetReg"), site}}, getpid());
  ASSERT_TRUE(group.ok()) << group.error().ToString();
  FakeThread th{0, 9, 0};
  for (int i = 0; i < 20; ++i) RvProbeExcludedCaller(&th);
  for (int i = 0; i < 5; ++i) RvProbeTargetReg(&th);
  ASSERT_TRUE(session->Poll(100).ok());
  EXPECT_EQ(got.size(), 5u);
  // Every call trapped, events or not: the budget's input counts them all, and the discarded ones apart.
  const rv_counters c = session->ReadCounters();
  EXPECT_EQ(c.probe_hits, 25u);
  EXPECT_EQ(c.hits_discarded, 20u);
  EXPECT_EQ(c.events, 5u);
  const std::vector<uint64_t> per_site = session->ReadSiteHits();
  ASSERT_EQ((*group)->cookies().size(), 1u);
  ASSERT_LT((*group)->cookies()[0], per_site.size());
  EXPECT_EQ(per_site[(*group)->cookies()[0]], 25u);
  // ... and per process (the fleet agent's per-process budget): discarded hits included.
  const std::optional<rv_pid_traps> mine = session->PidTraps(static_cast<uint32_t>(getpid()));
  ASSERT_TRUE(mine.has_value());
  EXPECT_EQ(mine->traps, 25u);
  EXPECT_FALSE(session->PidTraps(static_cast<uint32_t>(getpid()) + 1).has_value());  // not in the filter
  // Adding a pid again starts its count over; removing it drops it.
  ASSERT_TRUE(session->AddPid(static_cast<uint32_t>(getpid())).ok());
  EXPECT_EQ(session->PidTraps(static_cast<uint32_t>(getpid()))->traps, 0u);
  ASSERT_TRUE(session->RemovePid(static_cast<uint32_t>(getpid())).ok());
  EXPECT_FALSE(session->PidTraps(static_cast<uint32_t>(getpid())).has_value());
}

TEST_P(BpfSessionTest, AHitLongAfterThePreviousOneOnItsCpuIsCold) {
  // Pinned to one CPU, so "the previous hit on this CPU" is this thread's previous call.
  cpu_set_t old_set, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof(old_set), &old_set), 0);
  CPU_ZERO(&one);
  CPU_SET(static_cast<int>(sched_getcpu()), &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  uint64_t received = 0;
  SessionOptions opts;
  opts.config.cold_gap_ns = 20'000'000;  // 20 ms: far above one call's trap (1-10 us), far below the sleeps below
  std::unique_ptr<BpfSession> session = OpenOnSelf([&](const rv_record&) { ++received; }, opts);
  ASSERT_NE(session, nullptr);
  const std::vector<SiteSpec> sites = {
      {FileOffsetOf("RvProbeTargetReg"), rv_site{RV_EV_THREAD_RESUMED, RV_LOC_REG, RV_REG_RDI, kBin, 0}}};
  auto group = session->Attach(SelfPath(), sites, getpid());
  ASSERT_TRUE(group.ok()) << group.error().ToString();
  FakeThread th{0, 7, 0};
  // Back to back: only the first hit finds no recent one on its CPU.
  for (int i = 0; i < 100; ++i) RvProbeTargetReg(&th);
  // Each after 50 ms without a hit: cold.
  for (int i = 0; i < 5; ++i) {
    usleep(50'000);
    RvProbeTargetReg(&th);
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(old_set), &old_set), 0);
  const rv_counters c = session->ReadCounters();
  EXPECT_EQ(c.probe_hits, 105u);
  EXPECT_EQ(c.cold_hits, 6u);
  const rv_pid_traps mine = session->PidTraps(static_cast<uint32_t>(getpid())).value();
  EXPECT_EQ(mine.traps, 105u);
  EXPECT_EQ(mine.cold, 6u);

  // cold_gap_ns 0 (a session opened without it, as bench_uprobe_cost): no hit is cold.
  group.value().reset();
  session.reset();
  session = OpenOnSelf([&](const rv_record&) { ++received; });
  ASSERT_NE(session, nullptr);
  auto plain_group = session->Attach(SelfPath(), sites, getpid());
  ASSERT_TRUE(plain_group.ok()) << plain_group.error().ToString();
  for (int i = 0; i < 5; ++i) {
    usleep(50'000);
    RvProbeTargetReg(&th);
  }
  EXPECT_EQ(session->ReadCounters().cold_hits, 0u);
  EXPECT_EQ(session->ReadCounters().probe_hits, 5u);
}

TEST_P(BpfSessionTest, TheSamplerIsLoadedOnlyWhenTheConfigSamples) {
  // Without rv_config.sampling the perf_event program is never loaded (nor verified): sampling cannot start.
  std::unique_ptr<BpfSession> plain = OpenOnSelf([](const rv_record&) {});
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(plain->StartSampling(99).ok());
  plain.reset();
  SessionOptions opts;
  opts.config.sampling = 1;
  std::unique_ptr<BpfSession> sampling = OpenOnSelf([](const rv_record&) {}, opts);
  ASSERT_NE(sampling, nullptr);
  Status st = sampling->StartSampling(99);
  EXPECT_TRUE(st.ok()) << st.error().ToString();
}

TEST_P(BpfSessionTest, HitsOfASingleSteppedSiteAreCountedApart) {
  std::unique_ptr<BpfSession> session = OpenOnSelf([](const rv_record&) {});
  ASSERT_NE(session, nullptr);
  rv_site stepped{RV_EV_THREAD_RESUMED, RV_LOC_REG, RV_REG_RDI, kBin, 0};
  stepped.flags = RV_SITE_SINGLE_STEP;
  auto group = session->Attach(
      SelfPath(),
      {{FileOffsetOf("RvProbeTargetReg"), stepped},
       {FileOffsetOf("RvProbeTargetMem"), rv_site{RV_EV_THREAD_SUSPENDED, RV_LOC_MEM, RV_REG_RDI, kBin, 0}}},
      getpid());
  ASSERT_TRUE(group.ok()) << group.error().ToString();
  FakeThread th{0, 3, 0};
  FakeThread* slot = &th;
  for (int i = 0; i < 10; ++i) {
    RvProbeTargetReg(&th);
    RvProbeTargetMem(&slot);
  }
  const rv_counters c = session->ReadCounters();
  EXPECT_EQ(c.probe_hits, 20u);
  EXPECT_EQ(c.stepped_hits, 10u);
  const rv_pid_traps mine = session->PidTraps(static_cast<uint32_t>(getpid())).value();
  EXPECT_EQ(mine.traps, 20u);
  EXPECT_EQ(mine.stepped, 10u);
}

TEST_P(BpfSessionTest, SiteHitsArePerCookieAndGroupsKeepTheirCookies) {
  std::unique_ptr<BpfSession> session = OpenOnSelf([](const rv_record&) {});
  ASSERT_NE(session, nullptr);
  auto low = session->Attach(
      SelfPath(), {{FileOffsetOf("RvProbeTargetReg"), rv_site{RV_EV_THREAD_RESUMED, RV_LOC_REG, RV_REG_RDI, kBin, 0}}},
      getpid());
  auto high = session->Attach(
      SelfPath(),
      {{FileOffsetOf("RvProbeTargetMem"), rv_site{RV_EV_THREAD_SUSPENDED, RV_LOC_MEM, RV_REG_RDI, kBin, 0}}},
      getpid());
  ASSERT_TRUE(low.ok() && high.ok());
  FakeThread th{0, 1, 0};
  FakeThread* slot = &th;
  for (int i = 0; i < 7; ++i) RvProbeTargetReg(&th);
  for (int i = 0; i < 3; ++i) RvProbeTargetMem(&slot);
  session->Detach(**high);  // a detached site takes no hits
  for (int i = 0; i < 4; ++i) RvProbeTargetMem(&slot);
  const std::vector<uint64_t> hits = session->ReadSiteHits();
  ASSERT_EQ(hits.size(), 2u);
  EXPECT_EQ(hits[(*low)->cookies()[0]], 7u);
  EXPECT_EQ(hits[(*high)->cookies()[0]], 3u);
  EXPECT_EQ(session->ReadCounters().probe_hits, 10u);
  EXPECT_EQ(session->ReadCounters().hits_discarded, 0u);
}

TEST_P(BpfSessionTest, AReleasedGroupsCookiesAndARemovedBinarysIndexAreReusedWithFreshCounts) {
  std::unique_ptr<BpfSession> session = OpenOnSelf([](const rv_record&) {});
  ASSERT_NE(session, nullptr);
  const SiteSpec spec{FileOffsetOf("RvProbeTargetReg"), rv_site{RV_EV_THREAD_RESUMED, RV_LOC_REG, RV_REG_RDI, kBin, 0}};
  FakeThread th{0, 1, 0};
  auto first = session->Attach(SelfPath(), {spec}, getpid());
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  const uint64_t cookie = (*first)->cookies()[0];
  for (int i = 0; i < 7; ++i) RvProbeTargetReg(&th);
  EXPECT_EQ(session->ReadSiteHits().at(cookie), 7u);
  EXPECT_EQ(session->slot_usage().cookies, 1u);
  first->reset();  // released: its links closed, its cookie back
  EXPECT_EQ(session->slot_usage().cookies, 0u);
  auto second = session->Attach(SelfPath(), {spec}, getpid());
  ASSERT_TRUE(second.ok()) << second.error().ToString();
  EXPECT_EQ((*second)->cookies()[0], cookie);
  EXPECT_EQ(session->ReadSiteHits().at(cookie), 0u) << "a reused cookie kept its last group's hits";
  for (int i = 0; i < 2; ++i) RvProbeTargetReg(&th);
  EXPECT_EQ(session->ReadSiteHits().at(cookie), 2u);
  // More sites than there are cookies: refused before anything reaches the kernel.
  EXPECT_FALSE(session->Attach(SelfPath(), std::vector<SiteSpec>(RV_MAX_SITES, spec), getpid()).ok());
  EXPECT_EQ(session->slot_usage().cookies, 1u);

  // Binary indexes: kBin is taken; fill the rest, then one more is refused until one is removed.
  for (uint32_t i = 1; i < RV_MAX_BINARIES; ++i) {
    Result<uint8_t> b = session->AddBinary(rv_offsets{8, 0, 0, RV_OFF_HAS_SERIAL});
    ASSERT_TRUE(b.ok()) << b.error().ToString();
    EXPECT_EQ(*b, i);
  }
  EXPECT_FALSE(session->AddBinary(rv_offsets{}).ok());
  ASSERT_TRUE(session->RemoveBinary(5).ok());
  Result<uint8_t> again = session->AddBinary(rv_offsets{8, 0, 0, RV_OFF_HAS_SERIAL});
  ASSERT_TRUE(again.ok()) << again.error().ToString();
  EXPECT_EQ(*again, 5);
}

TEST_P(BpfSessionTest, DetachOrderedByHitsAndReattachKeepEachSiteItsCookie) {
  // Detach(group, hits) destroys single-site links hottest first, and the next Reattach puts the coldest site first
  // in a multi link: the offsets are reordered, so each must still arrive with its own cookie.
  std::vector<rv_record> got;
  std::unique_ptr<BpfSession> session = OpenOnSelf([&](const rv_record& r) { got.push_back(r); });
  ASSERT_NE(session, nullptr);
  auto group = session->Attach(
      SelfPath(),
      {{FileOffsetOf("RvProbeTargetReg"), rv_site{RV_EV_THREAD_RESUMED, RV_LOC_REG, RV_REG_RDI, kBin, 0}},
       {FileOffsetOf("RvProbeTargetMem"), rv_site{RV_EV_THREAD_SUSPENDED, RV_LOC_MEM, RV_REG_RDI, kBin, 0}}},
      getpid());
  ASSERT_TRUE(group.ok()) << group.error().ToString();
  FakeThread th{0, 1, 0};
  FakeThread* slot = &th;
  RvProbeTargetReg(&th);
  for (int i = 0; i < 5; ++i) RvProbeTargetMem(&slot);  // the second site is the hot one
  std::vector<uint64_t> hits = session->ReadSiteHits();
  ASSERT_EQ(hits.size(), 2u);
  session->Detach(**group, hits);
  EXPECT_FALSE((*group)->attached());
  RvProbeTargetMem(&slot);
  ASSERT_TRUE(session->Reattach(**group).ok());
  RvProbeTargetReg(&th);
  RvProbeTargetReg(&th);
  RvProbeTargetMem(&slot);
  hits = session->ReadSiteHits();
  EXPECT_EQ(hits[(*group)->cookies()[0]], 3u) << "RvProbeTargetReg's site kept its cookie";
  EXPECT_EQ(hits[(*group)->cookies()[1]], 6u) << "RvProbeTargetMem's site kept its cookie";
  ASSERT_TRUE(session->Poll(100).ok());
  size_t resumed = 0, suspended = 0;
  for (const rv_record& r : got) {
    resumed += r.kind == RV_EV_THREAD_RESUMED;
    suspended += r.kind == RV_EV_THREAD_SUSPENDED;
  }
  EXPECT_EQ(resumed, 3u);
  EXPECT_EQ(suspended, 6u);
}

TEST(OrderSitesByHits, HottestOrColdestFirstWithTiesInOrder) {
  const std::vector<uint64_t> cookies = {4, 1, 7, 2};
  const std::vector<uint64_t> hits = {0, 50, 9, 0, 50, 0, 0};  // cookie 7 is past the end: 0 hits
  EXPECT_EQ(OrderSitesByHits(cookies, hits, /*hottest_first=*/true), (std::vector<size_t>{0, 1, 3, 2}));
  EXPECT_EQ(OrderSitesByHits(cookies, hits, /*hottest_first=*/false), (std::vector<size_t>{2, 3, 0, 1}));
  EXPECT_EQ(OrderSitesByHits(cookies, {}, /*hottest_first=*/true), (std::vector<size_t>{0, 1, 2, 3}));
}

TEST_P(BpfSessionTest, ReturnProbesFireWhenTheFunctionReturns) {
  std::vector<rv_record> got;
  std::unique_ptr<BpfSession> session = OpenOnSelf([&](const rv_record& r) { got.push_back(r); });
  ASSERT_NE(session, nullptr);
  // The GC fallback's shape: an entry probe and a return probe on the same function, in one group.
  const uint64_t off = FileOffsetOf("RvProbeTargetReg");
  std::vector<SiteSpec> sites = {{off, rv_site{RV_EV_GC_ENTER, RV_LOC_CURRENT, 0, kBin, 0}, false},
                                 {off, rv_site{RV_EV_GC_EXIT, RV_LOC_CURRENT, 0, kBin, 0}, true}};
  auto group = session->Attach(SelfPath(), sites, getpid());
  ASSERT_TRUE(group.ok()) << group.error().ToString();
  FakeThread th{0, 1, 0};
  constexpr int kCalls = 10;
  for (int i = 0; i < kCalls; ++i) RvProbeTargetReg(&th);
  for (int i = 0; i < 10 && got.size() < 2 * kCalls; ++i) ASSERT_TRUE(session->Poll(100).ok());
  ASSERT_EQ(got.size(), 2u * kCalls);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].kind, i % 2 == 0 ? RV_EV_GC_ENTER : RV_EV_GC_EXIT) << i;  // enter, exit, enter, exit, ...
    if (i > 0) {
      EXPECT_GE(got[i].ts_ns, got[i - 1].ts_ns);
    }
  }
  EXPECT_EQ(session->ReadCounters().probe_hits, 2u * kCalls);
  // Detaching removes both kinds; reattaching restores both.
  session->Detach(**group);
  EXPECT_FALSE((*group)->attached());
  RvProbeTargetReg(&th);
  ASSERT_TRUE(session->Reattach(**group).ok());
  RvProbeTargetReg(&th);
  ASSERT_TRUE(session->Poll(100).ok());
  EXPECT_EQ(got.size(), 2u * kCalls + 2);
}

// A target in a pid namespace of its own: the VM names threads by namespace tids (rb_native_thread.tid), the records
// must carry host tids. Layout of this fake VM: th->nt at 8, nt->tid at 0.
struct FakeNt {
  int32_t tid;
};
struct FakeNsThread {
  uint64_t pad;
  FakeNt* nt;
};
extern "C" __attribute__((noinline)) void RvProbeNsReady(FakeNsThread* th) { g_sink = g_sink + th->nt->tid; }
extern "C" __attribute__((noinline)) void RvProbeNsResumed(FakeNsThread* th) { g_sink = g_sink + th->pad; }

TEST(BpfSessionPidNamespaceTest, NamespaceTidsBecomeHostTidsOrUnknownNeverNamespaceNumbers) {
  if (std::string why = SkipReason(); !why.empty()) GTEST_SKIP() << why;
  int to_test[2], to_target[2];
  ASSERT_EQ(pipe(to_test), 0);
  ASSERT_EQ(pipe(to_target), 0);
  // The target: the grandchild of a child that unshared its pid namespace (pid 1 there). Its host pid comes back
  // through the pipe from the child, which sees it in the host's namespace.
  pid_t mid = fork();
  ASSERT_GE(mid, 0);
  if (mid == 0) {
    // Only the test holds the write end of to_target: if it fails before sending "g", closing it ends the target.
    close(to_target[1]);
    close(to_test[0]);
    if (unshare(CLONE_NEWPID) != 0) _exit(2);
    pid_t target = fork();
    if (target == 0) {
      char go = 0;
      if (read(to_target[0], &go, 1) != 1) _exit(3);
      FakeNt own_nt{static_cast<int32_t>(gettid())};  // 1: the namespace's number of this thread
      FakeNsThread self{0, &own_nt};
      RvProbeNsReady(&self);  // about itself
      // A second thread reports itself once (RESUMED), then is named by the first (READY from a waker).
      std::atomic<int32_t> other_ns_tid{0};
      std::thread other([&] {
        other_ns_tid = static_cast<int32_t>(gettid());
        FakeNt nt{other_ns_tid};
        FakeNsThread th{0, &nt};
        RvProbeNsResumed(&th);
      });
      other.join();
      FakeNt other_nt{other_ns_tid};
      FakeNsThread named{0, &other_nt};
      RvProbeNsReady(&named);
      FakeNt unknown_nt{999};  // no thread of this number ever hit a probe
      FakeNsThread unknown{0, &unknown_nt};
      RvProbeNsReady(&unknown);
      const int32_t reply = other_ns_tid;
      _exit(write(to_test[1], &reply, sizeof(reply)) == sizeof(reply) ? 0 : 4);
    }
    const int32_t host_pid = target;
    if (target < 0 || write(to_test[1], &host_pid, sizeof(host_pid)) != sizeof(host_pid)) _exit(5);
    int status = 0;
    waitpid(target, &status, 0);
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 6);
  }
  close(to_target[0]);
  close(to_test[1]);
  int32_t target = 0;
  // A failed assertion below returns early: the children must not outlive the test (they would hold its output open
  // and keep a runner waiting on it). EOF on to_target ends the target, and with it the middle child.
  struct Children {
    int go_fd;    // to_target's write end
    int from_fd;  // to_test's read end
    pid_t mid;
    bool reaped = false;
    ~Children() {
      close(go_fd);
      if (!reaped) waitpid(mid, nullptr, 0);
      close(from_fd);
    }
  } children{to_target[1], to_test[0], mid};
  ASSERT_EQ(read(to_test[0], &target, sizeof(target)), static_cast<ssize_t>(sizeof(target)));
  ASSERT_GT(target, 0);

  std::vector<rv_record> got;
  Result<std::unique_ptr<BpfSession>> session = BpfSession::Open({}, [&](const rv_record& r) { got.push_back(r); });
  ASSERT_TRUE(session.ok()) << session.error().ToString();
  ASSERT_TRUE((*session)->AddBinary(rv_offsets{0, 8, 0, 0}).ok());
  struct stat st{};
  ASSERT_EQ(stat(("/proc/" + std::to_string(target) + "/ns/pid").c_str(), &st), 0);
  const rv_pidns ns{(static_cast<uint64_t>(major(st.st_dev)) << 20) | minor(st.st_dev), st.st_ino};
  ASSERT_TRUE((*session)->AddPid(static_cast<uint32_t>(target), ns).ok());
  std::vector<SiteSpec> sites = {
      {FileOffsetOf("RvProbeNsReady"), rv_site{RV_EV_THREAD_READY, RV_LOC_REG, RV_REG_RDI, 0, 0}},
      {FileOffsetOf("RvProbeNsResumed"), rv_site{RV_EV_THREAD_RESUMED, RV_LOC_REG, RV_REG_RDI, 0, 0}},
  };
  auto group = (*session)->Attach(SelfPath(), sites, target);
  ASSERT_TRUE(group.ok()) << group.error().ToString();
  ASSERT_EQ(write(to_target[1], "g", 1), 1);
  int32_t other_ns_tid = 0;
  ASSERT_EQ(read(to_test[0], &other_ns_tid, sizeof(other_ns_tid)), static_cast<ssize_t>(sizeof(other_ns_tid)));
  int status = 0;
  ASSERT_EQ(waitpid(mid, &status, 0), mid);
  children.reaped = true;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  for (int i = 0; i < 10 && got.size() < 4; ++i) ASSERT_TRUE((*session)->Poll(100).ok());
  ASSERT_EQ(got.size(), 4u);
  const uint32_t host = static_cast<uint32_t>(target);
  // READY about itself: the host tid, as a thread's own event.
  EXPECT_EQ(got[0].kind, RV_EV_THREAD_READY);
  EXPECT_EQ(got[0].tid, host);
  EXPECT_EQ(got[0].flags & RV_REC_TID_UNKNOWN, 0u);
  // The second thread's own RESUMED: its host tid, which the READY naming it by its namespace tid then carries.
  EXPECT_EQ(got[1].kind, RV_EV_THREAD_RESUMED);
  const uint32_t other_host = got[1].probe_tid;
  EXPECT_NE(other_host, host);
  EXPECT_NE(other_host, static_cast<uint32_t>(other_ns_tid));  // host and namespace numbers differ here
  EXPECT_EQ(got[1].tid, other_host);
  EXPECT_EQ(got[2].probe_tid, host);
  EXPECT_EQ(got[2].tid, other_host);
  EXPECT_EQ(got[2].flags & RV_REC_TID_UNKNOWN, 0u);
  // A namespace tid no hit translated: unknown, not 999.
  EXPECT_EQ(got[3].tid, 0u);
  EXPECT_NE(got[3].flags & RV_REC_TID_UNKNOWN, 0u);
}

INSTANTIATE_TEST_SUITE_P(Links, BpfSessionTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "Single" : "Multi"; });

}  // namespace
}  // namespace rvbpfd
