// How a sample finds its EC (src/stacks/ec_route.h, bpf/ruby_ec.h):
//  - the route computed from the test Rubies' VM binaries (3.4.5 static: local-exec at fs-0x50, cross-checked against
//    rb_current_ec_noinline's instruction and glibc's layout rule; 3.3.8 shared: the general-dynamic GOT slot that
//    rb_current_ec_noinline itself passes to __tls_get_addr, symbol offset 0x30);
//  - the per-process resolution (module id, TLSDESC descriptor) against fake memory, including "not relocated yet"
//    and implausible values;
//  - end to end with the real glibc: small libraries built with -mtls-dialect=gnu2 (TLSDESC) and the default dialect
//    (general-dynamic) are dlopen'ed into this test, a value is stored in their thread-local ruby_current_ec from two
//    threads, and the same C code BPF runs finds each thread's value from that thread's fsbase; a local-exec
//    executable prints &ruby_current_ec - fsbase and the route computed from its file must say the same.
#include <asm/prctl.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>

#include "elf/elf_file.h"
#include "elf/elf_fixtures.h"
#include "fake_memory.h"
#include "sites/disasm.h"
#include "stacks/ec_route.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"

namespace rvbpfd {
namespace {

using testing::CompileC;
using testing::TempDir;
using testing::TestRuby;

RubyOffsets Offsets(const ElfFile& elf, int major, int minor) {
  OffsetsReport report;
  Result<RubyOffsets> off = OffsetsForBinary(elf, major, minor, &report);
  EXPECT_TRUE(off.ok());
  EXPECT_TRUE(report.mismatches.empty()) << report.mismatches.front();
  return off.ok() ? *off : RubyOffsets{};
}

// The RIP-relative address rb_current_ec_noinline loads into rdi before calling __tls_get_addr: the tls_index
// {module, offset} of ruby_current_ec that the program itself uses.
std::optional<uint64_t> TlsIndexUsedByCode(const ElfFile& elf) {
  std::optional<ElfSymbol> fn = elf.FindSymbol("rb_current_ec_noinline");
  if (!fn) return std::nullopt;
  Result<Disassembler> d = Disassembler::Create();
  if (!d) return std::nullopt;
  std::optional<uint64_t> target;
  d->DecodeRange(elf.BytesAt(fn->value, fn->size), fn->value, [&](const cs_insn& insn) {
    if (insn.id == X86_INS_LEA && RipRelativeTarget(insn)) {
      target = RipRelativeTarget(insn);
      return false;
    }
    return true;
  });
  return target;
}

TEST(EcRouteRubyTest, StaticRuby345IsLocalExecAtFsMinus0x50) {
  const std::string dir = TestRuby("3.4.5-static");
  if (dir.empty()) GTEST_SKIP() << "3.4.5-static not built (tools/build-test-rubies.sh)";
  Result<ElfFile> elf = ElfFile::Open(dir + "/bin/ruby");
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  const RubyOffsets off = Offsets(*elf, 3, 4);
  const EcRoute r = ComputeEcRoute(*elf, off);
  EXPECT_EQ(r.kind, EcTlsKind::kLocalExec) << DescribeEcRoute(r);
  EXPECT_EQ(r.tls_symbol_value, 0x30u);
  // The reference measured %fs:-0x50 (cruby-frame-walker.md §1.3); both ways of computing it must agree.
  EXPECT_EQ(r.tp_offset, -0x50);
  ASSERT_TRUE(r.tp_offset_from_code.has_value());
  EXPECT_EQ(*r.tp_offset_from_code, -0x50);
  ASSERT_TRUE(r.tp_offset_from_layout.has_value());
  EXPECT_EQ(*r.tp_offset_from_layout, -0x50);
  EXPECT_EQ(DescribeEcRoute(r), "local-exec fs-0x50 (from rb_current_ec_noinline)");
  std::optional<ElfSymbol> vm = elf->FindSymbol("ruby_current_vm_ptr");
  ASSERT_TRUE(vm.has_value());
  EXPECT_EQ(r.vm_ptr_vaddr, vm->value);
  // The ractor route's offsets, from DWARF (reference §4: 48 / 32 / 384).
  EXPECT_EQ(r.ec_thread_ptr, 48u);
  EXPECT_EQ(r.vm_main_ractor, 32u);
  EXPECT_EQ(r.ractor_running_ec, 384u);

  // Per process it needs no memory at all.
  testing::FakeMemory mem;
  Result<std::optional<rv_proc_ec>> pe = ResolveProcessEc(r, 3, 0x555500000000, mem);
  ASSERT_TRUE(pe.ok() && pe->has_value());
  EXPECT_EQ(mem.reads(), 0u);
  EXPECT_EQ((*pe)->mode, uint32_t{RV_EC_TLS_TP_OFFSET});
  EXPECT_EQ((*pe)->tp_offset, -0x50);
  EXPECT_EQ((*pe)->binary, 3u);
  EXPECT_EQ((*pe)->vm_ptr, 0x555500000000 + vm->value);
}

TEST(EcRouteRubyTest, SharedLibruby338IsGeneralDynamicThroughTheCodesOwnGotSlot) {
  const std::string dir = TestRuby("3.3.8-shared");
  if (dir.empty()) GTEST_SKIP() << "3.3.8-shared not built (tools/build-test-rubies.sh)";
  Result<ElfFile> elf = ElfFile::Open(dir + "/lib/libruby.so.3.3.8");
  ASSERT_TRUE(elf.ok()) << elf.error().ToString();
  const EcRoute r = ComputeEcRoute(*elf, Offsets(*elf, 3, 3));
  // gcc's default TLS dialect: no TLSDESC relocation, DTPMOD64 slots (reference §1.3).
  EXPECT_TRUE(elf->DynamicRelocations(R_X86_64_TLSDESC).empty());
  EXPECT_EQ(r.kind, EcTlsKind::kDtv) << DescribeEcRoute(r);
  EXPECT_EQ(r.tls_symbol_value, 0x30u);
  std::optional<uint64_t> used = TlsIndexUsedByCode(*elf);
  ASSERT_TRUE(used.has_value()) << "rb_current_ec_noinline has no lea of a tls_index";
  EXPECT_EQ(r.got_vaddr, *used);
  // Its file offset: the data segment is mapped 0x1000 below its vaddr in the file.
  std::optional<uint64_t> expected_offset;
  for (const ElfSegment& seg : elf->load_segments()) {
    if (r.got_vaddr >= seg.vaddr && r.got_vaddr < seg.vaddr + seg.filesz) {
      expected_offset = seg.offset + (r.got_vaddr - seg.vaddr);
    }
  }
  ASSERT_TRUE(expected_offset.has_value());
  EXPECT_EQ(r.got_file_offset, *expected_offset);
  EXPECT_NE(r.got_file_offset, r.got_vaddr) << "the reservation view would read other bytes: the check matters";
  EXPECT_TRUE(EcRouteSlotInPlace(r, r.got_file_offset));
  EXPECT_FALSE(EcRouteSlotInPlace(r, r.got_vaddr)) << "ld.so's first reservation maps the file from offset 0";
  EXPECT_EQ(r.ec_thread_ptr, 48u);
  EXPECT_EQ(r.vm_main_ractor, 32u);
  EXPECT_EQ(r.ractor_running_ec, 384u);
  rv_walk_config wc{};
  ApplyEcRoute(r, &wc);
  EXPECT_EQ(wc.ec_thread_ptr, 48u);
  EXPECT_EQ(wc.vm_main_ractor, 32u);
  EXPECT_EQ(wc.ractor_running_ec, 384u);

  // Per process: the module id ld.so wrote into that slot.
  const uint64_t bias = 0x7f0000000000;
  testing::FakeMemory mem;
  mem.Map(bias + r.got_vaddr, 16);
  Result<std::optional<rv_proc_ec>> pending = ResolveProcessEc(r, 0, bias, mem);
  ASSERT_TRUE(pending.ok());
  EXPECT_FALSE(pending->has_value()) << "module id 0: ld.so has not relocated libruby yet";
  mem.Put64(bias + r.got_vaddr, 1);
  Result<std::optional<rv_proc_ec>> pe = ResolveProcessEc(r, 0, bias, mem);
  ASSERT_TRUE(pe.ok() && pe->has_value());
  EXPECT_EQ((*pe)->mode, uint32_t{RV_EC_TLS_DTV});
  EXPECT_EQ((*pe)->dtv_module, 1u);
  EXPECT_EQ((*pe)->tls_offset, 0x30u);
  EXPECT_EQ((*pe)->dtv_offset, 8u);
  EXPECT_EQ((*pe)->dtv_entry_size, 16u);
}

EcRoute FakeRoute(EcTlsKind kind) {
  EcRoute r;
  r.kind = kind;
  r.tls_symbol_value = 0x30;
  r.got_vaddr = 0x1000;
  r.vm_ptr_vaddr = 0x2000;
  return r;
}

TEST(EcRouteResolveTest, TlsDescriptorResolvedToStaticTlsGivesItsOffset) {
  testing::FakeMemory mem;
  mem.Map(0x10000, 0x3000);
  const EcRoute r = FakeRoute(EcTlsKind::kTlsDesc);
  Result<std::optional<rv_proc_ec>> pending = ResolveProcessEc(r, 1, 0x10000, mem);
  ASSERT_TRUE(pending.ok());
  EXPECT_FALSE(pending->has_value()) << "an unresolved descriptor is not an error, just early";
  mem.Put64(0x11000, 0x7f00deadbeef);           // _dl_tlsdesc_return
  mem.Put64(0x11008, static_cast<uint64_t>(-0x1d0));  // offset from the thread pointer
  Result<std::optional<rv_proc_ec>> pe = ResolveProcessEc(r, 1, 0x10000, mem);
  ASSERT_TRUE(pe.ok() && pe->has_value());
  EXPECT_EQ((*pe)->mode, uint32_t{RV_EC_TLS_TP_OFFSET});
  EXPECT_EQ((*pe)->tp_offset, -0x1d0);
  EXPECT_EQ((*pe)->vm_ptr, 0x12000u);
  // A local-dynamic descriptor resolves to the module's block start: the variable's offset is added.
  EcRoute ld = r;
  ld.tlsdesc_extra = 0x30;
  Result<std::optional<rv_proc_ec>> pe_ld = ResolveProcessEc(ld, 1, 0x10000, mem);
  ASSERT_TRUE(pe_ld.ok() && pe_ld->has_value());
  EXPECT_EQ((*pe_ld)->tp_offset, -0x1d0 + 0x30);
}

TEST(EcRouteResolveTest, DynamicTlsDescriptorFollowsItsTlsIndexThroughTheDtv) {
  testing::FakeMemory mem;
  mem.Map(0x10000, 0x3000);
  mem.Map(0x900000, 24);
  const EcRoute r = FakeRoute(EcTlsKind::kTlsDesc);
  mem.Put64(0x11000, 0x7f00deadbeef);  // _dl_tlsdesc_dynamic
  mem.Put64(0x11008, 0x900000);        // -> struct tlsdesc_dynamic_arg {tls_index {module, offset}, gen_count}
  mem.Put64(0x900000, 4);
  mem.Put64(0x900008, 0x30);
  Result<std::optional<rv_proc_ec>> pe = ResolveProcessEc(r, 1, 0x10000, mem);
  ASSERT_TRUE(pe.ok() && pe->has_value());
  EXPECT_EQ((*pe)->mode, uint32_t{RV_EC_TLS_DTV});
  EXPECT_EQ((*pe)->dtv_module, 4u);
  EXPECT_EQ((*pe)->tls_offset, 0x30u);
}

TEST(EcRouteResolveTest, AGotSlotCountsOnlyOnceItsSegmentIsMappedInPlace) {
  for (EcTlsKind kind : {EcTlsKind::kDtv, EcTlsKind::kTlsDesc}) {
    EcRoute r = FakeRoute(kind);
    r.got_file_offset = 0x800;
    EXPECT_FALSE(EcRouteSlotInPlace(r, std::nullopt)) << "not mapped";
    EXPECT_FALSE(EcRouteSlotInPlace(r, 0x1000)) << "the reservation's view of another part of the file";
    EXPECT_TRUE(EcRouteSlotInPlace(r, 0x800));
  }
  EXPECT_TRUE(EcRouteHasGotSlot(FakeRoute(EcTlsKind::kDtv)));
  EXPECT_TRUE(EcRouteHasGotSlot(FakeRoute(EcTlsKind::kTlsDesc)));
  EXPECT_FALSE(EcRouteHasGotSlot(FakeRoute(EcTlsKind::kLocalExec)));
  // Routes without a slot do not wait for one.
  EXPECT_TRUE(EcRouteSlotInPlace(FakeRoute(EcTlsKind::kLocalExec), std::nullopt));
  EXPECT_TRUE(EcRouteSlotInPlace(FakeRoute(EcTlsKind::kNone), std::nullopt));
}

TEST(EcRouteResolveTest, UnreadableOrImplausibleValuesAreErrorsNotGuesses) {
  testing::FakeMemory mem;
  const EcRoute dtv = FakeRoute(EcTlsKind::kDtv);
  EXPECT_FALSE(ResolveProcessEc(dtv, 0, 0x10000, mem).ok()) << "unmapped GOT";
  mem.Map(0x11000, 16);
  mem.Put64(0x11000, uint64_t{1} << 40);
  EXPECT_FALSE(ResolveProcessEc(dtv, 0, 0x10000, mem).ok()) << "module id far beyond any process's";
  const EcRoute desc = FakeRoute(EcTlsKind::kTlsDesc);
  mem.Put64(0x11000, 0x7f00deadbeef);
  mem.Put64(0x11008, 0x900000);  // a dynamic argument that cannot be read
  EXPECT_FALSE(ResolveProcessEc(desc, 0, 0x10000, mem).ok());
  // No TLS route: an entry still goes in (binary index, ractor route), in mode NONE.
  Result<std::optional<rv_proc_ec>> none = ResolveProcessEc(FakeRoute(EcTlsKind::kNone), 2, 0x10000, mem);
  ASSERT_TRUE(none.ok() && none->has_value());
  EXPECT_EQ((*none)->mode, uint32_t{RV_EC_TLS_NONE});
  EXPECT_EQ((*none)->binary, 2u);
}

// ---- End to end with glibc: fixtures built at test time. ----------------------------------------------------------

// CRuby's declaration (vm.c): a hidden thread-local pointer, after other TLS so its offset is not 0.
constexpr const char* kLibSource = R"(
__thread long other_tls[5] = {1, 2, 3, 4, 5};
__attribute__((visibility("hidden"))) __thread void *ruby_current_ec;
__attribute__((noinline)) void *rb_current_ec_noinline(void) { return ruby_current_ec; }
void fixture_set_ec(void *ec) { ruby_current_ec = ec; other_tls[0]++; }
)";

// Local-dynamic: a static ruby_current_ec used together with another static TLS variable, so gcc asks for the module's
// block start (TLSDESC / DTPMOD64 with addend 0) and adds the variables' offsets in code.
constexpr const char* kLocalDynamicSource = R"(
static __thread long counter = 1;
static __thread void *ruby_current_ec;
void fixture_set_ec(void *ec) { ruby_current_ec = ec; counter++; }
long fixture_get(void) { return (long)ruby_current_ec + counter; }
)";

