#include "sites/gc_hook_calls.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>

#include "rvbpfd/abi.h"
#include "sites/stripped.h"

namespace rvbpfd {
namespace {

// RUBY_INTERNAL_EVENT_GC_ENTER / _EXIT (include/ruby/internal/event.h), the `event` argument of rb_gc_event_hook.
constexpr int64_t kGcEnterEvent = 0x2000000;
constexpr int64_t kGcExitEvent = 0x4000000;

// Whether `code` (at vaddr) holds a rel32 or RIP-relative disp32 that resolves to one of `targets` at the end of
// its 4 bytes: the encoding of `call/jmp target` and `call/jmp *target(%rip)`. A cheap filter before decoding.
bool MayEncodeReachTo(std::span<const uint8_t> code, uint64_t vaddr, const std::set<uint64_t>& targets) {
  for (size_t i = 0; i + 4 <= code.size(); ++i) {
    int32_t rel;
    std::memcpy(&rel, code.data() + i, sizeof(rel));
    if (targets.count(vaddr + i + 4 + static_cast<uint64_t>(static_cast<int64_t>(rel)))) return true;
  }
  return false;
}

// `mov $imm, %esi` (or %rsi): the immediate.
std::optional<int64_t> EsiImmediate(const cs_insn& insn) {
  if (insn.id != X86_INS_MOV) return std::nullopt;
  const cs_x86& x86 = insn.detail->x86;
  if (x86.op_count != 2 || x86.operands[0].type != X86_OP_REG || x86.operands[1].type != X86_OP_IMM) {
    return std::nullopt;
  }
  if (x86.operands[0].reg != X86_REG_ESI && x86.operands[0].reg != X86_REG_RSI) return std::nullopt;
  return x86.operands[1].imm;
}

}  // namespace

GcHookCalls FindGcHookCalls(const ElfFile& vm, Disassembler& dis, const std::vector<CodeRange>& functions,
                            const std::vector<uint64_t>& branch_targets) {
  GcHookCalls out;
  constexpr const char* kCallee = "rb_gc_event_hook";
  std::set<uint64_t> direct;  // call/jmp rel32 targets that are the callee: its entry here, its PLT stubs
  std::set<uint64_t> slots;   // call/jmp *slot(%rip) through its GOT slot
  if (std::optional<ElfSymbol> sym = vm.FindSymbol(kCallee); sym && sym->shndx != SHN_UNDEF && sym->value != 0) {
    direct.insert(sym->value);
  }
  const GotRoute route = GotRouteOf(vm, dis, kCallee);
  direct.insert(route.plt_stubs.begin(), route.plt_stubs.end());
  slots.insert(route.slots.begin(), route.slots.end());
  std::set<uint64_t> any_target = direct;
  any_target.insert(slots.begin(), slots.end());
  if (any_target.empty()) return out;

  std::set<std::string> via;
  for (const CodeRange& fn : functions) {
    if (fn.end <= fn.start) continue;
    std::span<const uint8_t> code = vm.BytesAt(fn.start, fn.end - fn.start);
    if (code.empty() || !MayEncodeReachTo(code, fn.start, any_target)) continue;
    struct Candidate {
      uint64_t mov = 0;
      uint64_t call = 0;
      uint8_t event = 0;
    };
    std::vector<Candidate> found;
    std::vector<uint64_t> local_targets;
    std::optional<int64_t> esi;  // the immediate esi holds on this straight line, if set by a mov
    uint64_t esi_mov = 0;
    dis.DecodeRange(code, fn.start, [&](const cs_insn& insn) {
      std::optional<uint64_t> target = DirectBranchTarget(insn);
      if (target) local_targets.push_back(*target);
      if (insn.id == X86_INS_CALL || insn.id == X86_INS_JMP) {
        const char* how = nullptr;
        if (target && direct.count(*target)) {
          how = route.plt_stubs.end() != std::find(route.plt_stubs.begin(), route.plt_stubs.end(), *target) ? "PLT"
                                                                                                             : "direct";
        } else if (std::optional<uint64_t> rip = RipRelativeTarget(insn); rip && slots.count(*rip)) {
          how = "GOT";
        }
        if (how != nullptr && esi && (*esi == kGcEnterEvent || *esi == kGcExitEvent)) {
          found.push_back({esi_mov, insn.address,
                           static_cast<uint8_t>(*esi == kGcEnterEvent ? RV_EV_GC_ENTER : RV_EV_GC_EXIT)});
          via.insert(how);
        }
      }
      if (IsControlTransfer(insn)) {
        esi.reset();
      } else if (std::optional<int64_t> imm = EsiImmediate(insn)) {
        esi = imm;
        esi_mov = insn.address;
      } else if (dis.WrittenRegs(insn) & (1u << RV_REG_RSI)) {
        esi.reset();
      }
      return true;
    });
    // A branch that lands after the mov and at or before the call may bring another esi: not one site we know.
    auto lands_between = [](const std::vector<uint64_t>& targets, uint64_t lo, uint64_t hi) {
      return std::any_of(targets.begin(), targets.end(), [&](uint64_t t) { return t > lo && t <= hi; });
    };
    for (const Candidate& c : found) {
      auto it = std::upper_bound(branch_targets.begin(), branch_targets.end(), c.mov);
      if (lands_between(local_targets, c.mov, c.call) || (it != branch_targets.end() && *it <= c.call)) {
        ++out.ambiguous;
        continue;
      }
      out.calls.push_back({c.call, c.event});
    }
  }
  std::sort(out.calls.begin(), out.calls.end(), [](const GcHookCall& a, const GcHookCall& b) {
    return a.vaddr < b.vaddr;
  });
  for (const std::string& v : via) out.via += (out.via.empty() ? "" : ",") + v;
  return out;
}

}  // namespace rvbpfd
