// `rvbpfd dump --pid PID [--json]`: every Ruby thread of a live process, read from its memory without stopping it
// (process_vm_readv; no BPF). Needs ptrace access to the target: root, or CAP_SYS_PTRACE for another user's process
// (the same user's process only where kernel.yama.ptrace_scope allows it). docs/dump.md has the output.
#ifndef RVBPFD_SRC_DUMP_DUMP_COMMAND_H_
#define RVBPFD_SRC_DUMP_DUMP_COMMAND_H_

#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "common/error.h"
#include "dump/dump_layout.h"
#include "dump/dump_reader.h"
#include "session/vm_binary.h"
#include "stacks/memory_reader.h"
#include "target/target.h"

namespace rvbpfd {

struct DumpOptions {
  int pid = 0;
  std::string core;     // --core: dump this core file instead of a live process (dump/dump_core.h)
  std::string exe;      // --exe: the core's executable as a file on this host (default: the path the core names)
  std::string libruby;  // --libruby: the core's libruby as a file on this host (default: the path the core names)
  bool json = false;
  std::string cache_dir;  // the stack-layout cache (stacks/offsets_cache.h); "" none
};

// Dumps process options.pid (or core file options.core: RunDumpCore) to `out`. Errors (one line, common/error.h): kNoSuchProcess, kNotRuby,
// kUnsupportedVersion (no thread-list layout for this version without DWARF), kNoSymbols (the VM's memory does not
// match its binary's layout), kNoPrivilege (no ptrace access: CAP_SYS_PTRACE), kIo.
Status RunDump(const DumpOptions& options, std::ostream& out, const ProcFs& procfs = ProcFs());

// The descriptor a thread blocked in a system call waits on, from /proc/PID/task/TID/syscall text ("NR ARG0 ..."):
// the first argument of read/write-like calls (read, write, readv, writev, pread64, pwrite64, recvfrom, sendto,
// recvmsg, sendmsg, accept, accept4, connect, epoll_wait, epoll_pwait), and for poll/ppoll the fd of the first struct
// pollfd, read through `mem`. nullopt for other calls, "running", or text that does not parse.
std::optional<int> BlockedFd(std::string_view syscall_text, MemoryReader& mem);

// BlockedFd of a system call given by number and its first two arguments (has_second: the second one is known).
std::optional<int> BlockedFdOfCall(uint64_t nr, const uint64_t args[2], bool has_second, MemoryReader& mem);

// The VM binary of a dump's target (a live process or a core): where it is, its version and where it was loaded.
struct DumpVmIdentity {
  std::string path;  // for messages
  std::string ruby_version;
  int major = 0, minor = 0;
  uint64_t load_start = 0;  // the lowest address the target mapped the binary at
};
// What reading the threads of that VM needs: its stack layout, the dump layout, where the VM is, and the runtime
// address of ruby_global_symbols (0: unknown).
struct DumpVm {
  StackSetup setup;
  DumpLayout layout;
  VmRoots roots;
  uint64_t global_symbols = 0;
};
// Errors: those of PrepareStacks / DumpLayoutForBinary; kNoSymbols when the VM cannot be found in the binary.
Result<DumpVm> PrepareDumpVm(ElfFile& vm, const DumpVmIdentity& id, const std::string& cache_dir);
// Every thread of the VM through `mem` (a live process's or a core's memory), stacks walked and symbolized.
Result<DumpSnapshot> ReadDumpThreads(const DumpVm& vm, MemoryReader& mem);
// The snapshot as text or one JSON object (docs/dump.md).
void WriteDump(const DumpSnapshot& snap, bool json, std::ostream& out);

// The state letter of /proc/PID/task/TID/stat text (after the last ')'); 0 when it does not parse.
char TaskStateLetter(std::string_view stat_text);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_DUMP_DUMP_COMMAND_H_