uint64_t ThreadPointer() {
  unsigned long fs = 0;
  if (syscall(SYS_arch_prctl, ARCH_GET_FS, &fs) != 0) return 0;
  return fs;
}

// A fake EC and thread that point at each other at the CRuby offsets (ec->thread_ptr +48, th->ec +48).
struct FakeRubyThread {
  uint64_t ec[8] = {};
  uint64_t th[8] = {};
  FakeRubyThread() {
    ec[6] = reinterpret_cast<uint64_t>(th);
    th[6] = reinterpret_cast<uint64_t>(ec);
  }
};

rv_walk_config TestWalkConfig() {
  rv_walk_config wc{};
  wc.thread_ec = 48;
  wc.ec_thread_ptr = 48;
  wc.vm_main_ractor = 32;
  wc.ractor_running_ec = 384;
  wc.valid = 1;
  return wc;
}

// Loads the library, resolves its route in this process and checks that each of two threads finds its own EC from
// its own fsbase through the BPF lookup code. Returns the resolved mode.
uint32_t CheckLibraryInProcess(const std::string& lib, EcTlsKind want_kind) {
  Result<ElfFile> elf = ElfFile::Open(lib);
  EXPECT_TRUE(elf.ok());
  if (!elf.ok()) return 0;
  RubyOffsets off;
  const EcRoute r = ComputeEcRoute(*elf, off);
  EXPECT_EQ(r.kind, want_kind) << DescribeEcRoute(r);
  // RTLD_NODELETE: the library (and its dynamic TLS blocks) outlives dlclose. LeakSanitizer scans every thread's DTV
  // at exit, and an entry glibc left behind for a closed module crashed its tracer (SIGSEGV, "Tracer caught signal 11")
  // on CI now and then.
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  EXPECT_NE(h, nullptr) << dlerror();
  if (h == nullptr) return 0;
  auto set_ec = reinterpret_cast<void (*)(void*)>(dlsym(h, "fixture_set_ec"));
  link_map* lm = nullptr;
  EXPECT_EQ(dlinfo(h, RTLD_DI_LINKMAP, &lm), 0);
  ProcessMemoryReader mem(getpid());
  uint32_t mode = 0;
  if (set_ec != nullptr && lm != nullptr) {
    Result<std::optional<rv_proc_ec>> pe = ResolveProcessEc(r, 0, lm->l_addr, mem);
    EXPECT_TRUE(pe.ok() && pe->has_value()) << (pe.ok() ? "not relocated" : pe.error().ToString());
    if (pe.ok() && pe->has_value()) {
      const rv_proc_ec proc = **pe;
      mode = proc.mode;
      const rv_walk_config wc = TestWalkConfig();
      FakeRubyThread main_thread, other_thread;
      auto check = [&](FakeRubyThread& t) {
        const uint64_t tp = ThreadPointer();
        EcLookup before = FindEcForThread(mem, proc, wc, 40, 24, tp, static_cast<uint32_t>(gettid()));
        // NULL before it is set (a new thread's DTV may not even have the block yet: unavailable, never TLS).
        EXPECT_EQ(before.route, uint32_t{RV_EC_ROUTE_NONE});
        set_ec(t.ec);
        EcLookup got = FindEcForThread(mem, proc, wc, 40, 24, tp, static_cast<uint32_t>(gettid()));
        EXPECT_EQ(got.route, uint32_t{RV_EC_ROUTE_TLS});
        EXPECT_EQ(got.ec, reinterpret_cast<uint64_t>(t.ec));
        EXPECT_EQ(got.th, reinterpret_cast<uint64_t>(t.th));
        // An EC whose thread does not point back is not trusted.
        t.th[6] = 0;
        EcLookup broken = FindEcForThread(mem, proc, wc, 40, 24, tp, static_cast<uint32_t>(gettid()));
        EXPECT_EQ(broken.route, uint32_t{RV_EC_ROUTE_NONE});
        EXPECT_TRUE(broken.tls_unavailable);
        t.th[6] = reinterpret_cast<uint64_t>(t.ec);
      };
      check(main_thread);
      std::thread([&] { check(other_thread); }).join();
      // The first thread still finds its own value, not the other thread's.
      EcLookup again = FindEcForThread(mem, proc, wc, 40, 24, ThreadPointer(), static_cast<uint32_t>(gettid()));
      EXPECT_EQ(again.th, reinterpret_cast<uint64_t>(main_thread.th));
      set_ec(nullptr);
      EcLookup cleared = FindEcForThread(mem, proc, wc, 40, 24, ThreadPointer(), static_cast<uint32_t>(gettid()));
      EXPECT_EQ(cleared.route, uint32_t{RV_EC_ROUTE_NONE});
      EXPECT_FALSE(cleared.tls_unavailable) << "an empty TLS slot is an answer (no Ruby here), not a failure";
    }
  }
  dlclose(h);
  return mode;
}

