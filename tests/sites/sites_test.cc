#include "sites/sites.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <tuple>

#include "common/sha256.h"
#include "elf/elf_fixtures.h"
#include "sites/disasm.h"
#include "sites/dwarf_info.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::TempDir;

// A miniature VM: the same hook-list test and hook call shape as CRuby's RB_INTERNAL_THREAD_HOOK, with `th` in
// different registers, plus the structs whose layout the finder reads from DWARF. -D switches add broken variants.
constexpr const char* kFixtureSource = R"(
#include <stddef.h>
#ifdef RV_HOOKS_AT_ZERO
/* A crafted binary: the symbol rb_internal_thread_event_hooks is an absolute 0; the code tests another list. */
#define rb_internal_thread_event_hooks rv_real_hooks
__asm__(".globl rb_internal_thread_event_hooks\n.set rb_internal_thread_event_hooks, 0");
#endif
struct rb_native_thread { char pad[24]; int tid; };
struct rb_thread_struct { char pad0[40]; struct rb_native_thread *nt; char pad1[152]; unsigned serial; };
static void *rb_internal_thread_event_hooks;
void *volatile rv_sink;
extern void rv_external(void);
extern struct rb_thread_struct *rv_get_th(void);
#ifdef RV_REGISTRY
/* CRuby's registry shape: add/remove take the list's lock by address and read/write the list. */
#include <pthread.h>
static pthread_rwlock_t hooks_lock = PTHREAD_RWLOCK_INITIALIZER;
__attribute__((noinline)) static void rb_thread_execute_hooks(unsigned event, struct rb_thread_struct *th) {
  pthread_rwlock_rdlock(&hooks_lock);
  if (rb_internal_thread_event_hooks) { rv_sink = th; rv_sink = (void *)(size_t)event; }
  pthread_rwlock_unlock(&hooks_lock);
}
void rb_internal_thread_add_event_hook(void *h) {
  pthread_rwlock_wrlock(&hooks_lock);
  *(void **)h = rb_internal_thread_event_hooks;
  __atomic_exchange_n(&rb_internal_thread_event_hooks, h, __ATOMIC_SEQ_CST);
  pthread_rwlock_unlock(&hooks_lock);
}
int rb_internal_thread_remove_event_hook(void *h) {
  int found = 0;
  pthread_rwlock_wrlock(&hooks_lock);
  if (rb_internal_thread_event_hooks == h) {
    __atomic_exchange_n(&rb_internal_thread_event_hooks, *(void **)h, __ATOMIC_SEQ_CST);
    found = 1;
  }
  pthread_rwlock_unlock(&hooks_lock);
  return found;
}
#else
__attribute__((noinline)) static void rb_thread_execute_hooks(unsigned event, struct rb_thread_struct *th) {
  rv_sink = th; rv_sink = (void *)(size_t)event; rv_sink = rb_internal_thread_event_hooks;
}
void rb_internal_thread_add_event_hook(void *h) { rb_internal_thread_event_hooks = h; }
#endif
#define HOOK(ev, th) do { if (rb_internal_thread_event_hooks != NULL) rb_thread_execute_hooks((ev), (th)); } while (0)
#ifdef RV_RUBY32
/* CRuby 3.2's shapes (thread_pthread.c 3.2.11): the hook call passes no thread; th is the th->nt whose tid
 * native_thread_init just stored (STARTED, in the pthread start routine, which loops for cached native threads) and
 * the value stored to sched->running right before RESUMED; READY is the first statement of the same function. */
struct rv32_nt { char pad[16]; int tid; };
struct rv32_sched { struct rb_thread_struct *running; int need_yield; };
extern long syscall(long, ...);
/* Hidden, as the static functions of thread_pthread.c are: a stripped binary does not name them. */
#define RV_HIDDEN __attribute__((visibility("hidden"), noinline))
RV_HIDDEN void fx32_start_func_2(struct rb_thread_struct *th) { rv_sink = th; rv_external(); HOOK(8, NULL); }
RV_HIDDEN void *fx32_start_func_1(void *th_ptr) {
  struct rb_thread_struct *th = th_ptr;
  do {
    struct rv32_nt *nt = (struct rv32_nt *)th->nt;
    nt->tid = (int)syscall(186);
    rv_external();
    HOOK(1, NULL);
    fx32_start_func_2(th);
    HOOK(16, NULL);
    th = rv_get_th();
  } while (th != NULL);
  return NULL;
}
void *fx32_thread_entry(void) { return (void *)fx32_start_func_1; }  /* pthread_create's start routine */
void fx32_to_running(struct rv32_sched *sched, struct rb_thread_struct *th) {
  HOOK(2, NULL);
  while (sched->running) rv_external();
#ifdef RV_RUBY32_TWO_STORES
  ((struct rv32_sched *)th)->running = (struct rb_thread_struct *)sched;
#endif
  sched->running = th;
  HOOK(4, NULL);
  if (sched->need_yield) rv_external();
}
void fx32_to_waiting(struct rv32_sched *sched) { HOOK(8, NULL); sched->running = NULL; }
#else
void fx_started(struct rb_thread_struct *th) { HOOK(1, th); }
void fx_ready(int unused, struct rb_thread_struct *th) { rv_sink = (void *)(size_t)unused; HOOK(2, th); }
void fx_resumed(struct rb_thread_struct *th) { rv_external(); HOOK(4, th); }
void fx_suspended(struct rb_thread_struct *th) { HOOK(8, th); }
void fx_exited(struct rb_thread_struct *th) { HOOK(16, th); }
#endif
int fx_layout(struct rb_thread_struct *th) { return th->nt->tid + (int)th->serial; }
void rb_f_sleep(void) { rv_sink = 0; }
void rb_mutex_lock(void) { rv_sink = 0; }
void rb_mutex_synchronize(void) { rb_mutex_lock(); rv_sink = 0; }
void rb_mutex_synchronize_m(void) { rb_mutex_synchronize(); rv_sink = 0; }
#ifdef RV_GC_FUNCS
/* GC functions as GCC leaves them: gc_rest split into its early-out test and a .part.0 body, a .cold piece of
 * gc_start, and a neighbour whose name shares the prefix. */
void gc_rest_part0(void) __asm__("gc_rest.part.0");
void gc_start_cold(void) __asm__("gc_start.cold");
__attribute__((noinline)) void gc_rest_part0(void) { rv_sink = (void *)1; }
__attribute__((noinline)) void gc_start_cold(void) { rv_sink = (void *)2; }
int gc_start(void *objspace, unsigned reason) {
  if (!objspace) gc_start_cold();
  rv_sink = objspace;
  return (int)reason;
}
void gc_rest(void *objspace) { if (objspace) gc_rest_part0(); }
void gc_continue(void *objspace) { rv_sink = objspace; }
void gc_start_internal(void) { gc_start(0, 0); }
#endif
#ifdef RV_BAD_UTF8_NAME
/* A hook site inside a function whose symbol name is not valid UTF-8. */
void fx_bad_name(struct rb_thread_struct *th) __asm__("fx_\xff\xfename");
void fx_bad_name(struct rb_thread_struct *th) { HOOK(1, th); }
#endif
#ifdef RV_BAD_EVENT
void fx_bad(struct rb_thread_struct *th) { HOOK(3, th); }
#endif
#ifdef RV_LOST_READY
void fx_lost(void) { HOOK(2, rv_get_th()); }
#endif
#ifdef RV_LOST_SUSPENDED
void fx_lost(void) { HOOK(8, rv_get_th()); }
#endif
)";

struct Expected {
  const char* function;
  uint8_t event;
  ThLocation th;
};

class FixtureTest : public ::testing::Test {
 protected:
  std::string Build(const std::string& name, const std::string& flags) {
    std::string path = dir_.Join(name);
    EXPECT_TRUE(CompileC(kFixtureSource, path, "-shared -fPIC -O2 " + flags));
    return path;
  }
  // A `strip`ped copy (no .symtab, no DWARF) of the fixture built with `flags`, as name; "" on failure.
  std::string BuildStripped(const std::string& name, const std::string& flags) {
    const std::string full = Build("full-" + name, flags);
    const std::string stripped = dir_.Join(name);
    if (std::system(("strip -o '" + stripped + "' '" + full + "'").c_str()) != 0) return "";
    return stripped;
  }
  Result<SiteSet> Find(const std::string& path, const std::string& version) {
    Result<ElfFile> elf = ElfFile::Open(path);
    if (!elf.ok()) return elf.error();
    return FindSites(*elf, version);
  }
  // The site cache's file for a binary: named by the SHA-256 of its content.
  static std::string CacheFileFor(const std::string& cache, const std::string& binary) {
    Result<ElfFile> elf = ElfFile::Open(binary);
    EXPECT_TRUE(elf.ok());
    return cache + "/" + (elf.ok() ? SparseContentSha256Hex(elf->content()) : std::string("?")) + ".json";
  }
  static std::map<std::string, const ProbeSite*> ByFunction(const SiteSet& set) {
    std::map<std::string, const ProbeSite*> out;
    for (const ProbeSite& s : set.sites) out[s.function] = &s;
    return out;
  }
  TempDir dir_;
};

