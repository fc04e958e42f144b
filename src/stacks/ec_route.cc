#include "stacks/ec_route.h"

#include <elf.h>

#include <algorithm>

#include "common/hex.h"
#include "sites/disasm.h"
#include "stacks/ruby_ec_host.h"

namespace rvbpfd {
namespace {

// Largest plausible distance of a static TLS variable from the thread pointer, bytes. glibc's static TLS area is the
// executable's and startup libraries' blocks plus a small surplus (KiBs to a few MiB); a larger "offset" is a pointer
// (a dynamic TLSDESC argument) or garbage.
constexpr int64_t kMaxStaticTlsOffset = int64_t{1} << 30;

std::string SignedHex(int64_t v) {
  return v < 0 ? "-" + Hex(static_cast<uint64_t>(0) - static_cast<uint64_t>(v)) : "+" + Hex(static_cast<uint64_t>(v));
}

// glibc's _dl_determine_tlsoffset for the first TLS module (the executable) on a TLS_TCB_AT_TP target (x86-64): the
// block ends at the thread pointer, aligned so that its first byte keeps the segment's alignment offset.
std::optional<int64_t> LocalExecOffsetFromLayout(const ElfTlsSegment& tls, uint64_t symbol_value) {
  const uint64_t align = tls.align > 1 ? tls.align : 1;
  if ((align & (align - 1)) != 0 || align > (uint64_t{1} << 20) || tls.memsz > uint64_t(kMaxStaticTlsOffset)) {
    return std::nullopt;
  }
  const uint64_t firstbyte = (0 - (tls.vaddr & (align - 1))) & (align - 1);
  if (tls.memsz < firstbyte) return std::nullopt;
  const uint64_t block_offset = ((tls.memsz - firstbyte + align - 1) & ~(align - 1)) + firstbyte;
  return static_cast<int64_t>(symbol_value) - static_cast<int64_t>(block_offset);
}

// rb_current_ec_noinline() is `mov %fs:OFF,%rax; ret` in a local-exec build: OFF is the offset the program itself
// uses. nullopt when the function is absent or has another shape (e.g. -mno-tls-direct-seg-refs).
std::optional<int64_t> LocalExecOffsetFromCode(const ElfFile& elf) {
  std::optional<ElfSymbol> fn = elf.FindSymbol("rb_current_ec_noinline");
  if (!fn || fn->shndx == SHN_UNDEF || fn->type != STT_FUNC || fn->size == 0) return std::nullopt;
  std::span<const uint8_t> code = elf.BytesAt(fn->value, std::min<uint64_t>(fn->size, 64));
  if (code.empty()) return std::nullopt;
  Result<Disassembler> d = Disassembler::Create();
  if (!d) return std::nullopt;
  std::optional<int64_t> found;
  d->DecodeRange(code, fn->value, [&](const cs_insn& insn) {
    if (insn.id == X86_INS_RET) return false;
    if (insn.id != X86_INS_MOV || insn.detail == nullptr) return true;
    const cs_x86& x = insn.detail->x86;
    if (x.op_count != 2 || x.operands[0].type != X86_OP_REG || x.operands[1].type != X86_OP_MEM) return true;
    const x86_op_mem& m = x.operands[1].mem;
    if (m.segment != X86_REG_FS || m.base != X86_REG_INVALID || m.index != X86_REG_INVALID ||
        x.operands[1].size != 8) {
      return true;
    }
    found = m.disp;
    return false;
  });
  return found;
}

// The general-dynamic GOT slot of ruby_current_ec: an R_X86_64_DTPMOD64 of this object's own module (symbol 0, or
// the symbol itself when it is exported), preferring the slot whose second word (the DTPOFF ld wrote, for a local
// symbol) is the symbol's offset: the {module, offset} pair __tls_get_addr gets for ruby_current_ec.
std::optional<uint64_t> FindDtpmodSlot(const ElfFile& elf, uint64_t symbol_value) {
  std::optional<uint64_t> any_own;
  for (const ElfRelocation& r : elf.DynamicRelocations(R_X86_64_DTPMOD64)) {
    if (r.symbol_name == "ruby_current_ec") return r.offset;
    if (r.symbol != 0) continue;  // another object's TLS variable: another module
    std::span<const uint8_t> word = elf.BytesAt(r.offset + 8, 8);
    uint64_t dtpoff = 0;
    if (word.size() == 8) std::copy(word.begin(), word.end(), reinterpret_cast<uint8_t*>(&dtpoff));
    if (word.size() == 8 && dtpoff == symbol_value) return r.offset;
    if (!any_own) any_own = r.offset;  // local-dynamic: the module id is the same for all of the object's variables
  }
  return any_own;
}

// Without a ruby_current_ec symbol (hidden since 3.3 and gone with .symtab): how the exported rb_errinfo(), which
// is `return GET_EC()->errinfo`, reaches it. A shared libruby's general-dynamic code is `lea X(%rip), %rdi; call
// __tls_get_addr`, X the {module, offset} GOT pair whose DTPOFF word ld wrote into the file; TLSDESC code is
// `lea X(%rip), %rax; call *(%rax)`, X a TLSDESC relocation whose addend is the offset. An executable's local-exec
// code is `mov %fs:OFF, %reg`.
struct EcFromCode {
  std::optional<uint64_t> tls_value;    // ruby_current_ec's offset in the module's TLS block
  std::optional<int64_t> tp_offset;     // local-exec: offset from the thread pointer
};

EcFromCode EcFromErrinfo(const ElfFile& elf) {
  EcFromCode out;
  std::optional<ElfSymbol> fn = elf.FindSymbol("rb_errinfo");
  if (!fn || fn->shndx == SHN_UNDEF || fn->type != STT_FUNC || fn->size == 0) return out;
  Result<Disassembler> d = Disassembler::Create();
  if (!d) return out;
  std::optional<uint64_t> lea_rdi, lea_rax;
  std::optional<int64_t> imm_reg_value;  // `mov $imm, %reg` just before: GCC's `mov %fs:(%reg)` form
  unsigned imm_reg = X86_REG_INVALID;
  d->DecodeRange(elf.BytesAt(fn->value, std::min<uint64_t>(fn->size, 96)), fn->value, [&](const cs_insn& insn) {
    const cs_x86& x = insn.detail->x86;
    if (insn.id == X86_INS_MOV && x.op_count == 2 && x.operands[1].type == X86_OP_MEM &&
        x.operands[1].mem.segment == X86_REG_FS && x.operands[1].mem.index == X86_REG_INVALID &&
        x.operands[1].size == 8) {
      const x86_op_mem& m = x.operands[1].mem;
      if (m.base == X86_REG_INVALID) {
        out.tp_offset = m.disp;
      } else if (m.base == imm_reg && imm_reg_value) {
        out.tp_offset = *imm_reg_value + m.disp;
      }
      return false;
    }
    if (insn.id == X86_INS_MOV && x.op_count == 2 && x.operands[0].type == X86_OP_REG &&
        x.operands[1].type == X86_OP_IMM && x.operands[0].size == 8) {
      imm_reg = x.operands[0].reg;
      imm_reg_value = x.operands[1].imm;
      return true;
    }
    imm_reg_value.reset();
    if (insn.id == X86_INS_LEA && x.op_count == 2 && x.operands[0].type == X86_OP_REG) {
      std::optional<uint64_t> t = RipRelativeTarget(insn);
      if (t && x.operands[0].reg == X86_REG_RDI) lea_rdi = t;
      if (t && x.operands[0].reg == X86_REG_RAX) lea_rax = t;
      return true;
    }
    if (insn.id == X86_INS_CALL) {
      if (lea_rax) {
        for (const ElfRelocation& r : elf.DynamicRelocations(R_X86_64_TLSDESC)) {
          if (r.offset == *lea_rax && r.symbol == 0 && r.addend >= 0) out.tls_value = static_cast<uint64_t>(r.addend);
        }
      }
      if (!out.tls_value && lea_rdi) {
        for (const ElfRelocation& r : elf.DynamicRelocations(R_X86_64_DTPMOD64)) {
          std::span<const uint8_t> word = elf.BytesAt(*lea_rdi + 8, 8);
          if (r.offset != *lea_rdi || r.symbol != 0 || word.size() != 8) continue;
          uint64_t dtpoff = 0;
          std::copy(word.begin(), word.end(), reinterpret_cast<uint8_t*>(&dtpoff));
          out.tls_value = dtpoff;
        }
      }
      return false;
    }
    return !IsControlTransfer(insn);
  });
  return out;
}

}  // namespace

const char* EcTlsKindName(EcTlsKind kind) {
  switch (kind) {
    case EcTlsKind::kNone:
      return "none";
    case EcTlsKind::kLocalExec:
      return "local-exec";
    case EcTlsKind::kTlsDesc:
      return "tlsdesc";
    case EcTlsKind::kDtv:
      return "dtv";
  }
  return "none";
}

namespace {

// Everything ComputeEcRoute decides except got_file_offset.
EcRoute ComputeEcRouteInBinary(const ElfFile& elf, const RubyOffsets& offsets) {
  EcRoute r;
  r.ec_thread_ptr = offsets.ec_thread_ptr;
  r.vm_main_ractor = offsets.vm_main_ractor;
  r.ractor_running_ec = offsets.ractor_running_ec;
  uint64_t lowest = UINT64_MAX;
  for (const ElfSegment& s : elf.load_segments()) lowest = std::min(lowest, s.vaddr);
  r.lowest_load_vaddr = lowest == UINT64_MAX ? 0 : lowest & ~uint64_t{4095};
  if (std::optional<ElfSymbol> vm = elf.FindSymbol("ruby_current_vm_ptr"); vm && vm->shndx != SHN_UNDEF) {
    r.vm_ptr_vaddr = vm->value;
  }

  std::optional<ElfSymbol> ec = elf.FindSymbol("ruby_current_ec");
  if (!ec || ec->shndx == SHN_UNDEF || ec->type != STT_TLS) {
    const EcFromCode code = EcFromErrinfo(elf);
    const bool exe = elf.has_interp() || elf.elf_type() == ET_EXEC;
    if (exe && code.tp_offset && *code.tp_offset < 0 && *code.tp_offset > -kMaxStaticTlsOffset) {
      r.kind = EcTlsKind::kLocalExec;
      r.tp_offset = *code.tp_offset;
      r.tp_offset_from_code = code.tp_offset;
      r.from_exported_code = true;
      return r;
    }
    if (!exe && code.tls_value) {
      ec = ElfSymbol{"ruby_current_ec", *code.tls_value, 8, STT_TLS, STB_LOCAL, 1, false};
      r.from_exported_code = true;
    } else {
      r.why_none = elf.path() + " has no thread-local ruby_current_ec symbol and rb_errinfo's code does not show "
                                "how it is reached (stripped, or CRuby built without TLS)";
      return r;
    }
  }
  const std::optional<ElfTlsSegment>& tls = elf.tls_segment();
  if (!tls || ec->value > tls->memsz || tls->memsz - ec->value < 8) {
    r.why_none = elf.path() + ": ruby_current_ec (st_value " + Hex(ec->value) + ") is not inside a PT_TLS block";
    return r;
  }
  r.tls_symbol_value = ec->value;

  if (elf.has_interp() || elf.elf_type() == ET_EXEC) {
    // An executable holds the VM: its block is the first static TLS block and the offset is a link-time constant.
    r.tp_offset_from_code = LocalExecOffsetFromCode(elf);
    r.tp_offset_from_layout = LocalExecOffsetFromLayout(*tls, ec->value);
    if (!r.tp_offset_from_code && !r.tp_offset_from_layout) {
      r.why_none = elf.path() + ": cannot work out ruby_current_ec's offset from the thread pointer (PT_TLS align " +
                   Hex(tls->align) + ")";
      return r;
    }
    // The program's own instruction wins: it is what CRuby reads, whatever the layout rule says.
    r.tp_offset = r.tp_offset_from_code ? *r.tp_offset_from_code : *r.tp_offset_from_layout;
    r.kind = EcTlsKind::kLocalExec;
    return r;
  }

  // A shared library: ld.so decides where its block lives. TLSDESC first (its resolved descriptor holds the offset
  // itself), then the general-dynamic module id.
  const std::vector<ElfRelocation> tlsdesc = elf.DynamicRelocations(R_X86_64_TLSDESC);
  for (const ElfRelocation& rel : tlsdesc) {
    const bool named = rel.symbol_name == "ruby_current_ec" && rel.addend == 0;
    const bool local = rel.symbol == 0 && rel.addend >= 0 && static_cast<uint64_t>(rel.addend) == ec->value;
    if (named || local) {
      r.kind = EcTlsKind::kTlsDesc;
      r.got_vaddr = rel.offset;
      return r;
    }
  }
  // Local-dynamic code asks for the module's block start (symbol 0, addend 0) and adds the variable's offset itself.
  for (const ElfRelocation& rel : tlsdesc) {
    if (rel.symbol == 0 && rel.addend == 0) {
      r.kind = EcTlsKind::kTlsDesc;
      r.got_vaddr = rel.offset;
      r.tlsdesc_extra = ec->value;
      return r;
    }
  }
  if (std::optional<uint64_t> slot = FindDtpmodSlot(elf, ec->value)) {
    r.kind = EcTlsKind::kDtv;
    r.got_vaddr = *slot;
    return r;
  }
  r.why_none = elf.path() + " has no TLSDESC or DTPMOD64 relocation for ruby_current_ec";
  return r;
}

}  // namespace

EcRoute ComputeEcRoute(const ElfFile& elf, const RubyOffsets& offsets) {
  EcRoute r = ComputeEcRouteInBinary(elf, offsets);
  if (!EcRouteHasGotSlot(r)) return r;
  for (const ElfSegment& seg : elf.load_segments()) {
    if (r.got_vaddr >= seg.vaddr && r.got_vaddr - seg.vaddr < seg.filesz) {
      r.got_file_offset = seg.offset + (r.got_vaddr - seg.vaddr);
      return r;
    }
  }
  // A relocated slot lies in the file's part of a segment; one that does not is a binary this reading cannot trust.
  r.why_none = elf.path() + ": ruby_current_ec's GOT slot " + Hex(r.got_vaddr) + " lies in no loadable segment";
  r.kind = EcTlsKind::kNone;
  r.got_vaddr = 0;
  return r;
}

std::string DescribeEcRoute(const EcRoute& route) {
  switch (route.kind) {
    case EcTlsKind::kNone:
      return "none (" + route.why_none + ")";
    case EcTlsKind::kLocalExec:
      return std::string("local-exec fs") + SignedHex(route.tp_offset) +
             (route.from_exported_code ? " (from rb_errinfo's code)"
              : route.tp_offset_from_code ? " (from rb_current_ec_noinline)" : " (from PT_TLS)");
    case EcTlsKind::kTlsDesc:
      return "tlsdesc (descriptor " + Hex(route.got_vaddr) +
             (route.tlsdesc_extra != 0 ? " of the module's block, +" + Hex(route.tlsdesc_extra) : "") + ")";
    case EcTlsKind::kDtv:
      return "dtv (GOT " + Hex(route.got_vaddr) + ", +" + Hex(route.tls_symbol_value) + ")" +
             (route.from_exported_code ? " (ruby_current_ec's offset from rb_errinfo's code)" : "");
  }
  return "none";
}

void ApplyEcRoute(const EcRoute& route, rv_walk_config* config) {
  config->ec_thread_ptr = route.ec_thread_ptr;
  config->vm_main_ractor = route.vm_main_ractor;
  config->ractor_running_ec = route.ractor_running_ec;
}

uint64_t EcRouteLoadBias(const EcRoute& route, uint64_t lowest_mapping_start) {
  return lowest_mapping_start - route.lowest_load_vaddr;
}

bool EcRouteHasGotSlot(const EcRoute& route) {
  return route.kind == EcTlsKind::kTlsDesc || route.kind == EcTlsKind::kDtv;
}

bool EcRouteSlotInPlace(const EcRoute& route, std::optional<uint64_t> mapped_file_offset) {
  if (!EcRouteHasGotSlot(route)) return true;
  return mapped_file_offset && *mapped_file_offset == route.got_file_offset;
}

Result<std::optional<rv_proc_ec>> ResolveProcessEc(const EcRoute& route, uint8_t binary, uint64_t load_bias,
                                                   MemoryReader& mem) {
  rv_proc_ec pe{};
  pe.binary = binary;
  pe.mode = RV_EC_TLS_NONE;
  pe.vm_ptr = route.vm_ptr_vaddr != 0 ? load_bias + route.vm_ptr_vaddr : 0;
  auto set_dtv = [&](uint64_t module, uint64_t offset) -> Status {
    if (module == 0 || module > RV_EC_MAX_DTV_MODULE || offset > uint64_t(kMaxStaticTlsOffset)) {
      return Error(ErrorCode::kIo, "ruby_current_ec's TLS module " + std::to_string(module) + " / offset " +
                                       Hex(offset) + " read from the target are implausible");
    }
    pe.mode = RV_EC_TLS_DTV;
    pe.dtv_module = module;
    pe.tls_offset = offset;
    pe.dtv_offset = kGlibcDtvOffset;
    pe.dtv_entry_size = kGlibcDtvEntrySize;
    return Status::Ok();
  };
  switch (route.kind) {
    case EcTlsKind::kNone:
      return std::optional<rv_proc_ec>(pe);
    case EcTlsKind::kLocalExec:
      pe.mode = RV_EC_TLS_TP_OFFSET;
      pe.tp_offset = route.tp_offset;
      return std::optional<rv_proc_ec>(pe);
    case EcTlsKind::kTlsDesc: {
      uint64_t desc[2] = {0, 0};  // {resolver function, argument}
      const uint64_t at = load_bias + route.got_vaddr;
      if (!mem.Read(at, desc, sizeof(desc))) {
        return Error(ErrorCode::kIo, "reading ruby_current_ec's TLSDESC descriptor at " + Hex(at) + " failed");
      }
      if (desc[0] == 0) return std::optional<rv_proc_ec>();  // not relocated yet
      const int64_t arg = static_cast<int64_t>(desc[1]);
      if (arg < 0 && arg > -kMaxStaticTlsOffset) {
        // Static TLS (_dl_tlsdesc_return): the argument is the variable's offset from the thread pointer.
        pe.mode = RV_EC_TLS_TP_OFFSET;
        pe.tp_offset = arg + static_cast<int64_t>(route.tlsdesc_extra);
        return std::optional<rv_proc_ec>(pe);
      }
      if (arg > 0) {
        // Dynamic TLS (_dl_tlsdesc_dynamic, e.g. a dlopen'ed libruby without static TLS room): the argument points
        // to {tls_index {module, offset}, generation}: follow the DTV like general-dynamic code does.
        uint64_t ti[2] = {0, 0};
        if (!mem.Read(desc[1], ti, sizeof(ti))) {
          return Error(ErrorCode::kIo, "reading ruby_current_ec's dynamic TLSDESC argument at " + Hex(desc[1]) +
                                           " failed");
        }
        if (Status st = set_dtv(ti[0], ti[1] + route.tlsdesc_extra); !st) return st.error();
        return std::optional<rv_proc_ec>(pe);
      }
      return Error(ErrorCode::kIo, "ruby_current_ec's TLSDESC descriptor holds an implausible argument " +
                                       Hex(desc[1]));
    }
    case EcTlsKind::kDtv: {
      uint64_t module = 0;
      const uint64_t at = load_bias + route.got_vaddr;
      if (!mem.ReadValue(at, &module)) {
        return Error(ErrorCode::kIo, "reading ruby_current_ec's TLS module id at " + Hex(at) + " failed");
      }
      if (module == 0) return std::optional<rv_proc_ec>();  // not relocated yet (ld.so writes it at load)
      if (Status st = set_dtv(module, route.tls_symbol_value); !st) return st.error();
      return std::optional<rv_proc_ec>(pe);
    }
  }
  return std::optional<rv_proc_ec>(pe);
}

EcLookup FindEcForThread(MemoryReader& mem, const rv_proc_ec& proc, const rv_walk_config& config, uint32_t th_nt,
                         uint32_t nt_tid, uint64_t thread_pointer, uint32_t tid) {
  EcLookup out;
  __u64 ec = 0, th = 0;
  int unavailable = 0;
  out.route = rv_host_find_ec(&mem, &proc, &config, th_nt, nt_tid, thread_pointer, tid, &ec, &th, &unavailable);
  out.ec = ec;
  out.th = th;
  out.tls_unavailable = unavailable != 0;
  return out;
}

std::optional<rv_gvl_reading> ReadGvlForThread(MemoryReader& mem, const rv_gvl_offsets& offsets, uint64_t vm_ptr,
                                               uint64_t th) {
  rv_gvl_reading r{};
  if (rv_host_read_gvl(&mem, &offsets, vm_ptr, th, &r) != 0) return std::nullopt;
  return r;
}

std::optional<uint64_t> ReadGvlHolderForThread(MemoryReader& mem, const rv_gvl_offsets& offsets, uint64_t vm_ptr,
                                               uint64_t th) {
  __u64 holder = 0;
  if (rv_host_read_gvl_holder(&mem, &offsets, vm_ptr, th, &holder) != 0) return std::nullopt;
  return holder;
}

}  // namespace rvbpfd
