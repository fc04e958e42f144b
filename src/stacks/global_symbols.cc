#include "stacks/global_symbols.h"

#include <elf.h>

#include <set>
#include <vector>

#include "sites/disasm.h"

namespace rvbpfd {

namespace {

// rb_symbols_t: last_id (u32) at +0, ids (VALUE) at +16; 32 bytes in 3.1 - 4.0.
constexpr uint64_t kIdsOffset = 16;
constexpr uint64_t kStructBytes = 32;
// Decoding budget per function (instructions) when its size is unknown (a tail-called local function has no
// symbol); rb_id2str's table reads come within its first ~30 instructions in every build seen.
constexpr int kInstructionBudget = 96;
// How many direct jumps/calls deep the search follows, and how many functions it decodes at most.
constexpr int kMaxDepth = 2;
constexpr size_t kMaxFunctions = 12;

// True when [addr, addr + kStructBytes) lies in .data or .bss: where a zero- or value-initialized writable global
// lives (not .got, .data.rel.ro or any code section).
bool InDataOrBss(const ElfFile& elf, uint64_t addr) {
  for (const ElfSection& s : elf.sections()) {
    if (s.name != ".data" && s.name != ".bss") continue;
    if ((s.flags & SHF_ALLOC) == 0 || (s.flags & SHF_WRITE) == 0) continue;
    if (addr >= s.addr && addr - s.addr <= s.size && kStructBytes <= s.size - (addr - s.addr)) return true;
  }
  return false;
}

bool InText(const ElfFile& elf, uint64_t addr) {
  for (const ElfSection& s : elf.sections()) {
    if (s.name == ".text" && (s.flags & SHF_EXECINSTR) && addr >= s.addr && addr - s.addr < s.size) return true;
  }
  return false;
}

struct FunctionScan {
  std::set<uint64_t> reads4, reads8;  // RIP-relative targets read as 4 / 8 bytes by mov or cmp
  std::vector<uint64_t> callees;      // direct jmp/call targets inside .text
};

FunctionScan Scan(Disassembler& d, const ElfFile& elf, uint64_t start, uint64_t size) {
  FunctionScan out;
  uint64_t pc = start;
  for (int n = 0; n < kInstructionBudget && (size == 0 || pc < start + size); n++) {
    const cs_insn* insn = d.DecodeAt(elf, pc);
    if (insn == nullptr) break;
    pc = insn->address + insn->size;
    if (insn->id == X86_INS_INT3 || insn->id == X86_INS_HLT || insn->id == X86_INS_UD2) break;  // padding / no return
    if (std::optional<uint64_t> t = DirectBranchTarget(*insn)) {
      if ((insn->id == X86_INS_JMP || insn->id == X86_INS_CALL) && InText(elf, *t)) out.callees.push_back(*t);
      continue;
    }
    if (insn->id != X86_INS_MOV && insn->id != X86_INS_CMP) continue;
    const cs_x86& x86 = insn->detail->x86;
    for (uint8_t i = 0; i < x86.op_count; i++) {
      const cs_x86_op& op = x86.operands[i];
      if (op.type != X86_OP_MEM || op.mem.base != X86_REG_RIP || op.mem.index != X86_REG_INVALID) continue;
      if (insn->id == X86_INS_MOV && i != 1) continue;  // a store into the table is not what we look for
      const uint64_t target = insn->address + insn->size + static_cast<uint64_t>(op.mem.disp);
      if (op.size == 4) out.reads4.insert(target);
      if (op.size == 8) out.reads8.insert(target);
    }
  }
  return out;
}

}  // namespace

Result<uint64_t> GlobalSymbolsFromCode(const ElfFile& elf) {
  std::optional<ElfSymbol> fn = elf.FindSymbol("rb_id2str");
  if (!fn || fn->shndx == SHN_UNDEF || fn->type != STT_FUNC || fn->value == 0) {
    return Error(ErrorCode::kNoSymbols, elf.path() +
                                            " defines no rb_id2str: ruby_global_symbols cannot be recovered "
                                            "from code; C function names stay unresolved");
  }
  Result<Disassembler> d = Disassembler::Create();
  if (!d) return d.error();
  // Breadth first: the first depth that yields candidates decides, so code reached only through deeper calls (locks,
  // rb_ary_entry in a static build) cannot add look-alikes when rb_id2str itself already shows the table.
  std::vector<std::pair<uint64_t, uint64_t>> level = {{fn->value, fn->size}};
  std::set<uint64_t> seen = {fn->value};
  for (int depth = 0; depth <= kMaxDepth && !level.empty(); depth++) {
    std::set<uint64_t> candidates;
    std::vector<std::pair<uint64_t, uint64_t>> next;
    for (const auto& [start, size] : level) {
      FunctionScan s = Scan(*d, elf, start, size);
      for (uint64_t x : s.reads4) {
        if (s.reads8.count(x + kIdsOffset) && InDataOrBss(elf, x)) candidates.insert(x);
      }
      for (uint64_t callee : s.callees) {
        if (seen.size() < kMaxFunctions && seen.insert(callee).second) next.push_back({callee, 0});
      }
    }
    if (candidates.size() == 1) return *candidates.begin();
    if (candidates.size() > 1) {
      return Error(ErrorCode::kNoSymbols, elf.path() + ": rb_id2str's code reads " + std::to_string(candidates.size()) +
                                              " tables shaped like ruby_global_symbols; refusing to guess (C "
                                              "function names stay unresolved; install the VM's debug symbols)");
    }
    level = std::move(next);
  }
  return Error(ErrorCode::kNoSymbols, elf.path() +
                                          ": no ruby_global_symbols access found in rb_id2str's code (an "
                                          "unknown build shape); C function names stay unresolved");
}

}  // namespace rvbpfd
