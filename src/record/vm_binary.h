// Preparing one CRuby VM binary for probing, shared by the single-process recorder and the fleet agent: its probe
// sites (cached per binary content hash), the walker and symbolizer layout for stacks, the two attach groups (rare events /
// high-rate GVL events), and the per-process pieces a stack needs (the VM's load address, the resolver).
//
// Pure functions over files; no BPF. Threading: callable from any thread (no shared state).
#ifndef RVBPFD_SRC_RECORD_VM_BINARY_H_
#define RVBPFD_SRC_RECORD_VM_BINARY_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "elf/elf_file.h"
#include "probe/bpf_session.h"
#include "record/stack_resolver.h"
#include "rvbpfd/abi.h"
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
  EcRoute ec_route;  // how samples find their EC (per-process part: ResolveProcessEc, src/stacks/ec_route.h)
  uint64_t lowest_load_vaddr = UINT64_MAX;  // the VM's lowest PT_LOAD vaddr: its load bias in a process, with maps
};

// Walker/symbolizer layout of the VM binary `vm` (DWARF over the version table; debug info by build-id is attached
// to `vm` when it has none of its own).
Result<StackSetup> PrepareStacks(ElfFile& vm, const std::string& ruby_version);

struct PreparedBinary {
  SiteSet sites;
  std::optional<StackSetup> stacks;   // empty when stacks were not wanted or could not be set up
  std::optional<Error> stacks_error;  // why `stacks` is empty although they were wanted
};

// Sites (LoadOrFindSites with the content-hash cache in cache_dir) and, when want_stacks, the stack layout, all from the
// one parse of the VM binary `vm`. A failure to find sites is the error; a failure to set up stacks only leaves
// stacks empty (stacks_error says why).
Result<PreparedBinary> PrepareVmBinary(ElfFile& vm, const std::string& ruby_version,
                                       const std::string& cache_dir, bool want_stacks);
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

// Lowest start address of the mappings of the file at `path` (matched by inode, so a /proc/PID/root/... host path and
// the target's own view of the file agree) in <proc_root>/PID/maps; nullopt when it is not mapped (yet).
std::optional<uint64_t> LowestMappingOf(int pid, const std::string& path, const std::string& proc_root = "/proc");

// A stack resolver for one process of a prepared binary: reads the process's memory, names C functions through
// ruby_global_symbols once the VM is mapped (0 otherwise).
std::unique_ptr<StackResolver> MakeStackResolver(int pid, const std::string& vm_path, const StackSetup& setup,
                                                 const std::string& proc_root = "/proc");

// Where the stack facts of the VM binary come from (fact, source), for `rvbpfd sites`: the walker and symbolizer
// offsets (DWARF over the version table, or the table alone), how samples find their EC, and ruby_global_symbols
// (symtab, or rb_id2str's code). Looks up its debug file first, as a recording does. A fact that cannot be set up
// says why.
std::vector<std::pair<std::string, std::string>> StackProvenance(ElfFile& vm, const std::string& ruby_version);

// Checks a live process against what the analysis of its VM binary assumes, before any probe goes in: the
// ruby_version string the process holds is the analysed one, the hook list pointer is readable (NULL, or the
// address of a readable hook), and in a single-ractor process the main thread's native tid (th->nt->tid, with the
// offsets the probes will use) is the pid. `vm` is the VM binary, `load_bias` its load bias in the process. A
// mismatch is kNoSymbols with one line naming the version, the failed check and what is supported; a process where a
// check cannot apply (several ractors) skips that check, never guesses.
// ns_pid: the pid as the target sees it in its own pid namespace (RubyTarget::ns_pid), which its main thread's
// nt->tid holds.
Status CheckLiveLayout(int pid, int ns_pid, const ElfFile& vm, uint64_t load_bias, const SiteSet& sites,
                       MemoryReader& mem);

// A stack that is not complete says so at its oldest end rather than passing for a whole one: cut at
// RV_MAX_STACK_FRAMES ("<truncated>"), or the walk could not read a frame ("<incomplete stack>").
void AppendStackEndMarker(const rv_stack_header& header, std::vector<FrameInfo>* frames);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_RECORD_VM_BINARY_H_
