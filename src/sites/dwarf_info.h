// DWARF queries the site finder needs (libdw): where a variable lives at a PC, and struct member offsets.
// Internal to the sites module.
#ifndef RVBPFD_SRC_SITES_DWARF_INFO_H_
#define RVBPFD_SRC_SITES_DWARF_INFO_H_

#include <elfutils/libdw.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "elf/elf_file.h"
#include "sites/sites.h"

namespace rvbpfd {

class DwarfInfo {
 public:
  // nullptr when the file has no usable DWARF (.debug_info absent or unreadable).
  static std::unique_ptr<DwarfInfo> Open(const ElfFile& elf);
  DwarfInfo(const DwarfInfo&) = delete;
  DwarfInfo& operator=(const DwarfInfo&) = delete;
  ~DwarfInfo();

  enum class VarStatus {
    kFound,         // loc is valid
    kOptimizedOut,  // the variable exists but has no location at pc
    kNoVariable,    // no variable of that name in scope at pc (or no CU covers pc)
    kUnsupported,   // a location expression we do not translate; detail says which
  };
  struct VarResult {
    VarStatus status = VarStatus::kNoVariable;
    ThLocation loc;
    std::string detail;
  };
  // Location of the innermost variable or parameter called `name` in scope at `pc` (inlined subroutines included),
  // translated to a ThLocation valid at that instruction (CFA-relative slots become rsp/rbp-relative through CFI).
  VarResult LocateVariable(uint64_t pc, const char* name);

  // Byte offset of `member` in `struct struct_name` as defined in the compilation unit that covers `cu_pc`.
  std::optional<uint32_t> MemberOffset(uint64_t cu_pc, const char* struct_name, const char* member);
  // The same for a member of a member, following the members' struct types (typedefs and qualifiers stripped), e.g.
  // {"ractor", "main_ractor"} in rb_vm_struct, whose `ractor` is an anonymous struct. Offsets add up.
  std::optional<uint32_t> MemberPathOffset(uint64_t cu_pc, const char* struct_name,
                                           std::initializer_list<const char*> path);
  // Bit offset of `member` (a bit-field, or any member: then 8 x its byte offset) from the start of the struct, from
  // DW_AT_data_bit_offset (DWARF 4+). nullopt for the old big-endian-relative DW_AT_bit_offset form.
  std::optional<uint32_t> MemberBitOffset(uint64_t cu_pc, const char* struct_name, const char* member);

  // CFA at pc as "reg + offset" from .eh_frame (then .debug_frame); false if there is no rule or an unsupported one.
  bool CfaAt(uint64_t pc, int* reg, int64_t* offset);

 private:
  DwarfInfo() = default;
  bool CuDieFor(uint64_t pc, Dwarf_Die* cudie);
  // The DIE of `member` of `struct struct_name` (a definition) in the CU that covers cu_pc.
  bool FindMember(uint64_t cu_pc, const char* struct_name, const char* member, Dwarf_Die* out);

  Dwarf* dwarf_ = nullptr;
  Dwarf_CFI* eh_cfi_ = nullptr;  // owned (dwarf_getcfi_elf); .debug_frame CFI is owned by dwarf_
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SITES_DWARF_INFO_H_
