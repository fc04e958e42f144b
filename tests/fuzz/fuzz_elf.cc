// libFuzzer harness: the analysis rvbpfd runs on a target's VM binary, which the target controls: ElfFile's parsing
// and lookups, DWARF (variable locations, struct members, CFI), the probe-site finder with its cache serialisation,
// the GC fallback, the walker's struct offsets, the EC route, the stripped-binary global_symbols search, and the
// symbol-name pre-filter DiscoverTarget runs on executables (StringTablesName, checked against the full parse). The
// input is the binary's bytes, handed to ElfFile::Open through a memfd (no file system write per run). Seeds are
// small VM look-alikes compiled at build time (tests/fuzz/elf_seed.c) in several link modes.
#include <elf.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "elf/elf_file.h"
#include "elf/symbol_names.h"
#include "fuzz/fuzz_util.h"
#include "sites/dwarf_info.h"
#include "sites/sites.h"
#include "stacks/ec_route.h"
#include "stacks/global_symbols.h"
#include "stacks/ruby_offsets.h"

namespace {

// One memfd for the whole run, rewritten for each input.
int MemFd() {
  static const int fd = [] {
    const int f = memfd_create("rvbpfd-fuzz-elf", MFD_CLOEXEC);
    if (f < 0) rvbpfd::fuzz::Fail("memfd_create");
    return f;
  }();
  return fd;
}

bool Load(const uint8_t* data, size_t size) {
  const int fd = MemFd();
  if (ftruncate(fd, 0) != 0) return false;
  size_t done = 0;
  while (done < size) {
    const ssize_t n = pwrite(fd, data + done, size - done, static_cast<off_t>(done));
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rvbpfd;
  if (!Load(data, size)) fuzz::Fail("writing the memfd");
  // DiscoverTarget's pre-filter for executables, in small chunks so names cross chunk borders.
  constexpr std::string_view kVmNames[] = {"ruby_version", "ruby_vm_event_flags"};
  const Result<bool> named = StringTablesName(MemFd(), kVmNames, 64);
  Result<ElfFile> elf = ElfFile::Open("/proc/self/fd/" + std::to_string(MemFd()));
  if (!elf.ok()) return 0;
  // Never a "no" for a file where the full parse finds such a symbol.
  if (named.ok() && !named.value()) {
    for (std::string_view name : kVmNames) FUZZ_CHECK(!elf->FindSymbol(name).has_value());
  }

  // Lookups every analysis builds on, at the addresses the file itself names.
  for (const ElfSection& s : elf->sections()) {
    const auto bytes = elf->SectionData(s);
    FUZZ_CHECK(bytes.empty() || (s.offset <= size && bytes.size() <= size - s.offset));
  }
  size_t probed = 0;
  for (const ElfSymbol& sym : elf->symbols()) {
    if (++probed > 256) break;
    (void)elf->FunctionContaining(sym.value);
    (void)elf->VaddrToFileOffset(sym.value);
    const auto bytes = elf->BytesAt(sym.value, sym.size > 4096 ? 4096 : sym.size);
    FUZZ_CHECK(bytes.size() <= size);
    (void)elf->CStringAt(sym.value, 256);
  }
  (void)elf->FindSymbolsWithPrefix("gc_rest");
  (void)elf->DynamicRelocations(R_X86_64_TLSDESC);
  (void)elf->DynamicRelocations(R_X86_64_DTPMOD64);

  if (std::unique_ptr<DwarfInfo> dwarf = DwarfInfo::Open(*elf)) {
    probed = 0;
    for (const ElfSymbol& sym : elf->symbols()) {
      if (sym.type != STT_FUNC || ++probed > 16) continue;
      (void)dwarf->LocateVariable(sym.value, "th");
      (void)dwarf->MemberOffset(sym.value, "rb_thread_struct", "serial");
      (void)dwarf->MemberPathOffset(sym.value, "rb_vm_struct", {"ractor", "main_ractor"});
      int reg;
      int64_t offset;
      (void)dwarf->CfaAt(sym.value, &reg, &offset);
    }
  }

  // The site finder, for the layout the input's size picks, and its cache form read back.
  static const char* const kVersions[] = {"3.2.9", "3.3.8", "3.4.5", "4.0.1"};
  const char* version = kVersions[size % std::size(kVersions)];
  Result<SiteSet> sites = FindSites(*elf, version);
  if (sites.ok()) {
    (void)FormatSites(*sites);
    const std::string json = SiteSetToJson(*sites);
    Result<SiteSet> back = SiteSetFromJson(json);
    FUZZ_CHECK(back.ok());
    FUZZ_CHECK(SiteSetToJson(*back) == json);
    (void)UseGcFunctionProbes(*elf, &*sites);
  }
  (void)FindGcFunctionSites(*elf, version);

  int major = 0, minor = 0, teeny = 0;
  FUZZ_CHECK(ParseRubyVersion(version, &major, &minor, &teeny));
  OffsetsReport report;
  Result<RubyOffsets> offsets = OffsetsForBinary(*elf, major, minor, &report);
  if (offsets.ok()) {
    const EcRoute route = ComputeEcRoute(*elf, *offsets);
    (void)DescribeEcRoute(route);
  }
  (void)FindGlobalSymbolsVaddr(*elf);
  (void)GlobalSymbolsFromCode(*elf);
  return 0;
}
