#include "target/target.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string_view>

#include "common/capabilities.h"
#include "common/deadline.h"
#include "common/target_file.h"
#include "elf/elf_file.h"
#include "elf/symbol_names.h"

namespace rvbpfd {
namespace {

// /proc/PID/maps of a large Ruby process is a few hundred KB; more than this is not a maps file we should trust.
constexpr size_t kMaxProcFileBytes = 64u << 20;
// ruby_version is "X.Y.Z" (at most a few bytes); the bound only stops a scan through a corrupt file.
constexpr size_t kMaxVersionLength = 32;

// Reads a whole /proc file (their st_size is 0, so read until EOF). Returns errno on failure.
int ReadProcFile(const ProcFs& procfs, const std::string& path, std::string* out) {
  int fd = procfs.OpenFile(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  out->clear();
  char buf[65536];
  int err = 0;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      err = errno;
      break;
    }
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > kMaxProcFileBytes) {
      err = EFBIG;
      break;
    }
  }
  close(fd);
  return err;
}

std::string_view Basename(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

Error PrivilegeError(const std::string& what, int err) {
  // Another user's /proc/PID/{maps,root,mem} need ptrace read access.
  return Error(ErrorCode::kNoPrivilege, ErrnoMessage(what, err) + "; " + PrivilegeHint({kCapSysPtrace}));
}

// Symbols of which a static ruby's executable defines at least one (DiscoverTarget's test for the VM).
constexpr std::string_view kVmSymbols[] = {"ruby_version", "ruby_vm_event_flags"};

// Opens `path` O_PATH inside the target's root and parses the ELF file through that descriptor, so that the file
// analysed is the file later read and probed (target->vm_fd), however the path changes meanwhile. On success records
// the descriptor and path in *target. With `must_name`, a file whose symbol string tables name none of those symbols
// is a kNotRuby error without being parsed (StringTablesName: a few reads instead of a copy of the whole file); a file
// that cannot be scanned so is parsed.
Result<ElfFile> OpenThroughDescriptor(const std::string& path, RubyTarget* target,
                                      std::span<const std::string_view> must_name = {}) {
  Result<FileFd> handle = OpenPathInRoot(path);
  if (!handle) return handle.error();
  // One readable descriptor for the pre-filter and the parse.
  Result<FileFd> fd = ReopenRegularFile(*handle, path, "ELF file");
  if (!fd) return fd.error();
  if (!must_name.empty()) {
    Result<bool> named = StringTablesName(fd->get(), must_name);
    if (named.ok() && !*named) return Error(ErrorCode::kNotRuby, path + " names none of the VM's symbols");
  }
  Result<ElfFile> elf = ElfFile::OpenReopened(*fd, path);
  if (!elf) return elf.error();
  target->vm_fd = std::make_shared<const FileFd>(std::move(handle.value()));
  target->vm_host_path = path;
  return elf;
}

}  // namespace

// libruby.so, libruby.so.3.3, libruby.so.3.3.8, libruby-3.1.so.3.1, libruby-static? (no: static links into ruby).
bool IsLibrubyName(std::string_view base) {
  if (base.rfind("libruby.so", 0) == 0) return true;
  return base.rfind("libruby-", 0) == 0 && base.find(".so") != std::string_view::npos;
}

std::string ProcFs::PidPath(int pid, std::string_view rel) const {
  std::string out = root_ + "/" + std::to_string(pid);
  if (!rel.empty()) {
    out += "/";
    out += rel;
  }
  return out;
}

int ProcFs::OpenFile(const std::string& path, int flags) const { return open(path.c_str(), flags); }

std::vector<MapsEntry> ParseMaps(std::string_view text) {
  std::vector<MapsEntry> out;
  while (!text.empty()) {
    size_t nl = text.find('\n');
    std::string line(text.substr(0, nl));
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    MapsEntry e;
    char perms[8] = {};
    unsigned dev_major = 0, dev_minor = 0;
    int consumed = 0;
    if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %x:%x %" SCNu64 "%n", &e.start, &e.end,
                    perms, &e.offset, &dev_major, &dev_minor, &e.inode, &consumed) != 7 ||
        e.end < e.start) {
      continue;
    }
    e.perms = perms;
    std::string_view rest = std::string_view(line).substr(static_cast<size_t>(consumed));
    size_t first = rest.find_first_not_of(' ');
    if (first != std::string_view::npos) {
      std::string_view path = rest.substr(first);
      constexpr std::string_view kDeleted = " (deleted)";
      if (path.size() > kDeleted.size() && path.substr(path.size() - kDeleted.size()) == kDeleted) {
        path.remove_suffix(kDeleted.size());
        e.deleted = true;
      }
      e.path = std::string(path);
    }
    out.push_back(std::move(e));
  }
  return out;
}

