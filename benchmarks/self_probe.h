// Shared by the benchmarks that put rvbpfd's BPF program on functions of their own executable (uprobe_cost.cc,
// trap_gap_cost.cc): two identical CRuby-shaped hook checks and the session setup. Needs root.
#ifndef RVBPFD_BENCHMARKS_SELF_PROBE_H_
#define RVBPFD_BENCHMARKS_SELF_PROBE_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "elf/elf_file.h"
#include "probe/bpf_session.h"

extern "C" {
volatile uint64_t rv_bench_flag;
// `cmpq $0, rv_bench_flag(%rip); jne 1f; 1: ret`, like a CRuby hook check: the kernel single-steps the cmpq and
// emulates the jne (kCheckJneOffset), where rvbpfd puts its probes. rdi (th) is unchanged at both.
void RvBenchCheck(uint64_t* th);
void RvBenchCheckTwin(uint64_t* th);  // the same, never probed: the unprobed side of a comparison
}
__asm__(
    ".text\n.globl RvBenchCheck\n.type RvBenchCheck,@function\nRvBenchCheck:\n"
    "  cmpq $0, rv_bench_flag(%rip)\n  jne 1f\n1: ret\n.size RvBenchCheck, .-RvBenchCheck\n"
    ".globl RvBenchCheckTwin\n.type RvBenchCheckTwin,@function\nRvBenchCheckTwin:\n"
    "  cmpq $0, rv_bench_flag(%rip)\n  jne 1f\n1: ret\n.size RvBenchCheckTwin, .-RvBenchCheckTwin\n");

namespace rvbpfd_bench {

constexpr uint64_t kCheckJneOffset = 8;  // `cmpq $imm8, disp32(%rip)` is 8 bytes

struct SelfProbe {
  std::unique_ptr<rvbpfd::BpfSession> session;
  std::string exe;            // this executable: the file the uprobes go into
  uint64_t check_offset = 0;  // file offset of RvBenchCheck
  uint8_t binary = 0;         // offsets index for rv_site
  // A probe on RvBenchCheck at `at_offset` (0: the cmpq, kCheckJneOffset: the jne): a RESUMED event, th in rdi.
  rvbpfd::SiteSpec Site(uint64_t at_offset) const {
    return {check_offset + at_offset, rv_site{RV_EV_THREAD_RESUMED, RV_LOC_REG, RV_REG_RDI, binary, 0}};
  }
};

// A session counting its records into *received, with this process in its pid filter. nullopt after printing why.
inline std::optional<SelfProbe> OpenSelfProbe(uint64_t* received) {
  auto session = rvbpfd::BpfSession::Open(rvbpfd::SessionOptions{}, [received](const rv_record&) { ++*received; });
  if (!session) {
    fprintf(stderr, "%s\n", session.error().ToString().c_str());
    return std::nullopt;
  }
  SelfProbe p;
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  auto self = rvbpfd::ElfFile::Open("/proc/self/exe");
  auto sym = self ? self->FindSymbol("RvBenchCheck") : std::nullopt;
  auto off = sym ? self->VaddrToFileOffset(sym->value) : std::nullopt;
  auto bin = (*session)->AddBinary(rv_offsets{0, 0, 0, RV_OFF_HAS_SERIAL});
  if (len <= 0 || !off || !bin || !(*session)->AddPid(static_cast<uint32_t>(getpid()))) {
    fprintf(stderr, "cannot set up probes on this executable\n");
    return std::nullopt;
  }
  p.exe.assign(exe, static_cast<size_t>(len));
  p.check_offset = *off;
  p.binary = *bin;
  p.session = std::move(*session);
  return p;
}

}  // namespace rvbpfd_bench

#endif  // RVBPFD_BENCHMARKS_SELF_PROBE_H_
