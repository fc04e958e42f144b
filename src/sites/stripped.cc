#include "sites/stripped.h"

#include <elf.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "common/hex.h"
#include "rvbpfd/abi.h"

namespace rvbpfd {
namespace {

constexpr const char* kAddHook = "rb_internal_thread_add_event_hook";
constexpr const char* kRemoveHook = "rb_internal_thread_remove_event_hook";
// rb_thread_execute_hooks takes the lock and reads the list within its first few dozen instructions.
constexpr int kExecuteHooksBudget = 200;

bool InWritableData(const ElfFile& vm, uint64_t addr, uint64_t len) {
  for (const ElfSection& s : vm.sections()) {
    if (s.name != ".data" && s.name != ".bss") continue;
    if ((s.flags & SHF_ALLOC) == 0 || (s.flags & SHF_WRITE) == 0) continue;
    if (addr >= s.addr && addr - s.addr <= s.size && len <= s.size - (addr - s.addr)) return true;
  }
  return false;
}

struct DataRefs {
  std::set<uint64_t> words;  // RIP-relative 8-byte memory operands (loads, stores, compares, exchanges)
  std::set<uint64_t> leas;   // RIP-relative addresses taken with lea
};

DataRefs RefsOf(const ElfFile& vm, Disassembler& dis, const ElfSymbol& fn) {
  DataRefs out;
  dis.DecodeRange(vm.BytesAt(fn.value, fn.size), fn.value, [&](const cs_insn& insn) {
    std::optional<uint64_t> t = RipRelativeTarget(insn);
    if (!t) return true;
    if (insn.id == X86_INS_LEA) {
      if (InWritableData(vm, *t, 8)) out.leas.insert(*t);
      return true;
    }
    const cs_x86& x86 = insn.detail->x86;
    for (uint8_t i = 0; i < x86.op_count; ++i) {
      if (x86.operands[i].type == X86_OP_MEM && x86.operands[i].mem.base == X86_REG_RIP &&
          x86.operands[i].size == 8 && InWritableData(vm, *t, 8)) {
        out.words.insert(*t);
      }
    }
    return true;
  });
  return out;
}

std::set<uint64_t> Intersect(const std::set<uint64_t>& a, const std::set<uint64_t>& b) {
  std::set<uint64_t> out;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::inserter(out, out.begin()));
  return out;
}

// GOT slot -> symbol of the JUMP_SLOT / GLOB_DAT relocation that fills it.
std::map<uint64_t, std::string> GotSlots(const ElfFile& vm) {
  std::map<uint64_t, std::string> out;
  for (uint32_t type : {R_X86_64_JUMP_SLOT, R_X86_64_GLOB_DAT}) {
    for (const ElfRelocation& r : vm.DynamicRelocations(type)) {
      if (!r.symbol_name.empty()) out[r.offset] = r.symbol_name;
    }
  }
  return out;
}

std::string ExportedFunctionAt(const ElfFile& vm, uint64_t addr) {
  std::optional<ElfSymbol> f = vm.FunctionContaining(addr);
  if (f && f->value == addr && !f->from_symtab && f->shndx != SHN_UNDEF) return f->name;
  return "";
}

// A PLT stub (`[endbr64;] [bnd] jmp *slot(%rip)`) at addr: the symbol its GOT slot is relocated to.
std::string PltTarget(const ElfFile& vm, Disassembler& dis, const std::map<uint64_t, std::string>& slots,
                      uint64_t addr) {
  for (int i = 0; i < 2; ++i) {
    const cs_insn* insn = dis.DecodeAt(vm, addr);
    if (insn == nullptr) return "";
    if (insn->id == X86_INS_ENDBR64) {
      addr = insn->address + insn->size;
      continue;
    }
    if (insn->id != X86_INS_JMP) return "";
    std::optional<uint64_t> slot = RipRelativeTarget(*insn);
    if (!slot) return "";
    auto it = slots.find(*slot);
    return it == slots.end() ? "" : it->second;
  }
  return "";
}

}  // namespace

std::string CalleeName(const ElfFile& vm, Disassembler& dis, uint64_t target) {
  std::string direct = ExportedFunctionAt(vm, target);
  if (!direct.empty()) return direct;
  return PltTarget(vm, dis, GotSlots(vm), target);
}