int ReadNsPid(const ProcFs& procfs, int pid) {
  std::string status;
  if (ReadProcFile(procfs, procfs.PidPath(pid, "status"), &status) != 0) return pid;
  return ParseNsPid(status).value_or(pid);
}

std::optional<int> ParseNsPid(std::string_view status_text) {
  size_t at = status_text.find("\nNSpid:");
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view line = status_text.substr(at + 7);
  line = line.substr(0, line.find('\n'));
  // Fields are tab-separated pids from the outermost namespace to the innermost: the last is the target's own.
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
  const size_t sep = line.find_last_of(" \t");
  std::string_view last = sep == std::string_view::npos ? line : line.substr(sep + 1);
  if (last.empty() || last.size() > 9) return std::nullopt;
  int v = 0;
  for (char c : last) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v > 0 ? std::optional<int>(v) : std::nullopt;
}

bool StatSaysExiting(std::string_view stat_text) {
  const size_t close = stat_text.rfind(')');
  if (close == std::string_view::npos) return false;
  // After "pid (comm)": state, ppid, pgrp, session, tty_nr, tpgid, flags (fields 3 to 9), space-separated.
  std::string_view rest = stat_text.substr(close + 1);
  std::string_view fields[7];
  for (std::string_view& f : fields) {
    if (rest.empty() || rest.front() != ' ') return false;
    rest.remove_prefix(1);
    f = rest.substr(0, rest.find(' '));
    rest.remove_prefix(f.size());
    if (f.empty()) return false;
  }
  if (fields[0].size() != 1) return false;
  if (fields[0][0] == 'Z' || fields[0][0] == 'X') return true;
  uint64_t flags = 0;
  const std::string_view digits = fields[6];
  if (digits.size() > 10) return false;  // an unsigned int in decimal
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    flags = flags * 10 + static_cast<uint64_t>(c - '0');
  }
  constexpr uint64_t kPfExiting = 0x4;  // include/linux/sched.h
  return (flags & kPfExiting) != 0;
}

bool ProcessEnding(const ProcFs& procfs, int pid) {
  std::string stat;
  return ReadProcFile(procfs, procfs.PidPath(pid, "stat"), &stat) != 0 || stat.empty() || StatSaysExiting(stat);
}