constexpr ThLocation kRdi{RV_LOC_REG, RV_REG_RDI, 0};
constexpr ThLocation kRsi{RV_LOC_REG, RV_REG_RSI, 0};
constexpr ThLocation kCurrent{RV_LOC_CURRENT, 0, 0};

TEST_F(FixtureTest, FindsEveryHookSiteWithItsEventAndThFromDwarf) {
  const std::string fixture_path = Build("libfx.so", "-g");
  Result<SiteSet> set = Find(fixture_path, "3.3.0");
  ASSERT_TRUE(set.ok()) << set.error().ToString();
  auto by_fn = ByFunction(*set);
  EXPECT_EQ(set->sites.size(), 8u) << FormatSites(*set);  // 5 hook sites, sleep, Mutex#lock, #synchronize
  ASSERT_TRUE(by_fn.count("fx_started"));
  EXPECT_EQ(by_fn["fx_started"]->event, RV_EV_THREAD_STARTED);
  EXPECT_EQ(by_fn["fx_started"]->th, kRdi);
  EXPECT_EQ(by_fn["fx_started"]->th_source, "dwarf");
  ASSERT_TRUE(by_fn.count("fx_ready"));
  EXPECT_EQ(by_fn["fx_ready"]->event, RV_EV_THREAD_READY);
  EXPECT_EQ(by_fn["fx_ready"]->th, kRsi);
  ASSERT_TRUE(by_fn.count("fx_resumed"));
  EXPECT_EQ(by_fn["fx_resumed"]->event, RV_EV_THREAD_RESUMED);
  // th survives the call in a callee-saved register; which one is the compiler's choice, but never a scratch one.
  EXPECT_EQ(by_fn["fx_resumed"]->th.kind, RV_LOC_REG);
  EXPECT_TRUE(by_fn["fx_resumed"]->th.reg == RV_REG_RBX || by_fn["fx_resumed"]->th.reg == RV_REG_RBP ||
              by_fn["fx_resumed"]->th.reg >= RV_REG_R12)
      << FormatThLocation(by_fn["fx_resumed"]->th);
  ASSERT_TRUE(by_fn.count("fx_suspended"));
  EXPECT_EQ(by_fn["fx_suspended"]->event, RV_EV_THREAD_SUSPENDED);
  ASSERT_TRUE(by_fn.count("fx_exited"));
  EXPECT_EQ(by_fn["fx_exited"]->event, RV_EV_THREAD_EXITED);
  EXPECT_EQ(by_fn["fx_exited"]->th, kRdi);
  EXPECT_EQ(by_fn.count("rb_internal_thread_add_event_hook"), 0u) << "the hook registry itself is not a site";

  for (const ProbeSite& s : set->sites) {
    if (s.method != "hook-site") continue;
    EXPECT_EQ(s.file_offset, s.vaddr) << "fixture .text has vaddr == file offset";
    ASSERT_TRUE(s.th_disasm.has_value()) << s.function;
    EXPECT_EQ(*s.th_disasm, s.th) << "DWARF and the rsi load disagree at " << s.function;
  }
  ASSERT_TRUE(by_fn.count("rb_f_sleep"));
  EXPECT_EQ(by_fn["rb_f_sleep"]->event, RV_EV_SLEEP_ENTER);
  EXPECT_EQ(by_fn["rb_f_sleep"]->method, "function-entry");
  ASSERT_TRUE(by_fn.count("rb_mutex_lock"));
  EXPECT_EQ(by_fn["rb_mutex_lock"]->event, RV_EV_MUTEX_LOCK_ENTER);
  ASSERT_TRUE(by_fn.count("rb_mutex_synchronize_m"));
  EXPECT_EQ(by_fn["rb_mutex_synchronize_m"]->event, RV_EV_MUTEX_LOCK_ENTER);
  EXPECT_EQ(by_fn.count("rb_mutex_synchronize"), 0u) << "the C API is not Mutex#lock";
  {
    // Calls of rb_mutex_lock from rb_mutex_synchronize (the C API) are excluded by return address.
    Result<ElfFile> fx = ElfFile::Open(fixture_path);
    ASSERT_TRUE(fx.ok());
    auto sync = fx->FindSymbol("rb_mutex_synchronize");
    ASSERT_TRUE(sync.has_value());
    EXPECT_EQ(by_fn["rb_mutex_lock"]->exclude_caller_start, sync->value);
    EXPECT_EQ(by_fn["rb_mutex_lock"]->exclude_caller_end, sync->value + sync->size);
    EXPECT_EQ(by_fn["rb_mutex_synchronize_m"]->exclude_caller_end, 0u);
  }
  EXPECT_EQ(set->offsets.th_serial, 200u);
  EXPECT_EQ(set->offsets.th_nt, 40u);
  EXPECT_EQ(set->offsets.nt_tid, 24u);
  EXPECT_EQ(set->offsets_source, "dwarf");
  EXPECT_EQ(set->main_thread_serial, 1u);
}

TEST_F(FixtureTest, WithoutDwarfThComesFromTheRsiLoad) {
  Result<SiteSet> set = Find(Build("libfx-nodwarf.so", "-g0"), "3.4.0");
  ASSERT_TRUE(set.ok()) << set.error().ToString();
  auto by_fn = ByFunction(*set);
  ASSERT_TRUE(by_fn.count("fx_ready"));
  EXPECT_EQ(by_fn["fx_ready"]->th, kRsi);
  EXPECT_EQ(by_fn["fx_ready"]->th_source, "disasm");
  EXPECT_EQ(by_fn["fx_started"]->th, kRdi);
  EXPECT_EQ(set->offsets_source, "table");
  EXPECT_EQ(set->offsets.th_serial, 204u) << "3.4 table";
}

// 3.2's hook call passes no thread, so th comes from DWARF or is "the current thread", which the BPF side only knows
// after a site with an explicit th ran on that native thread. STARTED (a thread's first event) and RESUMED (before
// every SUSPENDED) must therefore locate th: with DWARF they do and the rest may use the current thread; without it
// the binary is refused (before, every site became "current" and no event could be attributed: a stripped 3.2.11
// recorded two threads for four).
TEST_F(FixtureTest, Ruby32NeedsAnExplicitThAtStartedAndResumed) {
  Result<SiteSet> set = Find(Build("libfx-32.so", "-g"), "3.2.9");
  ASSERT_TRUE(set.ok()) << set.error().ToString();
  auto by_fn = ByFunction(*set);
  ASSERT_TRUE(by_fn.count("fx_ready") && by_fn.count("fx_started") && by_fn.count("fx_resumed"));
  EXPECT_EQ(by_fn["fx_ready"]->event, RV_EV_THREAD_READY);
  EXPECT_FALSE(by_fn["fx_ready"]->th_disasm.has_value());
  EXPECT_EQ(by_fn["fx_started"]->th_source, "dwarf");
  EXPECT_EQ(by_fn["fx_resumed"]->th_source, "dwarf");
  EXPECT_EQ(set->main_thread_serial, 0u);
  EXPECT_EQ(set->offsets.th_serial, 200u) << "DWARF";

  Result<SiteSet> no_dwarf = Find(Build("libfx-32-nodwarf.so", "-g0"), "3.2.9");
  ASSERT_FALSE(no_dwarf.ok()) << FormatSites(*no_dwarf);
  EXPECT_EQ(no_dwarf.error().code(), ErrorCode::kNoSymbols);
  const std::string& why = no_dwarf.error().message();
  EXPECT_TRUE(why.find("STARTED hook site") != std::string::npos || why.find("RESUMED hook site") != std::string::npos)
      << why;
  EXPECT_NE(why.find("cannot locate th"), std::string::npos) << why;
}

