#include "dump/dump_command.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <charconv>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "common/hex.h"
#include "common/json_dump.h"
#include "common/text_escape.h"
#include "dump/dump_analysis.h"
#include "dump/dump_core.h"
#include "dump/dump_layout.h"
#include "dump/dump_output.h"
#include "dump/dump_page_cache.h"
#include "dump/dump_vm_route.h"
#include "ops/file_read.h"
#include "session/stack_resolver.h"
#include "session/vm_binary.h"
#include "sites/disasm.h"
#include "sites/sites.h"
#include "sites/stripped.h"
#include "stacks/symbolizer.h"
#include "stacks/walker.h"
#include "target/pid_namespace.h"

namespace rvbpfd {
namespace {

constexpr size_t kMaxProcFileBytes = 4096;
// Frames per thread: far beyond any real stack (CRuby's default VM stack holds ~10,000 frames at most).
constexpr uint32_t kMaxDumpFrames = 16384;

bool ParseHex(std::string_view s, uint64_t* out) {
  if (s.substr(0, 2) == "0x") s.remove_prefix(2);
  if (s.empty()) return false;
  auto r = std::from_chars(s.data(), s.data() + s.size(), *out, 16);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

// The host tid of each namespace tid (identity outside a pid namespace of its own).
std::map<int, int> HostTids(int pid, const ProcFs& procfs, std::vector<std::string>* notes) {
  std::map<int, int> out;
  Result<TargetPidNamespace> ns = ReadPidNamespace(pid, procfs);
  if (!ns) {
    notes->push_back("native tids are the target's own (its pid namespace could not be read: " +
                     ns.error().message() + ")");
    return out;
  }
  if (!ns->own_namespace()) return out;
  for (const auto& [ns_tid, host_tid] : ns->threads) out[static_cast<int>(ns_tid)] = static_cast<int>(host_tid);
  return out;
}

// Native tids, /proc task states, and for threads waiting for IO the descriptor and what it is.
void AddProcFacts(int pid, const ProcFs& procfs, MemoryReader& mem, DumpSnapshot* snap) {
  const std::map<int, int> host = HostTids(pid, procfs, &snap->notes);
  for (DumpedThread& t : snap->threads) {
    if (!host.empty()) {
      auto it = host.find(t.ns_tid);
      t.native_tid = it != host.end() ? it->second : 0;
    }
    if (t.native_tid == 0) continue;
    const std::string task = "task/" + std::to_string(t.native_tid) + "/";
    SmallFile stat = ReadSmallFile(procfs.PidPath(pid, task + "stat"), kMaxProcFileBytes);
    t.task_state = TaskStateLetter(stat.data);
  }
  DeriveStates(snap);
  for (DumpedThread& t : snap->threads) {
    if (!t.waiting_for || t.waiting_for->kind != "io" || t.native_tid == 0) continue;
    const std::string task = "task/" + std::to_string(t.native_tid) + "/";
    SmallFile sc = ReadSmallFile(procfs.PidPath(pid, task + "syscall"), kMaxProcFileBytes);
    std::optional<int> fd = BlockedFd(sc.data, mem);
    if (!fd) continue;
    t.waiting_for->fd = *fd;
    char target[512];
    const std::string link = procfs.PidPath(pid, "fd/" + std::to_string(*fd));
    const ssize_t n = readlink(link.c_str(), target, sizeof(target));
    if (n > 0) t.waiting_for->fd_target = std::string(target, static_cast<size_t>(n));
  }
}

}  // namespace

char TaskStateLetter(std::string_view stat_text) {
  const size_t close = stat_text.rfind(')');
  if (close == std::string_view::npos || close + 2 >= stat_text.size() || stat_text[close + 1] != ' ') return 0;
  const char c = stat_text[close + 2];
  return c >= 'A' && c <= 'Z' ? c : 0;
}

std::optional<int> BlockedFd(std::string_view text, MemoryReader& mem) {
  std::vector<uint64_t> words;
  while (!text.empty() && words.size() < 3) {
    const size_t sp = text.find_first_of(" \n");
    std::string_view w = text.substr(0, sp);
    text.remove_prefix(sp == std::string_view::npos ? text.size() : sp + 1);
    if (w.empty()) continue;
    uint64_t v = 0;
    if (words.empty()) {
      auto r = std::from_chars(w.data(), w.data() + w.size(), v, 10);
      if (r.ec != std::errc() || r.ptr != w.data() + w.size()) return std::nullopt;  // "running", "-1 ..."
    } else if (!ParseHex(w, &v)) {
      return std::nullopt;
    }
    words.push_back(v);
  }
  if (words.size() < 2) return std::nullopt;
  const uint64_t args[2] = {words[1], words.size() > 2 ? words[2] : 0};
  return BlockedFdOfCall(words[0], args, words.size() > 2, mem);
}

std::optional<int> BlockedFdOfCall(uint64_t nr, const uint64_t args[2], bool has_second, MemoryReader& mem) {
  const uint64_t arg0 = args[0];
  // x86-64 system call numbers.
  switch (nr) {
    case 0: case 1: case 17: case 18: case 19: case 20: case 42: case 43: case 44: case 45: case 46: case 47:
    case 232: case 281: case 288:
      return arg0 <= INT32_MAX ? std::optional<int>(static_cast<int>(arg0)) : std::nullopt;
    case 7: case 271: {  // poll, ppoll: struct pollfd {int fd; short events, revents;} *fds, nfds
      if (!has_second || args[1] == 0) return std::nullopt;
      int32_t fd = -1;
      if (!mem.ReadValue(arg0, &fd) || fd < 0) return std::nullopt;
      return fd;
    }
    default:
      return std::nullopt;
  }
}

Result<DumpVm> PrepareDumpVm(ElfFile& vm, const DumpVmIdentity& id, const std::string& cache_dir) {
  const std::string sha = cache_dir.empty() ? "" : ContentSha256Of(vm, cache_dir);
  Result<StackSetup> setup = PrepareStacks(vm, id.ruby_version, sha, cache_dir);
  if (!setup) return setup.error().Wrap("the VM binary's stack layout");
  Result<DumpLayout> layout = DumpLayoutForBinary(vm, id.major, id.minor, setup->offsets, sha, cache_dir);
  if (!layout) return layout.error();
  DumpVm out{std::move(setup.value()), std::move(layout.value())};
  const uint64_t bias = LoadBiasFromLowestMapping(out.setup.lowest_load_vaddr, id.load_start);
  out.roots.vm_ptr_addr = out.setup.current_vm_ptr_vaddr != 0 ? out.setup.current_vm_ptr_vaddr + bias : 0;
  if (out.roots.vm_ptr_addr == 0) {
    // A build that does not export ruby_current_vm_ptr (Debian's libruby-3.3): the global ruby_vm_at_exit reads,
    // else the main ractor from rb_thread_main.
    Result<Disassembler> dis = Disassembler::Create();
    if (!dis) return dis.error().Wrap("disassembling " + id.path);
    if (std::optional<uint64_t> g = FindVmPointerInCode(vm, *dis)) {
      out.roots.vm_ptr_addr = *g + bias;
      out.roots.vm_ptr_from_code = true;
      out.roots.vm_ptr_source = "ruby_current_vm_ptr (not exported: the global " + std::string(kVmPointerReader) +
                                " reads, at " + Hex(*g) + ")";
    } else if (std::optional<MainThreadRoute> route = FindMainThreadRoute(vm, *dis)) {
      out.roots.main_ractor_ptr_addr = route->main_ractor_vaddr + bias;
    } else {
      return Error(ErrorCode::kNoSymbols, id.path + " exports no ruby_current_vm_ptr, its " + kVmPointerReader +
                                              " reads no single global and its rb_thread_main does not name the "
                                              "main ractor: cannot find the VM");
    }
  }
  out.global_symbols = out.setup.global_symbols_vaddr != 0 ? out.setup.global_symbols_vaddr + bias : 0;
  return out;
}

Result<DumpSnapshot> ReadDumpThreads(const DumpVm& vm, MemoryReader& mem) {
  // Stacks are walked and named through a page cache emptied before each one (dump/dump_page_cache.h).
  PageCachedReader pages(mem);
  StackResolver resolver(std::make_unique<BorrowedMemoryReader>(pages), vm.setup.offsets, vm.global_symbols,
                         vm.roots.vm_ptr_addr);
  Symbolizer strings(&mem, vm.setup.offsets, vm.global_symbols);
  const rv_ruby_walk_offsets walk = vm.setup.offsets.walk;
  DumpReadHooks hooks;
  hooks.stack = [&](uint64_t ec) {
    pages.Clear();
    WalkResult w = WalkRubyStack(pages, walk, ec, WalkLimits{kMaxDumpFrames, 1 << 20});
    StackReading s;
    resolver.Resolve(w.frames, &s.frames);
    s.complete = w.complete;
    return s;
  };
  hooks.string = [&](uint64_t value) { return strings.ReadString(value); };
  Result<DumpSnapshot> snap = ReadRubyThreads(mem, vm.layout, vm.roots, hooks);
  if (snap && vm.roots.vm_ptr_from_code) {
    snap->notes.push_back("the VM was found through " + vm.roots.vm_ptr_source +
                          "; its main thread's Thread object was checked");
  }
  return snap;
}

void WriteDump(const DumpSnapshot& snap, bool json, std::ostream& out) {
  if (json) {
    out << DumpJson(DumpToJson(snap)) << "\n";
    return;
  }
  std::ostringstream text;
  PrintDumpText(snap, text);
  out << EscapeControlBytes(text.str(), /*keep_newlines=*/true);
}

Status RunDump(const DumpOptions& options, std::ostream& out, const ProcFs& procfs) {
  if (!options.core.empty()) return RunDumpCore(options, out);
  Result<RubyTarget> target = DiscoverTarget(options.pid, procfs);
  if (!target) return target.error();
  const DumpVmIdentity id{target->vm_host_path, target->ruby_version, target->major, target->minor,
                          target->vm_load_start};
  Result<DumpVm> vm = PrepareDumpVm(*target->vm_elf, id, options.cache_dir);
  if (!vm) return vm.error();
  const uint64_t root = vm->roots.vm_ptr_addr != 0 ? vm->roots.vm_ptr_addr : vm->roots.main_ractor_ptr_addr;
  if (const int err = ProcessReadErrno(options.pid, root); err != 0) {
    const ErrorCode code = err == EPERM || err == EACCES ? ErrorCode::kNoPrivilege
                           : err == ESRCH                ? ErrorCode::kNoSuchProcess
                                                         : ErrorCode::kIo;
    return Error(code, ErrnoMessage("reading process " + std::to_string(options.pid) +
                                        "'s memory (process_vm_readv; another user's process needs root or "
                                        "CAP_SYS_PTRACE)",
                                    err));
  }
  ProcessMemoryReader mem(options.pid);
  Result<DumpSnapshot> snap = ReadDumpThreads(*vm, mem);
  if (!snap) {
    if (ProcessEnding(procfs, options.pid)) {
      return Error(ErrorCode::kNoSuchProcess, "process " + std::to_string(options.pid) + " exited during the dump");
    }
    return snap.error().Wrap("process " + std::to_string(options.pid) + " (" + target->vm_host_path + ", CRuby " +
                             target->ruby_version + ")");
  }
  snap->pid = options.pid;
  snap->ruby_version = target->ruby_version;
  AddProcFacts(options.pid, procfs, mem, &snap.value());
  WriteDump(*snap, options.json, out);
  return Status::Ok();
}

}  // namespace rvbpfd
