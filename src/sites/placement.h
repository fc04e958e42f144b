// Where a site's uprobe sits: on an instruction the kernel emulates, near the check it stands for. Internal to the
// sites module (FindSites calls it; tests drive it on hand-written shapes).
#ifndef RVBPFD_SRC_SITES_PLACEMENT_H_
#define RVBPFD_SRC_SITES_PLACEMENT_H_

#include <vector>

#include "elf/elf_file.h"
#include "sites/disasm.h"
#include "sites/dwarf_info.h"
#include "sites/sites.h"
#include "sites/stripped.h"

namespace rvbpfd {

// Moves each hook-check and function-entry probe (not the GC function fallback's entry/return pairs, whose return
// probe must stay on the entry) from its instruction to the first later one on the same straight-line path that the
// kernel emulates (IsKernelEmulated): usually the jcc that consumes the check's flags, or the jmp after
// rb_mutex_lock's argument setup. A single-stepped uprobe takes a second exception; on a VM that is ~9 of the
// ~10 us a hit costs. The move keeps the hit count (nothing in between branches, and no direct branch of the
// function or its pieces lands in between), the stack pointer (nothing in between writes rsp, so a function entry's
// return address is still at [rsp]) and `th`: a DWARF location is evaluated again at the new address (the probe
// stays if DWARF loses th there), other locations need their registers unwritten in between. Sets check_vaddr
// (where unset) and single_step (whether the kernel single-steps the instruction the probe ends up on) of every site.
// Without .symtab (`stripped` set) a function's extent is its FDE and the branches considered are every direct
// branch of the whole binary.
void PlaceOnEmulatedInstructions(const ElfFile& vm, Disassembler& dis, DwarfInfo* dwarf,
                                 std::vector<ProbeSite>* sites, const StrippedCode* stripped = nullptr);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SITES_PLACEMENT_H_
