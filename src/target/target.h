// Target discovery: from a pid, find the ELF that holds the CRuby VM and read its identity (build-id, version).
//
// Everything is read through an injectable /proc root so that tests can use a fake tree, and the VM binary is opened
// through /proc/PID/root/<path> so that processes in other mount namespaces (containers) resolve to their own files.
#ifndef RVBPFD_SRC_TARGET_TARGET_H_
#define RVBPFD_SRC_TARGET_TARGET_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/target_file.h"
#include "elf/elf_file.h"

namespace rvbpfd {

// A /proc root ("/proc" by default). File access goes through OpenFile so tests can inject errors (EACCES) that a
// root-run test could not provoke with permissions.
class ProcFs {
 public:
  explicit ProcFs(std::string root = "/proc") : root_(std::move(root)) {}
  virtual ~ProcFs() = default;
  const std::string& root() const { return root_; }
  // "<root>/<pid>/<rel>" (rel without a leading slash; empty rel gives the pid directory).
  std::string PidPath(int pid, std::string_view rel) const;
  // open(2) of an absolute path; returns an fd or -1 with errno set.
  virtual int OpenFile(const std::string& path, int flags) const;

 private:
  std::string root_;
};

struct MapsEntry {
  uint64_t start = 0;
  uint64_t end = 0;
  std::string perms;    // "r-xp"
  uint64_t offset = 0;  // file offset of the mapping
  uint64_t inode = 0;
  std::string path;     // as the target sees it; " (deleted)" stripped (see deleted)
  bool deleted = false;
};

// Parses /proc/PID/maps text; malformed lines are skipped. Paths may contain spaces.
std::vector<MapsEntry> ParseMaps(std::string_view text);

// Lowest start address of the mappings of the file at `path` (matched by inode, so a /proc/PID/root/... host path and
// the target's own view of the file agree) in <proc_root>/PID/maps; nullopt when it is not mapped (yet).
std::optional<uint64_t> LowestMappingOf(int pid, const std::string& path, const std::string& proc_root = "/proc");
// The file offset that address `addr` maps of the file at `path` (matched by inode, as LowestMappingOf) in
// <proc_root>/PID/maps; nullopt when no mapping of that file holds it. While ld.so loads a library it first reserves
// the whole span with one mapping of the file from offset 0 and then maps each segment over it at its own offset: a
// data address reads the wrong bytes of the file until then, which this tells apart.
std::optional<uint64_t> MappedFileOffset(int pid, const std::string& path, uint64_t addr,
                                         const std::string& proc_root = "/proc");

struct RubyTarget {
  int pid = 0;
  std::string vm_path;        // path as the target sees it (from maps)
  std::string vm_host_path;   // path the daemon opens (/proc/PID/root/... or /proc/PID/map_files/...)
  bool vm_is_shared_library = false;
  std::string build_id;       // hex, empty when the binary has none
  std::string ruby_version;   // "3.3.8", from the exported `ruby_version` string in the ELF
  int major = 0, minor = 0, teeny = 0;
  std::string comm;           // /proc/PID/comm
  // The pid as the target sees it in its own pid namespace (the last NSpid of /proc/PID/status): the main thread's
  // tid the VM itself recorded. Equals pid outside a container, and when the kernel reports no NSpid.
  int ns_pid = 0;
  uint64_t vm_load_start = 0;  // lowest mapping address of the VM file (for reports; uprobes use file offsets)
  // The VM binary as parsed here, through vm_fd: callers analyse, read and probe this one file and never reopen
  // vm_host_path (which the target may have swapped since).
  std::shared_ptr<ElfFile> vm_elf;
  // O_PATH descriptor of the file vm_elf parsed, opened inside the target's root (an absolute symlink there never
  // names a host file); vm_fd_path() names it for uprobes and readers.
  std::shared_ptr<const FileFd> vm_fd;

  std::string vm_fd_path() const { return vm_fd ? "/proc/self/fd/" + std::to_string(vm_fd->get()) : vm_host_path; }
};

// Whether a file's base name is a libruby's: libruby.so, libruby.so.3.3, libruby.so.3.3.8, libruby-3.1.so.3.1.
bool IsLibrubyName(std::string_view base);

// The VM's version string ("3.3.8") from the exported `ruby_version` array of a VM binary (the executable of a
// static ruby or libruby.so); nullopt when the binary defines none or it is not a short NUL-terminated string.
// The one place rvbpfd reads it: discovery, launch mode and `rvbpfd sites --binary` all call this.
std::optional<std::string> ReadRubyVersion(const ElfFile& vm);

// The last field of the "NSpid:" line of /proc/PID/status text (the pid in the innermost pid namespace); nullopt
// when there is none or it does not parse.
std::optional<int> ParseNsPid(std::string_view status_text);
// The pid as the process sees it in its own pid namespace (RubyTarget::ns_pid): ParseNsPid of <root>/PID/status, or
// `pid` when the kernel reports no NSpid (or the file is unreadable).
int ReadNsPid(const ProcFs& procfs, int pid);

// Whether /proc/PID/stat text says the process has ended or is ending: state Z (zombie) or X (dead), or PF_EXITING
// (0x4) in its flags (the ninth field), set as its exit begins: the kernel releases the process's memory (its maps
// read empty) before it turns zombie, while the state still reads R or D. Fields are counted after the last ')'
// since comm may hold spaces and parentheses. False for text that does not parse.
bool StatSaysExiting(std::string_view stat_text);
// Whether process `pid` has ended or is ending: its /proc/PID/stat cannot be read or is empty (no such process), or
// StatSaysExiting.
bool ProcessEnding(const ProcFs& procfs, int pid);

// Errors: kNoSuchProcess, kNotRuby, kUnsupportedVersion (< 3.2), kNoPrivilege (maps/root not readable), kIo.
// Reads files the target controls (its VM binary through /proc/PID/root, which may lie on a FUSE or NFS mount that
// never answers): commands run it bounded (DiscoverTargetBounded), the agent in its inspector (agent/discovery.h).
Result<RubyTarget> DiscoverTarget(int pid, const ProcFs& procfs);

// What discovery of one process may take: it reads the VM binary's headers and allocated sections (a few MB, a
// fraction of a second); more means a file that stalls reads.
inline constexpr std::chrono::milliseconds kDiscoverTimeout{5000};
// DiscoverTarget(pid, /proc) on a helper thread bounded by kDiscoverTimeout, given up at once when `cancel` (a stop
// signal's flag; may be null) is set: then or at the bound, a kIo error naming the pid.
Result<RubyTarget> DiscoverTargetBounded(int pid, const std::atomic<bool>* cancel);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TARGET_TARGET_H_
