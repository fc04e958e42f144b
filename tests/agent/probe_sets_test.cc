#include "agent/probe_sets.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "agent/discovery.h"
#include "agent_fakes.h"
#include "elf/debug_lookup.h"
#include "elf/elf_fixtures.h"

namespace rvbpfd {
namespace {

using agent_testing::FakeBackend;
using agent_testing::FakePrepared;
using agent_testing::FakeProc;

class ProbeSetsTest : public ::testing::Test {
 protected:
  ProbeSetsTest()
      : sets_(&backend_,
              [this](const std::string&, const std::string& version,
                     std::shared_ptr<ElfFile> parsed,
                     std::shared_ptr<const FileFd> handle) -> Result<PreparedBinary> {
                ++prepares_;
                prepared_from_ = parsed.get();
                prepared_handle_ = handle.get();
                if (fail_) return Error(ErrorCode::kNoSymbols, "no .symtab");
                return FakePrepared(version);
              },
              5, TrapCosts(1.5, 10.5, 3)) {}

  RubyTarget Target(int pid) {
    Inspection i = ProcessInspector(proc_.root()).Inspect(pid);
    EXPECT_EQ(i.outcome, InspectOutcome::kRuby) << (i.error ? i.error->message() : "");
    return i.target;
  }
  void AddRuby(int pid, const std::string& rootfs, const std::string& version = "3.3.8") {
    const std::string exe = proc_.AddExe(rootfs, "ruby");
    proc_.AddProcess(pid, "ruby", rootfs, exe, {proc_.AddLibruby(rootfs, version)});
  }
  // The same in a root of its own holding copies of one compiled ruby and libruby: another binary (inode) each,
  // without a compiler run each.
  void AddRubyCopy(int pid, const std::string& rootfs) {
    const std::string exe = proc_.AddExe("template", "ruby");
    const std::string lib = proc_.AddLibruby("template", "3.3.8");
    std::filesystem::copy(proc_.RootFs("template"), proc_.RootFs(rootfs), std::filesystem::copy_options::recursive);
    proc_.AddProcess(pid, "ruby", rootfs, exe, {lib});
  }

