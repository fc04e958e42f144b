// Per-binary CRuby layout for the frame walker and the symbolizer (x86_64, CRuby 3.2 - 4.0).
//
// Two sources: the tables in ruby_offsets.cc (from ../shared/reference/cruby-frame-walker.md §4, themselves measured
// with gdb on our 3.3.8/3.4.5 builds and taken from rbspy's bindgen structs for 3.2/4.0), and the VM binary's DWARF
// when it has some. DWARF wins; every field both sources know is cross-checked and disagreements are reported, so a
// table that drifts from a real build is caught (tests assert there are none on the test Rubies).
#ifndef RVBPFD_SRC_STACKS_RUBY_OFFSETS_H_
#define RVBPFD_SRC_STACKS_RUBY_OFFSETS_H_

#include <linux/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../../bpf/ruby_walker_types.h"
#include "common/error.h"
#include "elf/elf_file.h"

namespace rvbpfd {

struct RubyOffsets {
  int major = 0, minor = 0;
  rv_ruby_walk_offsets walk{};  // what the walker (BPF and host) needs

  uint32_t thread_ec = 48;  // rb_thread_t.ec

  // rb_iseq_t / rb_iseq_constant_body
  uint32_t iseq_body = 16;
  uint32_t body_type = 0;          // enum rb_iseq_type (u32); ISEQ_TYPE_METHOD = 1
  uint32_t body_iseq_size = 4;     // u32, in VALUE words
  uint32_t body_iseq_encoded = 8;  // VALUE *
  uint32_t body_location = 64;     // rb_iseq_location_t
  uint32_t loc_pathobj = 0, loc_base_label = 8, loc_label = 16, loc_first_lineno = 24;  // first_lineno is an int
  uint32_t body_insns_info_body = 112;  // struct iseq_insn_info_entry * (12-byte entries, line_no first)
  uint32_t body_insns_info_size = 128;  // u32
  uint32_t body_succ_index_table = 136;
  uint32_t body_local_iseq = 168;

  // rb_callable_method_entry_t / rb_method_definition_t
  uint32_t cme_defined_class = 8;
  uint32_t cme_def = 16;
  uint32_t def_iseqptr = 8;  // body.iseq.iseqptr
  uint32_t def_original_id = 32;

  // Classes (3.3+: the classext follows RClass). 0 = not available (3.2 keeps the class path in a hidden ivar).
  uint32_t klass_super = 16;
  uint32_t klass_attached_object = 128;
  uint32_t klass_classpath = 152;
  uint64_t fl_singleton = 0x1000;          // FL_USER0 up to 3.3, FL_USER1 from 3.4
  bool singleton_requires_t_class = false;  // 3.4+: RCLASS_SINGLETON_P also requires T_CLASS

  // rb_symbols_t (ruby_global_symbols) and symbol.c's ID numbering.
  uint32_t symbols_last_id = 0;
  uint32_t symbols_ids = 16;
  uint64_t last_op_id = 169;  // tLAST_OP_ID

  // The reference table for a CRuby version. kUnsupportedVersion outside 3.2 - 4.0.
  static Result<RubyOffsets> ForVersion(int major, int minor);
};

// What OffsetsForBinary learned from DWARF.
struct OffsetsReport {
  int from_dwarf = 0;                   // fields whose value came from DWARF
  std::vector<std::string> mismatches;  // "ec.cfp: table 16, dwarf 24" for each field where table and DWARF differ
};

// Table values for the binary's version, overridden by what its DWARF says. Without DWARF the table is returned
// unchanged (report->from_dwarf == 0).
Result<RubyOffsets> OffsetsForBinary(const ElfFile& elf, int major, int minor, OffsetsReport* report);

// Runtime addresses of the VM's global symbols the symbolizer needs.
struct VmSymbols {
  uint64_t load_bias = 0;            // runtime address - ELF virtual address
  uint64_t global_symbols = 0;       // &ruby_global_symbols (0: unknown; cfunc names become unresolved)
};

// ELF vaddr of ruby_global_symbols from .symtab (LOCAL there; stripped binaries lack it: kNoSymbols).
Result<uint64_t> FindGlobalSymbolsVaddr(const ElfFile& elf);

// Load bias of an ELF whose lowest mapping in the process starts at `lowest_mapping_start`.
uint64_t LoadBiasFromLowestMapping(const ElfFile& elf, uint64_t lowest_mapping_start);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_STACKS_RUBY_OFFSETS_H_
