// Probe sites of one CRuby VM binary (libruby.so or a static ruby), computed from the binary itself.
//
// Every place where the VM tests its thread-event hook list (`cmpq $0, rb_internal_thread_event_hooks(%rip)`) becomes
// one uprobe, mapped to the event the VM would deliver there and to where `th` (rb_thread_t *) lives at that
// instruction. Probing the VM's own hook sites rather than functions makes the events identical to the in-process
// hook's whatever the compiler inlined. GC enter/exit use the equivalent GC hook-check sites, Kernel#sleep and
// Mutex#lock the entry of their workers. See ../shared/reference/cruby-scheduler-probe-points.md §1-§6.
#ifndef RVBPFD_SRC_SITES_SITES_H_
#define RVBPFD_SRC_SITES_SITES_H_

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "elf/elf_file.h"
#include "rvbpfd/abi.h"

namespace rvbpfd {

struct ThLocation {
  uint8_t kind = RV_LOC_CURRENT;  // enum rv_loc_kind
  uint8_t reg = 0;                // enum rv_reg (DWARF x86-64 numbering); unused for CURRENT/NONE
  int32_t offset = 0;             // bytes: REG -> th = reg + offset; MEM -> th = *(u64 *)(reg + offset)
  bool operator==(const ThLocation&) const = default;
};

struct ProbeSite {
  uint64_t vaddr = 0;        // virtual address of the probed instruction in the ELF
  uint64_t file_offset = 0;  // uprobe offset in the ELF file
  uint8_t event = RV_EV_NONE;  // enum rv_event_kind
  ThLocation th;
  std::string function;      // enclosing symbol (the outermost function, as in the reference tables)
  std::string method;        // "hook-site", "gc-hook-site", "function-entry", "gc-function-entry"/"-return"
  std::string th_source;     // where `th` came from: "dwarf", "disasm", "current" (for reports and tests)
  // Hook sites of 3.3+: where the path to rb_thread_execute_hooks loads `th` into rsi, expressed at the site
  // instruction (the second, independent source; tests cross-check it against DWARF).
  std::optional<ThLocation> th_disasm;
  // Function-entry sites: calls whose return address is in [start, end) (ELF vaddrs) are not events (rv_site).
  uint64_t exclude_caller_start = 0;
  uint64_t exclude_caller_end = 0;
  // A return probe on the function at vaddr (method "gc-function-return"): fires when that call returns.
  bool return_probe = false;
  // The instruction the site stands for: the hook check (`cmpq $0, hooks(%rip)`, `testb $bit, flags`) or the
  // function's entry, as in the reference tables. vaddr is where the uprobe sits: this instruction, or the first
  // one after it on the same straight-line path that the kernel emulates (PlaceOnEmulatedInstructions). 0: vaddr.
  uint64_t check_vaddr = 0;
  uint64_t check() const { return check_vaddr != 0 ? check_vaddr : vaddr; }
  // The kernel single-steps the instruction at vaddr (no emulated one was within reach): each hit costs a second
  // exception (rv_site RV_SITE_SINGLE_STEP).
  bool single_step = false;
  // The check's offset in the file (the reference tables' column).
  uint64_t check_file_offset() const { return file_offset - (vaddr - check()); }
};

struct SiteSet {
  std::string build_id;
  // SHA-256 (hex, SparseContentSha256Hex) of the whole binary the sites were computed from. Empty when the set did
  // not come through the cache.
  std::string content_sha256;
  // SHA-256 of the whole debug file attached when the sites were computed (found by build-id in the target's root,
  // on the host, or through debuginfod), "none" without one. With content_sha256 it keys the caches: a result is
  // only ever reused for the same binary analysed with the same debug file (or none).
  std::string debug_sha256 = "none";
  // The caches' key of this analysis: content_sha256, or content_sha256 + ".debug-" + debug_sha256.
  std::string AnalysisKey() const;
  std::string ruby_version;
  std::vector<ProbeSite> sites;  // sorted by file_offset
  rv_offsets offsets{};          // th->serial, th->nt, nt->tid in bytes
  uint32_t main_thread_serial = 1;  // 1 on 3.3+ (vm.c th_init), 0 on 3.2
  std::string offsets_source;    // "dwarf" or "table"
  // Where the .symtab/DWARF the sites were computed from came from: ElfFile::symbols_source() ("binary", a build-id
  // debug file, debuginfod).
  std::string symbols_source = "binary";
  // Where each fact the sites rest on came from (fact, source): symtab, DWARF, exports (.dynsym), .eh_frame,
  // disassembly or a built-in table. Printed by `rvbpfd sites` and kept in the cache.
  std::vector<std::pair<std::string, std::string>> provenance;
  // Whether the analysed file had a .symtab. A stripped copy keeps its build-id, so the cache checks this too: a
  // result computed from the symbols is not reported as found without them, nor the other way round.
  bool analysed_with_symtab = true;
  // For the check of a live process (session/vm_binary.h CheckLiveLayout): the hook list, and the main
  // thread's route from rb_thread_main's code (0: unknown).
  uint64_t hooks_vaddr = 0;
  uint64_t main_ractor_vaddr = 0;
  uint32_t ractor_main_thread = 0;
};

// Parsed "X.Y.Z"; false when the string is not of that shape.
bool ParseRubyVersion(const std::string& version, int* major, int* minor, int* teeny);

// Version-table struct offsets (§6 of the reference) for major.minor; false for versions we have no table for.
bool TableOffsets(int major, int minor, rv_offsets* offsets, uint32_t* main_thread_serial);

// The hard time cap of one binary's analysis (FindSites). A real VM binary takes well under a few seconds; a crafted
// one may not take the agent's probing hostage.
inline constexpr std::chrono::milliseconds kSiteAnalysisTimeout{20'000};

// Computes all probe sites of `vm`, in time linear in its code and symbols. Every site is checked against the code
// (CheckSitesAgainstCode, sites/code_check.h: an instruction boundary of its function, decoded from the function's
// start as the binary's own .eh_frame or .symtab gives it) before it is returned. Errors: kUnsupportedVersion for
// Ruby < 3.2 (or unparseable), or when the analysis passes `timeout` (SiteAnalysisTimeoutMessage); kNoSymbols when
// the binary has no .symtab or no `rb_internal_thread_event_hooks`, when a STARTED/READY site's `th` cannot be
// located, or when a site fails the code check.
Result<SiteSet> FindSites(const ElfFile& vm, const std::string& ruby_version,
                          std::chrono::milliseconds timeout = kSiteAnalysisTimeout);
// The error message of an analysis past its time cap, and whether an error is one (the agent counts them).
std::string SiteAnalysisTimeoutMessage(const ElfFile& vm);
bool IsSiteAnalysisTimeout(const Error& e);

// SparseContentSha256Hex of the binary, which keys the caches. Hashing reads the whole file (~70 ms for a 46 MB
// static ruby with debug info), so the hash is kept in `<cache_dir>/file-<dev>-<ino>.json` (FileHashEntryPath) with
// the file's identity (FileIdentity: dev, ino, size, mtime, ctime) and used again only for a file of that identity.
// Only a file unchanged for settle_ns before it was opened is entered (FileIdentity::Settled), so an entry never
// pairs an identity with content read while the file changed. An entry that is malformed or of another identity is
// ignored and rewritten. cache_dir "": always hashed. "" when the content cannot be read
// (ElfFile::LoadDeferredSections).
// kFileSettleNs: far more than any file system's timestamp granularity (ext4, tmpfs: ns, set from a clock that ticks
// every few ms; FAT: 2 s).
inline constexpr int64_t kFileSettleNs = 3'000'000'000;
std::string ContentSha256Of(const ElfFile& elf, const std::string& cache_dir, int64_t settle_ns = kFileSettleNs);
std::string FileHashEntryPath(const std::string& cache_dir, const FileIdentity& id);

// FindSites with a JSON cache `<cache_dir>/<key>.json`, keyed by everything the sites were computed from
// (SiteSet::AnalysisKey): the SHA-256 of the whole binary and of the debug file attached to it (or none), never by
// the build-id a binary claims: a crafted binary carrying another's build-id, or a binary analysed with a debug file
// a tenant planted in its own root, only ever finds or writes its own entry. The debug file is looked up
// (AttachDebugInfo) before the cache. A cache file that is corrupt, of another format version, for other content or
// another version, whose values are out of range, or whose sites fail the code check (CheckSitesAgainstCode) is
// ignored and rewritten (atomically: an O_EXCL temporary file renamed into place, removed on any failure). Names are written with invalid UTF-8 replaced, so no symbol name can make the
// write throw. A cache directory that cannot be written only costs the cache, never the result.
Result<SiteSet> LoadOrFindSites(ElfFile& elf, const std::string& ruby_version, const std::string& cache_dir);
// The same for the file at elf_path (opened and parsed here).
Result<SiteSet> LoadOrFindSites(const std::string& elf_path, const std::string& ruby_version,
                                const std::string& cache_dir);

// GC enter/exit by function-level probes, for a binary whose GC hook checks cannot be found (§4 of the reference):
// GC_ENTER at the entry of each out-of-line function that runs one gc_enter()/gc_exit() pair, GC_EXIT at its return
// (a return probe; method "gc-function-entry" / "gc-function-return"). 3.3+: gc_start, gc_rest, gc_continue; 3.2:
// gc_start, gc_rest, gc_marks_continue, gc_sweep_continue. Where GCC split a function into `base` and `base.part.N`
// (gc_rest: the body after its "anything to finish?" test), only the part is probed, since the whole function also
// runs when there is nothing to do. Differences from the VM's own events are in docs/design.md (a gc_start that
// returns without collecting still gives a pair; the shutdown finalizer GC and rb_memerror are not covered).
// Returns an empty list when the binary has none of these functions.
std::vector<ProbeSite> FindGcFunctionSites(const ElfFile& vm, const std::string& ruby_version);

// Replaces the GC sites of `set` with FindGcFunctionSites (--gc-probes=fallback). kNoSymbols when the binary has no
// GC function to probe.
Status UseGcFunctionProbes(const ElfFile& vm, SiteSet* set);

// Bounds every site set meets (CheckSiteSet): the provenance list is a handful of facts, each a short line.
inline constexpr size_t kMaxSiteProvenance = 32;
inline constexpr size_t kMaxSiteProvenanceText = 512;

// The plausibility rules of a site set, one place for the finder and the cache reader: each site's method matches
// its event, locations are known kinds and registers, the probe sits at most a few instructions after its check,
// the exclusion range is not empty; the hook list's address is set; struct offsets are below 4 KiB (no CRuby struct
// we read from is near that large); at most RV_MAX_SITES sites and kMaxSiteProvenance short provenance lines. A
// binary whose facts break them (only a crafted or corrupt one can) is refused, so a result is always cacheable.
// Errors: kNoSymbols, naming the first rule broken.
Status CheckSiteSet(const SiteSet& set);

// Serialisation used by the cache (exposed for tests and `rvbpfd sites`).
std::string SiteSetToJson(const SiteSet& set);
Result<SiteSet> SiteSetFromJson(const std::string& text);

// Human-readable table, one line per site in the style of the reference tables:
// "0x2ac90e   READY     thread_sched_to_ready_common   th: $rsi".
std::string FormatSites(const SiteSet& set);
// One "# fact: source" line per provenance entry.
std::string FormatProvenance(const SiteSet& set);
// "$rsi", "$rbx-288", "[$rsp+80]", "current".
std::string FormatThLocation(const ThLocation& loc);
// "STARTED", "READY", ..., "GC_ENTER", "SLEEP", "MUTEX_LOCK".
std::string EventKindName(uint8_t event);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SITES_SITES_H_
