#include "sites/gc_hook_calls.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "elf/elf_fixtures.h"
#include "rvbpfd/abi.h"
#include "sites/sites.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::TempDir;

// A miniature 3.4 VM as a shared libruby built with semantic interposition leaves it: gc_start calls the exported
// rb_gc_event_hook (through the PLT, or its GOT slot with -DRV_NO_PLT) with GC_ENTER and GC_EXIT in esi; other
// callers pass FREEOBJ (0x200000) or an esi from a register. The GC code is written in assembly so the shapes are
// exact: gc_join's call (-DRV_JOIN) is reached both after `mov $GC_ENTER, %esi` and from a branch that skips it. The thread hook
// list and the symbols FindSites needs are there too.
constexpr const char* kSource = R"(
unsigned int ruby_vm_event_flags;
void *rb_internal_thread_event_hooks;
void *volatile rv_sink;
void rb_gc_event_hook(void *obj, unsigned int event) {
  if (ruby_vm_event_flags & event) rv_sink = obj;
}
void rb_thread_execute_hooks(unsigned event, void *th) { rv_sink = th; rv_sink = (void *)(unsigned long)event; }
void fx_started(void *th) { if (rb_internal_thread_event_hooks) rb_thread_execute_hooks(1, th); }
void rb_f_sleep(void) { rv_sink = 0; }
void rb_mutex_lock(void) { rv_sink = 0; }
void rb_mutex_synchronize_m(void) { rb_mutex_lock(); }
#ifdef RV_NO_PLT
#define CALL "call *rb_gc_event_hook@GOTPCREL(%rip)\n"
#else
#define CALL "call rb_gc_event_hook@PLT\n"
#endif
#define FN(name, body) \
  ".globl " #name "\n.type " #name ", @function\n" #name ":\n.cfi_startproc\n" body ".cfi_endproc\n" \
  ".size " #name ", .-" #name "\n"
__asm__(".text\n"
  FN(gc_start, "push %rbx\n.cfi_def_cfa_offset 16\nmov %rdi, %rbx\nmov $0x2000000, %esi\nxor %edi, %edi\n" CALL
               "mov %rbx, %rax\nmov $0x4000000, %esi\nxor %edi, %edi\n" CALL "pop %rbx\n"
               ".cfi_def_cfa_offset 8\nret\n")
  FN(gc_sweep_step, "sub $8, %rsp\n.cfi_def_cfa_offset 16\nmov $0x200000, %esi\n" CALL "add $8, %rsp\n"
                    ".cfi_def_cfa_offset 8\nret\n")
  FN(gc_by_register, "sub $8, %rsp\n.cfi_def_cfa_offset 16\nmov %edx, %esi\n" CALL "add $8, %rsp\n"
                     ".cfi_def_cfa_offset 8\nret\n"));
#ifdef RV_JOIN
__asm__(".text\n"
  FN(gc_join, "sub $8, %rsp\n.cfi_def_cfa_offset 16\ntest %edi, %edi\njne 1f\nmov $0x2000000, %esi\n1:\n" CALL
              "add $8, %rsp\n.cfi_def_cfa_offset 8\nret\n"));
#endif
)";

class GcHookCallsTest : public ::testing::Test {
 protected:
  std::string Build(const std::string& name, const std::string& flags) {
    const std::string path = dir_.Join(name);
    EXPECT_TRUE(CompileC(kSource, path, "-shared -fPIC -O2 -g " + flags));
    return path;
  }
  TempDir dir_;
};

std::vector<ProbeSite> GcSites(const SiteSet& set) {
  std::vector<ProbeSite> out;
  for (const ProbeSite& s : set.sites) {
    if (s.event == RV_EV_GC_ENTER || s.event == RV_EV_GC_EXIT) out.push_back(s);
  }
  return out;
}

std::string Provenance(const SiteSet& set, const std::string& fact) {
  for (const auto& [f, source] : set.provenance) {
    if (f == fact) return source;
  }
  return "";
}

