#include "record/vm_binary.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "elf/debug_lookup.h"
#include "elf/elf_file.h"
#include "stacks/memory_reader.h"

namespace rvbpfd {

Result<StackSetup> PrepareStacks(const std::string& vm_path, const std::string& ruby_version) {
  int major = 0, minor = 0, teeny = 0;
  if (!ParseRubyVersion(ruby_version, &major, &minor, &teeny)) {
    return Error(ErrorCode::kUnsupportedVersion, "cannot parse ruby_version " + ruby_version);
  }
  Result<ElfFile> elf = OpenWithDebugInfo(vm_path);
  if (!elf) return elf.error();
  Result<RubyOffsets> off = OffsetsForBinary(*elf, major, minor, nullptr);
  if (!off) return off.error();
  StackSetup s;
  s.offsets = *off;
  if (Result<uint64_t> g = FindGlobalSymbolsVaddr(*elf); g) s.global_symbols_vaddr = *g;
  s.ec_route = ComputeEcRoute(*elf, s.offsets);
  return s;
}

Result<PreparedBinary> PrepareVmBinary(const std::string& vm_path, const std::string& ruby_version,
                                       const std::string& cache_dir, bool want_stacks) {
  Result<SiteSet> sites = LoadOrFindSites(vm_path, ruby_version, cache_dir);
  if (!sites) return sites.error();
  PreparedBinary p;
  p.sites = std::move(sites.value());
  if (want_stacks) {
    Result<StackSetup> ss = PrepareStacks(vm_path, ruby_version);
    if (ss) {
      p.stacks = std::move(ss.value());
    } else {
      p.stacks_error = ss.error();
    }
  }
  return p;
}

bool IsHighRateEvent(uint8_t event) {
  // Kernel#sleep and Mutex#lock are per call: an uncontended lock loop or sleep(0) traps without any GVL transition,
  // and in a shared libruby the Mutex#lock site is also entered (and discarded) by every IO#write's write lock.
  // GC enter/exit fire at every lazy-sweep and incremental-marking step (gc_continue), ~1,300 pairs a second in
  // io_heavy, and those isolated traps cost 2-4x a back-to-back one (docs/design.md, "Cold traps"): left attached
  // while paused they alone cost io_heavy_long ~6.5% on 3.4.5, more than a 5% budget.
  return event == RV_EV_THREAD_READY || event == RV_EV_THREAD_RESUMED || event == RV_EV_THREAD_SUSPENDED ||
         event == RV_EV_MUTEX_LOCK_ENTER || event == RV_EV_SLEEP_ENTER || event == RV_EV_GC_ENTER ||
         event == RV_EV_GC_EXIT;
}

SplitSiteSpecs SplitSites(const SiteSet& sites, uint8_t binary) {
  SplitSiteSpecs out;
  std::vector<std::string> high_fn;
  for (const ProbeSite& ps : sites.sites) {
    SiteSpec spec{ps.file_offset,
                  rv_site{ps.event, ps.th.kind, ps.th.reg, binary, ps.th.offset, ps.vaddr, ps.exclude_caller_start,
                          ps.exclude_caller_end, ps.single_step ? static_cast<uint32_t>(RV_SITE_SINGLE_STEP) : 0u, 0},
                  ps.return_probe};
    if (IsHighRateEvent(ps.event)) {
      out.high.push_back(spec);
      high_fn.push_back(ps.function);
    } else {
      out.low.push_back(spec);
      out.functions.push_back(ps.function);
    }
  }
  out.functions.insert(out.functions.end(), high_fn.begin(), high_fn.end());
  return out;
}

rv_walk_config WalkConfigFor(const StackSetup& setup) {
  rv_walk_config wc{};
  wc.walk = setup.offsets.walk;
  wc.thread_ec = setup.offsets.thread_ec;
  ApplyEcRoute(setup.ec_route, &wc);
  wc.valid = 1;
  return wc;
}

std::optional<uint64_t> LowestMappingOf(int pid, const std::string& path, const std::string& proc_root) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  std::ifstream maps(proc_root + "/" + std::to_string(pid) + "/maps");
  std::string line;
  std::optional<uint64_t> lowest;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev;
    uint64_t inode = 0;
    if (!(in >> range >> perms >> offset >> dev >> inode) || inode != st.st_ino) continue;
    const uint64_t start = std::stoull(range, nullptr, 16);
    if (!lowest || start < *lowest) lowest = start;
  }
  return lowest;
}

std::unique_ptr<StackResolver> MakeStackResolver(int pid, const std::string& vm_path, const StackSetup& setup,
                                                 const std::string& proc_root) {
  uint64_t gsym = 0;
  if (setup.global_symbols_vaddr != 0) {
    if (std::optional<uint64_t> lowest = LowestMappingOf(pid, vm_path, proc_root)) {
      Result<ElfFile> elf = ElfFile::Open(vm_path);
      if (elf) gsym = setup.global_symbols_vaddr + LoadBiasFromLowestMapping(*elf, *lowest);
    }
  }
  return std::make_unique<StackResolver>(std::make_unique<ProcessMemoryReader>(pid), setup.offsets, gsym);
}

void AppendStackEndMarker(const rv_stack_header& h, std::vector<FrameInfo>* frames) {
  if (h.flags & RV_STACK_F_TRUNCATED) {
    frames->push_back(FrameInfo{"<truncated>", "", 0, FrameKind::kUnresolved});
  } else if (h.walk_status != RV_WALK_OK || (h.flags & RV_STACK_F_NO_EC)) {
    frames->push_back(FrameInfo{"<incomplete stack>", "", 0, FrameKind::kUnresolved});
  }
}

}  // namespace rvbpfd
