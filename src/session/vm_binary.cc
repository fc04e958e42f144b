#include "session/vm_binary.h"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/deadline.h"
#include "common/target_file.h"
#include "elf/debug_lookup.h"
#include "elf/elf_file.h"
#include "stacks/memory_reader.h"
#include "stacks/offsets_cache.h"
#include "target/target.h"

namespace rvbpfd {

Result<StackSetup> PrepareStacks(ElfFile& vm, const std::string& ruby_version, const std::string& content_sha256,
                                 const std::string& cache_dir) {
  int major = 0, minor = 0, teeny = 0;
  if (!ParseRubyVersion(ruby_version, &major, &minor, &teeny)) {
    return Error(ErrorCode::kUnsupportedVersion, "cannot parse ruby_version " + ruby_version);
  }
  AttachDebugInfo(&vm);  // the layout needs DWARF: from the binary or its debug file by build-id
  Result<RubyOffsets> off = CachedOffsetsForBinary(vm, major, minor, content_sha256, cache_dir);
  if (!off) return off.error();
  StackSetup s;
  s.offsets = *off;
  if (Result<uint64_t> g = FindGlobalSymbolsVaddr(vm); g) s.global_symbols_vaddr = *g;
  s.current_vm_ptr_vaddr = FindCurrentVmPtrVaddr(vm);
  s.ec_route = ComputeEcRoute(vm, s.offsets);
  s.lowest_load_vaddr = LowestLoadVaddr(vm);
  return s;
}

Result<PreparedBinary> PrepareVmBinary(const std::string& vm_path, const std::string& ruby_version,
                                       const std::string& cache_dir, bool want_stacks) {
  Result<ElfFile> vm = ElfFile::Open(vm_path);
  if (!vm) return vm.error();
  return PrepareVmBinary(*vm, ruby_version, cache_dir, want_stacks);
}

Result<PreparedBinary> PrepareVmBinaryBounded(std::shared_ptr<ElfFile> vm, const std::string& ruby_version,
                                              const std::string& cache_dir, bool want_stacks,
                                              const std::atomic<bool>* cancel) {
  const std::string step = "analysing " + vm->path();
  return RunBounded<PreparedBinary>(step, kAnalysisTimeout, cancel, [vm, ruby_version, cache_dir, want_stacks] {
    return PrepareVmBinary(*vm, ruby_version, cache_dir, want_stacks);
  });
}

Result<PreparedBinary> PrepareVmBinary(ElfFile& vm, const std::string& ruby_version,
                                       const std::string& cache_dir, bool want_stacks) {
  Result<SiteSet> sites = LoadOrFindSites(vm, ruby_version, cache_dir);
  if (!sites) return sites.error();
  PreparedBinary p;
  p.sites = std::move(sites.value());
  p.live_layout = LiveLayoutOf(vm, p.sites);
  if (want_stacks) {
    // Keyed as the sites are: the binary and the debug file the layout was read from (LoadOrFindSites attached it).
    Result<StackSetup> ss = PrepareStacks(vm, ruby_version, p.sites.AnalysisKey(), cache_dir);
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
  wc.gvl = setup.offsets.gvl;
  wc.valid = 1;
  return wc;
}

std::unique_ptr<StackResolver> MakeStackResolver(int pid, const std::string& vm_path, const StackSetup& setup,
                                                 const std::string& proc_root) {
  uint64_t gsym = 0, vm_ptr = 0;
  if (setup.global_symbols_vaddr != 0 || setup.current_vm_ptr_vaddr != 0) {
    if (std::optional<uint64_t> lowest = LowestMappingOf(pid, vm_path, proc_root)) {
      const uint64_t bias = LoadBiasFromLowestMapping(setup.lowest_load_vaddr, *lowest);
      if (setup.global_symbols_vaddr != 0) gsym = setup.global_symbols_vaddr + bias;
      if (setup.current_vm_ptr_vaddr != 0) vm_ptr = setup.current_vm_ptr_vaddr + bias;
    }
  }
  return std::make_unique<StackResolver>(std::make_unique<ProcessMemoryReader>(pid), setup.offsets, gsym, vm_ptr);
}

std::vector<std::pair<std::string, std::string>> StackProvenance(ElfFile& vm, const std::string& ruby_version) {
  std::vector<std::pair<std::string, std::string>> out;
  int major = 0, minor = 0, teeny = 0;
  if (!ParseRubyVersion(ruby_version, &major, &minor, &teeny)) {
    out.push_back({"stack offsets", "none: unparseable ruby_version"});
    return out;
  }
  AttachDebugInfo(&vm);  // as PrepareStacks does: the offsets come from the debug file's DWARF when there is one
  ElfFile* const elf = &vm;
  OffsetsReport report;
  Result<RubyOffsets> off = OffsetsForBinary(*elf, major, minor, &report);
  if (!off) {
    out.push_back({"stack offsets", "none: " + off.error().message()});
    return out;
  }
  const std::string table = "table " + std::to_string(major) + "." + std::to_string(minor);
  out.push_back({"stack offsets", report.from_dwarf > 0 ? "dwarf (" + std::to_string(report.from_dwarf) +
                                                              " fields) over " + table
                                                        : table});
  out.push_back({"sample EC route", DescribeEcRoute(ComputeEcRoute(*elf, *off))});
  const bool gvl_dwarf = std::find(report.dwarf_fields.begin(), report.dwarf_fields.end(),
                                   "ractor.threads.sched.running") != report.dwarf_fields.end();
  out.push_back({"sample GVL reading", off->gvl.base == RV_GVL_BASE_NONE ? "none: no layout for " + table.substr(6)
                                       : gvl_dwarf                       ? "dwarf (ractor threads.sched)"
                                                                         : table + " (ractor threads.sched)"});
  std::optional<ElfSymbol> gsym = elf->FindSymbol("ruby_global_symbols");
  Result<uint64_t> gvaddr = FindGlobalSymbolsVaddr(*elf);
  out.push_back({"ruby_global_symbols", !gvaddr ? "none: " + gvaddr.error().message()
                                        : gsym && gsym->shndx != SHN_UNDEF ? "symtab"
                                                                           : "disassembly of rb_id2str (exports)"});
  return out;
}

LiveLayout LiveLayoutOf(const ElfFile& vm, const SiteSet& sites) {
  LiveLayout l;
  l.vm_path = vm.origin_path();
  l.ruby_version = sites.ruby_version;
  l.description = "CRuby " + sites.ruby_version + ", build-id " + (sites.build_id.empty() ? "none" : sites.build_id) +
                  ", " + (sites.analysed_with_symtab ? "symbols" : "no symbols: offsets " + sites.offsets_source);
  if (std::optional<ElfSymbol> v = vm.FindSymbol("ruby_version"); v && v->shndx != SHN_UNDEF) {
    l.ruby_version_vaddr = v->value;
  }
  l.hooks_vaddr = sites.hooks_vaddr;
  l.main_ractor_vaddr = sites.main_ractor_vaddr;
  l.ractor_main_thread = sites.ractor_main_thread;
  l.th_nt = sites.offsets.th_nt;
  l.nt_tid = sites.offsets.nt_tid;
  l.lowest_load_vaddr = LowestLoadVaddr(vm);
  return l;
}

std::string NotStartedReason(const LiveLayout& layout) {
  return "its main thread is not set up (the main ractor's threads.main at +" +
         std::to_string(layout.ractor_main_thread) + " stays NULL)";
}

Error LiveLayoutRefusal(const LiveLayout& layout, int pid, const std::string& what) {
  return Error(ErrorCode::kNoSymbols,
               layout.vm_path + " (" + layout.description + "): process " + std::to_string(pid) +
                   " does not match the layout rvbpfd derived: " + what +
                   "; supported without debug symbols: CRuby 3.2, 3.3 and 3.4 release builds (GCC, x86-64), otherwise "
                   "install the VM's debug symbols");
}

Result<LiveLayoutResult> CheckLiveLayout(int pid, int ns_pid, const LiveLayout& layout, uint64_t load_bias,
                                         MemoryReader& mem, bool vm_may_be_starting) {
  auto refuse = [&](const std::string& what) { return LiveLayoutRefusal(layout, pid, what); };
  // 1. The version the tables were chosen for.
  if (layout.ruby_version_vaddr != 0) {
    char buf[32] = {};
    if (!mem.Read(layout.ruby_version_vaddr + load_bias, buf, sizeof(buf) - 1)) {
      return refuse("ruby_version is unreadable");
    }
    if (std::string(buf, strnlen(buf, sizeof(buf) - 1)) != layout.ruby_version) {
      return refuse("its ruby_version is \"" + std::string(buf, strnlen(buf, sizeof(buf) - 1)) + "\"");
    }
  }
  // 2. The hook list the sites test.
  if (layout.hooks_vaddr != 0) {
    uint64_t head = 0;
    if (!mem.ReadValue(layout.hooks_vaddr + load_bias, &head)) return refuse("the hook list pointer is unreadable");
    uint64_t word = 0;
    if (head != 0 && !mem.ReadValue(head, &word)) return refuse("the hook list points to unreadable memory");
  }
  // 3. th->nt->tid of the main thread, with the offsets BPF will use.
  if (layout.main_ractor_vaddr != 0 && layout.ractor_main_thread != 0) {
    uint64_t ractor = 0, th = 0, nt = 0;
    int32_t tid = 0;
    if (!mem.ReadValue(layout.main_ractor_vaddr + load_bias, &ractor)) return refuse("the main ractor is unreadable");
    // NULL: several ractors (the check does not apply), or a VM that has not reached ruby_setup yet.
    if (ractor == 0) return vm_may_be_starting ? LiveLayoutResult::kNotStarted : LiveLayoutResult::kMatches;
    if (!mem.ReadValue(ractor + layout.ractor_main_thread, &th)) {
      return refuse("the main ractor's main thread is unreadable");
    }
    if (th == 0) return LiveLayoutResult::kNotStarted;  // ruby_setup has not set the main thread up yet
    if (!mem.ReadValue(th + layout.th_nt, &nt) || nt == 0) {
      return refuse("the main thread's native thread (th->nt at +" + std::to_string(layout.th_nt) +
                    ") is unreadable");
    }
    if (!mem.ReadValue(nt + layout.nt_tid, &tid)) {
      return refuse("the main thread's native tid (nt->tid at +" + std::to_string(layout.nt_tid) +
                    ") is unreadable");
    }
    if (tid != ns_pid) {
      return refuse("the main thread's native tid (nt->tid at +" + std::to_string(layout.nt_tid) + ") is " +
                    std::to_string(tid) + ", not the pid (" + std::to_string(ns_pid) + " in its pid namespace)");
    }
  }
  return LiveLayoutResult::kMatches;
}

LiveLayoutGate::State LiveLayoutGate::Poll(uint64_t now_ns,
                                           const std::function<std::optional<uint64_t>()>& lowest_mapping_of,
                                           MemoryReader& mem) {
  if (state_ != State::kPending) return state_;
  if (last_ns_ && now_ns - *last_ns_ < kRetryNs) return state_;
  if (!first_ns_) first_ns_ = now_ns;
  last_ns_ = now_ns;
  const std::optional<uint64_t> lowest_mapping = lowest_mapping_of();
  if (lowest_mapping && unreadable_ && !readability_known_) {
    readability_known_ = true;
    const int err = unreadable_->read_errno(*lowest_mapping);
    if (err == EPERM || err == EACCES) {
      if (unreadable_->layout_from_binary) {
        state_ = State::kSkipped;
      } else {
        error_ = Error(ErrorCode::kNoPrivilege,
                       "checking the command's memory against the layout rvbpfd derived from a VM binary without "
                       "debug symbols: " + ErrnoMessage("process_vm_readv of pid " + std::to_string(pid_), err) +
                           " (it runs as another user); give rvbpfd CAP_SYS_PTRACE, or install the VM's debug symbols");
        state_ = State::kFailed;
      }
      return state_;
    }
  }
  Result<LiveLayoutResult> r =
      lowest_mapping ? CheckLiveLayout(pid_, ns_pid_, layout_,
                                       LoadBiasFromLowestMapping(layout_.lowest_load_vaddr, *lowest_mapping), mem)
                     : Result<LiveLayoutResult>(LiveLayoutResult::kNotStarted);
  if (!r) {
    error_ = r.error();
    state_ = State::kFailed;
  } else if (*r == LiveLayoutResult::kMatches) {
    state_ = State::kPassed;
  } else if (now_ns - *first_ns_ >= kGiveUpNs) {
    error_ = LiveLayoutRefusal(layout_, pid_,
                               (lowest_mapping ? NotStartedReason(layout_) : "it does not map its VM binary") + " " +
                                   std::to_string(kGiveUpNs / 1'000'000'000) + " s after it started");
    state_ = State::kFailed;
  }
  return state_;
}

int ProcessReadErrno(int pid, uint64_t addr) {
  uint8_t byte = 0;
  struct iovec local = {&byte, 1}, remote = {reinterpret_cast<void*>(addr), 1};
  return process_vm_readv(pid, &local, 1, &remote, 1, 0) == 1 ? 0 : errno;
}

}  // namespace rvbpfd
