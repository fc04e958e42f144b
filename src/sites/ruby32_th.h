// Where `th` is at a CRuby 3.2 STARTED or RESUMED hook site of a VM binary without DWARF. Internal to the sites
// module.
//
// 3.2's hook calls pass no thread (rb_thread_execute_hooks(event)), so th is a variable of the code around the site.
// The BPF side can use "the thread last seen on this native thread" everywhere except at a thread's first event
// (STARTED) and at the event that precedes every release (RESUMED), which must name th themselves. Without DWARF it
// is read off the one statement CRuby 3.2's thread_pthread.c runs right before each of those hooks, matched exactly
// on the straight-line code that ends at the site; any other shape is refused, never guessed:
//   - STARTED (thread_start_func_1): `native_thread_init(th->nt)` stores gettid() into th->nt->tid. th is the base
//     register R of a load `mov th_nt(R), Q` whose Q then receives a 32-bit store at nt_tid(Q), R not written from
//     the load to the site (calls clobber the caller-saved registers), and no other register qualifies.
//   - RESUMED (thread_sched_to_running_common): `sched->running = th;` is the statement before the hook. th is the
//     source register of the only 64-bit register store to [base + sched_running] between the start of the
//     straight-line code and the hook test's conditional jump, not written between that store and the site.
// The straight-line code starts at the last direct branch target at or before the site (or the function's entry):
// no other path reaches the site through it.
// READY needs no th of its own (the thread's previous event names it), but the main thread's first READY after
// tracing starts would have none: where its function also holds the RESUMED site, th is shown to be the same
// argument register there (Ruby32ThAtReady).
#ifndef RVBPFD_SRC_SITES_RUBY32_TH_H_
#define RVBPFD_SRC_SITES_RUBY32_TH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "elf/eh_frame.h"
#include "elf/elf_file.h"
#include "sites/disasm.h"
#include "sites/sites.h"

namespace rvbpfd {

// The 3.2 struct offsets the two statements use, in bytes.
struct Ruby32ThLayout {
  uint32_t th_nt = 0;          // rb_thread_t.nt
  uint32_t nt_tid = 0;         // rb_native_thread.tid
  uint32_t sched_running = 0;  // rb_thread_sched.running: its first field in 3.2 (thread_pthread.h)
};
inline constexpr uint32_t kRuby32SchedRunningOffset = 0;

// Instructions decoded from the start of the straight-line code to the site (and on to the hook test's jump) at
// most; a longer run is refused.
inline constexpr int kRuby32MaxWindowInsns = 64;

// The start of the straight-line code that ends at `site`: the greatest of `function_entry` and the direct branch
// targets (sorted) at or before `site`.
uint64_t StraightLineStart(const std::vector<uint64_t>& branch_targets, uint64_t function_entry, uint64_t site);

// th at a STARTED site, decoding [start, site). nullopt with `why` when the shape is not there.
std::optional<ThLocation> Ruby32ThAtStarted(const ElfFile& vm, Disassembler& dis, uint64_t start, uint64_t site,
                                            const Ruby32ThLayout& layout, std::string* why);
// th at a RESUMED site, decoding [start, test_jump) where test_jump is the hook test's conditional jump after the
// site. nullopt with `why` when the shape is not there.
std::optional<ThLocation> Ruby32ThAtResumed(const ElfFile& vm, Disassembler& dis, uint64_t start, uint64_t site,
                                            uint64_t test_jump, const Ruby32ThLayout& layout, std::string* why);

// th at a READY site, the first statement of thread_sched_to_running_common(sched, th), whose RESUMED site in the
// same function `fn` found th in register `resumed_reg`: when the straight-line code from the entry to the site
// copies an argument register, untouched since the entry, into resumed_reg, and the rest of the function writes
// resumed_reg only in epilogues (`pop` then more pops and a return or a jump out), resumed_reg holds the same
// argument at both sites. `entry_straight`: no branch target lies between the entry and the site. nullopt with
// `why` otherwise.
std::optional<ThLocation> Ruby32ThAtReady(const ElfFile& vm, Disassembler& dis, CodeRange fn, uint64_t site,
                                          bool entry_straight, uint8_t resumed_reg, std::string* why);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SITES_RUBY32_TH_H_