  FakeProc proc_;
  FakeBackend backend_;
  ProbeSetManager sets_;
  int prepares_ = 0;
  const ElfFile* prepared_from_ = nullptr;  // the parse the last preparation was handed (null: none)
  const FileFd* prepared_handle_ = nullptr;  // the descriptor it was handed (null: none)
  bool fail_ = false;
};

TEST_F(ProbeSetsTest, ProcessesSharingALibrubyShareOneSetOfUprobes) {
  AddRuby(10, "host");
  AddRuby(11, "host");
  Result<ProbeSetManager::Acquired> a = sets_.Acquire(10, Target(10));
  ASSERT_TRUE(a.ok()) << a.error().message();
  EXPECT_TRUE(a->newly_attached);
  Result<ProbeSetManager::Acquired> b = sets_.Acquire(11, Target(11));
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->newly_attached);
  EXPECT_EQ(a->set, b->set);
  EXPECT_EQ(prepares_, 1);
  ASSERT_EQ(backend_.groups.size(), 2u);  // one low group, one high group: not per process
  // Thread start stays attached while paused; GC (every lazy-sweep step) pauses with the GVL sites.
  ASSERT_EQ(backend_.groups[0].sites.size(), 1u);
  EXPECT_EQ(backend_.groups[0].sites[0].site.event, RV_EV_THREAD_STARTED);
  ASSERT_EQ(backend_.groups[1].sites.size(), 2u);
  EXPECT_EQ(backend_.groups[1].sites[0].site.event, RV_EV_GC_ENTER);
  EXPECT_EQ(backend_.groups[1].sites[1].site.event, RV_EV_THREAD_RESUMED);
  // Attached through the set's own descriptor, not the first process's /proc/PID/root.
  EXPECT_EQ(backend_.groups[0].path.rfind("/proc/self/fd/", 0), 0u);
  EXPECT_EQ(a->set->pids, (std::set<int>{10, 11}));
  EXPECT_EQ(sets_.active_sets(), 1u);
}

// Issue 45: a debug file by build-id decides where the analysis puts probes, so processes of one binary share a set
// only when their analysis would read the same debug file. One appearing (planted) for the binary's build-id makes the
// next process's binary another set, prepared on its own.
TEST_F(ProbeSetsTest, ProcessesWhoseAnalysisWouldReadAnotherDebugFileGetTheirOwnSet) {
  const DebugLookupConfig saved = DebugLookupSettings();
  testing::TempDir debug_dir;
  ConfigureDebugLookup(DebugLookupConfig{debug_dir.path(), 0});
  AddRuby(10, "host");
  AddRuby(11, "host");
  AddRuby(12, "host");
  const RubyTarget t10 = Target(10);
  ASSERT_FALSE(t10.build_id.empty());
  Result<ProbeSetManager::Acquired> a = sets_.Acquire(10, t10);
  ASSERT_TRUE(a.ok()) << a.error().message();
  const std::string planted = BuildIdDebugPath("", debug_dir.path(), t10.build_id);
  testing::WriteFile(planted, "any symbols a tenant likes");
  Result<ProbeSetManager::Acquired> b = sets_.Acquire(11, Target(11));
  ASSERT_TRUE(b.ok()) << b.error().message();
  EXPECT_NE(a->set, b->set);
  EXPECT_EQ(prepares_, 2);
  EXPECT_NE(a->set->key.debug, b->set->key.debug);
  // A third process reading that same file shares the second's set.
  Result<ProbeSetManager::Acquired> c = sets_.Acquire(12, Target(12));
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(b->set, c->set);
  EXPECT_EQ(prepares_, 2);
  ConfigureDebugLookup(saved);
}

TEST_F(ProbeSetsTest, ABinaryIsPreparedFromDiscoverysOwnParseOfIt) {
  AddRuby(10, "host");
  const RubyTarget t = Target(10);
  ASSERT_NE(t.vm_elf, nullptr);
  ASSERT_TRUE(sets_.Acquire(10, t).ok());
  EXPECT_EQ(prepared_from_, t.vm_elf.get()) << "the binary was parsed a second time";
  ASSERT_NE(prepared_handle_, nullptr);
  EXPECT_EQ(prepared_handle_, t.vm_fd.get()) << "an analysis child would read another file than the one parsed";
}

TEST_F(ProbeSetsTest, TheLastProcessOutDetachesAndAReturningBinaryReattachesWithoutNewSlots) {
  AddRuby(10, "host");
  AddRuby(11, "host");
  ProbeSet* set = sets_.Acquire(10, Target(10))->set;
  sets_.Acquire(11, Target(11));
  sets_.Release(10, set);
  EXPECT_EQ(backend_.attached_groups(), 2u);
  sets_.Release(11, set);
  EXPECT_EQ(backend_.attached_groups(), 0u);
  EXPECT_EQ(sets_.active_sets(), 0u);
  AddRuby(12, "host");
  Result<ProbeSetManager::Acquired> again = sets_.Acquire(12, Target(12));
  ASSERT_TRUE(again.ok()) << again.error().message();
  EXPECT_TRUE(again->newly_attached);
  EXPECT_EQ(again->set, set);
  EXPECT_EQ(backend_.groups.size(), 2u);  // the same groups, reattached
  EXPECT_EQ(backend_.attached_groups(), 2u);
  EXPECT_EQ(backend_.groups[0].attaches, 2);
  EXPECT_EQ(backend_.binaries, 1);
  EXPECT_EQ(prepares_, 1);
}

TEST_F(ProbeSetsTest, AContainerWithItsOwnCopyIsAnotherBinary) {
  AddRuby(10, "host");
  AddRuby(20, "container1");
  ProbeSet* a = sets_.Acquire(10, Target(10))->set;
  ProbeSet* b = sets_.Acquire(20, Target(20))->set;
  EXPECT_NE(a, b);
  EXPECT_EQ(backend_.groups.size(), 4u);
  EXPECT_EQ(sets_.active_sets(), 2u);
}

TEST_F(ProbeSetsTest, AnUnprobeableBinaryIsPreparedAndReportedOnce) {
  fail_ = true;
  AddRuby(10, "host");
  AddRuby(11, "host");
  bool first = false;
  Result<ProbeSetManager::Acquired> a = sets_.Acquire(10, Target(10), &first);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().code(), ErrorCode::kNoSymbols);
  EXPECT_TRUE(first);
  Result<ProbeSetManager::Acquired> b = sets_.Acquire(11, Target(11), &first);
  ASSERT_FALSE(b.ok());
  EXPECT_FALSE(first);
  EXPECT_EQ(prepares_, 1);
  EXPECT_TRUE(backend_.groups.empty());
}

TEST_F(ProbeSetsTest, ALongRunningAgentProbesTheThousandthDistinctBinaryAsItDidTheFirst) {
  // Deploys, copies, container images: each a binary of its own, started and stopped over weeks. The BPF arrays
  // hold RV_MAX_BINARIES binaries and RV_MAX_SITES cookies at once (the fake backend keeps those limits).
  for (int i = 0; i < 1000; ++i) {
    const int pid = 1000 + i;
    AddRubyCopy(pid, "deploy" + std::to_string(i));
    Result<ProbeSetManager::Acquired> a = sets_.Acquire(pid, Target(pid));
    ASSERT_TRUE(a.ok()) << "binary " << i << ": " << a.error().message();
    EXPECT_TRUE(a->newly_attached);
    sets_.Release(pid, a->set);
    ASSERT_LE(backend_.slot_usage().binaries, static_cast<size_t>(RV_MAX_BINARIES));
  }
  EXPECT_EQ(backend_.binaries, 1000);
  EXPECT_EQ(sets_.recycled_sets(), 1000u - RV_MAX_BINARIES);
  EXPECT_EQ(sets_.total_sets(), static_cast<size_t>(RV_MAX_BINARIES));
  // What was recycled is released, never left attached.
  for (const auto& g : backend_.groups) EXPECT_TRUE(g.released || !g.attached);
}