// A stripped 3.2: th at STARTED and RESUMED is read off the statement CRuby 3.2 runs before each hook
// (sites/ruby32_th.h), and equals what DWARF says of the unstripped build; READY, in the same function as RESUMED,
// takes the register that holds the same argument there.
TEST_F(FixtureTest, StrippedRuby32LocatesThFromTheStatementsBeforeTheHooks) {
  const std::string stripped = BuildStripped("libfx32.so", "-g -DRV_REGISTRY -DRV_RUBY32");
  ASSERT_FALSE(stripped.empty());
  Result<SiteSet> want = Find(dir_.Join("full-libfx32.so"), "3.2.9");
  Result<SiteSet> got = Find(stripped, "3.2.9");
  ASSERT_TRUE(want.ok()) << want.error().ToString();
  ASSERT_TRUE(got.ok()) << got.error().ToString();
  // One site per event, but SUSPENDED: fx32_to_waiting's, and the thread's last one in fx32_start_func_2.
  std::map<uint8_t, const ProbeSite*> want_by_event, got_by_event;
  const ProbeSite* last_release = nullptr;
  for (const ProbeSite& s : want->sites) {
    if (s.method == "hook-site") want_by_event[s.event] = &s;
  }
  for (const ProbeSite& s : got->sites) {
    if (s.method != "hook-site") continue;
    if (s.event == RV_EV_THREAD_SUSPENDED && s.function == "thread_start_func_2") last_release = &s;
    else got_by_event[s.event] = &s;
  }
  ASSERT_EQ(got_by_event.size(), 5u) << FormatSites(*got);
  ASSERT_NE(last_release, nullptr) << "the function thread_start_func_1 calls is named: " << FormatSites(*got);
  for (uint8_t event : {RV_EV_THREAD_STARTED, RV_EV_THREAD_RESUMED}) {
    SCOPED_TRACE(EventKindName(event));
    ASSERT_TRUE(want_by_event.count(event) && got_by_event.count(event));
    EXPECT_EQ(want_by_event[event]->th_source, "dwarf");
    EXPECT_EQ(got_by_event[event]->th_source, "disasm");
    EXPECT_EQ(got_by_event[event]->th, want_by_event[event]->th) << FormatSites(*got);
    EXPECT_EQ(got_by_event[event]->vaddr, want_by_event[event]->vaddr);
  }
  const ProbeSite* ready = got_by_event[RV_EV_THREAD_READY];
  ASSERT_NE(ready, nullptr);
  EXPECT_EQ(ready->th_source, "disasm");
  EXPECT_EQ(ready->th, got_by_event[RV_EV_THREAD_RESUMED]->th);
  EXPECT_EQ(got_by_event[RV_EV_THREAD_SUSPENDED]->th, kCurrent);
  EXPECT_EQ(got_by_event[RV_EV_THREAD_EXITED]->th, kCurrent);
  EXPECT_EQ(got_by_event[RV_EV_THREAD_STARTED]->function, "thread_start_func_1");
  EXPECT_EQ(got_by_event[RV_EV_THREAD_EXITED]->function, "thread_start_func_1");
  bool provenance = false;
  for (const auto& [fact, source] : got->provenance) {
    if (fact == "th at 3.2 STARTED/READY/RESUMED") provenance = source.find("(3 sites)") != std::string::npos;
  }
  EXPECT_TRUE(provenance) << FormatSites(*got);
}

// Two register stores to [base + 0] next to the RESUMED hook: which one is sched->running is not known, so the
// binary is refused rather than traced with a guessed th.
TEST_F(FixtureTest, StrippedRuby32WithTwoCandidateRunningStoresIsRefused) {
  const std::string stripped = BuildStripped("libfx32-two.so", "-g0 -DRV_REGISTRY -DRV_RUBY32 -DRV_RUBY32_TWO_STORES");
  ASSERT_FALSE(stripped.empty());
  Result<SiteSet> got = Find(stripped, "3.2.9");
  ASSERT_FALSE(got.ok()) << FormatSites(*got);
  EXPECT_EQ(got.error().code(), ErrorCode::kNoSymbols);
  EXPECT_NE(got.error().message().find("RESUMED hook site"), std::string::npos) << got.error().message();
  EXPECT_NE(got.error().message().find("2 candidate `sched->running = th` stores"), std::string::npos)
      << got.error().message();
}

TEST_F(FixtureTest, UnknownEventArgumentIsRefused) {
  Result<SiteSet> set = Find(Build("libfx-bad.so", "-g -DRV_BAD_EVENT"), "3.3.0");
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.error().code(), ErrorCode::kUnsupportedVersion);
  EXPECT_NE(set.error().message().find("fx_bad"), std::string::npos) << set.error().message();
  EXPECT_NE(set.error().message().find("cannot tell its event"), std::string::npos);
}

TEST_F(FixtureTest, ReadyWithUnlocatableThIsAnErrorButSuspendedFallsBackToCurrent) {
  Result<SiteSet> ready = Find(Build("libfx-lost-ready.so", "-g -DRV_LOST_READY"), "3.3.0");
  ASSERT_FALSE(ready.ok());
  EXPECT_EQ(ready.error().code(), ErrorCode::kNoSymbols);
  EXPECT_NE(ready.error().message().find("READY hook site"), std::string::npos) << ready.error().message();
  EXPECT_NE(ready.error().message().find("fx_lost"), std::string::npos);

  Result<SiteSet> suspended = Find(Build("libfx-lost-susp.so", "-g -DRV_LOST_SUSPENDED"), "3.3.0");
  ASSERT_TRUE(suspended.ok()) << suspended.error().ToString();
  auto by_fn = ByFunction(*suspended);
  ASSERT_TRUE(by_fn.count("fx_lost"));
  EXPECT_EQ(by_fn["fx_lost"]->th, kCurrent);
  EXPECT_EQ(by_fn["fx_lost"]->th_source, "current");
}

TEST_F(FixtureTest, StrippedBinaryWithoutTheHookRegistryExportsIsNoSymbolsWithTheFix) {
  // No rb_internal_thread_remove_event_hook to recover the hook list from.
  std::string path = Build("libfx-stripped.so", "-g0 -s -Wl,--build-id=0xabcdef12");
  Result<SiteSet> set = Find(path, "3.3.8");
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.error().code(), ErrorCode::kNoSymbols);
  EXPECT_EQ(set.error().message(),
            path + " (build-id abcdef12) has no symbol table and its hook sites cannot be recovered from its exports "
                   "and code: " + path + " exports no rb_internal_thread_add_event_hook/"
                   "rb_internal_thread_remove_event_hook (CRuby < 3.2, or not a CRuby VM); install the matching "
                   "debug symbols (e.g. the -dbgsym package) or use a Ruby built with symbols");
}

TEST_F(FixtureTest, StrippedBinaryGivesTheSitesOfTheUnstrippedOne) {
  const std::string stripped = BuildStripped("libfx-registry.so", "-g -DRV_REGISTRY");
  ASSERT_FALSE(stripped.empty());
  Result<SiteSet> want = Find(dir_.Join("full-libfx-registry.so"), "3.3.0");
  Result<SiteSet> got = Find(stripped, "3.3.0");
  ASSERT_TRUE(want.ok()) << want.error().ToString();
  ASSERT_TRUE(got.ok()) << got.error().ToString();
  std::vector<std::tuple<uint64_t, uint8_t, ThLocation>> want_hooks, got_hooks;
  for (const ProbeSite& s : want->sites) {
    if (s.method == "hook-site") want_hooks.emplace_back(s.vaddr, s.event, s.th);
  }
  for (const ProbeSite& s : got->sites) {
    if (s.method == "hook-site") {
      got_hooks.emplace_back(s.vaddr, s.event, s.th);
      EXPECT_EQ(s.th_source, "disasm");
    }
  }
  EXPECT_EQ(want_hooks.size(), 5u) << FormatSites(*want);
  EXPECT_EQ(got_hooks, want_hooks) << FormatProvenance(*got) << FormatSites(*got);
  // rb_mutex_lock is exported, so it is found in .dynsym; rb_f_sleep and rb_mutex_synchronize_m of the fixture are
  // exported too but have no registration call, and without .symtab a name alone is not trusted for them.
  std::string prov = FormatProvenance(*got);
  EXPECT_NE(prov.find("# hook list: 0x"), std::string::npos) << prov;
  EXPECT_NE(prov.find("exports + disassembly"), std::string::npos) << prov;
  EXPECT_NE(prov.find("# function extents: .eh_frame"), std::string::npos) << prov;
  EXPECT_NE(prov.find("# Kernel#sleep: none"), std::string::npos) << prov;
  EXPECT_NE(prov.find("# Mutex#lock: exports (rb_mutex_lock)"), std::string::npos) << prov;
  EXPECT_EQ(got->offsets_source, "table");
}

TEST_F(FixtureTest, OldOrUnparseableVersionsAreUnsupported) {
  std::string path = Build("libfx-v.so", "-g0");
  Result<SiteSet> old = Find(path, "3.1.2");
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.error().code(), ErrorCode::kUnsupportedVersion);
  EXPECT_EQ(old.error().message(),
            "CRuby 3.1.2 has no thread scheduler events (they were added in 3.2); use Ruby >= 3.2");
  EXPECT_EQ(Find(path, "banana").error().code(), ErrorCode::kUnsupportedVersion);
  EXPECT_EQ(Find(path, "2.7.8").error().code(), ErrorCode::kUnsupportedVersion);
}

TEST_F(FixtureTest, FormatSitesPrintsOneLinePerSite) {
  Result<SiteSet> set = Find(Build("libfx-fmt.so", "-g"), "3.3.0");
  ASSERT_TRUE(set.ok());
  std::string text = FormatSites(*set);
  EXPECT_EQ(static_cast<size_t>(std::count(text.begin(), text.end(), '\n')), set->sites.size());
  auto by_fn = ByFunction(*set);
  char expect[128];
  // The first column is the check's offset (the reference tables'), wherever the probe sits.
  std::snprintf(expect, sizeof(expect), "0x%-8lx READY     fx_ready", by_fn["fx_ready"]->check_file_offset());
  EXPECT_NE(text.find(expect), std::string::npos) << text;
  EXPECT_NE(text.find("th: $rsi"), std::string::npos) << text;
  EXPECT_EQ(FormatThLocation({RV_LOC_MEM, RV_REG_RSP, 8}), "[$rsp+8]");
  EXPECT_EQ(FormatThLocation({RV_LOC_REG, RV_REG_RBX, -288}), "$rbx-288");
  EXPECT_EQ(FormatThLocation(kCurrent), "current");
}

