// Function extents from the call-frame information (.eh_frame) of an ELF file.
//
// A stripped binary has no .symtab, but it keeps .eh_frame: the unwinder needs it, so `strip` and distribution
// packaging leave it in place. Every FDE covers one contiguous piece of code (a function, or a GCC `.cold` /
// `.part.N` piece of one), which is what the site finder needs to decode code function by function without symbols.
#ifndef RVBPFD_SRC_ELF_EH_FRAME_H_
#define RVBPFD_SRC_ELF_EH_FRAME_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "common/error.h"
#include "elf/elf_file.h"

namespace rvbpfd {

// [start, end) in ELF virtual addresses.
struct CodeRange {
  uint64_t start = 0;
  uint64_t end = 0;
  bool operator==(const CodeRange&) const = default;
};

// The code ranges of every FDE in .eh_frame whose range lies inside an executable PT_LOAD segment's file part,
// sorted by start, one per start, none overlapping the next (a crafted file's overlapping FDEs are cut at the next
// one's start, so walks over them stay linear in the code). Bounded by the section size; kNoSymbols when the file has no .eh_frame, or
// an entry cannot be parsed (an unknown pointer encoding, a length running past the section): a partial list would
// hide code from the site finder, so none is returned.
Result<std::vector<CodeRange>> FunctionRangesFromEhFrame(const ElfFile& elf);

// The range of `ranges` (sorted, as returned above) that contains vaddr, if any.
std::optional<CodeRange> RangeContaining(const std::vector<CodeRange>& ranges, uint64_t vaddr);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_ELF_EH_FRAME_H_
