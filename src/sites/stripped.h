// What the site finder needs from a VM binary without .symtab or DWARF (a distribution's stripped libruby or ruby),
// recovered from what every CRuby exports for its extensions (.dynsym), the unwind tables (.eh_frame) and the code.
// Internal to the sites module. Nothing here guesses: a fact that cannot be recovered uniquely is an error.
#ifndef RVBPFD_SRC_SITES_STRIPPED_H_
#define RVBPFD_SRC_SITES_STRIPPED_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "elf/eh_frame.h"
#include "elf/elf_file.h"
#include "sites/disasm.h"

namespace rvbpfd {

// One direct call made with a RIP-relative address in rsi and another in rdx, both loaded by `lea` on the straight
// line before it: the shape of `rb_define_method(klass, "name", func, argc)` and `rb_define_global_function("name",
// func, argc)` in the VM's Init functions (for the latter, rdi holds the name: recorded as name_rdi).
struct DefineCall {
  std::string callee;   // the called exported function (directly, through the PLT or through the GOT)
  uint64_t name_rsi = 0;   // lea target in rsi (0: none)
  uint64_t name_rdi = 0;   // lea target in rdi (0: none)
  uint64_t func_rdx = 0;   // lea target in rdx (0: none)
  uint64_t func_rsi = 0;   // lea target in rsi, for the rdi-named form
  uint64_t call_vaddr = 0;
};

struct StrippedCode {
  std::vector<CodeRange> functions;  // every FDE of .eh_frame, sorted
  uint64_t hooks = 0;                // &rb_internal_thread_event_hooks
  uint64_t hooks_lock = 0;           // &rb_internal_thread_event_hooks_rw_lock (0 when the build has none)
  std::vector<uint64_t> registry;    // entries of rb_internal_thread_add/remove_event_hook (not hook sites)
  std::vector<uint64_t> branch_targets;  // every direct jmp/jcc/call target in the code, sorted (placement)
  std::vector<uint64_t> hook_refs;       // every instruction with a RIP-relative operand at `hooks`, sorted
  // Instructions whose RIP-relative operand is `extra_target` (GC: ruby_vm_event_flags + 3), with the test's
  // immediate (-1 when none).
  std::vector<std::pair<uint64_t, int64_t>> extra_refs;
  std::vector<DefineCall> define_calls;
  std::map<uint64_t, bool> execute_hooks_cache;  // function entry -> LooksLikeExecuteHooks
};

// Recovers the hook list from rb_internal_thread_add_event_hook and rb_internal_thread_remove_event_hook (.dynsym):
// the one 8-byte global in .data/.bss that both read or write (and the lock both take by address), then decodes
// every FDE's code once. `extra_target` (0: none) is another global whose references are collected.
Result<StrippedCode> AnalyzeStrippedCode(const ElfFile& vm, Disassembler& dis, uint64_t extra_target);

// Whether the function entered at `entry` is rb_thread_execute_hooks (or a GCC clone of it): a function of its own
// FDE that takes the hook list's lock by address and reads the list, and is not one of the registry functions.
bool LooksLikeExecuteHooks(const ElfFile& vm, Disassembler& dis, StrippedCode& code, uint64_t entry);

// The exported function a direct call at `target` reaches: the .dynsym function there, or the symbol of the
// JUMP_SLOT a PLT stub there jumps through. Empty when neither.
std::string CalleeName(const ElfFile& vm, Disassembler& dis, uint64_t target);

// The GOT slots relocated to `symbol` (JUMP_SLOT or GLOB_DAT), and the entry of every PLT stub (.plt, .plt.sec: 16
// bytes each) that jumps through one of them. Empty when the binary reaches nothing by that name through its GOT.
struct GotRoute {
  std::vector<uint64_t> slots;
  std::vector<uint64_t> plt_stubs;
};
GotRoute GotRouteOf(const ElfFile& vm, Disassembler& dis, const std::string& symbol);

// Addresses in .rodata where the NUL-terminated string `s` starts (a merged string may also end another one).
std::vector<uint64_t> RodataStrings(const ElfFile& vm, const std::string& s);

// The one 4-byte global in .data/.bss that the exported function `fn` reads (e.g. ruby_vm_event_flags in 3.4's
// rb_gc_event_hook_required_p, the GC's `ruby_vm_event_flags & event` test). nullopt when fn is not exported or does
// not read exactly one.
std::optional<uint64_t> SoleGlobalReadBy(const ElfFile& vm, Disassembler& dis, const std::string& fn);

// Where the main thread is, from the exported rb_thread_main() (`return ruby_single_main_ractor->threads.main->self`
// in a single-ractor process): the global holding the main ractor and threads.main's offset in it. nullopt when the
// function does not have that shape.
struct MainThreadRoute {
  uint64_t main_ractor_vaddr = 0;   // &ruby_single_main_ractor
  uint32_t ractor_main_thread = 0;  // offsetof(rb_ractor_t, threads.main), bytes
};
std::optional<MainThreadRoute> FindMainThreadRoute(const ElfFile& vm, Disassembler& dis);

// "name" of the exported function containing vaddr, else "fn@0x<entry>" of its FDE, else the address.
std::string StrippedFunctionName(const ElfFile& vm, const StrippedCode& code, uint64_t vaddr);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SITES_STRIPPED_H_
