// libFuzzer harness: the site finder's cost on crafted VM look-alikes (tests/sites/crafted_vm_elf.h) of any size: the
// input picks the symbol count (up to 30,000), the bytes per function (the text size), whether every symbol's extent
// runs to the end of .text, the number of hook checks and the Ruby version, and its remaining bytes flip bytes
// anywhere in the file (code, symbol values and sizes, headers). The finder must stay linear in text + symbols: an
// analysis that reaches a time cap far above what such an input needs is a finding, as is any site that fails the
// code check. tools/run-fuzzers.sh bounds each input with libFuzzer's -timeout as well.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "elf/elf_file.h"
#include "fuzz/fuzz_util.h"
#include "sites/code_check.h"
#include "sites/crafted_vm_elf.h"
#include "sites/disasm.h"
#include "sites/sites.h"

namespace {

int MemFd() {
  static const int fd = [] {
    const int f = memfd_create("rvbpfd-fuzz-sites", MFD_CLOEXEC);
    if (f < 0) rvbpfd::fuzz::Fail("memfd_create");
    return f;
  }();
  return fd;
}

bool Load(const std::string& bytes) {
  const int fd = MemFd();
  if (ftruncate(fd, 0) != 0) return false;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = pwrite(fd, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rvbpfd;
  if (size < 6) return 0;
  testing::CraftedVmSpec spec;
  spec.functions = (static_cast<size_t>(data[0]) | static_cast<size_t>(data[1]) << 8) % 30001;
  spec.fn_bytes = 6 + data[2] % 58;
  spec.overlapping = (data[3] & 1) != 0;
  spec.hook_checks = 1 + data[4] % 8;
  static const char* const kVersions[] = {"3.2.9", "3.3.8", "3.4.5", "4.0.1"};
  const char* version = kVersions[data[5] % std::size(kVersions)];
  std::string elf_bytes = testing::CraftVmElf(spec);
  for (size_t i = 6; i + 2 < size; i += 3) {
    const uint64_t at = ((static_cast<uint64_t>(data[i]) | static_cast<uint64_t>(data[i + 1]) << 8) *
                         elf_bytes.size()) >> 16;
    elf_bytes[at] = static_cast<char>(elf_bytes[at] ^ data[i + 2]);
  }
  if (!Load(elf_bytes)) fuzz::Fail("writing the memfd");
  Result<ElfFile> elf = ElfFile::Open("/proc/self/fd/" + std::to_string(MemFd()));
  if (!elf.ok()) return 0;
  // At most ~2 MB of code and 30,000 symbols: linear work is well under a second even under ASan.
  constexpr std::chrono::milliseconds kCap{5'000};
  Result<SiteSet> sites = FindSites(*elf, version, kCap);
  FUZZ_CHECK(sites.ok() || !IsSiteAnalysisTimeout(sites.error()));
  if (sites.ok()) {
    Result<Disassembler> dis = Disassembler::Create();
    FUZZ_CHECK(dis.ok());
    FUZZ_CHECK(CheckSitesAgainstCode(*elf, *dis, sites->sites).ok());
  }
  return 0;
}
