#include "dump/dump_vm_route.h"

#include <elf.h>

#include <algorithm>
#include <set>

namespace rvbpfd {
namespace {

// [addr, addr+8) inside an allocated, writable .data or .bss: where a mutable global pointer lives.
bool InWritableData(const ElfFile& vm, uint64_t addr) {
  for (const ElfSection& s : vm.sections()) {
    if (s.name != ".data" && s.name != ".bss") continue;
    if ((s.flags & SHF_ALLOC) == 0 || (s.flags & SHF_WRITE) == 0 || s.size < 8) continue;
    if (addr >= s.addr && addr - s.addr <= s.size - 8) return true;
  }
  return false;
}

// `mov <64-bit reg>, [mem]`: the destination register, else X86_REG_INVALID.
x86_reg LoadDestination(const cs_insn& insn) {
  const cs_x86& x = insn.detail->x86;
  if (insn.id != X86_INS_MOV || x.op_count != 2 || x.operands[0].type != X86_OP_REG ||
      x.operands[1].type != X86_OP_MEM || x.operands[1].size != 8) {
    return X86_REG_INVALID;
  }
  return x.operands[0].reg;
}

}  // namespace

std::optional<uint64_t> FindVmPointerInCode(const ElfFile& vm, Disassembler& dis) {
  std::optional<ElfSymbol> fn = vm.FindSymbol(kVmPointerReader);
  if (!fn || fn->shndx == SHN_UNDEF || fn->type != STT_FUNC || fn->size == 0) return std::nullopt;
  std::set<uint64_t> globals;               // 8-byte globals of .data/.bss the function loads
  std::vector<std::pair<x86_reg, uint64_t>> leas;  // registers holding such a global's address, and which
  bool shape = true;
  dis.DecodeRange(vm.BytesAt(fn->value, std::min(fn->size, kMaxVmReaderBytes)), fn->value, [&](const cs_insn& insn) {
    if (insn.id == X86_INS_RET) return false;
    const cs_x86& x = insn.detail->x86;
    if (std::optional<uint64_t> rip = RipRelativeTarget(insn)) {
      const bool data = InWritableData(vm, *rip);
      if (insn.id == X86_INS_LEA && data) {
        leas.emplace_back(x.operands[0].reg, *rip);
      } else if (LoadDestination(insn) != X86_REG_INVALID && data) {
        globals.insert(*rip);
      } else if (data) {
        shape = false;  // a store, compare or other use of a global: not the function described above
        return false;
      }
      return true;
    }
    if (const x86_reg dst = LoadDestination(insn); dst != X86_REG_INVALID) {
      const x86_op_mem& m = x.operands[1].mem;
      for (const auto& [reg, addr] : leas) {
        if (m.base == reg && m.index == X86_REG_INVALID && m.disp == 0) globals.insert(addr);
      }
    }
    // A register that held a global's address and is written again no longer does.
    const uint32_t written = dis.WrittenRegs(insn);
    std::erase_if(leas, [&](const std::pair<x86_reg, uint64_t>& l) {
      const int dwarf = CapstoneRegToDwarf(l.first);
      return dwarf >= 0 && (written & (1u << dwarf)) != 0;
    });
    return true;
  });
  if (!shape || globals.size() != 1) return std::nullopt;
  return *globals.begin();
}

}  // namespace rvbpfd
