// How an on-CPU sample finds the execution context (EC) of the native thread it interrupted, decided in userspace per
// VM binary (ComputeEcRoute, from the ELF) and per process (ResolveProcessEc, from what ld.so wrote into the process),
// and followed by BPF (bpf/ruby_ec.h) without any version or linker knowledge of its own.
//
// The EC is the thread's own `ruby_current_ec` (thread-local, what GET_EC() reads), found from the thread pointer
// (x86-64 fsbase) in one of three ways, depending on how the VM binary was linked:
//   - local-exec (a static ruby: the executable holds the VM): &ruby_current_ec = fsbase + a constant fixed at link
//     time, read from rb_current_ec_noinline's `mov %fs:OFF,%rax` when that function exists and computed from PT_TLS
//     with glibc's layout rule otherwise (both are kept for the cross-check);
//   - TLSDESC (a shared libruby built with -mtls-dialect=gnu2): the R_X86_64_TLSDESC descriptor of ruby_current_ec;
//     once ld.so resolved it to static TLS its second word is that same constant, read from the process;
//   - general-dynamic (a shared libruby, gcc's default dialect): the module id ld.so wrote into the R_X86_64_DTPMOD64
//     GOT slot, and glibc's DTV: block = DTV[module], &ruby_current_ec = block + st_value.
// Beside it, the ractor route (ruby_current_vm_ptr -> main ractor -> running_ec) gives the GVL holder; BPF uses it
// only for the holder's own native thread. See docs/design.md, "How a sample finds its EC".
//
// Assumes glibc on x86-64 (tcbhead_t.dtv at fsbase+8, 16-byte dtv_t); musl's DTV differs and is not supported.
#ifndef RVBPFD_SRC_STACKS_EC_ROUTE_H_
#define RVBPFD_SRC_STACKS_EC_ROUTE_H_

#include <linux/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "common/error.h"
#include "elf/elf_file.h"
#include "rvbpfd/abi.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"