GotRoute GotRouteOf(const ElfFile& vm, Disassembler& dis, const std::string& symbol) {
  GotRoute route;
  const std::map<uint64_t, std::string> slots = GotSlots(vm);
  for (const auto& [slot, name] : slots) {
    if (name == symbol) route.slots.push_back(slot);
  }
  if (route.slots.empty()) return route;
  constexpr uint64_t kPltEntry = 16;  // bytes, .plt and .plt.sec alike on x86-64
  // Bounded by the section sizes in the file (a crafted size costs at most one decode per 16 bytes of the file).
  for (const char* name : {".plt", ".plt.sec"}) {
    std::optional<ElfSection> sec = vm.FindSection(name);
    if (!sec || sec->addr == 0 || sec->type == SHT_NOBITS) continue;
    const uint64_t size = vm.SectionData(*sec).size();
    for (uint64_t i = 0; i + kPltEntry <= size; i += kPltEntry) {
      if (PltTarget(vm, dis, slots, sec->addr + i) == symbol) route.plt_stubs.push_back(sec->addr + i);
    }
  }
  return route;
}

std::vector<uint64_t> RodataStrings(const ElfFile& vm, const std::string& s) {
  std::vector<uint64_t> out;
  std::optional<ElfSection> ro = vm.FindSection(".rodata");
  if (!ro) return out;
  std::span<const uint8_t> data = vm.SectionData(*ro);
  const size_t n = s.size() + 1;  // with the NUL
  for (size_t i = 0; i + n <= data.size(); ++i) {
    if (std::memcmp(data.data() + i, s.c_str(), n) == 0) out.push_back(ro->addr + i);
  }
  return out;
}

std::optional<uint64_t> SoleGlobalReadBy(const ElfFile& vm, Disassembler& dis, const std::string& name) {
  std::optional<ElfSymbol> fn = vm.FindSymbol(name);
  if (!fn || fn->shndx == SHN_UNDEF || fn->type != STT_FUNC || fn->size == 0) return std::nullopt;
  std::set<uint64_t> reads;
  dis.DecodeRange(vm.BytesAt(fn->value, fn->size), fn->value, [&](const cs_insn& insn) {
    std::optional<uint64_t> t = RipRelativeTarget(insn);
    if (!t || insn.id == X86_INS_LEA) return true;
    const cs_x86& x86 = insn.detail->x86;
    for (uint8_t i = 0; i < x86.op_count; ++i) {
      if (x86.operands[i].type == X86_OP_MEM && x86.operands[i].mem.base == X86_REG_RIP &&
          x86.operands[i].size == 4 && InWritableData(vm, *t, 4)) {
        reads.insert(*t);
      }
    }
    return true;
  });
  if (reads.size() != 1) return std::nullopt;
  return *reads.begin();
}

std::optional<MainThreadRoute> FindMainThreadRoute(const ElfFile& vm, Disassembler& dis) {
  std::optional<ElfSymbol> fn = vm.FindSymbol("rb_thread_main");
  if (!fn || fn->shndx == SHN_UNDEF || fn->type != STT_FUNC || fn->size == 0) return std::nullopt;
  // The fast path up to its first ret: rax = the global (mov G(%rip) or lea G(%rip) + mov (%rax)), a NULL test,
  // then exactly two loads through rax: threads.main, then ->self.
  uint64_t global = 0;
  bool via_lea = false;
  std::vector<int64_t> loads;
  bool shape = true;
  dis.DecodeRange(vm.BytesAt(fn->value, fn->size), fn->value, [&](const cs_insn& insn) {
    if (insn.id == X86_INS_RET) return false;
    // A build with -fcf-protection (Debian's) starts every exported function with endbr64: no part of the shape.
    if (global == 0 && insn.id == X86_INS_ENDBR64) return true;
    const cs_x86& x = insn.detail->x86;
    const bool mov_rax = insn.id == X86_INS_MOV && x.op_count == 2 && x.operands[0].type == X86_OP_REG &&
                         x.operands[0].reg == X86_REG_RAX && x.operands[1].type == X86_OP_MEM &&
                         x.operands[1].mem.index == X86_REG_INVALID && x.operands[1].size == 8;
    std::optional<uint64_t> rip = RipRelativeTarget(insn);
    if (global == 0) {
      if (mov_rax && rip && InWritableData(vm, *rip, 8)) {
        global = *rip;
      } else if (insn.id == X86_INS_LEA && rip && x.operands[0].reg == X86_REG_RAX && InWritableData(vm, *rip, 8)) {
        global = *rip;
        via_lea = true;
      } else {
        shape = false;
      }
      return shape;
    }
    if (via_lea) {
      via_lea = false;
      shape = mov_rax && x.operands[1].mem.base == X86_REG_RAX && x.operands[1].mem.disp == 0;
      return shape;
    }
    if (insn.id == X86_INS_TEST || IsConditionalJump(insn)) return true;
    if (mov_rax && x.operands[1].mem.base == X86_REG_RAX) {
      loads.push_back(x.operands[1].mem.disp);
      return true;
    }
    shape = false;
    return false;
  });
  if (!shape || global == 0 || loads.size() != 2 || loads[0] <= 0 || loads[0] > 4096) return std::nullopt;
  return MainThreadRoute{global, static_cast<uint32_t>(loads[0])};
}

