// Finding ruby_global_symbols (symbol.c's rb_symbols_t: the ID -> String table C function names come from) in a VM
// binary whose .symtab is gone.
//
// The symbol is LOCAL in every CRuby build, so a distro-stripped libruby (Debian's libruby-3.1.so.3.1 keeps only
// .dynsym) does not name it. Its address is still written into the code of the exported rb_id2str: in 3.1 - 3.4
// (x86_64, gcc -O2/-O3) get_id_serial_entry compares the serial against `global_symbols.last_id` (a 32-bit read of
// the struct's first field) and then loads `global_symbols.ids` (a 64-bit read 16 bytes further on), both
// RIP-relative. rb_id2str either inlines that (3.3, 3.4) or tail-calls it (3.1's rb_id2str is `jmp
// get_id_serial_entry`), so the search also follows direct jumps and calls into the binary's own .text.
#ifndef RVBPFD_SRC_STACKS_GLOBAL_SYMBOLS_H_
#define RVBPFD_SRC_STACKS_GLOBAL_SYMBOLS_H_

#include <cstdint>

#include "common/error.h"
#include "elf/elf_file.h"

namespace rvbpfd {

// ELF vaddr of ruby_global_symbols recovered from rb_id2str's code: the unique X such that the code reads 4 bytes at
// X (last_id, +0) and 8 bytes at X + 16 (ids, +16), with X inside .data or .bss. kNoSymbols when rb_id2str is not
// defined, no such pair exists, or more than one does (an unknown code shape is an error, never a guess). A live
// process or core should still confirm the table (Symbolizer checks it before its first use).
Result<uint64_t> GlobalSymbolsFromCode(const ElfFile& elf);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_STACKS_GLOBAL_SYMBOLS_H_
