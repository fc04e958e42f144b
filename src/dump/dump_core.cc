#include "dump/dump_core.h"

#include <elf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "common/deadline.h"
#include "dump/dump_analysis.h"
#include "elf/elf_file.h"
#include "target/target.h"

namespace rvbpfd {
namespace {

std::string_view Basename(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// Where the loader mapped `path`: the lowest mapping of it at file offset 0 that the next one continues (at its end,
// at the file offset that follows). A process may also hold the same file mapped whole elsewhere, e.g. CRuby's crash
// report maps its own binary to read DWARF for the [BUG] backtrace; the lowest mapping of the file alone would be
// that one. Without such a run (a one-segment file), the lowest mapping at offset 0, else the lowest.
uint64_t ImageStartOf(const CoreNotes& notes, const std::string& path) {
  uint64_t lowest = UINT64_MAX, lowest_at_zero = UINT64_MAX, image = UINT64_MAX;
  for (const CoreFileMapping& m : notes.files) {
    if (m.path != path) continue;
    lowest = std::min(lowest, m.start);
    if (m.offset != 0) continue;
    lowest_at_zero = std::min(lowest_at_zero, m.start);
    for (const CoreFileMapping& next : notes.files) {
      if (next.path == path && next.start == m.end && next.offset == m.end - m.start) {
        image = std::min(image, m.start);
        break;
      }
    }
  }
  return image != UINT64_MAX ? image : lowest_at_zero != UINT64_MAX ? lowest_at_zero : lowest;
}

Result<std::shared_ptr<ElfFile>> OpenVmFile(const std::string& path) {
  // The file may lie on a mount that never answers: bounded as target discovery is.
  return RunBounded<std::shared_ptr<ElfFile>>("reading " + path, kDiscoverTimeout, nullptr,
                                              [path]() -> Result<std::shared_ptr<ElfFile>> {
                                                Result<ElfFile> elf = ElfFile::Open(path);
                                                if (!elf) return elf.error();
                                                return std::make_shared<ElfFile>(std::move(elf.value()));
                                              });
}

bool DefinesVm(const ElfFile& elf) {
  std::optional<ElfSymbol> sym = elf.FindSymbol("ruby_version");
  return sym && sym->shndx != SHN_UNDEF;
}

}  // namespace

Result<CoreVmFile> ChooseCoreVmFile(const CoreNotes& notes, const std::string& exe, const std::string& libruby) {
  CoreVmFile out;
  for (const CoreFileMapping& m : notes.files) {
    if (!m.path.empty() && m.path[0] == '/' && IsLibrubyName(Basename(m.path))) {
      out.recorded_path = m.path;
      out.libruby = true;
      break;
    }
  }
  if (out.libruby) {
    out.host_path = libruby.empty() ? out.recorded_path : libruby;
  } else {
    if (!libruby.empty()) {
      return Error(ErrorCode::kUsage, "--libruby " + libruby + ": the core maps no libruby (a static ruby: give its "
                                      "executable with --exe)");
    }
    const CoreFileMapping* first = nullptr;
    for (const CoreFileMapping& m : notes.files) {
      if (m.path.empty() || m.path[0] != '/') continue;
      if (notes.entry != 0 && notes.entry >= m.start && notes.entry < m.end) {
        first = &m;
        break;
      }
      if (first == nullptr || m.start < first->start) first = &m;
    }
    if (first == nullptr) return Error(ErrorCode::kNotRuby, "the core's NT_FILE note names no mapped file");
    out.recorded_path = first->path;
    out.host_path = exe.empty() ? out.recorded_path : exe;
  }
  out.load_start = ImageStartOf(notes, out.recorded_path);
  return out;
}

void AddCoreFacts(const CoreNotes& notes, MemoryReader& mem, DumpSnapshot* snap) {
  std::map<int, const CoreThread*> by_tid;
  for (const CoreThread& t : notes.threads) by_tid.emplace(t.tid, &t);
  std::vector<int> missing;
  for (DumpedThread& t : snap->threads) {
    t.native_tid = t.ns_tid;
    auto it = by_tid.find(t.ns_tid);
    if (it == by_tid.end()) {
      if (t.ns_tid != 0) missing.push_back(t.ns_tid);
      continue;
    }
    t.task_state = it->second->in_syscall() ? 'S' : 'R';
  }
  DeriveStates(snap);
  for (DumpedThread& t : snap->threads) {
    if (!t.waiting_for || t.waiting_for->kind != "io") continue;
    auto it = by_tid.find(t.ns_tid);
    if (it == by_tid.end() || !it->second->in_syscall()) continue;
    if (std::optional<int> fd = BlockedFdOfCall(it->second->orig_rax, it->second->args, true, mem)) {
      t.waiting_for->fd = *fd;
    }
  }
  snap->notes.push_back("from a core file: a thread's running or holding_gvl is read from its registers (inside a "
                        "system call: off the CPU), not /proc; io descriptors are not resolved to what they name");
  if (!missing.empty()) {
    std::string tids;
    for (int tid : missing) tids += (tids.empty() ? "" : ", ") + std::to_string(tid);
    snap->notes.push_back("threads with no NT_PRSTATUS note in the core (another pid namespace's tids?): " + tids);
  }
}

Status RunDumpCore(const DumpOptions& options, std::ostream& out) {
  CoreFileReader::Options copts;
  Result<std::unique_ptr<CoreFileReader>> core = CoreFileReader::Open(options.core, copts);
  if (!core) return core.error();
  const CoreNotes& notes = (*core)->notes();
  Result<CoreVmFile> file = ChooseCoreVmFile(notes, options.exe, options.libruby);
  if (!file) return file.error().Wrap(options.core);
  const std::string flag = file->libruby ? "--libruby" : "--exe";
  Result<std::shared_ptr<ElfFile>> vm = OpenVmFile(file->host_path);
  if (!vm) {
    return Error(vm.error().code(), vm.error().message() + " (the core's " + file->recorded_path +
                                        "; give the file with " + flag + " PATH)");
  }
  ElfFile& elf = **vm;
  std::vector<std::string> notes_out;
  if (std::optional<std::string> id = CoreBuildIdAt(**core, file->load_start)) {
    if (*id != elf.build_id()) {
      return Error(ErrorCode::kNoSymbols,
                   options.core + " mapped " + file->recorded_path + " with build-id " + *id + ", but " +
                       file->host_path + " has build-id " + (elf.build_id().empty() ? "(none)" : elf.build_id()) +
                       ": not the same file; give the one the process ran with " + flag + " PATH");
    }
  } else {
    notes_out.push_back("the core does not carry the first page of " + file->recorded_path + ": " + file->host_path +
                        " is used without a build-id check");
  }
  if (!DefinesVm(elf)) {
    return Error(ErrorCode::kNotRuby, options.core + ": " + file->host_path + " defines no ruby_version: the core " +
                                          "maps no CRuby VM we know (a libruby under another name: " + flag + ")");
  }
  std::optional<std::string> version = ReadRubyVersion(elf);
  int major = 0, minor = 0, teeny = 0;
  if (!version || std::sscanf(version->c_str(), "%d.%d.%d", &major, &minor, &teeny) != 3) {
    return Error(ErrorCode::kNotRuby, file->host_path + " has no readable ruby_version string");
  }
  if (major < 3 || (major == 3 && minor < 2)) {
    return Error(ErrorCode::kUnsupportedVersion, "CRuby " + *version + " is not supported (use Ruby >= 3.2)");
  }
  // Bytes the core lacks of the VM file come from the file just checked.
  (*core)->SetOriginalFile(file->recorded_path, file->host_path);
  const DumpVmIdentity id{file->host_path, *version, major, minor, file->load_start};
  Result<DumpVm> dvm = PrepareDumpVm(elf, id, options.cache_dir);
  if (!dvm) return dvm.error();
  Result<DumpSnapshot> snap = ReadDumpThreads(*dvm, **core);
  if (!snap) return snap.error().Wrap(options.core + " (" + file->host_path + ", CRuby " + *version + ")");
  snap->ruby_version = *version;
  snap->pid = notes.pid != 0 ? notes.pid : (snap->threads.empty() ? 0 : snap->threads.front().ns_tid);
  AddCoreFacts(notes, **core, &snap.value());
  snap->notes.insert(snap->notes.end(), notes_out.begin(), notes_out.end());
  WriteDump(*snap, options.json, out);
  return Status::Ok();
}

}  // namespace rvbpfd
