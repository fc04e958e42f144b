#include "stacks/ruby_offsets.h"

#include <elf.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "sites/dwarf_info.h"
#include "stacks/global_symbols.h"

namespace rvbpfd {

Result<RubyOffsets> RubyOffsets::ForVersion(int major, int minor) {
  RubyOffsets o;
  o.major = major;
  o.minor = minor;
  const int v = major * 100 + minor;
  if (v < 301 || v > 400) {
    return Error(ErrorCode::kUnsupportedVersion,
                 "no frame-walker offsets for CRuby " + std::to_string(major) + "." + std::to_string(minor) +
                     " (3.1 - 4.0 are known)");
  }
  rv_ruby_walk_offsets& w = o.walk;
  w.ec_vm_stack = 0;
  w.ec_vm_stack_size = 8;
  w.ec_cfp = 16;
  w.cfp_pc = 0;
  w.cfp_iseq = 16;
  w.cfp_ep = 32;
  w.cme_def = 16;
  w.svar_cref_or_me = 8;
  // threads.running_ec: 3.2 has more ractor fields before it, 4.0 fewer (4.0.0 - 4.0.5: 312; 4.0.6 adds a word
  // before it, 320, which only DWARF tells apart).
  o.ractor_running_ec = v == 302 ? 520 : (v >= 400 ? 312 : 384);
  if (v <= 302) {
    // 3.1/3.2 still have __bp__ before jit_return; the class path is a hidden ivar, not a struct field.
    w.cfp_jit_return = 56;
    w.cfp_size = 64;
    w.flags = 0;  // 3.2's thread_profile_frames has no jit_return rule
    o.klass_attached_object = 0;
    o.klass_classpath = 0;
    o.last_op_id = 169;
  } else {
    w.cfp_jit_return = 48;
    w.cfp_size = 56;
    w.flags = RV_RB_WALK_F_HAS_JIT_RETURN;
  }
  if (v == 302) {
    // 3.2: class ivars in object shapes (ruby_offsets.h). gdb ptype /o on a 3.2.11 build (x86_64, RVARGC): RClass
    // {basic, super, m_tbl} = 32 bytes with the classext after it, iv_ptr its first field; rb_shape_t as in the
    // defaults; rb_vm_t.shape_list at 376 and next_shape_id at 392. DWARF overrides all of them when present.
    o.klass_ext_inline = 32;
    o.classext_iv_ptr = 0;
    o.vm_shape_list = 376;
    o.vm_next_shape_id = 392;
  }
  if (v == 301) {
    // 3.1 (Debian 12's ruby3.1; layouts from the 3.1.2 sources, x86_64, USE_RVARGC 0). Stacks only: the recorder
    // refuses < 3.2 for scheduler events. rb_profile_frames treats a non-CFRAME frame with pc 0 (the TOP frame
    // rb_vm_call_cfunc pushes while a .so loads) as a Ruby frame, and walks down to the VM stack's last frame.
    w.flags = RV_RB_WALK_F_NULL_PC_IS_RUBY_FRAME | RV_RB_WALK_F_INCLUDE_END_FRAME;
    o.thread_ec = 40;  // list_node lt_node, self, ractor, vm, ec
    o.body_insns_info_body = 120;  // rb_iseq_constant_body: param is 48 bytes, location 56 (node_id + code_location)
    o.body_insns_info_size = 136;
    o.body_succ_index_table = 144;
    o.body_local_iseq = 176;
    o.loc_first_lineno_is_fixnum = true;  // VALUE first_lineno (INT2FIX)
    // Non-RVARGC objects: embedded string bytes at +16, length in FL_USER2..6; embedded arrays hold <= 3 elements.
    o.string_embed_bytes = 16;
    o.string_embed_len_mask = 0x7c000;
    o.array_embed_len_mask = 0x3;
    // Classes: RClass {basic, super, ptr, class_serial}; the class path and a singleton's attached object are hidden
    // ivars (__classpath__ / __tmp_classpath__ / __attached__) in ptr->iv_tbl (an st_table).
    o.klass_ext_ptr = 24;
    o.classext_iv_tbl = 8;
  }
  if (v == 303 || v == 304) {
    // 3.3 / 3.4: the GVL is the ractor's threads.sched (struct rb_thread_sched: lock_ 40 bytes, running, three bools,
    // readyq, readyq_cnt) at rb_ractor_t + 288; a queued thread is linked through rb_thread_t.sched.node.readyq
    // (sched at +56, node.ubf first): gdb ptype /o on the 3.3.8 and 3.4.5 test builds, checked against DWARF by
    // OffsetsTableTest. Another release line is another entry here: its own offsets, RV_GVL_NO_FIELD for a count it
    // does not keep (the walk counts), RV_GVL_BASE_VM for a lock kept by the VM rather than per ractor.
    o.gvl = rv_gvl_offsets{.base = RV_GVL_BASE_THREAD_RACTOR,
                           .th_ractor = 24,
                           .holder = 288 + 40,
                           .queue = 288 + 56,
                           .queue_count = 288 + 72,
                           .th_queue_node = 56 + 16};
  }
  if (v == 303) o.last_op_id = 169;
  if (v >= 304) {
    o.fl_singleton = 0x2000;
    o.singleton_requires_t_class = true;
    o.last_op_id = v == 304 ? 170 : 171;
  }
  if (v >= 400) {
    // 4.0: RClass = RBasic + object_id; the classext follows it and holds super.
    o.body_local_iseq = 176;
    o.klass_super = 32;
    o.klass_attached_object = 136;
    o.klass_classpath = 152;
  }
  return o;
}

namespace {

std::optional<uint32_t> Add(std::optional<uint32_t> a, uint32_t b) {
  if (!a) return std::nullopt;
  return *a + b;
}

void Apply(std::optional<uint32_t> dwarf, uint32_t* field, const char* name, OffsetsReport* report) {
  ApplyDwarfOffset(dwarf, field, name, report);
}

}  // namespace

void ApplyDwarfOffset(std::optional<uint32_t> dwarf, uint32_t* field, const char* name, OffsetsReport* report) {
  if (!dwarf) return;
  report->from_dwarf++;
  report->dwarf_fields.push_back(name);
  // A field the table does not have for this release line (RV_GVL_NO_FIELD) is learnt, not contradicted.
  if (*dwarf != *field && *field != RV_GVL_NO_FIELD) {
    report->mismatches.push_back(std::string(name) + ": table " + std::to_string(*field) + ", dwarf " +
                          std::to_string(*dwarf));
  }
  *field = *dwarf;
}

namespace {

// Frames, iseqs, method entries and the thread's ec and name, from the CU of rb_profile_frames (vm_backtrace.c) at
// `pc`.
void ApplyFrameOffsets(DwarfInfo& dwarf, uint64_t pc, RubyOffsets& o, OffsetsReport* report) {
  auto m = [&](const char* s, const char* f) { return dwarf.MemberOffset(pc, s, f); };
  rv_ruby_walk_offsets& w = o.walk;
  Apply(m("rb_execution_context_struct", "vm_stack"), &w.ec_vm_stack, "ec.vm_stack", report);
  Apply(m("rb_execution_context_struct", "vm_stack_size"), &w.ec_vm_stack_size, "ec.vm_stack_size", report);
  Apply(m("rb_execution_context_struct", "cfp"), &w.ec_cfp, "ec.cfp", report);
  Apply(m("rb_control_frame_struct", "pc"), &w.cfp_pc, "cfp.pc", report);
  Apply(m("rb_control_frame_struct", "iseq"), &w.cfp_iseq, "cfp.iseq", report);
  Apply(m("rb_control_frame_struct", "ep"), &w.cfp_ep, "cfp.ep", report);
  std::optional<uint32_t> jit_return = m("rb_control_frame_struct", "jit_return");
  Apply(jit_return, &w.cfp_jit_return, "cfp.jit_return", report);
  // jit_return is the last member in 3.2 - 4.0, so the frame ends one pointer after it.
  Apply(Add(jit_return, 8), &w.cfp_size, "sizeof(rb_control_frame_t)", report);
  Apply(m("rb_callable_method_entry_struct", "def"), &w.cme_def, "cme.def", report);
  o.cme_def = w.cme_def;
  Apply(m("rb_callable_method_entry_struct", "defined_class"), &o.cme_defined_class, "cme.defined_class", report);
  Apply(m("rb_method_definition_struct", "original_id"), &o.def_original_id, "def.original_id", report);
  Apply(m("rb_method_definition_struct", "body"), &o.def_iseqptr, "def.body", report);
  Apply(m("vm_svar", "cref_or_me"), &w.svar_cref_or_me, "svar.cref_or_me", report);
  Apply(m("rb_thread_struct", "ec"), &o.thread_ec, "thread.ec", report);
  Apply(m("rb_thread_struct", "name"), &o.thread_name, "thread.name", report);
  Apply(m("rb_iseq_struct", "body"), &o.iseq_body, "iseq.body", report);
  Apply(m("rb_iseq_constant_body", "type"), &o.body_type, "body.type", report);
  Apply(m("rb_iseq_constant_body", "iseq_size"), &o.body_iseq_size, "body.iseq_size", report);
  Apply(m("rb_iseq_constant_body", "iseq_encoded"), &o.body_iseq_encoded, "body.iseq_encoded", report);
  Apply(m("rb_iseq_constant_body", "location"), &o.body_location, "body.location", report);
  std::optional<uint32_t> insns_info = m("rb_iseq_constant_body", "insns_info");
  // insns_info = {body, positions, size, succ_index_table} (pointer, pointer, u32 + pad, pointer).
  Apply(insns_info, &o.body_insns_info_body, "body.insns_info", report);
  Apply(Add(insns_info, 16), &o.body_insns_info_size, "body.insns_info.size", report);
  Apply(Add(insns_info, 24), &o.body_succ_index_table, "body.insns_info.succ_index_table",
        report);
  Apply(m("rb_iseq_constant_body", "local_iseq"), &o.body_local_iseq, "body.local_iseq", report);
  Apply(m("rb_iseq_location_struct", "pathobj"), &o.loc_pathobj, "location.pathobj", report);
  Apply(m("rb_iseq_location_struct", "base_label"), &o.loc_base_label, "location.base_label", report);
  Apply(m("rb_iseq_location_struct", "label"), &o.loc_label, "location.label", report);
  Apply(m("rb_iseq_location_struct", "first_lineno"), &o.loc_first_lineno, "location.first_lineno", report);
}

// The EC route (ec->thread_ptr, vm->ractor.main_ractor, ractor->threads.running_ec) from the first CU that has all
// three.
void ApplyEcRouteOffsets(const ElfFile& elf, DwarfInfo& dwarf, RubyOffsets& o, OffsetsReport* report) {
  // EC route: rb_execution_context_t and rb_vm_t come from vm_core.h, rb_ractor_t from ractor_core.h; vm.c (the CU
  // of rb_current_ec_noinline) includes both, the others are fallbacks for builds that inline it away.
  for (const char* anchor : {"rb_current_ec_noinline", "rb_vm_main_ractor_ec", "rb_profile_frames"}) {
    std::optional<ElfSymbol> fn = elf.FindSymbol(anchor);
    if (!fn || fn->shndx == SHN_UNDEF) continue;
    std::optional<uint32_t> thread_ptr = dwarf.MemberOffset(fn->value, "rb_execution_context_struct", "thread_ptr");
    std::optional<uint32_t> main_ractor = dwarf.MemberPathOffset(fn->value, "rb_vm_struct", {"ractor", "main_ractor"});
    std::optional<uint32_t> running_ec =
        dwarf.MemberPathOffset(fn->value, "rb_ractor_struct", {"threads", "running_ec"});
    if (!thread_ptr || !main_ractor || !running_ec) continue;
    Apply(thread_ptr, &o.ec_thread_ptr, "ec.thread_ptr", report);
    Apply(main_ractor, &o.vm_main_ractor, "vm.ractor.main_ractor", report);
    Apply(running_ec, &o.ractor_running_ec, "ractor.threads.running_ec", report);
    break;
  }
}

// The GVL reading (the ractor's scheduler, the thread's queue node) from the first CU that has them.
void ApplyGvlOffsets(const ElfFile& elf, DwarfInfo& dwarf, RubyOffsets& o, OffsetsReport* report) {
  // The GVL reading: rb_ractor_t's scheduler and rb_thread_t's queue node, from the same CUs as the EC route.
  for (const char* anchor : {"rb_current_ec_noinline", "rb_vm_main_ractor_ec", "rb_profile_frames"}) {
    std::optional<ElfSymbol> fn = elf.FindSymbol(anchor);
    if (!fn || fn->shndx == SHN_UNDEF) continue;
    const uint64_t pc = fn->value;
    std::optional<uint32_t> th_ractor = dwarf.MemberOffset(pc, "rb_thread_struct", "ractor");
    std::optional<uint32_t> holder = dwarf.MemberPathOffset(pc, "rb_ractor_struct", {"threads", "sched", "running"});
    std::optional<uint32_t> queue = dwarf.MemberPathOffset(pc, "rb_ractor_struct", {"threads", "sched", "readyq"});
    std::optional<uint32_t> node = dwarf.MemberPathOffset(pc, "rb_thread_struct", {"sched", "node", "readyq"});
    if (!th_ractor || !holder || !queue || !node) continue;
    Apply(th_ractor, &o.gvl.th_ractor, "thread.ractor", report);
    Apply(holder, &o.gvl.holder, "ractor.threads.sched.running", report);
    Apply(queue, &o.gvl.queue, "ractor.threads.sched.readyq", report);
    std::optional<uint32_t> count =
        dwarf.MemberPathOffset(pc, "rb_ractor_struct", {"threads", "sched", "readyq_cnt"});
    if (count) {
      Apply(count, &o.gvl.queue_count, "ractor.threads.sched.readyq_cnt", report);
    } else {
      o.gvl.queue_count = RV_GVL_NO_FIELD;  // the walk counts the queue
    }
    Apply(node, &o.gvl.th_queue_node, "thread.sched.node.readyq", report);
    o.gvl.base = RV_GVL_BASE_THREAD_RACTOR;
    break;
  }
}

// Class names (RClass and its classext or 3.2's shapes) from the CU of rb_class_path (variable.c), for the release
// lines whose table has a class layout.
void ApplyClassOffsets(DwarfInfo& dwarf, const std::optional<ElfSymbol>& variable, RubyOffsets& o,
                       OffsetsReport* report) {
  // Classes, from variable.c's CU: 3.2's shape layout, or 3.3/3.4's classext fields.
  const bool shape_classes = o.klass_ext_inline != 0;
  const bool classext_fields = o.klass_classpath != 0 && o.major * 100 + o.minor < 400;
  if (variable && (shape_classes || classext_fields)) {
    const uint64_t pc = variable->value;
    auto m = [&](const char* s, const char* f) { return dwarf.MemberOffset(pc, s, f); };
    Apply(m("RClass", "super"), &o.klass_super, "RClass.super", report);
    if (shape_classes) {
      // The classext follows RClass {basic, super, m_tbl}; a build with one size pool has RClass.ptr instead, which
      // this layout does not read (its classes stay unresolved).
      if (m("RClass", "ptr")) {
        o.klass_ext_inline = 0;
      } else {
        Apply(Add(m("RClass", "m_tbl"), 8), &o.klass_ext_inline, "sizeof(RClass)", report);
      }
      Apply(m("rb_classext_struct", "iv_ptr"), &o.classext_iv_ptr, "classext.iv_ptr", report);
      Apply(m("rb_vm_struct", "shape_list"), &o.vm_shape_list, "vm.shape_list", report);
      Apply(m("rb_vm_struct", "next_shape_id"), &o.vm_next_shape_id, "vm.next_shape_id", report);
      Apply(m("rb_shape", "edge_name"), &o.shape_edge_name, "shape.edge_name", report);
      Apply(m("rb_shape", "next_iv_index"), &o.shape_next_iv_index, "shape.next_iv_index", report);
      Apply(m("rb_shape", "type"), &o.shape_type, "shape.type", report);
      Apply(m("rb_shape", "parent_id"), &o.shape_parent_id, "shape.parent_id", report);
    } else {
      // 3.3/3.4: the classext sits right after struct RClass {basic(16), super, m_tbl} = 32 bytes.
      constexpr uint32_t kRClassSize = 32;
      Apply(Add(m("rb_classext_struct", "classpath"), kRClassSize), &o.klass_classpath, "classext.classpath",
            report);
      // as.singleton_class.attached_object is the first word of the `as` union.
      Apply(Add(m("rb_classext_struct", "as"), kRClassSize), &o.klass_attached_object,
            "classext.as.singleton_class.attached_object", report);
    }
  }
}

}  // namespace

Result<RubyOffsets> OffsetsForBinary(const ElfFile& elf, int major, int minor, OffsetsReport* report) {
  OffsetsReport scratch;
  if (report == nullptr) report = &scratch;
  Result<RubyOffsets> table = RubyOffsets::ForVersion(major, minor);
  if (!table.ok()) return table.error();
  RubyOffsets o = table.value();
  std::unique_ptr<DwarfInfo> dwarf = DwarfInfo::Open(elf);
  if (!dwarf) return o;
  // Struct layouts are looked up in the CU of a function whose file uses them: vm_backtrace.c (frames, iseqs, method
  // entries) and variable.c (classes).
  std::optional<ElfSymbol> backtrace = elf.FindSymbol("rb_profile_frames");
  std::optional<ElfSymbol> variable = elf.FindSymbol("rb_class_path");
  if (backtrace) ApplyFrameOffsets(*dwarf, backtrace->value, o, report);
  ApplyEcRouteOffsets(elf, *dwarf, o, report);
  ApplyGvlOffsets(elf, *dwarf, o, report);
  ApplyClassOffsets(*dwarf, variable, o, report);
  return o;
}

Result<uint64_t> FindGlobalSymbolsVaddr(const ElfFile& elf) {
  std::optional<ElfSymbol> sym = elf.FindSymbol("ruby_global_symbols");
  if (sym && sym->shndx != SHN_UNDEF) return sym->value;
  // Stripped binary (no .symtab): the address is still in rb_id2str's code.
  Result<uint64_t> from_code = GlobalSymbolsFromCode(elf);
  if (from_code) return from_code;
  return Error(ErrorCode::kNoSymbols,
               "ruby_global_symbols is not in .symtab (stripped binary?): " + from_code.error().message());
}

uint64_t FindCurrentVmPtrVaddr(const ElfFile& elf) {
  std::optional<ElfSymbol> sym = elf.FindSymbol("ruby_current_vm_ptr");
  return sym && sym->shndx != SHN_UNDEF ? sym->value : 0;
}

uint64_t LowestLoadVaddr(const ElfFile& elf) {
  uint64_t lowest = UINT64_MAX;
  for (const ElfSegment& s : elf.load_segments()) lowest = std::min(lowest, s.vaddr);
  return lowest;
}

uint64_t LoadBiasFromLowestMapping(uint64_t lowest_load_vaddr, uint64_t lowest_mapping_start) {
  if (lowest_load_vaddr == UINT64_MAX) return 0;
  constexpr uint64_t kPage = 4096;
  return lowest_mapping_start - (lowest_load_vaddr & ~(kPage - 1));
}

uint64_t LoadBiasFromLowestMapping(const ElfFile& elf, uint64_t lowest_mapping_start) {
  return LoadBiasFromLowestMapping(LowestLoadVaddr(elf), lowest_mapping_start);
}

}  // namespace rvbpfd
