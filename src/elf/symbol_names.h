// Whether an ELF file can define a symbol of a given name, read from its symbol string tables only.
//
// DiscoverTarget asks this of every executable that maps no libruby (every exec on a fleet host) before it parses the
// file as a possible static ruby. ElfFile copies a whole file (up to 1 GiB) to parse it; this reads the ELF header,
// the section headers and the string tables of SHT_DYNSYM and SHT_SYMTAB sections, in chunks of at most kChunkBytes
// held at once, so a large program that is not a Ruby VM costs the agent a few reads instead of a copy of the file.
//
// The answer is conservative: a name found as a whole NUL-terminated string in one of those tables "may" be a defined
// symbol (the full parse decides); one found in none cannot be a symbol of the file. Reads are bounded by the file's
// size (fstat) and every header is checked against it, and the string tables together may not exceed the file (so a
// crafted file cannot make it read the file many times); a file that is not a 64-bit little-endian ELF, or whose
// headers do not fit, is an error, so the caller falls back to the full parse.
//
// Threading: no state; safe from any thread.
#ifndef RVBPFD_SRC_ELF_SYMBOL_NAMES_H_
#define RVBPFD_SRC_ELF_SYMBOL_NAMES_H_

#include <cstddef>
#include <span>
#include <string_view>

#include "common/error.h"

namespace rvbpfd {

// Largest string-table chunk read at once (bytes).
inline constexpr size_t kSymbolNamesChunkBytes = 1u << 20;

// True when some name of `names` is a whole string of a symbol string table of the ELF file open at `fd` (a regular
// file, read with pread). `chunk_bytes` (tests) bounds each read; names must be non-empty and shorter than it.
Result<bool> StringTablesName(int fd, std::span<const std::string_view> names,
                              size_t chunk_bytes = kSymbolNamesChunkBytes);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_ELF_SYMBOL_NAMES_H_
