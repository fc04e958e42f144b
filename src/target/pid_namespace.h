// A target's pid namespace, as BPF needs it: a process in a pid namespace of its own (a container) writes into its
// memory the tids it sees there (rb_native_thread.tid), while BPF numbers threads by host tids. BPF then asks the
// kernel for the current thread's tid in that namespace (rv_pidns in the target_pids map) and translates the tids
// the VM names (the ns_tids map, seeded here with the threads that exist when the process is added).
#ifndef RVBPFD_SRC_TARGET_PID_NAMESPACE_H_
#define RVBPFD_SRC_TARGET_PID_NAMESPACE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "rvbpfd/abi.h"
#include "target/target.h"

namespace rvbpfd {

struct TargetPidNamespace {
  // Zero when the target shares rvbpfd's pid namespace (whose pids rvbpfd hands BPF as host tgids).
  rv_pidns ns{};
  // Namespaced targets only: their threads when this was read, as (namespace tid, host tid) pairs (at most
  // kMaxNamespaceThreads), which is what BpfSession::AddPid takes.
  std::vector<std::pair<uint32_t, uint32_t>> threads;
  bool own_namespace() const { return ns.ino != 0; }
};

// Threads listed per target; the BPF ns_tids map holds 65,536 entries over all targets.
inline constexpr size_t kMaxNamespaceThreads = 16384;

// Compares <proc>/PID/ns/pid with <proc>/self/ns/pid (fstat of each: device and inode) and, when they differ, lists
// <proc>/PID/task/*/status NSpid lines (ParseNsPid). Errors: kNoSuchProcess (the process is gone), kNoPrivilege (EACCES/EPERM),
// kIo; a thread that exits while the list is read is left out.
Result<TargetPidNamespace> ReadPidNamespace(int pid, const ProcFs& procfs);

// One thread's tid in its process's innermost pid namespace: ParseNsPid of <proc>/PID/task/TID/status (read up to
// 16 KiB, the line anywhere in that part). nullopt when the thread is gone, the file holds no parsable NSpid line, or
// it is not readable. `tid` is the host tid.
std::optional<uint32_t> ReadTaskNsTid(const ProcFs& procfs, int pid, int tid);

// The most bytes of a native thread name rvbpfd keeps (the kernel's are 15: TASK_COMM_LEN - 1).
inline constexpr size_t kMaxTaskCommBytes = 64;
// A native thread's name from the text of <proc>/PID/task/TID/comm: the text up to its first newline, cut to
// kMaxTaskCommBytes; nullopt when empty.
std::optional<std::string> ParseTaskComm(std::string_view text);
// ParseTaskComm of <proc>/PID/task/TID/comm (read up to kMaxTaskCommBytes + 1 bytes); nullopt when unreadable.
std::optional<std::string> ReadTaskComm(const ProcFs& procfs, int pid, int tid);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TARGET_PID_NAMESPACE_H_