TEST(EcRouteFixtureTest, TlsDescLibraryFindsEachThreadsEc) {
  TempDir dir;
  const std::string lib = dir.Join("libtlsdesc.so");
  ASSERT_TRUE(CompileC(kLibSource, lib, "-shared -fPIC -O2 -mtls-dialect=gnu2"));
  Result<ElfFile> elf = ElfFile::Open(lib);
  ASSERT_TRUE(elf.ok());
  ASSERT_FALSE(elf->DynamicRelocations(R_X86_64_TLSDESC).empty()) << "gcc emitted no TLSDESC relocation";
  const uint32_t mode = CheckLibraryInProcess(lib, EcTlsKind::kTlsDesc);
  // dlopen'ed: glibc puts it in static TLS when its surplus has room (TP offset), else dynamic TLS (DTV).
  EXPECT_TRUE(mode == RV_EC_TLS_TP_OFFSET || mode == RV_EC_TLS_DTV) << mode;
}

TEST(EcRouteFixtureTest, GeneralDynamicLibraryFindsEachThreadsEcThroughTheDtv) {
  TempDir dir;
  const std::string lib = dir.Join("libgd.so");
  ASSERT_TRUE(CompileC(kLibSource, lib, "-shared -fPIC -O2"));
  EXPECT_EQ(CheckLibraryInProcess(lib, EcTlsKind::kDtv), uint32_t{RV_EC_TLS_DTV});
}

