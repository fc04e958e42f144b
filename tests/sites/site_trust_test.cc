// Issue 45 item 1: nothing a tenant controls decides where root puts a probe. A debug file planted by build-id, or an
// edited cache entry, may name any address: every probe address is checked against the binary's own code, and every
// cached result is keyed by the binary's and the debug file's content, so it is never served to a process analysed
// with another debug file (or none). Item 6: the analysis has a hard time cap.
#include <elf.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "elf/debug_lookup.h"
#include "elf/elf_fixtures.h"
#include "sites/code_check.h"
#include "sites/crafted_vm_elf.h"
#include "sites/disasm.h"
#include "sites/sites.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

// A miniature VM (3.3 shape): one SUSPENDED hook check, Kernel#sleep and Mutex#lock workers, and a neighbour whose
// entry a planted debug file can name instead of rb_f_sleep's.
constexpr const char* kSource = R"(
struct rb_thread_struct;
static void *rb_internal_thread_event_hooks;
void *volatile rv_sink;
__attribute__((noipa)) static void rb_thread_execute_hooks(unsigned event, struct rb_thread_struct *th) {
  rv_sink = th; rv_sink = (void *)(unsigned long)event; rv_sink = rb_internal_thread_event_hooks;
}
void rb_internal_thread_add_event_hook(void *h) { rb_internal_thread_event_hooks = h; }
void fx_suspended(struct rb_thread_struct *th) { if (rb_internal_thread_event_hooks) rb_thread_execute_hooks(8, th); }
void rb_f_sleep(long n) { rv_sink = (void *)(n * 3 + 1); rv_sink = (void *)n; }
void fx_neighbour(long n) { rv_sink = (void *)(n * 5 + 2); rv_sink = (void *)n; }
void rb_mutex_lock(void) { rv_sink = 0; }
void rb_mutex_synchronize_m(void) { rv_sink = (void *)2; }
)";
constexpr const char* kBuildId = "a1b2c3d4e5f60718";

// Sets st_value of the .symtab symbol `name` in the ELF file at `path`; false when there is none.
bool PatchSymbolValue(const std::string& path, const std::string& name, uint64_t value) {
  std::string bytes = ReadFile(path);
  if (bytes.size() < sizeof(Elf64_Ehdr)) return false;
  Elf64_Ehdr eh;
  std::memcpy(&eh, bytes.data(), sizeof(eh));
  auto shdr = [&](size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, bytes.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof(sh));
    return sh;
  };
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr sh = shdr(i);
    if (sh.sh_type != SHT_SYMTAB) continue;
    const Elf64_Shdr str = shdr(sh.sh_link);
    for (uint64_t off = sh.sh_offset; off + sizeof(Elf64_Sym) <= sh.sh_offset + sh.sh_size; off += sizeof(Elf64_Sym)) {
      Elf64_Sym sym;
      std::memcpy(&sym, bytes.data() + off, sizeof(sym));
      if (std::strcmp(bytes.c_str() + str.sh_offset + sym.st_name, name.c_str()) != 0) continue;
      sym.st_value = value;
      std::memcpy(bytes.data() + off, &sym, sizeof(sym));
      WriteFile(path, bytes);
      return true;
    }
  }
  return false;
}

class SiteTrustTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = DebugLookupSettings();
    ConfigureDebugLookup(DebugLookupConfig{dir_.Join("debug"), 0});
    const std::string full = dir_.Join("full.so");
    ASSERT_TRUE(CompileC(kSource, full, std::string("-shared -fPIC -O2 -g -Wl,--build-id=0x") + kBuildId));
    // The binary keeps its .symtab but not its DWARF (so its debug file is looked up); the debug file has both.
    binary_ = dir_.Join("libvm.so");
    ASSERT_EQ(std::system(("objcopy --strip-debug '" + full + "' '" + binary_ + "'").c_str()), 0);
    debug_ = dir_.Join("vm.debug");
    ASSERT_EQ(std::system(("objcopy --only-keep-debug '" + full + "' '" + debug_ + "'").c_str()), 0);
    Result<ElfFile> elf = ElfFile::Open(binary_);
    ASSERT_TRUE(elf.ok());
    sleep_ = elf->FindSymbol("rb_f_sleep")->value;
    neighbour_ = elf->FindSymbol("fx_neighbour")->value;
  }
  void TearDown() override { ConfigureDebugLookup(saved_); }

  // Installs the debug file with rb_f_sleep's symbol at `sleep_value` where the lookup finds it by build-id.
  void PlantDebugFile(uint64_t sleep_value) {
    const std::string planted = BuildIdDebugPath("", dir_.Join("debug"), kBuildId);
    std::filesystem::create_directories(std::filesystem::path(planted).parent_path());
    std::filesystem::copy_file(debug_, planted, std::filesystem::copy_options::overwrite_existing);
    ASSERT_TRUE(PatchSymbolValue(planted, "rb_f_sleep", sleep_value));
  }
  void RemoveDebugFile() { std::filesystem::remove(BuildIdDebugPath("", dir_.Join("debug"), kBuildId)); }

  // Where the Kernel#sleep probes stand (their checks).
  static std::set<uint64_t> SleepChecks(const SiteSet& set) {
    std::set<uint64_t> out;
    for (const ProbeSite& s : set.sites) {
      if (s.event == RV_EV_SLEEP_ENTER) out.insert(s.check());
    }
    return out;
  }

  TempDir dir_;
  DebugLookupConfig saved_;
  std::string binary_, debug_;
  uint64_t sleep_ = 0, neighbour_ = 0;
};

