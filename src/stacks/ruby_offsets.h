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
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "rvbpfd/abi.h"
#include "rvbpfd/ruby_walker_types.h"
#include "common/error.h"
#include "elf/elf_file.h"

namespace rvbpfd {

// The two ABI structs RubyOffsets holds are all __u32 (no padding), so bytes compare them.
inline bool operator==(const rv_ruby_walk_offsets& a, const rv_ruby_walk_offsets& b) {
  return std::memcmp(&a, &b, sizeof(a)) == 0;
}
inline bool operator==(const rv_gvl_offsets& a, const rv_gvl_offsets& b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

struct RubyOffsets {
  int major = 0, minor = 0;
  rv_ruby_walk_offsets walk{};  // what the walker (BPF and host) needs

  uint32_t thread_ec = 48;  // rb_thread_t.ec
  // rb_thread_t.name (VALUE: Thread#name, a String or nil). From DWARF only (its offset depends on structs before it
  // that vary with the build); kNoThreadName without DWARF, and Thread#name is then not read.
  static constexpr uint32_t kNoThreadName = 0xffffffff;
  uint32_t thread_name = kNoThreadName;

  // How a sample finds its EC (bpf/ruby_ec.h, src/stacks/ec_route.h).
  uint32_t ec_thread_ptr = 48;        // rb_execution_context_t.thread_ptr
  uint32_t vm_main_ractor = 32;       // rb_vm_t.ractor.main_ractor
  uint32_t ractor_running_ec = 384;   // rb_ractor_t.threads.running_ec (4.0.6 moved it; DWARF knows, the table not)

  // How a sample reads its VM's GVL holder and queue (bpf/ruby_gvl.h). base RV_GVL_BASE_NONE: no reading (a release
  // line the table does not know, and no DWARF to say); fields the VM does not have are RV_GVL_NO_FIELD.
  rv_gvl_offsets gvl{RV_GVL_BASE_NONE, RV_GVL_NO_FIELD, RV_GVL_NO_FIELD, RV_GVL_NO_FIELD, RV_GVL_NO_FIELD,
                     RV_GVL_NO_FIELD};

  // rb_iseq_t / rb_iseq_constant_body
  uint32_t iseq_body = 16;
  uint32_t body_type = 0;          // enum rb_iseq_type (u32); ISEQ_TYPE_METHOD = 1
  uint32_t body_iseq_size = 4;     // u32, in VALUE words
  uint32_t body_iseq_encoded = 8;  // VALUE *
  uint32_t body_location = 64;     // rb_iseq_location_t
  uint32_t loc_pathobj = 0, loc_base_label = 8, loc_label = 16, loc_first_lineno = 24;  // first_lineno is an int
  bool loc_first_lineno_is_fixnum = false;  // 3.1: first_lineno is a VALUE holding a Fixnum
  uint32_t body_insns_info_body = 112;  // struct iseq_insn_info_entry * (12-byte entries, line_no first)
  uint32_t body_insns_info_size = 128;  // u32
  uint32_t body_succ_index_table = 136;
  uint32_t body_local_iseq = 168;

  // rb_callable_method_entry_t / rb_method_definition_t
  uint32_t cme_defined_class = 8;
  uint32_t cme_def = 16;
  uint32_t def_iseqptr = 8;  // body.iseq.iseqptr
  uint32_t def_original_id = 32;

  // Classes (3.3+: the classext follows RClass). 0 = not available (3.1/3.2 keep the class path in a hidden ivar).
  uint32_t klass_super = 16;
  uint32_t klass_attached_object = 128;
  uint32_t klass_classpath = 152;
  uint64_t fl_singleton = 0x1000;          // FL_USER0 up to 3.3, FL_USER1 from 3.4
  bool singleton_requires_t_class = false;  // 3.4+: RCLASS_SINGLETON_P also requires T_CLASS

  // 3.1: RClass.ptr, the rb_classext_t pointer (0 = none: 3.2+). When set, the class path and a singleton class's
  // attached object are read from the hidden ivars in classext->iv_tbl (an st_table of ID -> VALUE) instead of
  // klass_classpath / klass_attached_object.
  uint32_t klass_ext_ptr = 0;
  uint32_t classext_iv_tbl = 8;

  // 3.2: a class's ivars (the hidden ones above among them) live in object shapes, as rb_ivar_lookup reads them: the
  // shape id is flags >> 32, the shape vm->shape_list[id] (an rb_shape_t), and rb_shape_get_iv_index walks parent_id
  // to the shape whose edge_name is the ID; the value is RCLASS_EXT(klass)->iv_ptr[next_iv_index - 1], where the
  // classext follows struct RClass. klass_ext_inline 0: not this layout. Bytes.
  uint32_t klass_ext_inline = 0;      // RCLASS_EXT(klass) - klass = sizeof(struct RClass)
  uint32_t classext_iv_ptr = 0;       // rb_classext_t.iv_ptr (VALUE *)
  uint32_t vm_shape_list = 0;         // rb_vm_t.shape_list (rb_shape_t *)
  uint32_t vm_next_shape_id = 0;      // rb_vm_t.next_shape_id (u32): the ids in use are below it
  uint32_t shape_size = 32;           // sizeof(rb_shape_t)
  uint32_t shape_edge_name = 8;       // rb_shape_t.edge_name (ID)
  uint32_t shape_next_iv_index = 16;  // rb_shape_t.next_iv_index (u32)
  uint32_t shape_type = 24;           // rb_shape_t.type (u8, enum shape_type: SHAPE_IVAR = 1)
  uint32_t shape_parent_id = 28;      // rb_shape_t.parent_id (u32; 0xffffffff above the root)

  // RString / RArray (3.2+ RVARGC layout by default). 3.1: embedded bytes at +16 and the embedded length in the flags
  // (string_embed_len_mask, shifted by 14); embedded arrays keep their length in FL_USER3..4 instead of FL_USER3..9.
  uint32_t string_embed_bytes = 24;
  uint64_t string_embed_len_mask = 0;  // 0: the length is at +16 for embedded strings too
  uint64_t array_embed_len_mask = 0x7f;  // applied after >> 15

  // rb_symbols_t (ruby_global_symbols) and symbol.c's ID numbering.
  uint32_t symbols_last_id = 0;
  uint32_t symbols_ids = 16;
  uint64_t last_op_id = 169;  // tLAST_OP_ID

  // The reference table for a CRuby version. kUnsupportedVersion outside 3.2 - 4.0.
  static Result<RubyOffsets> ForVersion(int major, int minor);

  bool operator==(const RubyOffsets&) const = default;
};

// What OffsetsForBinary learned from DWARF.
struct OffsetsReport {
  int from_dwarf = 0;                   // fields whose value came from DWARF
  std::vector<std::string> dwarf_fields;  // their names ("ec.cfp", "ractor.threads.sched.running", ...)
  std::vector<std::string> mismatches;  // "ec.cfp: table 16, dwarf 24" for each field where table and DWARF differ
};

// Overrides `*field` with the DWARF value when there is one, counting it in `report` and noting a disagreement
// with the table value; a field the table does not have (0xffffffff, RV_GVL_NO_FIELD) is learnt, not contradicted.
void ApplyDwarfOffset(std::optional<uint32_t> dwarf, uint32_t* field, const char* name, OffsetsReport* report);

// Table values for the binary's version, overridden by what its DWARF says. Without DWARF the table is returned
// unchanged (report->from_dwarf == 0).
Result<RubyOffsets> OffsetsForBinary(const ElfFile& elf, int major, int minor, OffsetsReport* report);

// ELF vaddr of ruby_global_symbols: from .symtab (LOCAL there), else recovered from rb_id2str's code for stripped
// binaries (GlobalSymbolsFromCode, stacks/global_symbols.h); kNoSymbols when neither works.
Result<uint64_t> FindGlobalSymbolsVaddr(const ElfFile& elf);
// ELF vaddr of ruby_current_vm_ptr (exported, so .dynsym has it in a stripped binary too); 0 when absent.
uint64_t FindCurrentVmPtrVaddr(const ElfFile& elf);

// Load bias of an ELF whose lowest mapping in the process starts at `lowest_mapping_start`.
uint64_t LoadBiasFromLowestMapping(const ElfFile& elf, uint64_t lowest_mapping_start);
// The same from the ELF's lowest PT_LOAD vaddr (LowestLoadVaddr), for callers that keep that number, not the file.
uint64_t LoadBiasFromLowestMapping(uint64_t lowest_load_vaddr, uint64_t lowest_mapping_start);
// The lowest p_vaddr of the ELF's PT_LOAD headers; UINT64_MAX when it has none.
uint64_t LowestLoadVaddr(const ElfFile& elf);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_STACKS_RUBY_OFFSETS_H_