TEST(EcRouteFixtureTest, LocalDynamicDescriptorOfTheModuleBlockAddsTheSymbolOffset) {
  TempDir dir;
  const std::string lib = dir.Join("libld2.so");
  ASSERT_TRUE(CompileC(kLocalDynamicSource, lib, "-shared -fPIC -O2 -mtls-dialect=gnu2"));
  Result<ElfFile> elf = ElfFile::Open(lib);
  ASSERT_TRUE(elf.ok());
  std::optional<ElfSymbol> sym = elf->FindSymbol("ruby_current_ec");
  ASSERT_TRUE(sym.has_value());
  const EcRoute r = ComputeEcRoute(*elf, RubyOffsets{});
  ASSERT_EQ(r.kind, EcTlsKind::kTlsDesc) << DescribeEcRoute(r);
  EXPECT_EQ(r.tlsdesc_extra, sym->value) << "only the module-base descriptor exists in this fixture";
  const uint32_t mode = CheckLibraryInProcess(lib, EcTlsKind::kTlsDesc);
  EXPECT_TRUE(mode == RV_EC_TLS_TP_OFFSET || mode == RV_EC_TLS_DTV) << mode;
}

TEST(EcRouteFixtureTest, LocalDynamicGeneralDynamicModuleSlotIsEnoughForTheDtv) {
  TempDir dir;
  const std::string lib = dir.Join("libldgd.so");
  ASSERT_TRUE(CompileC(kLocalDynamicSource, lib, "-shared -fPIC -O2"));
  EXPECT_EQ(CheckLibraryInProcess(lib, EcTlsKind::kDtv), uint32_t{RV_EC_TLS_DTV});
}

