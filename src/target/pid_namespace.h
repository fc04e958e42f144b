// A target's pid namespace, as BPF needs it: a process in a pid namespace of its own (a container) writes into its
// memory the tids it sees there (rb_native_thread.tid), while BPF numbers threads by host tids. BPF then asks the
// kernel for the current thread's tid in that namespace (rv_pidns in the target_pids map) and translates the tids
// the VM names (the ns_tids map, seeded here with the threads that exist when the process is added).
#ifndef RVBPFD_SRC_TARGET_PID_NAMESPACE_H_
#define RVBPFD_SRC_TARGET_PID_NAMESPACE_H_

#include <cstdint>
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

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_TARGET_PID_NAMESPACE_H_