namespace {

// The target's memory mappings, and its name (target->comm) read after them. kNoSuchProcess when it is gone,
// kNoPrivilege without the right to read them, kNotRuby when it maps nothing (a zombie or a kernel thread).
Result<std::vector<MapsEntry>> ReadTargetMaps(const ProcFs& procfs, int pid, RubyTarget* target) {
  const std::string pid_str = std::to_string(pid);
  std::string maps_text;
  if (int err = ReadProcFile(procfs, procfs.PidPath(pid, "maps"), &maps_text); err != 0) {
    if (err == EACCES || err == EPERM) return PrivilegeError("reading " + procfs.PidPath(pid, "maps"), err);
    if (err == ENOENT || err == ESRCH) return Error(ErrorCode::kNoSuchProcess, "no process with pid " + pid_str);
    return Error(ErrorCode::kIo, ErrnoMessage("reading " + procfs.PidPath(pid, "maps"), err));
  }
  // Read after the maps, not before: a process caught in exec would otherwise pair its old name with the new
  // image's mappings. The kernel renames it before the new image runs a single instruction, so mappings that the
  // new image's loader made (a libruby) imply the name read now is the new one.
  if (ReadProcFile(procfs, procfs.PidPath(pid, "comm"), &target->comm) == 0) {
    while (!target->comm.empty() && target->comm.back() == '\n') target->comm.pop_back();
  }
  if (maps_text.empty()) {
    // A zombie or a kernel thread has no mappings.
    return Error(ErrorCode::kNotRuby, "pid " + pid_str + " (" + target->comm + ") has no memory mappings (exited, a "
                                      "zombie or a kernel thread)");
  }
  return ParseMaps(maps_text);
}

// Opens the VM file `path` as the target sees it: through its root, else through map_files (which also reaches a
// deleted file, e.g. after a package upgrade). Sets target->vm_load_start to the lowest mapping of `path`.
// `must_name`: as OpenThroughDescriptor's; its kNotRuby ends the search like a privilege error does.
Result<ElfFile> OpenVmFile(const ProcFs& procfs, int pid, const std::vector<MapsEntry>& maps, const std::string& path,
                           RubyTarget* target, std::span<const std::string_view> must_name = {}) {
  const MapsEntry* mapping = nullptr;
  for (const MapsEntry& e : maps) {
    if (e.path == path && (mapping == nullptr || e.start < mapping->start)) mapping = &e;
  }
  if (mapping != nullptr) target->vm_load_start = mapping->start;
  std::string via_root = procfs.PidPath(pid, "root") + path;
  Result<ElfFile> elf = Error(ErrorCode::kIo, "not opened");
  if (mapping == nullptr || !mapping->deleted) {
    elf = OpenThroughDescriptor(via_root, target, must_name);
    if (elf.ok() || elf.error().code() == ErrorCode::kNoPrivilege || elf.error().code() == ErrorCode::kNotRuby) {
      return elf;
    }
  }
  if (mapping != nullptr) {
    char range[64];
    std::snprintf(range, sizeof(range), "%" PRIx64 "-%" PRIx64, mapping->start, mapping->end);
    Result<ElfFile> alt = OpenThroughDescriptor(procfs.PidPath(pid, "map_files/") + range, target, must_name);
    if (alt.ok() || alt.error().code() == ErrorCode::kNoPrivilege || alt.error().code() == ErrorCode::kNotRuby) {
      return alt;
    }
  }
  return elf.ok() ? Error(ErrorCode::kIo, "cannot open " + path) : elf.error();
}

// A static ruby: the main executable itself defines the VM. Its path from the exe link (without " (deleted)"), else
// the first file mapped from offset 0. Leaves *vm empty when the executable is not a VM; errors only for a privilege
// refusal.
Status FindStaticVm(const ProcFs& procfs, int pid, const std::vector<MapsEntry>& maps, RubyTarget* target,
                    std::optional<ElfFile>* vm) {
  char exe[4096];
  std::string exe_path;
  ssize_t n = readlink(procfs.PidPath(pid, "exe").c_str(), exe, sizeof(exe) - 1);
  if (n > 0) {
    exe_path.assign(exe, static_cast<size_t>(n));
    constexpr std::string_view kDeleted = " (deleted)";
    if (exe_path.size() > kDeleted.size() && exe_path.ends_with(kDeleted)) {
      exe_path.resize(exe_path.size() - kDeleted.size());
    }
  } else if (n < 0 && (errno == EACCES || errno == EPERM)) {
    return PrivilegeError("reading " + procfs.PidPath(pid, "exe"), errno);
  } else {
    for (const MapsEntry& e : maps) {
      if (!e.path.empty() && e.path[0] == '/' && e.offset == 0) {
        exe_path = e.path;
        break;
      }
    }
  }
  if (exe_path.empty()) return Status::Ok();
  Result<ElfFile> elf = OpenVmFile(procfs, pid, maps, exe_path, target, kVmSymbols);
  if (!elf.ok() && elf.error().code() == ErrorCode::kNoPrivilege) return elf.error();
  if (!elf.ok()) return Status::Ok();
  bool defines_vm = false;
  for (std::string_view name : kVmSymbols) {
    std::optional<ElfSymbol> sym = elf->FindSymbol(name);
    defines_vm = defines_vm || (sym && sym->shndx != SHN_UNDEF);
  }
  if (defines_vm) {
    target->vm_path = exe_path;
    target->vm_is_shared_library = false;
    *vm = std::move(elf.value());
  }
  return Status::Ok();
}

// The VM's ruby_version into target (string and numbers). kNotRuby without a readable "X.Y.Z",
// kUnsupportedVersion before 3.2.
Status ReadTargetVersion(const ElfFile& vm, const std::string& pid_str, RubyTarget* target) {
  std::optional<std::string> version = ReadRubyVersion(vm);
  int major = 0, minor = 0, teeny = 0;
  if (!version || std::sscanf(version->c_str(), "%d.%d.%d", &major, &minor, &teeny) != 3) {
    return Error(ErrorCode::kNotRuby, "pid " + pid_str + " (" + target->comm + "): " + target->vm_path +
                                          " has no readable ruby_version string; not a CRuby VM we know");
  }
  target->ruby_version = *version;
  target->major = major;
  target->minor = minor;
  target->teeny = teeny;
  if (major < 3 || (major == 3 && minor < 2)) {
    return Error(ErrorCode::kUnsupportedVersion, "CRuby " + *version +
                                                     " has no thread scheduler events (they were added in 3.2); use "
                                                     "Ruby >= 3.2");
  }
  return Status::Ok();
}

}  // namespace