// A local-exec executable reports &ruby_current_ec - fsbase itself; the route computed from its file must match,
// with 64-byte aligned TLS before it (the layout rule's rounding) and with or without rb_current_ec_noinline.
TEST(EcRouteFixtureTest, LocalExecOffsetMatchesWhatTheProgramComputes) {
  constexpr const char* kExe = R"(
#include <asm/prctl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>
__thread long before[3] = {1, 2, 3};
__thread char big[40] __attribute__((aligned(64)));
__attribute__((visibility("hidden"))) __thread void *ruby_current_ec;
#ifndef NO_FN
__attribute__((noinline)) void *rb_current_ec_noinline(void) { return ruby_current_ec; }
#else
void *rb_current_ec_noinline(void) { return 0; }
#endif
int main(void) {
  unsigned long fs = 0;
  syscall(SYS_arch_prctl, ARCH_GET_FS, &fs);
  big[0] = (char)before[0];
  printf("%ld\n", (long)((char *)&ruby_current_ec - (char *)fs));
  return rb_current_ec_noinline() != 0;
}
)";
  TempDir dir;
  for (const char* variant : {"", "-DNO_FN"}) {
    SCOPED_TRACE(variant);
    const std::string exe = dir.Join(std::string("le") + variant);
    ASSERT_TRUE(CompileC(kExe, exe, std::string("-O2 ") + variant));
    FILE* p = popen(exe.c_str(), "r");
    ASSERT_NE(p, nullptr);
    long measured = 0;
    ASSERT_EQ(fscanf(p, "%ld", &measured), 1);
    pclose(p);
    Result<ElfFile> elf = ElfFile::Open(exe);
    ASSERT_TRUE(elf.ok());
    const EcRoute r = ComputeEcRoute(*elf, RubyOffsets{});
    ASSERT_EQ(r.kind, EcTlsKind::kLocalExec) << DescribeEcRoute(r);
    EXPECT_EQ(r.tp_offset, measured);
    ASSERT_TRUE(r.tp_offset_from_layout.has_value());
    EXPECT_EQ(*r.tp_offset_from_layout, measured);
    // Without the mov %fs: form (the -DNO_FN stub returns 0), only the layout rule is used.
    EXPECT_EQ(r.tp_offset_from_code.has_value(), std::string(variant).empty());
  }
}