TEST_F(SiteTrustTest, APlantedDebugFileMovingAProbeIntoAnInstructionIsRefused) {
  PlantDebugFile(sleep_ + 1);
  const std::string cache = dir_.Join("cache");
  Result<SiteSet> set = LoadOrFindSites(binary_, "3.3.0", cache);
  ASSERT_FALSE(set.ok()) << FormatSites(*set);
  EXPECT_EQ(set.error().code(), ErrorCode::kNoSymbols);
  EXPECT_NE(set.error().message().find("rb_f_sleep"), std::string::npos) << set.error().message();
  EXPECT_NE(set.error().message().find("refused"), std::string::npos) << set.error().message();
  // Nothing was cached for anyone.
  EXPECT_TRUE(!std::filesystem::exists(cache) || std::filesystem::is_empty(cache));

  // The same binary without that debug file: its own symbols, the right address.
  RemoveDebugFile();
  Result<SiteSet> clean = LoadOrFindSites(binary_, "3.3.0", cache);
  ASSERT_TRUE(clean.ok()) << clean.error().ToString();
  EXPECT_EQ(SleepChecks(*clean), std::set<uint64_t>{sleep_});
}

TEST_F(SiteTrustTest, AResultMadeWithADebugFileIsNeverServedToTheBinaryAnalysedWithoutIt) {
  // A planted debug file naming another function's entry for rb_f_sleep: the code allows it (an instruction
  // boundary, a function start), so the analysis succeeds and is cached, under its own key.
  PlantDebugFile(neighbour_);
  const std::string cache = dir_.Join("cache");
  Result<SiteSet> planted = LoadOrFindSites(binary_, "3.3.0", cache);
  ASSERT_TRUE(planted.ok()) << planted.error().ToString();
  EXPECT_EQ(SleepChecks(*planted).count(neighbour_), 1u) << FormatSites(*planted);
  EXPECT_NE(planted->debug_sha256, "none");
  EXPECT_TRUE(std::filesystem::exists(cache + "/" + planted->AnalysisKey() + ".json"));

  // Another process of the same binary, without that debug file: another key, the binary's own answer.
  RemoveDebugFile();
  Result<SiteSet> clean = LoadOrFindSites(binary_, "3.3.0", cache);
  ASSERT_TRUE(clean.ok()) << clean.error().ToString();
  EXPECT_EQ(clean->content_sha256, planted->content_sha256);
  EXPECT_EQ(clean->debug_sha256, "none");
  EXPECT_NE(clean->AnalysisKey(), planted->AnalysisKey());
  EXPECT_EQ(SleepChecks(*clean), std::set<uint64_t>{sleep_}) << FormatSites(*clean);

  // And the unmodified debug file keys yet another entry, with the right address too.
  PlantDebugFile(sleep_);
  Result<SiteSet> genuine = LoadOrFindSites(binary_, "3.3.0", cache);
  ASSERT_TRUE(genuine.ok()) << genuine.error().ToString();
  EXPECT_NE(genuine->AnalysisKey(), planted->AnalysisKey());
  EXPECT_NE(genuine->AnalysisKey(), clean->AnalysisKey());
  EXPECT_EQ(SleepChecks(*genuine), std::set<uint64_t>{sleep_}) << FormatSites(*genuine);
}

TEST_F(SiteTrustTest, AnEditedCacheEntryMovingAProbeIntoAnInstructionIsRecomputed) {
  RemoveDebugFile();
  const std::string cache = dir_.Join("cache");
  Result<SiteSet> first = LoadOrFindSites(binary_, "3.3.0", cache);
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  const std::string entry = cache + "/" + first->AnalysisKey() + ".json";
  nlohmann::json doc = nlohmann::json::parse(ReadFile(entry));
  bool edited = false;
  for (nlohmann::json& s : doc["sites"]) {
    if (s["event"].get<int>() != RV_EV_THREAD_SUSPENDED) continue;
    // One byte on, as an edit that keeps every other rule of the cache reader would.
    for (const char* k : {"vaddr", "check_vaddr", "file_offset"}) s[k] = s[k].get<uint64_t>() + 1;
    edited = true;
  }
  ASSERT_TRUE(edited);
  WriteFile(entry, doc.dump(1));
  ASSERT_TRUE(SiteSetFromJson(ReadFile(entry)).ok()) << "the edit must pass the cache reader's own rules";

  Result<SiteSet> second = LoadOrFindSites(binary_, "3.3.0", cache);
  ASSERT_TRUE(second.ok()) << second.error().ToString();
  EXPECT_EQ(SiteSetToJson(*second), SiteSetToJson(*first)) << "served the edited entry";
}

