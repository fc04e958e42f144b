#include "sites/dwarf_info.h"

#include <dwarf.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace rvbpfd {
namespace {

// Frees a malloc'd libdw result (dwarf_getscopes arrays, Dwarf_Frame) on scope exit.
template <typename T>
struct FreeOnExit {
  T* p = nullptr;
  ~FreeOnExit() { std::free(p); }
};

// A value on the symbolic DWARF stack: reg + offset (reg < 0: a constant).
struct SymValue {
  int reg = -1;
  int64_t offset = 0;
};

bool FitsInt32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

}  // namespace

std::unique_ptr<DwarfInfo> DwarfInfo::Open(const ElfFile& elf) {
  // DWARF from the binary or its split debug file; .eh_frame only from the binary (a debug file made by
  // `objcopy --only-keep-debug` keeps allocated sections such as .eh_frame as NOBITS).
  const ElfFile& dw = elf.dwarf_file();
  if (!dw.FindSection(".debug_info")) return nullptr;
  // Their debug sections are copied on first use (ElfFile::Open); a file that changed since it was opened gives none.
  if (!dw.LoadDeferredSections().ok() || !elf.LoadDeferredSections().ok()) return nullptr;
  Dwarf* dwarf = dwarf_begin_elf(dw.handle(), DWARF_C_READ, nullptr);
  if (dwarf == nullptr) return nullptr;
  std::unique_ptr<DwarfInfo> info(new DwarfInfo());
  info->dwarf_ = dwarf;
  info->eh_cfi_ = dwarf_getcfi_elf(elf.handle());
  return info;
}

DwarfInfo::~DwarfInfo() {
  if (eh_cfi_ != nullptr) dwarf_cfi_end(eh_cfi_);
  if (dwarf_ != nullptr) dwarf_end(dwarf_);
}

bool DwarfInfo::CuDieFor(uint64_t pc, Dwarf_Die* cudie) {
  if (dwarf_addrdie(dwarf_, pc, cudie) != nullptr) return true;
  // No .debug_aranges entry: walk the CUs and ask each whether it covers pc.
  Dwarf_Off off = 0, next = 0;
  size_t header_size = 0;
  while (dwarf_nextcu(dwarf_, off, &next, &header_size, nullptr, nullptr, nullptr) == 0) {
    if (dwarf_offdie(dwarf_, off + header_size, cudie) != nullptr && dwarf_haspc(cudie, pc) == 1) return true;
    off = next;
  }
  return false;
}

bool DwarfInfo::CfaAt(uint64_t pc, int* reg, int64_t* offset) {
  Dwarf_CFI* cfis[2] = {eh_cfi_, dwarf_getcfi(dwarf_)};
  for (Dwarf_CFI* cfi : cfis) {
    if (cfi == nullptr) continue;
    FreeOnExit<Dwarf_Frame> frame;
    if (dwarf_cfi_addrframe(cfi, pc, &frame.p) != 0) continue;
    Dwarf_Op* ops = nullptr;
    size_t nops = 0;
    if (dwarf_frame_cfa(frame.p, &ops, &nops) != 0) continue;
    // libdw expresses the usual "CFA = reg + offset" rule as a single DW_OP_bregx (number = register,
    // number2 = offset); accept DW_OP_bregN too.
    if (nops == 1 && ops[0].atom == DW_OP_bregx && ops[0].number < RV_REG_COUNT) {
      *reg = static_cast<int>(ops[0].number);
      *offset = static_cast<int64_t>(ops[0].number2);
      return true;
    }
    if (nops == 1 && ops[0].atom >= DW_OP_breg0 && ops[0].atom <= DW_OP_breg15) {
      *reg = ops[0].atom - DW_OP_breg0;
      *offset = static_cast<int64_t>(ops[0].number);
      return true;
    }
    return false;
  }
  return false;
}

