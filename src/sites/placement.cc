#include "sites/placement.h"

#include <algorithm>
#include <string>

namespace rvbpfd {
namespace {

// How far past the check PlaceOnEmulatedInstructions looks (the jcc after a cmp is the next instruction; after a
// `mov hooks(%rip), %reg` it is two further).
constexpr int kMaxInsnsToEmulated = 6;

// Whether a direct branch of `fn` or of its pieces lands inside [lo, hi] (fn.cold, fn.part.N, ...: GCC's hot/cold
// split jumps back into the parent anywhere; FindSymbolsWithPrefix gives the base name and its clone suffixes).
bool BranchLandsIn(const ElfFile& vm, Disassembler& dis, const ElfSymbol& fn, uint64_t lo, uint64_t hi) {
  bool lands = false;
  for (const ElfSymbol& p : vm.FindSymbolsWithPrefix(fn.name.substr(0, fn.name.find('.')))) {
    if (p.type != STT_FUNC || p.size == 0) continue;
    dis.DecodeRange(vm.BytesAt(p.value, p.size), p.value, [&](const cs_insn& insn) {
      std::optional<uint64_t> t = DirectBranchTarget(insn);
      if (t && *t >= lo && *t <= hi) lands = true;
      return !lands;
    });
    if (lands) return true;
  }
  return false;
}

// Moves one site if it can (see the header); false when it stays.
bool MoveToEmulated(const ElfFile& vm, Disassembler& dis, DwarfInfo* dwarf, ProbeSite& s,
                    const StrippedCode* stripped) {
  if (s.method != "hook-site" && s.method != "gc-hook-site" && s.method != "function-entry") return false;
  std::optional<ElfSymbol> fn;
  uint64_t fn_end = 0;
  if (stripped != nullptr) {
    std::optional<CodeRange> r = RangeContaining(stripped->functions, s.vaddr);
    if (!r) return false;
    fn_end = r->end;
  } else {
    fn = vm.FunctionContaining(s.vaddr);
    if (!fn) return false;
    fn_end = fn->value + fn->size;
  }
  std::optional<uint64_t> target;
  uint32_t written = 0;  // DWARF registers written by the instructions the probe would skip
  int seen = 0;
  dis.DecodeRange(vm.BytesAt(s.vaddr, fn_end - s.vaddr), s.vaddr, [&](const cs_insn& insn) {
    if (IsKernelEmulated(insn)) {
      target = insn.address;
      return false;
    }
    const uint32_t w = dis.WrittenRegs(insn);
    if (IsControlTransfer(insn) || (w & (1u << RV_REG_RSP)) != 0 || ++seen > kMaxInsnsToEmulated) return false;
    written |= w;
    return true;
  });
  if (!target || *target == s.vaddr) return false;
  if (stripped != nullptr) {
    auto it = std::lower_bound(stripped->branch_targets.begin(), stripped->branch_targets.end(), s.vaddr + 1);
    if (it != stripped->branch_targets.end() && *it <= *target) return false;
  } else if (BranchLandsIn(vm, dis, *fn, s.vaddr + 1, *target)) {
    return false;
  }
  ThLocation th = s.th;
  if (s.th_source == "dwarf") {
    if (!dwarf) return false;
    DwarfInfo::VarResult v = dwarf->LocateVariable(*target, "th");
    if (v.status != DwarfInfo::VarStatus::kFound) return false;
    th = v.loc;
  } else if (th.kind == RV_LOC_REG || th.kind == RV_LOC_MEM) {
    if ((written & (1u << th.reg)) != 0) return false;
  }
  s.th = th;
  s.vaddr = *target;
  return true;
}

}  // namespace

void PlaceOnEmulatedInstructions(const ElfFile& vm, Disassembler& dis, DwarfInfo* dwarf,
                                 std::vector<ProbeSite>* sites, const StrippedCode* stripped) {
  for (ProbeSite& s : *sites) {
    if (s.check_vaddr == 0) s.check_vaddr = s.vaddr;
    if (s.vaddr == s.check_vaddr) MoveToEmulated(vm, dis, dwarf, s, stripped);
    const cs_insn* insn = dis.DecodeAt(vm, s.vaddr);
    s.single_step = insn == nullptr || !IsKernelEmulated(*insn);
  }
}


}  // namespace rvbpfd
