#include "sites/ruby32_th.h"

#include <algorithm>
#include <set>

#include "common/hex.h"
#include "rvbpfd/abi.h"

namespace rvbpfd {
namespace {

// Registers a call may change (System V x86-64), as a mask of DWARF numbers.
constexpr uint32_t kCallerSaved = (1u << RV_REG_RAX) | (1u << RV_REG_RDX) | (1u << RV_REG_RCX) | (1u << RV_REG_RSI) |
                                  (1u << RV_REG_RDI) | (1u << RV_REG_R8) | (1u << RV_REG_R9) | (1u << RV_REG_R10) |
                                  (1u << RV_REG_R11);

// A general-purpose register's DWARF number (rsp excluded: it is not a variable's home), or -1.
int Gpr(unsigned capstone_reg) {
  const int r = CapstoneRegToDwarf(capstone_reg);
  return r >= 0 && r < RV_REG_COUNT && r != RV_REG_RSP ? r : -1;
}

// `base + disp` with a plain general-purpose base register (no index, no segment), or -1.
int PlainBase(const cs_x86_op& op, int64_t disp) {
  if (op.type != X86_OP_MEM || op.mem.index != X86_REG_INVALID || op.mem.segment != X86_REG_INVALID ||
      op.mem.disp != disp) {
    return -1;
  }
  return Gpr(op.mem.base);
}

struct Insn {
  uint64_t address = 0;
  uint32_t written = 0;  // DWARF register mask, calls' caller-saved registers included
  unsigned id = 0;
  cs_x86 x86{};
};

// Decodes the straight-line code that ends at `end` (exclusive), from `start` (the last direct branch target at or
// before it, or the entry) on. A jump or return in between ends a block; since no branch target lies after `start`,
// the code after it is entered only by falling through, and the window starts again there. nullopt when an
// instruction cannot be decoded, the decoding does not land on `end`, or more than max_insns are decoded.
std::optional<std::vector<Insn>> DecodeWindow(const ElfFile& vm, Disassembler& dis, uint64_t start, uint64_t end,
                                              int max_insns, std::string* why) {
  std::vector<Insn> out;
  uint64_t pc = start;
  int decoded = 0;
  while (pc < end) {
    if (decoded++ >= max_insns) {
      *why = "more than " + std::to_string(max_insns) + " instructions of straight-line code from " + Hex(start);
      return std::nullopt;
    }
    const cs_insn* insn = dis.DecodeAt(vm, pc);
    if (insn == nullptr) {
      *why = "cannot decode the instruction at " + Hex(pc);
      return std::nullopt;
    }
    const bool call = insn->id == X86_INS_CALL;
    if (IsControlTransfer(*insn) && !call) {
      out.clear();
      pc = insn->address + insn->size;
      continue;
    }
    Insn i;
    i.address = pc;
    i.id = insn->id;
    i.x86 = insn->detail->x86;
    i.written = dis.WrittenRegs(*insn) | (call ? kCallerSaved : 0);
    out.push_back(i);
    pc = insn->address + insn->size;
  }
  if (pc != end) {
    *why = "the instructions from " + Hex(start) + " do not end at " + Hex(end);
    return std::nullopt;
  }
  return out;
}

}  // namespace

uint64_t StraightLineStart(const std::vector<uint64_t>& branch_targets, uint64_t function_entry, uint64_t site) {
  auto it = std::upper_bound(branch_targets.begin(), branch_targets.end(), site);
  if (it == branch_targets.begin()) return function_entry;
  return std::max(function_entry, *std::prev(it));
}

std::optional<ThLocation> Ruby32ThAtStarted(const ElfFile& vm, Disassembler& dis, uint64_t start, uint64_t site,
                                            const Ruby32ThLayout& layout, std::string* why) {
  std::optional<std::vector<Insn>> window = DecodeWindow(vm, dis, start, site, kRuby32MaxWindowInsns, why);
  if (!window) return std::nullopt;
  struct NtLoad {
    int th_reg;
    int nt_reg;  // -1 once overwritten
    bool tid_stored;
  };
  std::vector<NtLoad> loads;
  for (const Insn& i : *window) {
    const cs_x86& x = i.x86;
    const bool mov2 = i.id == X86_INS_MOV && x.op_count == 2;
    // nt->tid = <32-bit register>
    if (mov2 && x.operands[0].size == 4 && x.operands[1].type == X86_OP_REG) {
      const int base = PlainBase(x.operands[0], layout.nt_tid);
      for (NtLoad& l : loads) {
        if (base >= 0 && l.nt_reg == base) l.tid_stored = true;
      }
    }
    std::erase_if(loads, [&](const NtLoad& l) { return (i.written >> l.th_reg) & 1u; });
    for (NtLoad& l : loads) {
      if (l.nt_reg >= 0 && ((i.written >> l.nt_reg) & 1u)) l.nt_reg = -1;
    }
    // Q = th->nt
    if (mov2 && x.operands[0].type == X86_OP_REG && x.operands[0].size == 8 && x.operands[1].size == 8) {
      const int q = Gpr(x.operands[0].reg);
      const int r = PlainBase(x.operands[1], layout.th_nt);
      if (q >= 0 && r >= 0 && q != r) loads.push_back({r, q, false});
    }
  }
  std::set<int> th_regs;
  for (const NtLoad& l : loads) {
    if (l.tid_stored) th_regs.insert(l.th_reg);
  }
  if (th_regs.size() != 1) {
    *why = th_regs.empty() ? "no store of th->nt->tid (native_thread_init) on the straight-line code from " +
                                 Hex(start) + " with th still in its register"
                           : "several registers load th->nt and store its tid before the site";
    return std::nullopt;
  }
  return ThLocation{RV_LOC_REG, static_cast<uint8_t>(*th_regs.begin()), 0};
}

std::optional<ThLocation> Ruby32ThAtResumed(const ElfFile& vm, Disassembler& dis, uint64_t start, uint64_t site,
                                            uint64_t test_jump, const Ruby32ThLayout& layout, std::string* why) {
  if (test_jump <= site) {
    *why = "no conditional jump after the hook test";
    return std::nullopt;
  }
  std::optional<std::vector<Insn>> window = DecodeWindow(vm, dis, start, test_jump, kRuby32MaxWindowInsns, why);
  if (!window) return std::nullopt;
  size_t site_index = window->size();
  std::vector<std::pair<size_t, int>> stores;  // (index, source register) of `mov %reg64, running(%base)`
  for (size_t k = 0; k < window->size(); ++k) {
    const Insn& i = (*window)[k];
    if (i.address == site) site_index = k;
    const cs_x86& x = i.x86;
    if (i.id != X86_INS_MOV || x.op_count != 2 || x.operands[0].size != 8 || x.operands[1].type != X86_OP_REG) {
      continue;
    }
    const int base = PlainBase(x.operands[0], layout.sched_running);
    const int src = Gpr(x.operands[1].reg);
    if (base >= 0 && src >= 0 && base != src) stores.emplace_back(k, src);
  }
  if (site_index == window->size()) {
    *why = "the site is not an instruction boundary of the code from " + Hex(start);
    return std::nullopt;
  }
  if (stores.size() != 1) {
    *why = stores.empty() ? "no `sched->running = th` store next to the hook test"
                          : std::to_string(stores.size()) + " candidate `sched->running = th` stores next to the "
                                                            "hook test";
    return std::nullopt;
  }
  const auto [store_index, reg] = stores.front();
  // The register must hold the stored value at the site: nothing in between writes it.
  const size_t from = std::min(store_index + 1, site_index);
  const size_t to = std::max(store_index, site_index);
  for (size_t k = from; k < to; ++k) {
    if (((*window)[k].written >> reg) & 1u) {
      *why = "the register stored to sched->running is written at " + Hex((*window)[k].address) +
             " between the store and the site";
      return std::nullopt;
    }
  }
  return ThLocation{RV_LOC_REG, static_cast<uint8_t>(reg), 0};
}

std::optional<ThLocation> Ruby32ThAtReady(const ElfFile& vm, Disassembler& dis, CodeRange fn, uint64_t site,
                                          bool entry_straight, uint8_t resumed_reg, std::string* why) {
  constexpr uint32_t kArgs = (1u << RV_REG_RDI) | (1u << RV_REG_RSI) | (1u << RV_REG_RDX) | (1u << RV_REG_RCX) |
                             (1u << RV_REG_R8) | (1u << RV_REG_R9);
  if (!entry_straight) {
    *why = "a branch target between the function's entry and the READY site";
    return std::nullopt;
  }
  std::optional<std::vector<Insn>> prologue = DecodeWindow(vm, dis, fn.start, site, kRuby32MaxWindowInsns, why);
  if (!prologue) return std::nullopt;
  if (prologue->empty() || prologue->front().address != fn.start) {
    *why = "the READY site is not on the straight-line code from the function's entry";
    return std::nullopt;
  }
  // The last write of resumed_reg before the site must copy an argument register still holding its entry value.
  uint32_t written = 0;
  std::optional<uint64_t> copy_at;
  for (const Insn& i : *prologue) {
    const cs_x86& x = i.x86;
    if ((i.written >> resumed_reg) & 1u) {
      copy_at.reset();
      if (i.id == X86_INS_MOV && x.op_count == 2 && x.operands[0].type == X86_OP_REG &&
          x.operands[1].type == X86_OP_REG && x.operands[0].size == 8) {
        const int src = Gpr(x.operands[1].reg);
        if (src >= 0 && ((kArgs >> src) & 1u) && !((written >> src) & 1u)) copy_at = i.address;
      }
    }
    written |= i.written;
  }
  if (!copy_at) {
    *why = "the register of RESUMED's th is not a copy of an argument made before the READY site";
    return std::nullopt;
  }
  // Everywhere else in the function, resumed_reg is written only on the way out.
  bool ok = true;
  bool in_epilogue = false;  // after a `pop` of resumed_reg: only pops, then ret or a jump out, may follow
  uint64_t decoded_to = fn.start;
  dis.DecodeRange(vm.BytesAt(fn.start, fn.end - fn.start), fn.start, [&](const cs_insn& insn) {
    decoded_to = insn.address + insn.size;
    if (in_epilogue) {
      if (insn.id == X86_INS_POP) return true;
      std::optional<uint64_t> t = insn.id == X86_INS_JMP ? DirectBranchTarget(insn) : std::nullopt;
      const bool out = insn.id == X86_INS_RET || (t && (*t < fn.start || *t >= fn.end));
      if (!out) {
        *why = "resumed's th register is restored at " + Hex(insn.address) + " without leaving the function";
        ok = false;
        return false;
      }
      in_epilogue = false;
      return true;
    }
    if (insn.address == *copy_at || !((dis.WrittenRegs(insn) >> resumed_reg) & 1u)) return true;
    if (insn.id == X86_INS_POP && insn.detail->x86.op_count == 1 && insn.detail->x86.operands[0].type == X86_OP_REG &&
        Gpr(insn.detail->x86.operands[0].reg) == resumed_reg) {
      in_epilogue = true;
      return true;
    }
    *why = "the register of RESUMED's th is also written at " + Hex(insn.address);
    ok = false;
    return false;
  });
  if (!ok) return std::nullopt;
  if (decoded_to != fn.end) {
    *why = "the function's code does not decode to its end (" + Hex(decoded_to) + ")";
    return std::nullopt;
  }
  if (in_epilogue) {
    *why = "the function ends inside an epilogue";
    return std::nullopt;
  }
  return ThLocation{RV_LOC_REG, resumed_reg, 0};
}

}  // namespace rvbpfd