TEST_F(SiteTrustTest, CheckSitesAgainstCodeAcceptsBoundariesAndRefusesTheRest) {
  RemoveDebugFile();
  Result<ElfFile> elf = ElfFile::Open(binary_);
  ASSERT_TRUE(elf.ok());
  Result<SiteSet> set = FindSites(*elf, "3.3.0");
  ASSERT_TRUE(set.ok()) << set.error().ToString();
  Result<Disassembler> dis = Disassembler::Create();
  ASSERT_TRUE(dis.ok());
  ASSERT_TRUE(CheckSitesAgainstCode(*elf, *dis, set->sites).ok());

  auto refused = [&](const std::function<void(ProbeSite&)>& edit, uint8_t event) {
    std::vector<ProbeSite> sites = set->sites;
    for (ProbeSite& s : sites) {
      if (s.event == event) edit(s);
    }
    Status st = CheckSitesAgainstCode(*elf, *dis, sites);
    return st.ok() ? std::string() : st.error().message();
  };
  // A hook site one byte into its instruction.
  std::string why = refused([](ProbeSite& s) { s.vaddr += 1; s.check_vaddr += 1; }, RV_EV_THREAD_SUSPENDED);
  EXPECT_NE(why.find("instruction boundary"), std::string::npos) << why;
  EXPECT_NE(why.find("fx_suspended"), std::string::npos) << why;
  // A function entry that is an instruction boundary but not its function's start.
  const cs_insn* first = dis->DecodeAt(*elf, sleep_);
  ASSERT_NE(first, nullptr);
  const uint64_t second_insn = sleep_ + first->size;
  why = refused([&](ProbeSite& s) { s.vaddr = s.check_vaddr = second_insn; }, RV_EV_SLEEP_ENTER);
  EXPECT_NE(why.find("not the start of its function"), std::string::npos) << why;
  // An address in no function of the binary.
  why = refused([](ProbeSite& s) { s.vaddr = s.check_vaddr = 8; }, RV_EV_MUTEX_LOCK_ENTER);
  EXPECT_NE(why.find("no function"), std::string::npos) << why;
}

TEST(SiteAnalysisDeadlineTest, AnAnalysisPastItsTimeCapFailsWithTheTimeoutError) {
  TempDir dir;
  const std::string path = dir.Join("vm");
  testing::CraftedVmSpec spec;
  spec.functions = 2000;
  WriteFile(path, testing::CraftVmElf(spec));
  Result<ElfFile> elf = ElfFile::Open(path);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  // With its default cap the crafted binary analyses: one hook site, sleep and two Mutex#lock entries.
  Result<SiteSet> set = FindSites(*elf, "3.3.8");
  ASSERT_TRUE(set.ok()) << set.error().ToString();
  EXPECT_EQ(set->sites.size(), 4u) << FormatSites(*set);
  // With none left, it fails, with the error the agent counts.
  Result<SiteSet> late = FindSites(*elf, "3.3.8", std::chrono::milliseconds(0));
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(IsSiteAnalysisTimeout(late.error())) << late.error().message();
  EXPECT_NE(late.error().message().find(path), std::string::npos);
}

TEST(SiteScalingTest, OverlappingSymbolExtentsGiveTheSitesOfTheirOwnExtents) {
  // The finder walks the symbols as non-overlapping pieces (sorted once): a binary whose symbols each span the rest
  // of .text gives exactly the sites of the same code with each symbol its own extent.
  TempDir dir;
  std::string results[2];
  for (int overlapping = 0; overlapping < 2; ++overlapping) {
    testing::CraftedVmSpec spec;
    spec.functions = 500;
    spec.hook_checks = 3;
    spec.overlapping = overlapping != 0;
    const std::string path = dir.Join("vm" + std::to_string(overlapping));
    WriteFile(path, testing::CraftVmElf(spec));
    Result<ElfFile> elf = ElfFile::Open(path);
    ASSERT_TRUE(elf.ok());
    Result<SiteSet> set = FindSites(*elf, "3.3.8");
    ASSERT_TRUE(set.ok()) << set.error().ToString();
    EXPECT_EQ(set->sites.size(), 6u) << FormatSites(*set);
    results[overlapping] = FormatSites(*set);
  }
  EXPECT_EQ(results[0], results[1]);
}

}  // namespace
}  // namespace rvbpfd
