// GC enter/exit sites of a 3.4+ VM that calls the exported rb_gc_event_hook(data, event) instead of inlining its
// `ruby_vm_event_flags & event` test into gc_enter/gc_exit. A shared libruby built with semantic interposition does
// this (the call goes through the PLT, and the flag test sits inside rb_gc_event_hook, which also serves NEWOBJ and
// FREEOBJ and is far too hot to probe). Each call whose `event` argument (esi) is GC_ENTER or GC_EXIT is exactly one
// place where the VM would fire that event, so the call instruction itself is the site: the in-process hook fires
// iff the call is made with the flag set. See ../shared/reference/cruby-scheduler-probe-points.md §4. Internal to the
// sites module.
#ifndef RVBPFD_SRC_SITES_GC_HOOK_CALLS_H_
#define RVBPFD_SRC_SITES_GC_HOOK_CALLS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "elf/eh_frame.h"
#include "elf/elf_file.h"
#include "sites/disasm.h"

namespace rvbpfd {

struct GcHookCall {
  uint64_t vaddr = 0;  // the call (or tail jump) instruction
  uint8_t event = 0;   // RV_EV_GC_ENTER or RV_EV_GC_EXIT
};

struct GcHookCalls {
  std::vector<GcHookCall> calls;  // sorted by vaddr
  // Calls with GC_ENTER/GC_EXIT in esi where a branch lands between the `mov $event, %esi` and the call, so another
  // path may reach the call with another esi. Any such call makes the whole result unusable: the caller falls back
  // (so only whether this is 0 decides; FindSites may count a call twice when it re-checks a function).
  size_t ambiguous = 0;
  // How the callee was reached: "PLT", "GOT" (call *slot(%rip), -fno-plt), "direct"; each kind seen, comma-joined.
  std::string via;
};

// The calls of rb_gc_event_hook with a GC event in esi, within `functions` (symtab extents or .eh_frame FDEs).
// `branch_targets` (sorted) are the direct branch targets that may land inside those functions: each function's own
// are added here, so callers pass the targets of code elsewhere that jumps in (a `.cold` part, or every FDE's when the
// binary is stripped). Only functions whose bytes can encode a call to the callee are decoded.
GcHookCalls FindGcHookCalls(const ElfFile& vm, Disassembler& dis, const std::vector<CodeRange>& functions,
                            const std::vector<uint64_t>& branch_targets);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SITES_GC_HOOK_CALLS_H_
