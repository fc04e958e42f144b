// The last word on every probe address, from the code itself: whatever named it (the binary's .symtab, a debug file
// found by build-id, the site cache, .eh_frame), a uprobe goes only on an instruction boundary of the binary's own
// code. A uprobe inside an instruction makes the kernel execute a corrupted one in every process that maps the file
// (the uprobe is on the inode, whoever attached it): a crash or silent corruption for every tenant of that binary.
// Internal to the sites module.
#ifndef RVBPFD_SRC_SITES_CODE_CHECK_H_
#define RVBPFD_SRC_SITES_CODE_CHECK_H_

#include <vector>

#include "common/error.h"
#include "elf/elf_file.h"
#include "sites/disasm.h"
#include "sites/sites.h"

namespace rvbpfd {

// Checks each site against the code of `vm` (its own bytes, never an attached debug file's): the function extents
// come from the binary's own .eh_frame (every GCC function and .cold/.part piece has its FDE; a tenant's debug file
// cannot move them), else from the binary's own .symtab. For each site, its check instruction and its probe lie in
// one function, and both are instruction boundaries of that function decoded linearly (capstone) from its start;
// function-entry, GC function entry and return sites stand for the function's very start (a return probe anywhere
// else would take a stack slot that is not the return address for it). Errors: kNoSymbols naming the first site
// refused (event, function, address, why) and the binary.
Status CheckSitesAgainstCode(const ElfFile& vm, Disassembler& dis, const std::vector<ProbeSite>& sites);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SITES_CODE_CHECK_H_