TEST(EcRouteFixtureTest, BinaryWithoutTheTlsSymbolHasNoTlsRouteButKeepsTheReason) {
  TempDir dir;
  const std::string lib = dir.Join("libnotls.so");
  ASSERT_TRUE(CompileC("int ruby_current_vm_ptr_holder; void *ruby_current_vm_ptr;", lib, "-shared -fPIC"));
  Result<ElfFile> elf = ElfFile::Open(lib);
  ASSERT_TRUE(elf.ok());
  const EcRoute r = ComputeEcRoute(*elf, RubyOffsets{});
  EXPECT_EQ(r.kind, EcTlsKind::kNone);
  EXPECT_NE(r.why_none.find("ruby_current_ec"), std::string::npos) << r.why_none;
  EXPECT_NE(r.vm_ptr_vaddr, 0u) << "the ractor route stays available";
}


// A stripped copy has no ruby_current_ec symbol (hidden since 3.3; .symtab gone): the route comes from the exported
// rb_errinfo's code and must be the one the symbols give.
TEST(EcRouteRubyTest, StrippedCopyGivesTheRouteOfTheBinaryWithSymbols) {
  struct Case {
    const char* ruby;
    const char* elf;
    int major, minor;
  };
  int ran = 0;
  for (const Case& c : {Case{"3.3.8-shared", "lib/libruby.so.3.3.8", 3, 3}, Case{"3.4.5-static", "bin/ruby", 3, 4},
                        Case{"3.4.5-shared-yjit", "lib/libruby.so.3.4.5", 3, 4}}) {
    const std::string dir = TestRuby(c.ruby);
    if (dir.empty()) continue;
    ++ran;
    SCOPED_TRACE(c.ruby);
    TempDir tmp;
    const std::string copy = tmp.Join("vm");
    ASSERT_EQ(std::system(("strip -o '" + copy + "' '" + dir + "/" + c.elf + "'").c_str()), 0);
    Result<ElfFile> full = ElfFile::Open(dir + "/" + c.elf);
    Result<ElfFile> stripped = ElfFile::Open(copy);
    ASSERT_TRUE(full.ok() && stripped.ok());
    ASSERT_FALSE(stripped->has_symtab());
    Result<RubyOffsets> off = RubyOffsets::ForVersion(c.major, c.minor);
    ASSERT_TRUE(off.ok());
    const EcRoute want = ComputeEcRoute(*full, *off);
    const EcRoute got = ComputeEcRoute(*stripped, *off);
    ASSERT_NE(want.kind, EcTlsKind::kNone) << want.why_none;
    EXPECT_EQ(got.kind, want.kind) << DescribeEcRoute(got) << " vs " << DescribeEcRoute(want);
    EXPECT_TRUE(got.from_exported_code);
    if (want.kind == EcTlsKind::kLocalExec) {
      EXPECT_EQ(got.tp_offset, want.tp_offset);
    } else {
      EXPECT_EQ(got.got_vaddr, want.got_vaddr);
      EXPECT_EQ(got.tls_symbol_value, want.tls_symbol_value);
      EXPECT_EQ(got.tlsdesc_extra, want.tlsdesc_extra);
    }
    std::printf("%s stripped: %s\n", c.ruby, DescribeEcRoute(got).c_str());
  }
  if (ran == 0) GTEST_SKIP() << "no test Ruby built";
}

}  // namespace
}  // namespace rvbpfd