DwarfInfo::VarResult DwarfInfo::LocateVariable(uint64_t pc, const char* name) {
  VarResult result;
  Dwarf_Die cudie;
  if (!CuDieFor(pc, &cudie)) return result;
  FreeOnExit<Dwarf_Die> scopes;
  int nscopes = dwarf_getscopes(&cudie, pc, &scopes.p);
  if (nscopes <= 0) return result;
  Dwarf_Die var;
  if (dwarf_getscopevar(scopes.p, nscopes, name, 0, nullptr, 0, 0, &var) < 0) return result;

  Dwarf_Attribute attr;
  Dwarf_Op* expr = nullptr;
  size_t len = 0;
  if (dwarf_attr(&var, DW_AT_location, &attr) == nullptr || dwarf_getlocation_addr(&attr, pc, &expr, &len, 1) <= 0 ||
      len == 0) {
    result.status = VarStatus::kOptimizedOut;
    return result;
  }

  // Frame base of the innermost concrete function among the scopes (abstract inline definitions carry none).
  int frame_base_reg = -1;
  int64_t frame_base_offset = 0;
  for (int i = 0; i < nscopes; ++i) {
    Dwarf_Attribute fb;
    if (dwarf_tag(&scopes.p[i]) != DW_TAG_subprogram || dwarf_attr(&scopes.p[i], DW_AT_frame_base, &fb) == nullptr) {
      continue;
    }
    Dwarf_Op* fb_expr = nullptr;
    size_t fb_len = 0;
    if (dwarf_getlocation_addr(&fb, pc, &fb_expr, &fb_len, 1) == 1 && fb_len == 1 &&
        fb_expr[0].atom >= DW_OP_breg0 && fb_expr[0].atom <= DW_OP_breg15) {
      frame_base_reg = fb_expr[0].atom - DW_OP_breg0;
      frame_base_offset = static_cast<int64_t>(fb_expr[0].number);
    }
    break;
  }

  // Evaluates the expression symbolically: every supported value is "register + constant".
  std::vector<SymValue> stack;
  bool is_value = false;  // DW_OP_stack_value: the result is th itself, not its address
  auto unsupported = [&](const std::string& why) {
    result.status = VarStatus::kUnsupported;
    result.detail = why;
    return result;
  };
  for (size_t i = 0; i < len; ++i) {
    const Dwarf_Op& op = expr[i];
    if (op.atom >= DW_OP_reg0 && op.atom <= DW_OP_reg31) {
      int reg = op.atom - DW_OP_reg0;
      // A register location: th is the register's value. Only valid as the whole expression (or one 8-byte piece).
      bool whole = len == 1 || (len == 2 && expr[1].atom == DW_OP_piece && expr[1].number == 8);
      if (!whole || reg >= RV_REG_COUNT) return unsupported("register location DW_OP_reg" + std::to_string(reg));
      result.status = VarStatus::kFound;
      result.loc = {RV_LOC_REG, static_cast<uint8_t>(reg), 0};
      return result;
    } else if (op.atom >= DW_OP_breg0 && op.atom <= DW_OP_breg31) {
      stack.push_back({op.atom - DW_OP_breg0, static_cast<int64_t>(op.number)});
    } else if (op.atom == DW_OP_fbreg && frame_base_reg >= 0) {
      // A frame base that is a register (+offset), e.g. rbp in code built with frame pointers.
      stack.push_back({frame_base_reg, frame_base_offset + static_cast<int64_t>(op.number)});
    } else if (op.atom == DW_OP_fbreg || op.atom == DW_OP_call_frame_cfa) {
      // The frame base is DW_OP_call_frame_cfa (what GCC emits on x86-64, and the assumption when the concrete
      // function's DW_AT_frame_base is not among the scopes): resolve the CFA from .eh_frame/.debug_frame at pc.
      int reg = -1;
      int64_t cfa_off = 0;
      if (!CfaAt(pc, &reg, &cfa_off)) return unsupported("no CFA rule at this pc");
      int64_t k = op.atom == DW_OP_fbreg ? static_cast<int64_t>(op.number) : 0;
      stack.push_back({reg, cfa_off + k});
    } else if (op.atom == DW_OP_plus_uconst) {
      if (stack.empty()) return unsupported("DW_OP_plus_uconst on empty stack");
      stack.back().offset += static_cast<int64_t>(op.number);
    } else if (op.atom >= DW_OP_lit0 && op.atom <= DW_OP_lit31) {
      stack.push_back({-1, op.atom - DW_OP_lit0});
    } else if (op.atom == DW_OP_consts || op.atom == DW_OP_constu || op.atom == DW_OP_const1s ||
               op.atom == DW_OP_const2s || op.atom == DW_OP_const4s || op.atom == DW_OP_const1u ||
               op.atom == DW_OP_const2u || op.atom == DW_OP_const4u) {
      stack.push_back({-1, static_cast<int64_t>(op.number)});
    } else if (op.atom == DW_OP_plus || op.atom == DW_OP_minus) {
      if (stack.size() < 2) return unsupported("arithmetic on a short stack");
      SymValue b = stack.back();
      stack.pop_back();
      SymValue& a = stack.back();
      if (b.reg >= 0) return unsupported("register-register arithmetic");
      a.offset = op.atom == DW_OP_plus ? a.offset + b.offset : a.offset - b.offset;
    } else if (op.atom == DW_OP_stack_value) {
      is_value = true;
      break;
    } else if (op.atom == DW_OP_piece && i == len - 1 && op.number == 8) {
      break;
    } else {
      return unsupported("DWARF op 0x" + std::to_string(op.atom));
    }
  }
  if (stack.size() != 1 || stack.back().reg < 0 || stack.back().reg >= RV_REG_COUNT ||
      !FitsInt32(stack.back().offset)) {
    return unsupported("expression does not reduce to register + offset");
  }
  result.status = VarStatus::kFound;
  result.loc = {static_cast<uint8_t>(is_value ? RV_LOC_REG : RV_LOC_MEM), static_cast<uint8_t>(stack.back().reg),
                static_cast<int32_t>(stack.back().offset)};
  return result;
}