TEST_F(ProbeSetsTest, ActiveBinariesKeepTheirSlotsAndTheOldestDormantOneGoesFirst) {
  std::vector<ProbeSet*> sets;
  for (int i = 0; i < RV_MAX_BINARIES; ++i) {
    AddRubyCopy(100 + i, "c" + std::to_string(i));
    Result<ProbeSetManager::Acquired> a = sets_.Acquire(100 + i, Target(100 + i));
    ASSERT_TRUE(a.ok()) << a.error().message();
    sets.push_back(a->set);
  }
  AddRubyCopy(500, "late");
  Result<ProbeSetManager::Acquired> refused = sets_.Acquire(500, Target(500));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("no BPF slots free"), std::string::npos) << refused.error().message();
  EXPECT_EQ(sets_.recycled_sets(), 0u);
  // Two leave, c7 first: c7's set is the one recycled for the newcomer; c3's stays dormant for its return.
  const BinaryKey c3 = sets[3]->key, c7 = sets[7]->key;
  sets_.Release(107, sets[7]);
  sets_.Release(103, sets[3]);
  Result<ProbeSetManager::Acquired> late = sets_.Acquire(500, Target(500));
  ASSERT_TRUE(late.ok()) << late.error().message();
  EXPECT_EQ(sets_.recycled_sets(), 1u);
  EXPECT_EQ(backend_.removed_binaries.size(), 1u);
  EXPECT_EQ(sets_.Find(c7), nullptr);
  EXPECT_EQ(sets_.Find(c3), sets[3]);
}

TEST_F(ProbeSetsTest, AFailedAttachGivesBackEverySlotItTook) {
  backend_.refuse_attach_call = 1;  // the second group (high) of the first binary
  AddRuby(10, "host");
  Result<ProbeSetManager::Acquired> a = sets_.Acquire(10, Target(10));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(backend_.slot_usage().binaries, 0u);
  EXPECT_EQ(backend_.slot_usage().cookies, 0u);
  EXPECT_EQ(backend_.released, (std::vector<int>{0}));  // the low group it had attached
  EXPECT_EQ(sets_.total_sets(), 0u);
}

TEST_F(ProbeSetsTest, DormantSetsAndRememberedFailuresExpire) {
  AddRuby(10, "host");
  ProbeSet* set = sets_.Acquire(10, Target(10))->set;
  sets_.Release(10, set);
  const auto now = std::chrono::steady_clock::now();
  sets_.Expire(now + ProbeSetManager::kDormantTtl / 2);
  EXPECT_EQ(sets_.total_sets(), 1u);
  EXPECT_EQ(backend_.slot_usage().binaries, 1u);
  sets_.Expire(now + ProbeSetManager::kDormantTtl + std::chrono::seconds(1));
  EXPECT_EQ(sets_.total_sets(), 0u);
  EXPECT_EQ(sets_.recycled_sets(), 1u);
  EXPECT_EQ(backend_.slot_usage().binaries, 0u);
  EXPECT_EQ(backend_.slot_usage().cookies, 0u);

  fail_ = true;
  AddRuby(20, "broken");
  ASSERT_FALSE(sets_.Acquire(20, Target(20)).ok());
  EXPECT_EQ(sets_.failed_binaries(), 1u);
  sets_.Expire(std::chrono::steady_clock::now() + ProbeSetManager::kFailedTtl / 2);
  EXPECT_EQ(sets_.failed_binaries(), 1u);
  sets_.Expire(std::chrono::steady_clock::now() + ProbeSetManager::kFailedTtl + std::chrono::seconds(1));
  EXPECT_EQ(sets_.failed_binaries(), 0u);
  fail_ = false;
  EXPECT_TRUE(sets_.Acquire(20, Target(20)).ok()) << "a forgotten failure is tried again";
}

TEST_F(ProbeSetsTest, RememberedFailuresAreBounded) {
  fail_ = true;
  sets_.set_max_failed(20);
  for (size_t i = 0; i < 30; ++i) {
    const int pid = 10000 + static_cast<int>(i);
    AddRubyCopy(pid, "bad" + std::to_string(i));
    ASSERT_FALSE(sets_.Acquire(pid, Target(pid)).ok());
  }
  EXPECT_EQ(sets_.failed_binaries(), 20u);
}

}  // namespace
}  // namespace rvbpfd