// --- Cache ------------------------------------------------------------------------------------------------------

TEST_F(FixtureTest, CacheRoundTripsAndIsUsedOnTheSecondCall) {
  std::string lib = Build("libfx-cache.so", "-g -Wl,--build-id=0x1122334455667788");
  std::string cache = dir_.Join("cache");
  Result<SiteSet> first = LoadOrFindSites(lib, "3.3.0", cache);
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  std::string file = CacheFileFor(cache, lib);
  ASSERT_TRUE(testing::FileExists(file));
  Result<SiteSet> parsed = SiteSetFromJson(testing::ReadFile(file));
  ASSERT_TRUE(parsed.ok()) << parsed.error().ToString();
  EXPECT_EQ(SiteSetToJson(*parsed), SiteSetToJson(*first));

  // Mark the cached copy; a second call must return the mark, proving the cache (not a recomputation) answered.
  std::string text = testing::ReadFile(file);
  size_t at = text.find("\"fx_ready\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 10, "\"fx_marked\"");
  testing::WriteFile(file, text);
  Result<SiteSet> second = LoadOrFindSites(lib, "3.3.0", cache);
  ASSERT_TRUE(second.ok());
  EXPECT_NE(FormatSites(*second).find("fx_marked"), std::string::npos);

  // Same build-id but another claimed version: not a hit.
  Result<SiteSet> other = LoadOrFindSites(lib, "3.3.1", cache);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(FormatSites(*other).find("fx_marked"), std::string::npos);
}

TEST_F(FixtureTest, ModifiedCopyWithTheSameBuildIdIsNotServedTheCache) {
  const std::string lib = Build("libfx-fp.so", "-g -Wl,--build-id=0x5566778899aabbcc");
  const std::string cache = dir_.Join("fp-cache");
  Result<SiteSet> first = LoadOrFindSites(lib, "3.3.0", cache);
  ASSERT_TRUE(first.ok());
  // Mark the cache, then change one byte of .text in a copy (same build-id): the mark must not come back for it.
  // The cache holds one file, named by the binary's content hash.
  std::string file;
  for (const auto& e : std::filesystem::directory_iterator(cache)) file = e.path().string();
  ASSERT_FALSE(file.empty());
  std::string text = testing::ReadFile(file);
  size_t at = text.find("\"fx_ready\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 10, "\"fx_marked\"");
  testing::WriteFile(file, text);
  Result<ElfFile> elf = ElfFile::Open(lib);
  ASSERT_TRUE(elf.ok());
  std::optional<ElfSymbol> fn = elf->FindSymbol("fx_layout");
  ASSERT_TRUE(fn.has_value());
  std::string bytes = testing::ReadFile(lib);
  const uint64_t off = *elf->VaddrToFileOffset(fn->value);
  bytes[off] = static_cast<char>(0xcc);
  const std::string copy = dir_.Join("libfx-fp-copy.so");
  testing::WriteFile(copy, bytes);
  Result<SiteSet> other = LoadOrFindSites(copy, "3.3.0", cache);
  ASSERT_TRUE(other.ok()) << other.error().ToString();
  EXPECT_EQ(FormatSites(*other).find("fx_marked"), std::string::npos) << "served the original's cache";
  EXPECT_NE(other->content_sha256, first->content_sha256);
}

// Found by tests/fuzz's fuzz_elf: a symbol table that puts the hook list at address 0 gave a site set the cache
// reader refused, so every run re-analysed the binary. The finder and the reader now apply the same CheckSiteSet.
TEST_F(FixtureTest, AHookListAtAddressZeroIsRefusedAndNotCached) {
  const std::string lib = Build("libfx-hooks0.so", "-g -DRV_HOOKS_AT_ZERO");
  const std::string cache = dir_.Join("cache0");
  Result<SiteSet> set = LoadOrFindSites(lib, "3.3.0", cache);
  ASSERT_FALSE(set.ok()) << FormatSites(*set);
  EXPECT_EQ(set.error().code(), ErrorCode::kNoSymbols);
  EXPECT_NE(set.error().message().find("hook list is at address 0"), std::string::npos) << set.error().message();
  EXPECT_NE(set.error().message().find(lib), std::string::npos) << set.error().message();
  EXPECT_FALSE(std::filesystem::exists(CacheFileFor(cache, lib)));
}

// Each rule of CheckSiteSet, broken one at a time on a real result: the finder's check refuses it, and so does the
// cache reader on its serialised form (one rule set for both).
TEST_F(FixtureTest, CheckSiteSetRulesHoldForTheFinderAndTheCacheAlike) {
  Result<SiteSet> good = Find(Build("libfx-rules.so", "-g"), "3.3.0");
  ASSERT_TRUE(good.ok()) << good.error().ToString();
  ASSERT_TRUE(CheckSiteSet(*good).ok());
  ASSERT_TRUE(SiteSetFromJson(SiteSetToJson(*good)).ok());
  ASSERT_FALSE(good->sites.empty());
  const std::vector<std::pair<std::string, std::function<void(SiteSet&)>>> breaks = {
      {"hook list at 0", [](SiteSet& s) { s.hooks_vaddr = 0; }},
      {"th_nt offset", [](SiteSet& s) { s.offsets.th_nt = 4096; }},
      {"nt_tid offset", [](SiteSet& s) { s.offsets.nt_tid = 1u << 31; }},
      {"ractor main thread", [](SiteSet& s) { s.ractor_main_thread = 70000; }},
      {"main thread serial", [](SiteSet& s) { s.main_thread_serial = 2; }},
      {"offsets source", [](SiteSet& s) { s.offsets_source = "guess"; }},
      {"provenance count", [](SiteSet& s) { s.provenance.resize(kMaxSiteProvenance + 1, {"f", "s"}); }},
      {"provenance text", [](SiteSet& s) { s.provenance.push_back({"f", std::string(kMaxSiteProvenanceText + 1, 'x')}); }},
      {"site count", [](SiteSet& s) { s.sites.resize(RV_MAX_SITES + 1, s.sites[0]); }},
      {"event of method", [](SiteSet& s) { s.sites[0].event = RV_EV_GC_EXIT; }},
      {"th register", [](SiteSet& s) { s.sites[0].th = {RV_LOC_REG, RV_REG_COUNT, 0}; }},
      {"probe after check", [](SiteSet& s) { s.sites[0].check_vaddr = s.sites[0].vaddr - 65; }},
      {"exclude range", [](SiteSet& s) { s.sites[0].exclude_caller_start = 10, s.sites[0].exclude_caller_end = 10; }},
      {"th source", [](SiteSet& s) { s.sites[0].th_source = "guess"; }},
  };
  for (const auto& [what, mutate] : breaks) {
    SiteSet broken = *good;
    mutate(broken);
    EXPECT_FALSE(CheckSiteSet(broken).ok()) << what;
    EXPECT_FALSE(SiteSetFromJson(SiteSetToJson(broken)).ok()) << what;
  }
}

