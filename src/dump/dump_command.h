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
#include "dump/dump_reader.h"
#include "stacks/memory_reader.h"
#include "target/target.h"

namespace rvbpfd {

struct DumpOptions {
  int pid = 0;
  bool json = false;
  std::string cache_dir;  // the stack-layout cache (stacks/offsets_cache.h); "" none
};

// Dumps process options.pid to `out`. Errors (one line, common/error.h): kNoSuchProcess, kNotRuby,
// kUnsupportedVersion (no thread-list layout for this version without DWARF), kNoSymbols (the VM's memory does not
// match its binary's layout), kNoPrivilege (no ptrace access: CAP_SYS_PTRACE), kIo.
Status RunDump(const DumpOptions& options, std::ostream& out, const ProcFs& procfs = ProcFs());

// The descriptor a thread blocked in a system call waits on, from /proc/PID/task/TID/syscall text ("NR ARG0 ..."):
// the first argument of read/write-like calls (read, write, readv, writev, pread64, pwrite64, recvfrom, sendto,
// recvmsg, sendmsg, accept, accept4, connect, epoll_wait, epoll_pwait), and for poll/ppoll the fd of the first struct
// pollfd, read through `mem`. nullopt for other calls, "running", or text that does not parse.
std::optional<int> BlockedFd(std::string_view syscall_text, MemoryReader& mem);

// The state letter of /proc/PID/task/TID/stat text (after the last ')'); 0 when it does not parse.
char TaskStateLetter(std::string_view stat_text);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_DUMP_DUMP_COMMAND_H_