bool DwarfInfo::FindMember(uint64_t cu_pc, const char* struct_name, const char* member, Dwarf_Die* out) {
  Dwarf_Die cudie;
  if (!CuDieFor(cu_pc, &cudie)) return false;
  Dwarf_Die child;
  if (dwarf_child(&cudie, &child) != 0) return false;
  do {
    if (dwarf_tag(&child) != DW_TAG_structure_type || dwarf_hasattr(&child, DW_AT_declaration)) continue;
    const char* n = dwarf_diename(&child);
    if (n == nullptr || std::strcmp(n, struct_name) != 0) continue;
    if (dwarf_child(&child, out) != 0) return false;
    do {
      if (dwarf_tag(out) != DW_TAG_member) continue;
      const char* mn = dwarf_diename(out);
      if (mn != nullptr && std::strcmp(mn, member) == 0) return true;
    } while (dwarf_siblingof(out, out) == 0);
    return false;
  } while (dwarf_siblingof(&child, &child) == 0);
  return false;
}

std::optional<uint32_t> DwarfInfo::MemberOffset(uint64_t cu_pc, const char* struct_name, const char* member) {
  Dwarf_Die m;
  if (!FindMember(cu_pc, struct_name, member, &m)) return std::nullopt;
  Dwarf_Attribute attr;
  Dwarf_Word off = 0;
  if (dwarf_attr(&m, DW_AT_data_member_location, &attr) == nullptr || dwarf_formudata(&attr, &off) != 0 ||
      off > UINT32_MAX) {
    return std::nullopt;
  }
  return static_cast<uint32_t>(off);
}

std::optional<uint32_t> DwarfInfo::MemberBitOffset(uint64_t cu_pc, const char* struct_name, const char* member) {
  Dwarf_Die m;
  if (!FindMember(cu_pc, struct_name, member, &m)) return std::nullopt;
  Dwarf_Attribute attr;
  Dwarf_Word off = 0;
  if (dwarf_attr(&m, DW_AT_data_bit_offset, &attr) != nullptr) {
    if (dwarf_formudata(&attr, &off) != 0 || off > UINT32_MAX) return std::nullopt;
    return static_cast<uint32_t>(off);
  }
  if (dwarf_hasattr(&m, DW_AT_bit_offset)) return std::nullopt;
  if (dwarf_attr(&m, DW_AT_data_member_location, &attr) == nullptr || dwarf_formudata(&attr, &off) != 0 ||
      off > UINT32_MAX / 8) {
    return std::nullopt;
  }
  return static_cast<uint32_t>(off * 8);
}

std::optional<uint32_t> DwarfInfo::MemberPathOffset(uint64_t cu_pc, const char* struct_name,
                                                    std::initializer_list<const char*> path) {
  if (path.size() == 0) return std::nullopt;
  Dwarf_Die cudie;
  if (!CuDieFor(cu_pc, &cudie)) return std::nullopt;
  Dwarf_Die type;
  bool found = false;
  if (dwarf_child(&cudie, &type) != 0) return std::nullopt;
  do {
    if (dwarf_tag(&type) != DW_TAG_structure_type || dwarf_hasattr(&type, DW_AT_declaration)) continue;
    const char* n = dwarf_diename(&type);
    if (n != nullptr && std::strcmp(n, struct_name) == 0) {
      found = true;
      break;
    }
  } while (dwarf_siblingof(&type, &type) == 0);
  if (!found) return std::nullopt;
  uint64_t total = 0;
  size_t depth = 0;
  for (const char* member : path) {
    Dwarf_Die m;
    if (dwarf_child(&type, &m) != 0) return std::nullopt;
    bool hit = false;
    do {
      if (dwarf_tag(&m) != DW_TAG_member) continue;
      const char* mn = dwarf_diename(&m);
      if (mn != nullptr && std::strcmp(mn, member) == 0) {
        hit = true;
        break;
      }
    } while (dwarf_siblingof(&m, &m) == 0);
    if (!hit) return std::nullopt;
    Dwarf_Attribute attr;
    Dwarf_Word off = 0;
    if (dwarf_attr(&m, DW_AT_data_member_location, &attr) == nullptr || dwarf_formudata(&attr, &off) != 0) {
      return std::nullopt;
    }
    total += off;
    if (total > UINT32_MAX) return std::nullopt;
    if (++depth == path.size()) break;
    // Descend into the member's struct type; a handful of typedef/qualifier hops at most in real code.
    Dwarf_Attribute type_attr;
    if (dwarf_attr_integrate(&m, DW_AT_type, &type_attr) == nullptr ||
        dwarf_formref_die(&type_attr, &type) == nullptr) {
      return std::nullopt;
    }
    for (int hops = 0; hops < 8; ++hops) {
      const int tag = dwarf_tag(&type);
      if (tag != DW_TAG_typedef && tag != DW_TAG_const_type && tag != DW_TAG_volatile_type) break;
      if (dwarf_attr_integrate(&type, DW_AT_type, &type_attr) == nullptr ||
          dwarf_formref_die(&type_attr, &type) == nullptr) {
        return std::nullopt;
      }
    }
    if (dwarf_tag(&type) != DW_TAG_structure_type) return std::nullopt;
  }
  return static_cast<uint32_t>(total);
}

}  // namespace rvbpfd
