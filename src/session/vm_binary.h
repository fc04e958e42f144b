// Preparing one CRuby VM binary for probing, shared by the single-process recorder and the fleet agent: its probe
// sites (cached per binary content hash), the walker and symbolizer layout for stacks, the two attach groups (rare events /
// high-rate GVL events), and the per-process pieces a stack needs (the VM's load address, the resolver).
//
// Pure functions over files; no BPF. Threading: callable from any thread (no shared state).
#ifndef RVBPFD_SRC_SESSION_VM_BINARY_H_
#define RVBPFD_SRC_SESSION_VM_BINARY_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "elf/elf_file.h"
#include "probe/bpf_session.h"
#include "rvbpfd/abi.h"
#include "session/stack_resolver.h"
#include "sites/sites.h"
#include "stacks/ec_route.h"
#include "stacks/memory_reader.h"
#include "stacks/ruby_offsets.h"
#include "trace/stacks.h"

namespace rvbpfd {

// Everything the daemon needs to turn stack records of one VM binary into frames.
struct StackSetup {
  RubyOffsets offsets;
  uint64_t global_symbols_vaddr = 0;  // ELF vaddr of ruby_global_symbols (0: C function names unresolved)
  uint64_t current_vm_ptr_vaddr = 0;  // ELF vaddr of ruby_current_vm_ptr (0: 3.2 class paths unresolved)
  EcRoute ec_route;  // how samples find their EC (per-process part: ResolveProcessEc, src/stacks/ec_route.h)
  uint64_t lowest_load_vaddr = UINT64_MAX;  // the VM's lowest PT_LOAD vaddr: its load bias in a process, with maps
};

// Walker/symbolizer layout of the VM binary `vm` (DWARF over the version table; debug info by build-id is attached
// to `vm` when it has none of its own). The DWARF part is cached in cache_dir under `analysis_key`
// (SiteSet::AnalysisKey: the binary's and its debug file's content hashes; CachedOffsetsForBinary,
// src/stacks/offsets_cache.h; "" for either: no cache).
Result<StackSetup> PrepareStacks(ElfFile& vm, const std::string& ruby_version, const std::string& analysis_key,
                                 const std::string& cache_dir);

// What CheckLiveLayout compares a live process with: the facts of its VM binary's analysis that the probes rely on,
// kept by PrepareVmBinary so that every process of a binary can be checked without the file (the fleet agent's probe
// sets, launch mode once the command runs).
struct LiveLayout {
  std::string vm_path;       // for messages (the binary as the daemon reached it)
  std::string ruby_version;  // the analysed version
  std::string description;   // "CRuby 3.4.5, build-id ..., symbols" / "..., no symbols: offsets table": for messages
  uint64_t ruby_version_vaddr = 0;  // ELF vaddr of the exported ruby_version string (0: none, not checked)
  uint64_t hooks_vaddr = 0;         // the thread-event hook list the sites test (0: not checked)
  uint64_t main_ractor_vaddr = 0;   // ruby_single_main_ractor, from rb_thread_main's code (0: unknown)
  uint32_t ractor_main_thread = 0;  // rb_ractor_t.threads.main (0: unknown)
  uint32_t th_nt = 0;               // rb_thread_t.nt, as the probes read it
  uint32_t nt_tid = 0;              // rb_native_thread.tid, as the probes read it
  uint64_t lowest_load_vaddr = UINT64_MAX;  // the binary's lowest PT_LOAD vaddr: its load bias with the maps
};
LiveLayout LiveLayoutOf(const ElfFile& vm, const SiteSet& sites);

struct PreparedBinary {
  SiteSet sites;
  LiveLayout live_layout;  // LiveLayoutOf(the binary, sites)
  std::optional<StackSetup> stacks;   // empty when stacks were not wanted or could not be set up
  std::optional<Error> stacks_error;  // why `stacks` is empty although they were wanted
};

// Sites (LoadOrFindSites with the content-hash cache in cache_dir) and, when want_stacks, the stack layout, all from the
// one parse of the VM binary `vm`. A failure to find sites is the error; a failure to set up stacks only leaves
// stacks empty (stacks_error says why).
Result<PreparedBinary> PrepareVmBinary(ElfFile& vm, const std::string& ruby_version,
                                       const std::string& cache_dir, bool want_stacks);
// PrepareVmBinary of the shared `vm` on a helper thread bounded by kAnalysisTimeout, given up at once when `cancel`
// (a stop signal's flag; may be null) is set: the analysis reads the binary's debug sections from a file the target
// controls. The helper owns what it uses, so an abandoned analysis never touches the caller's frame.
inline constexpr std::chrono::milliseconds kAnalysisTimeout{60'000};
Result<PreparedBinary> PrepareVmBinaryBounded(std::shared_ptr<ElfFile> vm, const std::string& ruby_version,
                                              const std::string& cache_dir, bool want_stacks,
                                              const std::atomic<bool>* cancel);
// The same for the file at vm_path (opened and parsed once here).
Result<PreparedBinary> PrepareVmBinary(const std::string& vm_path, const std::string& ruby_version,
                                       const std::string& cache_dir, bool want_stacks);

// Events whose rate follows the program's calls or allocations: the scheduler events of every GVL hand-off, GC
// enter/exit (every lazy-sweep and incremental-marking step), and the per-call Kernel#sleep / Mutex#lock probes.
// These are the sites --max-overhead detaches. Thread start/exit are rare enough to stay attached, so a paused
// window still shows which threads exist.
bool IsHighRateEvent(uint8_t event);

// The binary's sites as BpfSession attach specs, in two groups. BpfSession assigns cookies in attach order, so when
// low is attached before high, functions[cookie - first cookie] is the enclosing function of each site.
struct SplitSiteSpecs {
  std::vector<SiteSpec> low, high;
  std::vector<std::string> functions;  // low's functions, then high's
};
SplitSiteSpecs SplitSites(const SiteSet& sites, uint8_t binary);

// The BPF walker layout of a prepared binary (valid = 1).
rv_walk_config WalkConfigFor(const StackSetup& setup);

// A stack resolver for one process of a prepared binary: reads the process's memory, names C functions through
// ruby_global_symbols once the VM is mapped (0 otherwise).
std::unique_ptr<StackResolver> MakeStackResolver(int pid, const std::string& vm_path, const StackSetup& setup,
                                                 const std::string& proc_root = "/proc");

// Where the stack facts of the VM binary come from (fact, source), for `rvbpfd sites`: the walker and symbolizer
// offsets (DWARF over the version table, or the table alone), how samples find their EC, and ruby_global_symbols
// (symtab, or rb_id2str's code). Looks up its debug file first, as a recording does. A fact that cannot be set up
// says why.
std::vector<std::pair<std::string, std::string>> StackProvenance(ElfFile& vm, const std::string& ruby_version);

// Checks a live process against what the analysis of its VM binary assumes, before its events are trusted: the
// ruby_version string the process holds is the analysed one, the hook list pointer is readable (NULL, or the
// address of a readable hook), and in a single-ractor process the main thread's native tid (th->nt->tid, with the
// offsets the probes use) is the pid. `load_bias` is the binary's load bias in the process. A mismatch is kNoSymbols
// with one line naming the version, the failed check and what is supported; a process where a check cannot apply
// (several ractors) skips that check, never guesses.
// ns_pid: the pid as the target sees it in its own pid namespace (RubyTarget::ns_pid), which its main thread's
// nt->tid holds.
// kNotStarted: the VM has not set its main thread up yet, so the thread check cannot run now: the main ractor exists
// but has no main thread (ruby_setup is still running: a process caught right after exec), or, when
// `vm_may_be_starting` (the caller cannot rule out a process that has not reached ruby_setup), there is no single
// main ractor. Check again later.
enum class LiveLayoutResult { kMatches, kNotStarted };
Result<LiveLayoutResult> CheckLiveLayout(int pid, int ns_pid, const LiveLayout& layout, uint64_t load_bias,
                                         MemoryReader& mem, bool vm_may_be_starting = false);
// The one-line refusal (kNoSymbols) of process `pid` whose memory does not match `layout`: `what` failed, and what is
// supported. NotStartedReason: the `what` of a VM whose main thread stays unset past the caller's patience.
Error LiveLayoutRefusal(const LiveLayout& layout, int pid, const std::string& what);
std::string NotStartedReason(const LiveLayout& layout);

// CheckLiveLayout for a process whose VM may still be starting (launch mode, once the command runs), repeated until
// it decides: at most one attempt per kRetryNs, and a process whose VM has not set its main thread up kGiveUpNs after
// the first attempt is refused. Threading: one owner.
class LiveLayoutGate {
 public:
  static constexpr uint64_t kRetryNs = 1'000'000;        // 1 ms: ruby_setup takes a few ms
  static constexpr uint64_t kGiveUpNs = 5'000'000'000;   // far beyond ruby_setup on a loaded machine
  // kSkipped: the process's memory is not readable (see Unreadable) and the layout stands without the check.
  enum class State { kPending, kPassed, kSkipped, kFailed };

  // A command launched under sudo runs as the invoking user, whose memory rvbpfd cannot read without CAP_SYS_PTRACE
  // (docs/deploy.md gives launch mode no such capability). Once the VM is mapped the gate asks `read_errno` (errno
  // of a 1-byte read at the address, 0 when it worked) first: on EPERM/EACCES a layout taken from the binary's own
  // DWARF and symbols (`layout_from_binary`) stands without the check (kSkipped), one from the offsets table does
  // not (kFailed, kNoPrivilege, naming CAP_SYS_PTRACE and the debug symbols).
  struct Unreadable {
    bool layout_from_binary = false;
    std::function<int(uint64_t addr)> read_errno;
  };

  LiveLayoutGate(int pid, int ns_pid, LiveLayout layout, std::optional<Unreadable> unreadable = std::nullopt)
      : pid_(pid), ns_pid_(ns_pid), layout_(std::move(layout)), unreadable_(std::move(unreadable)) {}
  // One attempt when due. `lowest_mapping` gives the VM's lowest mapping in the process (nullopt while it is not
  // mapped); it is asked only when an attempt is due (it scans /proc/PID/maps).
  State Poll(uint64_t now_ns, const std::function<std::optional<uint64_t>()>& lowest_mapping, MemoryReader& mem);
  State state() const { return state_; }
  // Why it failed (kFailed only).
  const Error& error() const { return *error_; }

 private:
  int pid_, ns_pid_;
  LiveLayout layout_;
  std::optional<Unreadable> unreadable_;
  bool readability_known_ = false;
  State state_ = State::kPending;
  std::optional<uint64_t> first_ns_, last_ns_;  // the first and the latest attempt
  std::optional<Error> error_;
};

// The errno of a 1-byte process_vm_readv of `pid` at `addr`, 0 when it worked (LiveLayoutGate::Unreadable).
int ProcessReadErrno(int pid, uint64_t addr);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_SESSION_VM_BINARY_H_