std::string StrippedFunctionName(const ElfFile& vm, const StrippedCode& code, uint64_t vaddr) {
  std::optional<ElfSymbol> f = vm.FunctionContaining(vaddr);
  if (f) return f->name;
  if (std::optional<CodeRange> r = RangeContaining(code.functions, vaddr)) return "fn@" + Hex(r->start);
  return Hex(vaddr);
}

Result<StrippedCode> AnalyzeStrippedCode(const ElfFile& vm, Disassembler& dis, uint64_t extra_target) {
  StrippedCode code;
  std::optional<ElfSymbol> add = vm.FindSymbol(kAddHook);
  std::optional<ElfSymbol> remove = vm.FindSymbol(kRemoveHook);
  auto usable = [](const std::optional<ElfSymbol>& s) {
    return s && s->shndx != SHN_UNDEF && s->type == STT_FUNC && s->size > 0;
  };
  if (!usable(add) || !usable(remove)) {
    return Error(ErrorCode::kNoSymbols, vm.path() + " exports no " + kAddHook + "/" + kRemoveHook +
                                            " (CRuby < 3.2, or not a CRuby VM)");
  }
  const DataRefs a = RefsOf(vm, dis, *add), r = RefsOf(vm, dis, *remove);
  const std::set<uint64_t> lists = Intersect(a.words, r.words);
  if (lists.size() != 1) {
    return Error(ErrorCode::kNoSymbols,
                 vm.path() + ": " + kAddHook + " and " + kRemoveHook + " share " + std::to_string(lists.size()) +
                     " 8-byte globals instead of one (an unknown build shape): cannot tell which is the hook list");
  }
  code.hooks = *lists.begin();
  const std::set<uint64_t> locks = Intersect(a.leas, r.leas);
  if (locks.size() != 1) {
    return Error(ErrorCode::kNoSymbols, vm.path() + ": " + kAddHook + " and " + kRemoveHook + " take " +
                                            std::to_string(locks.size()) +
                                            " locks by address instead of one (an unknown build shape)");
  }
  code.hooks_lock = *locks.begin();
  code.registry = {add->value, remove->value};

  Result<std::vector<CodeRange>> fns = FunctionRangesFromEhFrame(vm);
  if (!fns.ok()) return fns.error();
  code.functions = std::move(fns.value());

  // One pass over all code: direct branch targets, references to the hook list (and the extra global), and the
  // argument loads of every call (for the Init functions' method registrations).
  const std::map<uint64_t, std::string> slots = GotSlots(vm);
  std::map<uint64_t, std::string> callee_cache;
  auto callee = [&](uint64_t target) -> const std::string& {
    auto it = callee_cache.find(target);
    if (it != callee_cache.end()) return it->second;
    std::string name = ExportedFunctionAt(vm, target);
    if (name.empty()) name = PltTarget(vm, dis, slots, target);
    return callee_cache.emplace(target, std::move(name)).first->second;
  };
  std::vector<uint64_t> targets;
  for (const CodeRange& fn : code.functions) {
    uint64_t lea_rdi = 0, lea_rsi = 0, lea_rdx = 0;  // RIP-relative addresses loaded since the last call
    dis.DecodeRange(vm.BytesAt(fn.start, fn.end - fn.start), fn.start, [&](const cs_insn& insn) {
      std::optional<uint64_t> rip = RipRelativeTarget(insn);
      if (std::optional<uint64_t> t = DirectBranchTarget(insn)) targets.push_back(*t);
      const bool is_call = insn.id == X86_INS_CALL;
      if (rip) {
        if (*rip == code.hooks) code.hook_refs.push_back(insn.address);
        if (extra_target != 0 && *rip == extra_target) {
          int64_t imm = -1;
          const cs_x86& x86 = insn.detail->x86;
          for (uint8_t i = 0; i < x86.op_count; ++i) {
            if (x86.operands[i].type == X86_OP_IMM) imm = x86.operands[i].imm;
          }
          code.extra_refs.emplace_back(insn.address, insn.id == X86_INS_TEST ? imm : -1);
        }
      }
      if (is_call) {
        std::string name;
        if (std::optional<uint64_t> t = DirectBranchTarget(insn)) {
          if ((lea_rsi != 0 || lea_rdi != 0) && (lea_rdx != 0 || lea_rsi != 0)) name = callee(*t);
        } else if (rip) {  // call *slot(%rip): -fno-plt
          auto it = slots.find(*rip);
          if (it != slots.end()) name = it->second;
        }
        if (!name.empty()) {
          code.define_calls.push_back({name, lea_rsi, lea_rdi, lea_rdx, lea_rsi, insn.address});
        }
        lea_rdi = lea_rsi = lea_rdx = 0;
        return true;
      }
      if (IsControlTransfer(insn)) {
        lea_rdi = lea_rsi = lea_rdx = 0;
        return true;
      }
      if (lea_rdi == 0 && lea_rsi == 0 && lea_rdx == 0 && insn.id != X86_INS_LEA) return true;  // nothing to track
      const uint32_t w = dis.WrittenRegs(insn);
      uint64_t lea = 0;
      int lea_reg = -1;
      const cs_x86& x86 = insn.detail->x86;
      if (insn.id == X86_INS_LEA && rip && x86.op_count == 2 && x86.operands[0].type == X86_OP_REG &&
          x86.operands[0].size == 8) {
        lea = *rip;
        lea_reg = CapstoneRegToDwarf(x86.operands[0].reg);
      }
      if (w & (1u << RV_REG_RDI)) lea_rdi = lea_reg == RV_REG_RDI ? lea : 0;
      if (w & (1u << RV_REG_RSI)) lea_rsi = lea_reg == RV_REG_RSI ? lea : 0;
      if (w & (1u << RV_REG_RDX)) lea_rdx = lea_reg == RV_REG_RDX ? lea : 0;
      return true;
    });
  }
  std::sort(targets.begin(), targets.end());
  targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
  code.branch_targets = std::move(targets);
  std::sort(code.hook_refs.begin(), code.hook_refs.end());
  return code;
}

bool LooksLikeExecuteHooks(const ElfFile& vm, Disassembler& dis, StrippedCode& code, uint64_t entry) {
  auto cached = code.execute_hooks_cache.find(entry);
  if (cached != code.execute_hooks_cache.end()) return cached->second;
  bool result = false;
  std::optional<CodeRange> fn = RangeContaining(code.functions, entry);
  const bool registry = std::find(code.registry.begin(), code.registry.end(), entry) != code.registry.end();
  if (fn && fn->start == entry && !registry && code.hooks_lock != 0) {
    bool takes_lock = false, reads_list = false;
    int n = 0;
    dis.DecodeRange(vm.BytesAt(fn->start, fn->end - fn->start), fn->start, [&](const cs_insn& insn) {
      std::optional<uint64_t> t = RipRelativeTarget(insn);
      if (t && *t == code.hooks_lock && insn.id == X86_INS_LEA) takes_lock = true;
      if (t && *t == code.hooks && insn.id != X86_INS_LEA) reads_list = true;
      return ++n < kExecuteHooksBudget && !(takes_lock && reads_list);
    });
    result = takes_lock && reads_list;
  }
  code.execute_hooks_cache[entry] = result;
  return result;
}

}  // namespace rvbpfd