TEST_F(FixtureTest, CorruptOrOutOfRangeCacheIsIgnoredAndRewritten) {
  std::string lib = Build("libfx-corrupt.so", "-g -Wl,--build-id=0xaabbccdd");
  std::string cache = dir_.Join("cache");
  Result<SiteSet> good = LoadOrFindSites(lib, "3.3.0", cache);
  ASSERT_TRUE(good.ok());
  const std::string file = CacheFileFor(cache, lib);
  const std::string good_json = SiteSetToJson(*good);

  std::string out_of_range = good_json;
  size_t at = out_of_range.find("\"event\": 2");
  ASSERT_NE(at, std::string::npos) << out_of_range;
  out_of_range.replace(at, 10, "\"event\": 99");
  std::string stale_format = good_json;
  at = stale_format.find("\"format\": 11");
  ASSERT_NE(at, std::string::npos);
  stale_format.replace(at, 12, "\"format\": 10");  // the previous format: recomputed
  std::string huge_offset = good_json;
  at = huge_offset.find("\"th_serial\": 200");
  ASSERT_NE(at, std::string::npos);
  huge_offset.replace(at, 16, "\"th_serial\": 99999");
  // Numbers that are not integers of the field's type: a float (converting 1e300 to int32 is undefined behaviour),
  // and an event that only wraps to a valid one (258 -> 2 as uint8) (found by tests/fuzz's fuzz_site_cache).
  std::string float_offset = good_json;
  at = float_offset.find("\"offset\": 0");
  ASSERT_NE(at, std::string::npos);
  float_offset.replace(at, 11, "\"offset\": 1e300");
  std::string wrapped_event = good_json;
  at = wrapped_event.find("\"event\": 2");
  wrapped_event.replace(at, 10, "\"event\": 258");

  // Every integer of the cache, one at a time, replaced by a float beyond uint64's range (converting it is undefined
  // behaviour; found by tests/fuzz's fuzz_site_cache in hooks_vaddr): each refuses the file.
  {
    const nlohmann::json doc = nlohmann::json::parse(good_json);
    const nlohmann::json flat = doc.flatten();
    int integers = 0;
    for (const auto& [pointer, value] : flat.items()) {
      if (!value.is_number_integer()) continue;
      ++integers;
      nlohmann::json changed = flat;
      changed[pointer] = 8.09049e19;
      EXPECT_FALSE(SiteSetFromJson(changed.unflatten().dump()).ok()) << pointer;
    }
    EXPECT_GT(integers, 10);
  }
  for (const std::string& bad : {std::string("{ this is not json"), std::string(""), good_json.substr(0, 100),
                                 out_of_range, stale_format, huge_offset, float_offset, wrapped_event}) {
    testing::WriteFile(file, bad);
    EXPECT_FALSE(SiteSetFromJson(bad).ok());
    Result<SiteSet> again = LoadOrFindSites(lib, "3.3.0", cache);
    ASSERT_TRUE(again.ok()) << again.error().ToString();
    EXPECT_EQ(SiteSetToJson(*again), good_json);
    EXPECT_EQ(testing::ReadFile(file), good_json) << "the bad cache file was not rewritten";
  }
  // No temporary files left behind by the atomic writes.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(cache)) entries += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(entries, 1);
}

TEST_F(FixtureTest, ABinaryClaimingAnotherBuildIdCannotPoisonItsCache) {
  // The attacker's binary carries the real one's build-id but other code (here: GC functions, so other sites).
  std::string evil = Build("libfx-evil.so", "-g -DRV_GC_FUNCS -Wl,--build-id=0x5555666677778888");
  std::string real = Build("libfx-real.so", "-g -Wl,--build-id=0x5555666677778888");
  std::string cache = dir_.Join("cache");
  Result<SiteSet> poisoned = LoadOrFindSites(evil, "3.3.0", cache);
  ASSERT_TRUE(poisoned.ok()) << poisoned.error().ToString();
  Result<SiteSet> fresh = Find(real, "3.3.0");
  ASSERT_TRUE(fresh.ok());
  Result<SiteSet> got = LoadOrFindSites(real, "3.3.0", cache);
  ASSERT_TRUE(got.ok());
  ASSERT_NE(FormatSites(*poisoned), FormatSites(*fresh)) << "the fixture must give the two binaries other sites";
  EXPECT_EQ(FormatSites(*got), FormatSites(*fresh)) << "the real binary got the attacker's sites";
  // Each binary has its own entry.
  EXPECT_TRUE(testing::FileExists(CacheFileFor(cache, evil)));
  EXPECT_TRUE(testing::FileExists(CacheFileFor(cache, real)));
  EXPECT_NE(CacheFileFor(cache, evil), CacheFileFor(cache, real));
}

TEST_F(FixtureTest, InvalidUtf8SymbolNameIsWrittenReplacedWithoutThrowing) {
  std::string lib = Build("libfx-utf8.so", "-g -DRV_BAD_UTF8_NAME");
  Result<SiteSet> direct = Find(lib, "3.3.0");
  ASSERT_TRUE(direct.ok()) << direct.error().ToString();
  bool has_bad_name = false;
  for (const ProbeSite& s : direct->sites) has_bad_name |= s.function.find('\xff') != std::string::npos;
  ASSERT_TRUE(has_bad_name) << "the fixture must put a site in the badly named function";
  std::string json;
  ASSERT_NO_THROW(json = SiteSetToJson(*direct));
  EXPECT_NE(json.find("fx_\xef\xbf\xbd"), std::string::npos) << "U+FFFD in place of the bad bytes";
  std::string cache = dir_.Join("cache");
  Result<SiteSet> first = LoadOrFindSites(lib, "3.3.0", cache);
  ASSERT_TRUE(first.ok()) << first.error().ToString();
  Result<SiteSet> second = LoadOrFindSites(lib, "3.3.0", cache);  // from the cache written with the replacement
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->sites.size(), direct->sites.size());
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(cache)) {
    ++entries;
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
  }
  EXPECT_EQ(entries, 1);
}

TEST_F(FixtureTest, PlantedTemporaryCacheSymlinkIsNotFollowed) {
  std::string lib = Build("libfx-tmp.so", "-g");
  std::string cache = dir_.Join("cache");
  std::filesystem::create_directories(cache);
  const std::string victim = dir_.Join("victim");
  testing::WriteFile(victim, "untouched");
  std::filesystem::create_symlink(victim, CacheFileFor(cache, lib) + ".tmp." + std::to_string(getpid()));
  Result<SiteSet> set = LoadOrFindSites(lib, "3.3.0", cache);
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(testing::ReadFile(victim), "untouched");
}

TEST_F(FixtureTest, UnwritableCacheDirectoryStillReturnsSites) {
  std::string lib = Build("libfx-nocache.so", "-g");
  testing::WriteFile(dir_.Join("not-a-dir"), "x");
  Result<SiteSet> set = LoadOrFindSites(lib, "3.3.0", dir_.Join("not-a-dir/cache"));
  ASSERT_TRUE(set.ok()) << set.error().ToString();
  EXPECT_FALSE(set->sites.empty());
}

TEST_F(FixtureTest, WithoutGcHookChecksGcComesFromEntryAndReturnOfTheGcFunctions) {
  // The fixture has GC functions but no `testb` hook checks: FindSites falls back to the functions on its own.
  Result<SiteSet> set = Find(Build("libfx-gc.so", "-g -DRV_GC_FUNCS"), "3.3.0");
  ASSERT_TRUE(set.ok()) << set.error().ToString();
  Result<ElfFile> elf = ElfFile::Open(dir_.Join("libfx-gc.so"));
  ASSERT_TRUE(elf.ok());
  std::vector<std::string> got;
  for (const ProbeSite& s : set->sites) {
    if (s.event != RV_EV_GC_ENTER && s.event != RV_EV_GC_EXIT) continue;
    got.push_back(s.function + (s.event == RV_EV_GC_ENTER ? " enter " : " exit ") + s.method +
                  (s.return_probe ? " ret" : ""));
    std::optional<ElfSymbol> sym = elf->FindSymbol(s.function);
    ASSERT_TRUE(sym.has_value()) << s.function;
    EXPECT_EQ(s.vaddr, sym->value) << "both probes are on the function's first instruction";
    EXPECT_EQ(s.th, kCurrent);
  }
  std::sort(got.begin(), got.end());
  // gc_rest itself is not probed: its entry also runs when there is nothing to finish (the .part.0 is the body).
  // Neither gc_start.cold (reached from gc_start) nor gc_start_internal (another function) is a GC function.
  EXPECT_EQ(got, (std::vector<std::string>{
                     "gc_continue enter gc-function-entry", "gc_continue exit gc-function-return ret",
                     "gc_rest.part.0 enter gc-function-entry", "gc_rest.part.0 exit gc-function-return ret",
                     "gc_start enter gc-function-entry", "gc_start exit gc-function-return ret"}));
  // Only these sites are return probes.
  for (const ProbeSite& s : set->sites) EXPECT_EQ(s.return_probe, s.method == "gc-function-return") << s.function;

  // The cache keeps them (a return probe is told by its method).
  std::string cache = dir_.Join("gc-cache");
  Result<SiteSet> fresh = LoadOrFindSites(dir_.Join("libfx-gc.so"), "3.3.0", cache);
  Result<SiteSet> cached = LoadOrFindSites(dir_.Join("libfx-gc.so"), "3.3.0", cache);
  ASSERT_TRUE(fresh.ok() && cached.ok());
  EXPECT_EQ(SiteSetToJson(*cached), SiteSetToJson(*fresh));
  size_t returns = 0;
  for (const ProbeSite& s : cached->sites) returns += s.return_probe ? 1 : 0;
  EXPECT_EQ(returns, 3u);
}

TEST_F(FixtureTest, NoGcFunctionsNoGcSitesAndForcingTheFallbackIsAnError) {
  std::string lib = Build("libfx-nogc.so", "-g");
  Result<SiteSet> set = Find(lib, "3.3.0");
  ASSERT_TRUE(set.ok());
  for (const ProbeSite& s : set->sites) EXPECT_FALSE(s.event == RV_EV_GC_ENTER || s.event == RV_EV_GC_EXIT);
  Result<ElfFile> elf = ElfFile::Open(lib);
  ASSERT_TRUE(elf.ok());
  Status st = UseGcFunctionProbes(*elf, &*set);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code(), ErrorCode::kNoSymbols);
  EXPECT_NE(st.error().message().find("--gc-probes=fallback"), std::string::npos) << st.error().message();
}