// Each case: the two GC calls in gc_start become one GC_ENTER and one GC_EXIT site on the call instruction; the
// NEWOBJ and FREEOBJ calls are not sites; the provenance names the route.
TEST_F(GcHookCallsTest, CallsWithAGcEventInEsiAreTheGcSites) {
  struct Case {
    const char* name;
    const char* flags;
    const char* via;
  };
  for (const Case& c : {Case{"libgc-plt.so", "", "PLT"}, Case{"libgc-got.so", "-DRV_NO_PLT", "GOT"}}) {
    SCOPED_TRACE(c.name);
    Result<ElfFile> elf = ElfFile::Open(Build(c.name, c.flags));
    ASSERT_TRUE(elf.ok()) << elf.error().ToString();
    Result<SiteSet> set = FindSites(*elf, "3.4.5");
    ASSERT_TRUE(set.ok()) << set.error().ToString();
    std::vector<ProbeSite> gc = GcSites(*set);
    ASSERT_EQ(gc.size(), 2u) << FormatSites(*set);
    EXPECT_EQ(gc[0].event, RV_EV_GC_ENTER);
    EXPECT_EQ(gc[1].event, RV_EV_GC_EXIT);
    Result<Disassembler> dis = Disassembler::Create();
    ASSERT_TRUE(dis.ok());
    for (const ProbeSite& s : gc) {
      EXPECT_EQ(s.function, "gc_start");
      EXPECT_EQ(s.method, "gc-hook-site");
      EXPECT_EQ(s.th.kind, RV_LOC_CURRENT);
      const cs_insn* insn = dis->DecodeAt(*elf, s.vaddr);
      ASSERT_NE(insn, nullptr);
      EXPECT_TRUE(insn->id == X86_INS_CALL || insn->id == X86_INS_JMP) << insn->mnemonic;
    }
    const std::string prov = Provenance(*set, "GC enter/exit");
    EXPECT_NE(prov.find("2 calls of rb_gc_event_hook"), std::string::npos) << prov;
    EXPECT_NE(prov.find(c.via), std::string::npos) << prov;
  }
}

// gc_by_register's esi is not an immediate on its straight line: no site. gc_join's call is reached after the mov
// and from the `jne` that skips it: counted as ambiguous, and FindSites then does not trust any call (no GC site
// from calls; the GC function probes take over).
TEST_F(GcHookCallsTest, AnEsiThatAnotherPathMaySetIsNotTrusted) {
  Result<ElfFile> elf = ElfFile::Open(Build("libgc-join.so", "-DRV_JOIN"));
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  Result<Disassembler> dis = Disassembler::Create();
  ASSERT_TRUE(dis.ok());
  std::vector<CodeRange> functions;
  for (const ElfSymbol& s : elf->symbols()) {
    if (s.from_symtab && s.type == STT_FUNC && s.size > 0) functions.push_back({s.value, s.value + s.size});
  }
  const GcHookCalls calls = FindGcHookCalls(*elf, *dis, functions, {});
  ASSERT_EQ(calls.calls.size(), 2u);  // gc_start's
  EXPECT_EQ(calls.ambiguous, 1u);     // gc_join's
  std::optional<ElfSymbol> gc_start = elf->FindSymbol("gc_start");
  ASSERT_TRUE(gc_start);
  for (const GcHookCall& c : calls.calls) {
    EXPECT_GE(c.vaddr, gc_start->value);
    EXPECT_LT(c.vaddr, gc_start->value + gc_start->size);
  }
  EXPECT_EQ(calls.via, "PLT");

  // A branch from code elsewhere (a .cold part) landing between gc_start's first mov and call: that call is ambiguous.
  const uint64_t first_call = calls.calls[0].vaddr;
  const GcHookCalls outside = FindGcHookCalls(*elf, *dis, functions, {first_call});
  EXPECT_EQ(outside.calls.size(), 1u);
  EXPECT_EQ(outside.ambiguous, 2u);

  // FindSites trusts no call then (gc_start's certain ones included: they would stand beside a missed event) and
  // says why in the provenance.
  Result<SiteSet> set = FindSites(*elf, "3.4.5");
  ASSERT_TRUE(set.ok()) << set.error().ToString();
  for (const ProbeSite& s : GcSites(*set)) EXPECT_NE(s.method, "gc-hook-site") << FormatSites(*set);
  const std::string prov = Provenance(*set, "GC enter/exit");
  EXPECT_NE(prov.find("whose event a branch may change"), std::string::npos) << prov;
}

}  // namespace
}  // namespace rvbpfd