namespace rvbpfd {

enum class EcTlsKind {
  kNone,       // no TLS route (no ruby_current_ec in .symtab, no PT_TLS, no usable relocation): why_none says why
  kLocalExec,  // executable: fixed offset from the thread pointer (tp_offset)
  kTlsDesc,    // shared library, TLSDESC descriptor at got_vaddr
  kDtv,        // shared library, general-dynamic: module id in the GOT slot at got_vaddr
};

const char* EcTlsKindName(EcTlsKind kind);  // "none", "local-exec", "tlsdesc", "dtv"

// glibc x86-64: tcbhead_t { void *tcb; dtv_t *dtv; ... } sits at the thread pointer, and dtv_t is a 16-byte union
// ({counter} or {val, to_free}); the TCB's dtv points at dtv[0], the generation counter, so dtv[m] is module m.
inline constexpr uint32_t kGlibcDtvOffset = 8;
inline constexpr uint32_t kGlibcDtvEntrySize = 16;

// Per VM binary: what the ELF says. Cheap to copy.
struct EcRoute {
  EcTlsKind kind = EcTlsKind::kNone;
  std::string why_none;               // kNone: the reason (the ractor and current_th routes remain)
  uint64_t tls_symbol_value = 0;      // ruby_current_ec's st_value: its offset inside the binary's TLS block, bytes
  int64_t tp_offset = 0;              // kLocalExec: &ruby_current_ec - thread pointer, bytes (negative)
  std::optional<int64_t> tp_offset_from_code;     // kLocalExec: from rb_current_ec_noinline, when it has the form
  std::optional<int64_t> tp_offset_from_layout;   // kLocalExec: from PT_TLS and glibc's static TLS layout
  uint64_t got_vaddr = 0;             // kTlsDesc: the 16-byte descriptor; kDtv: the tls_index {module, offset} slot
  uint64_t got_file_offset = 0;       // kTlsDesc / kDtv: the file offset of got_vaddr (its PT_LOAD's mapping)
  uint64_t tlsdesc_extra = 0;         // kTlsDesc: ruby_current_ec minus what the descriptor resolves to (0, or
                                      // st_value for a local-dynamic descriptor of the module's block start)
  bool from_exported_code = false;    // no ruby_current_ec symbol: its TLS offset came from rb_errinfo's code
  uint64_t vm_ptr_vaddr = 0;          // ruby_current_vm_ptr (0: no ractor route)
  uint64_t lowest_load_vaddr = 0;     // page-aligned lowest PT_LOAD vaddr, to turn a mapping address into a load bias
  // Struct offsets the BPF side needs with the route (from RubyOffsets: DWARF over the version table).
  uint32_t ec_thread_ptr = 0;
  uint32_t vm_main_ractor = 0;
  uint32_t ractor_running_ec = 0;
};

// Decides the route of the VM binary `elf` (libruby.so or a static ruby). Never fails: a binary without a TLS route
// gets kind kNone (why_none says why) and keeps the ractor route when ruby_current_vm_ptr is known.
EcRoute ComputeEcRoute(const ElfFile& elf, const RubyOffsets& offsets);

// One line for logs and `rvbpfd sites`-style output, e.g. "local-exec fs-0x50" or "dtv (GOT 0x5da788, +0x30)".
std::string DescribeEcRoute(const EcRoute& route);

// The per-binary fields of walk_config (ec_thread_ptr, vm_main_ractor, ractor_running_ec).
void ApplyEcRoute(const EcRoute& route, rv_walk_config* config);

// Load bias of the VM in a process whose lowest mapping of it starts at lowest_mapping_start.
uint64_t EcRouteLoadBias(const EcRoute& route, uint64_t lowest_mapping_start);

// Whether the route's GOT slot (kTlsDesc, kDtv) is mapped where its segment belongs: mapped_file_offset is the file
// offset the process maps at load_bias + got_vaddr (MappedFileOffset). Until ld.so has mapped the data segment over
// its first reservation, that address shows other bytes of the file, which ResolveProcessEc would take for a module
// id or a descriptor. Always true for routes without a GOT slot.
bool EcRouteSlotInPlace(const EcRoute& route, std::optional<uint64_t> mapped_file_offset);
// Whether the route reads a GOT slot (kTlsDesc, kDtv) at all: the others need no maps lookup.
bool EcRouteHasGotSlot(const EcRoute& route);

// Per process: the rv_proc_ec for BPF's proc_ec map, reading what ld.so wrote (TLSDESC descriptor, DTPMOD64 slot)
// through `mem`. nullopt while the VM is mapped but ld.so has not relocated it yet (launch mode, right after exec):
// try again later. An error when the process's values are unusable (unreadable GOT, implausible module id); the
// caller then installs nothing and samples use current_th. Bounded: at most three 16-byte reads.
Result<std::optional<rv_proc_ec>> ResolveProcessEc(const EcRoute& route, uint8_t binary, uint64_t load_bias,
                                                   MemoryReader& mem);

// The sampler's route decision (bpf/ruby_ec.h's rv_find_ec, the same C code) run on the host, for tests.
struct EcLookup {
  uint32_t route = RV_EC_ROUTE_NONE;  // enum rv_ec_route: TLS, RACTOR or NONE
  uint64_t ec = 0;
  uint64_t th = 0;
  bool tls_unavailable = false;  // the TLS route could not be evaluated (BPF may then fall back to current_th)
};
EcLookup FindEcForThread(MemoryReader& mem, const rv_proc_ec& proc, const rv_walk_config& config, uint32_t th_nt,
                         uint32_t nt_tid, uint64_t thread_pointer, uint32_t tid);

// The sampler's GVL reading (bpf/ruby_gvl.h's rv_read_gvl, the same C code) of the VM running thread `th`, on the
// host, for tests; vm_ptr: the runtime address of ruby_current_vm_ptr (RV_GVL_BASE_VM only). nullopt when the layout
// or the process gives no reading.
std::optional<rv_gvl_reading> ReadGvlForThread(MemoryReader& mem, const rv_gvl_offsets& offsets, uint64_t vm_ptr,
                                               uint64_t th);
// The holder alone, as a READY reads it (bpf/ruby_gvl.h's rv_read_gvl_holder): 0 when nobody holds the GVL, nullopt
// when the layout or the process gives no reading.
std::optional<uint64_t> ReadGvlHolderForThread(MemoryReader& mem, const rv_gvl_offsets& offsets, uint64_t vm_ptr,
                                               uint64_t th);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_STACKS_EC_ROUTE_H_