// --- The real test Rubies: the reference tables (../shared/reference/hooksites-*.txt and §3-§5) -----------------

// One row of a reference table. th: "$reg", "CFA-N" (a stack slot at CFA-N), "$reg+K value", or "current".
struct RefSite {
  uint64_t offset;
  uint8_t event;
  const char* function;
  const char* th;
};

constexpr uint8_t kS = RV_EV_THREAD_STARTED, kR = RV_EV_THREAD_READY, kRes = RV_EV_THREAD_RESUMED,
                  kSus = RV_EV_THREAD_SUSPENDED, kE = RV_EV_THREAD_EXITED;

const std::vector<RefSite> kRef338 = {
    {0x2ac90e, kR, "thread_sched_to_ready_common", "$rsi"},
    {0x2accaa, kS, "thread_create_core", "$r15"},
    {0x2ad982, kR, "ubf_waiting", "$rbx"},
    {0x2adbc3, kRes, "thread_sched_wait_running_turn", "$rbx"},
    {0x2adcc9, kR, "thread_sched_to_running", "$rbp"},
    {0x2addb8, kR, "thread_sched_to_running", "$rbp"},
    {0x2adf78, kSus, "thread_sched_to_waiting_until_wakeup", "CFA-72"},
    {0x2ae4ab, kSus, "rb_ractor_sched_sleep", "CFA-88"},
    {0x2b017d, kSus, "thread_sched_wait_events", "CFA-80"},
    {0x2b09d0, kSus, "native_cond_sleep", "CFA-144"},
    {0x2b28a8, kSus, "rb_thread_schedule_limits", "CFA-48"},
    {0x2b36dd, kSus, "rb_thread_call_with_gvl", "$rbx-288"},
    {0x2b4e78, kSus, "rb_nogvl", "current"},
    {0x2b5ae3, kSus, "thread_start_func_2", "CFA-408"},
    {0x2b5b0e, kE, "thread_start_func_2", "CFA-408"},
    {0x2b5bf4, kSus, "thread_start_func_2", "CFA-408"},
    {0x2b5c1f, kE, "thread_start_func_2", "CFA-408"},
    {0x2b618b, kRes, "co_start", "$rbx"},
    {0x2b752e, kSus, "rb_thread_io_blocking_call", "$rbx"},
    {0x2b83b0, kSus, "do_select", "current"},
    {0x2b9036, kSus, "rb_thread_wait_for_single_fd", "CFA-392"},
};

const std::vector<RefSite> kRef345 = {
    {0x1c72de, kR, "thread_sched_to_ready_common", "$rsi"},
    {0x1c76b3, kS, "thread_create_core", "$rbx"},
    {0x1c840b, kRes, "thread_sched_wait_running_turn", "$rbx"},
    {0x1c857d, kSus, "thread_sched_to_waiting_until_wakeup", "CFA-72"},
    {0x1c8b11, kSus, "rb_thread_schedule_limits", "CFA-48"},
    {0x1ca351, kR, "thread_sched_to_running", "$rbp"},
    {0x1ca791, kSus, "wait_for_single_fd_blocking_region", "CFA-168"},
    {0x1caa2a, kR, "ubf_waiting", "$rbx"},
    {0x1cae1f, kSus, "rb_ractor_sched_sleep", "CFA-72"},
    {0x1ccf5d, kSus, "thread_sched_wait_events", "CFA-80"},
    {0x1cd7c0, kSus, "native_cond_sleep", "CFA-144"},
    {0x1ce610, kSus, "thread_start_func_2", "CFA-408"},
    {0x1ce63b, kE, "thread_start_func_2", "CFA-408"},
    {0x1ce794, kSus, "thread_start_func_2", "CFA-408"},
    {0x1ce7bf, kE, "thread_start_func_2", "CFA-408"},
    {0x1cebe1, kRes, "co_start", "$rbx"},
    {0x1d0200, kSus, "do_select", "current"},
    {0x1d1440, kSus, "rb_nogvl", "current"},
    {0x1d1ade, kSus, "rb_thread_io_blocking_call", "$rbx"},
    {0x1d21a5, kSus, "rb_thread_call_with_gvl", "current"},
};

// §4: GC hook-check sites (file offsets).
const std::vector<uint64_t> kGcEnter338 = {0x140fb8, 0x1424dc, 0x140807, 0x13b69c};
const std::vector<uint64_t> kGcExit338 = {0x14147d, 0x142542, 0x142637, 0x140827, 0x13b738, 0x51b8d};
const std::vector<uint64_t> kGcEnter345 = {0x816eb, 0x83a94, 0x8403b, 0x772be};
const std::vector<uint64_t> kGcExit345 = {0x81b4e, 0x83ab4, 0x840a4, 0x84192, 0x77428};

int RegByName(const std::string& name) {
  static const char* kNames[] = {"rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp",
                                 "r8",  "r9",  "r10", "r11", "r12", "r13", "r14", "r15"};
  for (int i = 0; i < RV_REG_COUNT; ++i) {
    if (name == kNames[i]) return i;
  }
  return -1;
}

// The reference's description of `th` as the ThLocation the site finder must produce at `pc`.
ThLocation ExpectedLocation(DwarfInfo& dwarf, uint64_t pc, const std::string& th) {
  if (th == "current") return kCurrent;
  if (th.rfind("CFA-", 0) == 0) {
    int reg = -1;
    int64_t cfa = 0;
    EXPECT_TRUE(dwarf.CfaAt(pc, &reg, &cfa)) << std::hex << pc;
    return {RV_LOC_MEM, static_cast<uint8_t>(reg), static_cast<int32_t>(cfa - std::stoll(th.substr(4)))};
  }
  size_t sign = th.find_first_of("+-", 1);
  std::string reg = th.substr(1, sign == std::string::npos ? std::string::npos : sign - 1);
  int32_t off = sign == std::string::npos ? 0 : std::stoi(th.substr(sign));
  return {RV_LOC_REG, static_cast<uint8_t>(RegByName(reg)), off};
}

struct RealBinary {
  const char* ruby;
  const char* elf;
  const char* version;
  const std::vector<RefSite>* hooks;
  const std::vector<uint64_t>* gc_enter;
  const std::vector<uint64_t>* gc_exit;
  uint64_t sleep_entry;
  uint64_t mutex_entry;        // rb_mutex_lock
  uint64_t synchronize_entry;  // rb_mutex_synchronize_m
  uint64_t synchronize_c_api;  // rb_mutex_synchronize (excluded caller)
  uint32_t serial_offset;
};

class RealBinaryTest : public ::testing::TestWithParam<RealBinary> {};

