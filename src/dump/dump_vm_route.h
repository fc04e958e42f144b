// Where the VM is in a VM binary that does not export ruby_current_vm_ptr (Debian's libruby-3.3 builds it hidden):
// recovered from the code of an exported function that reads it.
//
// ruby_vm_at_exit() (include/ruby/vm.h, exported by every CRuby 3.x) is `rb_vm_t *vm = GET_VM();` then a push on
// vm->at_exit, and GET_VM() is a load of ruby_current_vm_ptr: the function reads exactly one 8-byte global of
// .data/.bss, either directly (`mov G(%rip), %reg`) or through its address (`lea G(%rip), %reg; mov (%reg), %reg2`),
// and writes none. A function of any other shape gives nothing. What the global holds is type-checked when it is
// read (dump/dump_reader.h: the main thread's `self` must be a Thread object pointing back at it).
#ifndef RVBPFD_SRC_DUMP_DUMP_VM_ROUTE_H_
#define RVBPFD_SRC_DUMP_DUMP_VM_ROUTE_H_

#include <cstdint>
#include <optional>

#include "elf/elf_file.h"
#include "sites/disasm.h"

namespace rvbpfd {

// The exported function the VM pointer is recovered from.
inline constexpr const char* kVmPointerReader = "ruby_vm_at_exit";

// The link-time address of ruby_current_vm_ptr, from kVmPointerReader's code up to its first `ret` (at most
// kMaxVmReaderBytes of it). nullopt when the function is not exported, not of the shape above, or reads no or
// several globals.
std::optional<uint64_t> FindVmPointerInCode(const ElfFile& vm, Disassembler& dis);

inline constexpr uint64_t kMaxVmReaderBytes = 512;

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_DUMP_DUMP_VM_ROUTE_H_