Result<RubyTarget> DiscoverTarget(int pid, const ProcFs& procfs) {
  const std::string pid_str = std::to_string(pid);
  struct stat st;
  if (pid <= 0 || stat(procfs.PidPath(pid, "").c_str(), &st) != 0) {
    if (pid > 0 && (errno == EACCES || errno == EPERM)) return PrivilegeError("stat " + procfs.PidPath(pid, ""), errno);
    return Error(ErrorCode::kNoSuchProcess, "no process with pid " + pid_str);
  }
  RubyTarget target;
  target.pid = pid;
  target.ns_pid = ReadNsPid(procfs, pid);
  Result<std::vector<MapsEntry>> maps = ReadTargetMaps(procfs, pid, &target);
  if (!maps.ok()) return maps.error();

  // The VM: a mapped libruby, else the executable when it defines the VM.
  std::optional<ElfFile> vm;
  for (const MapsEntry& e : *maps) {
    if (e.path.empty() || e.path[0] != '/' || !IsLibrubyName(Basename(e.path))) continue;
    Result<ElfFile> elf = OpenVmFile(procfs, pid, *maps, e.path, &target);
    if (!elf.ok()) return elf.error().Wrap("opening the target's " + e.path);
    target.vm_path = e.path;
    target.vm_is_shared_library = true;
    vm = std::move(elf.value());
    break;
  }
  if (!vm) {
    if (Status s = FindStaticVm(procfs, pid, *maps, &target, &vm); !s) return s.error();
  }
  if (!vm) {
    return Error(ErrorCode::kNotRuby, "pid " + pid_str + " (" + target.comm +
                                          ") maps no CRuby VM: no libruby.so and its executable defines no "
                                          "ruby_version");
  }
  target.build_id = vm->build_id();
  if (Status s = ReadTargetVersion(*vm, pid_str, &target); !s) return s.error();
  target.vm_elf = std::make_shared<ElfFile>(std::move(*vm));
  return target;
}

Result<RubyTarget> DiscoverTargetBounded(int pid, const std::atomic<bool>* cancel) {
  return RunBounded<RubyTarget>("reading the files of pid " + std::to_string(pid), kDiscoverTimeout, cancel,
                                [pid] { return DiscoverTarget(pid, ProcFs()); });
}

std::optional<std::string> ReadRubyVersion(const ElfFile& vm) {
  std::optional<ElfSymbol> sym = vm.FindSymbol("ruby_version");
  if (!sym || sym->shndx == SHN_UNDEF) return std::nullopt;
  return vm.CStringAt(sym->value, kMaxVersionLength);
}

std::optional<uint64_t> LowestMappingOf(int pid, const std::string& path, const std::string& proc_root) {
  struct stat st;
  if (StatInRoot(path, &st) != 0) return std::nullopt;
  std::ifstream maps(proc_root + "/" + std::to_string(pid) + "/maps");
  std::string line;
  std::optional<uint64_t> lowest;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev;
    uint64_t inode = 0;
    if (!(in >> range >> perms >> offset >> dev >> inode) || inode != st.st_ino) continue;
    char* end = nullptr;
    const uint64_t start = std::strtoull(range.c_str(), &end, 16);  // no exception on a malformed line
    if (end == range.c_str()) continue;
    if (!lowest || start < *lowest) lowest = start;
  }
  return lowest;
}

std::optional<uint64_t> MappedFileOffset(int pid, const std::string& path, uint64_t addr,
                                         const std::string& proc_root) {
  struct stat st;
  if (StatInRoot(path, &st) != 0) return std::nullopt;
  std::ifstream maps(proc_root + "/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(maps, line)) {
    for (const MapsEntry& m : ParseMaps(line)) {
      if (m.inode != st.st_ino || addr < m.start || addr >= m.end) continue;
      return m.offset + (addr - m.start);
    }
  }
  return std::nullopt;
}


}  // namespace rvbpfd