TEST_P(RealBinaryTest, ReproducesTheReferenceTables) {
  const RealBinary& b = GetParam();
  std::string dir = testing::TestRuby(b.ruby);
  if (dir.empty()) GTEST_SKIP() << "test Ruby " << b.ruby << " not built (tools/build-test-rubies.sh)";
  Result<ElfFile> elf = ElfFile::Open(dir + "/" + b.elf);
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  auto t0 = std::chrono::steady_clock::now();
  Result<SiteSet> set = FindSites(*elf, b.version);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(set.ok()) << set.error().ToString();
  std::printf("FindSites(%s): %zu sites in %.1f ms\n%s", b.ruby, set->sites.size(), ms, FormatSites(*set).c_str());
  // The time is printed, not asserted: a timed unit test fails on a loaded machine or under ASan; analysis speed is
  // benchmarks/startup.py's to measure.

  std::unique_ptr<DwarfInfo> dwarf = DwarfInfo::Open(*elf);
  ASSERT_NE(dwarf, nullptr);
  // Every probe of these builds sits on an instruction the kernel emulates (no single-step exception): the check
  // itself (a push at a function entry) or the next branch on its straight-line path.
  Result<Disassembler> dis = Disassembler::Create();
  ASSERT_TRUE(dis.ok());
  for (const ProbeSite& s : set->sites) {
    SCOPED_TRACE(::testing::Message() << s.function << " check 0x" << std::hex << s.check());
    const cs_insn* insn = dis->DecodeAt(*elf, s.vaddr);
    ASSERT_NE(insn, nullptr);
    EXPECT_TRUE(IsKernelEmulated(*insn)) << insn->mnemonic << " " << insn->op_str;
    EXPECT_GE(s.vaddr, s.check());
    if (s.method == "hook-site" || s.method == "gc-hook-site") {
      EXPECT_GT(s.vaddr, s.check()) << "a hook check (cmp/test) is never emulated itself";
    }
  }
  // Keyed by the check's offset: the reference tables list the checks.
  std::map<uint64_t, const ProbeSite*> hook_sites, gc_enter, gc_exit;
  std::vector<const ProbeSite*> sleep, mutex;
  for (const ProbeSite& s : set->sites) {
    if (s.method == "hook-site") hook_sites[s.check_file_offset()] = &s;
    if (s.event == RV_EV_GC_ENTER) gc_enter[s.check_file_offset()] = &s;
    if (s.event == RV_EV_GC_EXIT) gc_exit[s.check_file_offset()] = &s;
    if (s.event == RV_EV_SLEEP_ENTER) sleep.push_back(&s);
    if (s.event == RV_EV_MUTEX_LOCK_ENTER) mutex.push_back(&s);
  }
  EXPECT_EQ(hook_sites.size(), b.hooks->size());
  for (const RefSite& ref : *b.hooks) {
    SCOPED_TRACE(::testing::Message() << "site 0x" << std::hex << ref.offset);
    ASSERT_TRUE(hook_sites.count(ref.offset));
    const ProbeSite& s = *hook_sites[ref.offset];
    EXPECT_EQ(s.event, ref.event) << EventKindName(s.event);
    EXPECT_TRUE(MatchesWithCloneSuffix(s.function, ref.function)) << s.function;
    // Where the tables put th at the check, and the same at the probe (nothing in between moves rsp or writes th).
    EXPECT_EQ(s.th, ExpectedLocation(*dwarf, s.check(), ref.th)) << FormatThLocation(s.th) << " vs " << ref.th;
    EXPECT_EQ(s.th, ExpectedLocation(*dwarf, s.vaddr, ref.th)) << FormatThLocation(s.th) << " vs " << ref.th;
    EXPECT_EQ(s.file_offset, s.vaddr) << "text vaddr equals file offset in these builds";
    // Cross-check with the independent source: the rsi load on the path to rb_thread_execute_hooks. Where several
    // places hold th (some SUSPENDED sites), DWARF may name another one; for the other events both name the same.
    if (s.event != RV_EV_THREAD_SUSPENDED) {
      ASSERT_TRUE(s.th_disasm.has_value());
      EXPECT_EQ(*s.th_disasm, s.th) << FormatThLocation(*s.th_disasm) << " vs " << FormatThLocation(s.th);
    }
  }
  auto offsets = [](const std::map<uint64_t, const ProbeSite*>& m) {
    std::vector<uint64_t> v;
    for (const auto& [off, s] : m) {
      v.push_back(off);
      EXPECT_EQ(s->th, kCurrent);
    }
    return v;
  };
  std::vector<uint64_t> want_enter = *b.gc_enter, want_exit = *b.gc_exit;
  std::sort(want_enter.begin(), want_enter.end());
  std::sort(want_exit.begin(), want_exit.end());
  EXPECT_EQ(offsets(gc_enter), want_enter);
  EXPECT_EQ(offsets(gc_exit), want_exit);

  ASSERT_EQ(sleep.size(), 1u);
  EXPECT_EQ(sleep[0]->check_file_offset(), b.sleep_entry);
  EXPECT_EQ(sleep[0]->function, "rb_f_sleep");
  // Mutex#lock (rb_mutex_lock) and Mutex#synchronize (rb_mutex_synchronize_m): the Ruby-level methods.
  ASSERT_EQ(mutex.size(), 2u);
  EXPECT_EQ(mutex[0]->function, "rb_mutex_lock");
  EXPECT_EQ(mutex[0]->check_file_offset(), b.mutex_entry);
  EXPECT_EQ(mutex[1]->function, "rb_mutex_synchronize_m");
  EXPECT_EQ(mutex[1]->check_file_offset(), b.synchronize_entry);
  EXPECT_EQ(mutex[0]->exclude_caller_start, b.synchronize_c_api);

  // Struct offsets: DWARF and the built-in table must agree.
  EXPECT_EQ(set->offsets_source, "dwarf");
  rv_offsets table{};
  uint32_t main_serial = 99;
  int major = 0, minor = 0, teeny = 0;
  ASSERT_TRUE(ParseRubyVersion(b.version, &major, &minor, &teeny));
  ASSERT_TRUE(TableOffsets(major, minor, &table, &main_serial));
  EXPECT_EQ(set->offsets.th_serial, table.th_serial);
  EXPECT_EQ(set->offsets.th_nt, table.th_nt);
  EXPECT_EQ(set->offsets.nt_tid, table.nt_tid);
  EXPECT_EQ(set->offsets.th_serial, b.serial_offset);
  EXPECT_EQ(set->main_thread_serial, 1u);
}

TEST_P(RealBinaryTest, CachedResultEqualsFreshResult) {
  const RealBinary& b = GetParam();
  std::string dir = testing::TestRuby(b.ruby);
  if (dir.empty()) GTEST_SKIP() << "test Ruby " << b.ruby << " not built";
  TempDir cache;
  std::string path = dir + "/" + b.elf;
  Result<SiteSet> fresh = LoadOrFindSites(path, b.version, cache.path());
  ASSERT_TRUE(fresh.ok()) << fresh.error().ToString();
  auto t0 = std::chrono::steady_clock::now();
  Result<SiteSet> cached = LoadOrFindSites(path, b.version, cache.path());
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(cached.ok());
  EXPECT_EQ(SiteSetToJson(*cached), SiteSetToJson(*fresh));
  std::printf("LoadOrFindSites(%s) from cache: %.1f ms\n", b.ruby, ms);
}

INSTANTIATE_TEST_SUITE_P(
    TestRubies, RealBinaryTest,
    ::testing::Values(RealBinary{"3.3.8-shared", "lib/libruby.so.3.3.8", "3.3.8", &kRef338, &kGcEnter338,
                                 &kGcExit338, 0x204cb0, 0x2b4260, 0x2b42a0, 0x2b4270, 200},
                      RealBinary{"3.4.5-static", "bin/ruby", "3.4.5", &kRef345, &kGcEnter345, &kGcExit345, 0x11ad30,
                                 0x1c9ec0, 0x1c9ed0, 0x1cc0f0, 204}),
    [](const ::testing::TestParamInfo<RealBinary>& info) {
      return std::string(info.param.version[2] == '3' ? "Ruby338Shared" : "Ruby345Static");
    });

// --gc-probes=fallback on the test Rubies: the GC hook-check sites are replaced by entry + return probes of the
// three GC functions (gc.c 3.3.8 / gc/default/default.c 3.4.5; addresses from their .symtab), nothing else changes.
TEST(RealBinaryGcFallbackTest, ReplacesTheGcHookSitesWithTheGcFunctions) {
  struct Case {
    const char* ruby;
    const char* elf;
    const char* version;
    std::map<std::string, uint64_t> functions;
  };
  const Case cases[] = {
      {"3.3.8-shared", "lib/libruby.so.3.3.8", "3.3.8",
       {{"gc_start", 0x140ee0}, {"gc_rest.part.0", 0x142480}, {"gc_continue", 0x1407b0}}},
      {"3.4.5-static", "bin/ruby", "3.4.5",
       {{"gc_start", 0x815f0}, {"gc_rest.part.0", 0x83fe0}, {"gc_continue", 0x83a40}}},
  };
  int ran = 0;
  for (const Case& c : cases) {
    std::string dir = testing::TestRuby(c.ruby);
    if (dir.empty()) continue;
    ++ran;
    SCOPED_TRACE(c.ruby);
    Result<ElfFile> elf = ElfFile::Open(dir + "/" + c.elf);
    ASSERT_TRUE(elf.ok());
    Result<SiteSet> set = FindSites(*elf, c.version);
    ASSERT_TRUE(set.ok());
    const SiteSet before = *set;
    ASSERT_TRUE(UseGcFunctionProbes(*elf, &*set).ok());
    std::map<std::string, std::pair<int, int>> gc;  // function -> (entries, returns)
    size_t others = 0;
    for (const ProbeSite& s : set->sites) {
      if (s.event == RV_EV_GC_ENTER || s.event == RV_EV_GC_EXIT) {
        EXPECT_NE(s.method, "gc-hook-site");
        ASSERT_TRUE(c.functions.count(s.function)) << s.function;
        EXPECT_EQ(s.file_offset, c.functions.at(s.function)) << s.function;
        EXPECT_EQ(s.return_probe, s.event == RV_EV_GC_EXIT);
        (s.return_probe ? gc[s.function].second : gc[s.function].first)++;
      } else {
        ++others;
      }
    }
    EXPECT_EQ(gc.size(), 3u);
    for (const auto& [fn, n] : gc) EXPECT_EQ(n, std::make_pair(1, 1)) << fn;
    size_t others_before = 0;
    for (const ProbeSite& s : before.sites) {
      others_before += (s.event == RV_EV_GC_ENTER || s.event == RV_EV_GC_EXIT) ? 0 : 1;
    }
    EXPECT_EQ(others, others_before);
    EXPECT_TRUE(std::is_sorted(set->sites.begin(), set->sites.end(), [](const ProbeSite& a, const ProbeSite& b) {
      return a.file_offset < b.file_offset;
    }));
  }
  if (ran == 0) GTEST_SKIP() << "test Rubies not built (tools/build-test-rubies.sh)";
}

