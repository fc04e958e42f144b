// Thin RAII wrapper over capstone (x86-64, detail on) used by the site finder. Internal to the sites module.
#ifndef RVBPFD_SRC_SITES_DISASM_H_
#define RVBPFD_SRC_SITES_DISASM_H_

#include <capstone/capstone.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "common/error.h"
#include "elf/elf_file.h"

namespace rvbpfd {

// x86-64 register (any width: al/ax/eax/rax) -> DWARF register number 0..16 (16 = rip), or -1.
int CapstoneRegToDwarf(unsigned reg);

class Disassembler {
 public:
  static Result<Disassembler> Create();
  Disassembler(Disassembler&& other) noexcept;
  Disassembler& operator=(Disassembler&&) = delete;
  Disassembler(const Disassembler&) = delete;
  Disassembler& operator=(const Disassembler&) = delete;
  ~Disassembler();

  // A hard time cap for the analysis using this disassembler: once `at` has passed, DecodeAt returns nullptr and
  // DecodeRange stops (checked every few thousand instructions), and expired() says so. Callers must then discard
  // what they found (it is partial): FindSites fails with SiteAnalysisTimeout.
  void set_deadline(std::chrono::steady_clock::time_point at) { deadline_ = at; }
  bool expired();
  // The same, reading the clock now (for the checks between phases).
  bool deadline_passed() {
    since_check_ = kCheckEvery;
    return expired();
  }

  // Decodes one instruction at `vaddr` of `elf`; the returned pointer is valid until the next call. nullptr when the
  // bytes are not in the file or not a valid instruction.
  const cs_insn* DecodeAt(const ElfFile& elf, uint64_t vaddr);

  // Decodes [code, code+len) as if loaded at `vaddr`, calling `fn` for each instruction until it returns false or an
  // undecodable byte is met.
  void DecodeRange(std::span<const uint8_t> code, uint64_t vaddr, const std::function<bool(const cs_insn&)>& fn);

  // DWARF numbers of the registers `insn` writes (explicit and implicit), as a bitmask over 0..16.
  uint32_t WrittenRegs(const cs_insn& insn) const;

 private:
  Disassembler() = default;
  csh handle_ = 0;
  cs_insn* insn_ = nullptr;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  bool expired_ = false;
  // Reading the clock costs ~20 ns, a decode ~200 ns: every 4,096 decodes is well under 1% and ~1 ms apart.
  static constexpr uint32_t kCheckEvery = 4096;
  uint32_t since_check_ = 0;  // instructions decoded since the clock was last read
};

// The target of a RIP-relative memory operand of insn, if it has one.
std::optional<uint64_t> RipRelativeTarget(const cs_insn& insn);
// The target of a direct jmp/jcc/call, if any.
std::optional<uint64_t> DirectBranchTarget(const cs_insn& insn);
bool IsConditionalJump(const cs_insn& insn);
// Whether the kernel's x86 uprobe code emulates `insn` instead of single-stepping a copy of it: a direct jmp, jcc or
// call (emulated since Linux 3.x), a push of a register (6.x) or a nop (6.x), without prefixes (the kernel refuses
// a 0x66 prefix on branches). A single-stepped probe takes a second exception (#DB) after the int3, which on a VM
// costs ~9 us of the ~10 us a hit costs; an emulated one costs ~0.75 us (benchmarks/uprobe_cost.cc).
bool IsKernelEmulated(const cs_insn& insn);
// Whether `insn` may transfer control (jump, call, return, interrupt, syscall, ud2, hlt).
bool IsControlTransfer(const cs_insn& insn);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SITES_DISASM_H_