// A stripped copy (`strip`, `objcopy --strip-all`: no .symtab, no DWARF) must give the same sites as the binary
// with symbols: the same checks and probe offsets, events, th locations and entry probes. Only the function names
// (unknown without .symtab) and where each fact came from differ.
struct StripCase {
  const char* ruby;
  const char* elf;
  const char* version;
};

class StrippedCopyTest : public ::testing::TestWithParam<StripCase> {};

std::string SiteKey(const ProbeSite& s) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "check 0x%lx probe 0x%lx %s %s th %s exclude 0x%lx-0x%lx",
                static_cast<unsigned long>(s.check_file_offset()), static_cast<unsigned long>(s.file_offset),
                EventKindName(s.event).c_str(), s.method.c_str(), FormatThLocation(s.th).c_str(),
                static_cast<unsigned long>(s.exclude_caller_start), static_cast<unsigned long>(s.exclude_caller_end));
  return buf;
}

TEST_P(StrippedCopyTest, SitesEqualTheUnstrippedBinarys) {
  const StripCase& c = GetParam();
  std::string dir = testing::TestRuby(c.ruby);
  if (dir.empty()) GTEST_SKIP() << "test Ruby " << c.ruby << " not built (tools/build-test-rubies.sh)";
  const std::string original = dir + "/" + c.elf;
  Result<ElfFile> full = ElfFile::Open(original);
  ASSERT_TRUE(full.ok()) << full.error().ToString();
  ASSERT_TRUE(full->has_symtab());
  Result<SiteSet> want = FindSites(*full, c.version);
  ASSERT_TRUE(want.ok()) << want.error().ToString();
  // Every test Ruby's GC sites are hook checks or calls of rb_gc_event_hook (3.4.5-shared-yjit), which the stripped
  // copy must find too; function probes (the fallback) would need the symbol table.
  ASSERT_FALSE(std::any_of(want->sites.begin(), want->sites.end(),
                           [](const ProbeSite& s) { return s.method.rfind("gc-function-", 0) == 0; }))
      << FormatSites(*want);
  TempDir tmp;
  for (const char* tool : {"strip -o", "objcopy --strip-all"}) {
    SCOPED_TRACE(tool);
    const std::string copy = tmp.Join(std::string("stripped-") + (tool[0] == 's' ? "strip" : "objcopy"));
    const std::string cmd = tool[0] == 's' ? "strip -o '" + copy + "' '" + original + "'"
                                           : "objcopy --strip-all '" + original + "' '" + copy + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    Result<ElfFile> elf = ElfFile::Open(copy);
    ASSERT_TRUE(elf.ok()) << elf.error().ToString();
    ASSERT_FALSE(elf->has_symtab());
    ASSERT_FALSE(elf->FindSection(".debug_info").has_value());
    auto t0 = std::chrono::steady_clock::now();
    Result<SiteSet> got = FindSites(*elf, c.version);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(got.ok()) << got.error().ToString();
    std::printf("FindSites(stripped %s): %zu sites in %.1f ms\n%s%s", c.ruby, got->sites.size(), ms,
                FormatProvenance(*got).c_str(), FormatSites(*got).c_str());
    // th: DWARF's location where the binary has DWARF; the stripped copy has only the disassembly's, which the
    // unstripped analysis computes too (th_disasm, its cross-check). At every event but SUSPENDED the two are the
    // same place; at some SUSPENDED sites th is in several places at once, or DWARF says "optimized out" (then the
    // unstripped binary uses the current thread), and the disassembly names the rsi load the hook call itself uses.
    std::vector<std::string> want_keys, got_keys;
    for (ProbeSite s : want->sites) {
      if (s.method == "hook-site" && s.event == RV_EV_THREAD_SUSPENDED && s.th_disasm && *s.th_disasm != s.th) {
        std::printf("SUSPENDED 0x%lx: dwarf/current %s, disassembly %s\n", static_cast<unsigned long>(s.check()),
                    FormatThLocation(s.th).c_str(), FormatThLocation(*s.th_disasm).c_str());
        s.th = *s.th_disasm;
      }
      want_keys.push_back(SiteKey(s));
    }
    for (const ProbeSite& s : got->sites) got_keys.push_back(SiteKey(s));
    // The release-reason rules read these two function names; they are recognised without symbols too.
    for (size_t i = 0; i < want->sites.size() && i < got->sites.size(); ++i) {
      const std::string& w = want->sites[i].function;
      if (w == "thread_start_func_2" || w == "rb_thread_schedule_limits") {
        EXPECT_EQ(got->sites[i].function, w) << "site 0x" << std::hex << want->sites[i].check();
      }
      if (got->sites[i].function == "thread_start_func_2" || got->sites[i].function == "rb_thread_schedule_limits") {
        EXPECT_EQ(got->sites[i].function, w) << "site 0x" << std::hex << want->sites[i].check();
      }
    }
    EXPECT_EQ(got_keys, want_keys) << "unstripped:\n" << FormatSites(*want);
    for (size_t i = 0; i < want->sites.size() && i < got->sites.size(); ++i) {
      const ProbeSite &w = want->sites[i], &g = got->sites[i];
      if (w.event != RV_EV_THREAD_SUSPENDED && w.method == "hook-site") {
        EXPECT_EQ(g.th, w.th) << "th at a non-SUSPENDED site must be DWARF's own location, 0x" << std::hex << w.check();
      }
    }
    for (const ProbeSite& s : got->sites) {
      if (s.method == "hook-site") {
        EXPECT_NE(s.th_source, "dwarf");
      }
    }
    EXPECT_EQ(got->offsets.th_nt, want->offsets.th_nt);
    EXPECT_EQ(got->offsets.nt_tid, want->offsets.nt_tid);
    EXPECT_EQ(got->offsets.th_serial, want->offsets.th_serial);
    EXPECT_EQ(got->main_thread_serial, want->main_thread_serial);
    EXPECT_EQ(got->offsets_source, "table");
    // Every fact says where it came from, and none claims a symbol table the copy does not have.
    ASSERT_FALSE(got->provenance.empty());
    for (const auto& [fact, source] : got->provenance) {
      if (source.rfind("none:", 0) == 0) continue;  // a fact not found, saying why (e.g. "... without .symtab")
      EXPECT_EQ(source.find("symtab"), std::string::npos) << fact << ": " << source;
      EXPECT_EQ(source.find("dwarf"), std::string::npos) << fact << ": " << source;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TestRubies, StrippedCopyTest,
                         ::testing::Values(StripCase{"3.3.8-shared", "lib/libruby.so.3.3.8", "3.3.8"},
                                           StripCase{"3.4.5-static", "bin/ruby", "3.4.5"},
                                           StripCase{"3.4.5-shared-yjit", "lib/libruby.so.3.4.5", "3.4.5"}),
                         [](const ::testing::TestParamInfo<StripCase>& info) {
                           std::string n = info.param.ruby;
                           std::erase_if(n, [](char ch) { return ch == '.' || ch == '-'; });
                           return "Ruby" + n;
                         });

TEST(DebianRuby31Test, StrippedLibraryGivesTheRightErrors) {
  const std::string path = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1";
  if (!testing::FileExists(path)) GTEST_SKIP() << path << " absent";
  Result<ElfFile> elf = ElfFile::Open(path);
  ASSERT_TRUE(elf.ok());
  Result<SiteSet> real_version = FindSites(*elf, "3.1.2");
  ASSERT_FALSE(real_version.ok());
  EXPECT_EQ(real_version.error().code(), ErrorCode::kUnsupportedVersion);
  // Were it new enough, the missing symbol table would be the problem, and the message says how to fix it.
  Result<SiteSet> pretend = FindSites(*elf, "3.3.8");
  ASSERT_FALSE(pretend.ok());
  EXPECT_EQ(pretend.error().code(), ErrorCode::kNoSymbols);
  EXPECT_NE(pretend.error().message().find("build-id 862794fb"), std::string::npos) << pretend.error().message();
  EXPECT_NE(pretend.error().message().find("-dbgsym"), std::string::npos);
}

TEST(SiteCacheJsonTest, SymbolNamesThatAreNotUtf8AreReplacedNotThrown) {
  // A target's binary can name a function with any bytes (found by tests/fuzz's fuzz_elf).
  SiteSet set;
  set.build_id = "00ff";
  set.ruby_version = "3.4.5";
  set.offsets_source = "table";
  set.hooks_vaddr = 0x2000;
  ProbeSite site;
  site.vaddr = 0x1000;
  site.file_offset = 0x1000;
  site.event = RV_EV_THREAD_READY;
  site.function = "fx_\xaf\xff";
  site.method = "hook-site";
  site.th_source = "current";
  set.sites.push_back(site);
  const std::string json = SiteSetToJson(set);
  Result<SiteSet> back = SiteSetFromJson(json);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  ASSERT_EQ(back->sites.size(), 1u);
  EXPECT_EQ(back->sites[0].function, "fx_\xef\xbf\xbd\xef\xbf\xbd");
}

}  // namespace
}  // namespace rvbpfd
