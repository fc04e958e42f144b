// Handing the release of a process's open files to a child process, for a daemon about to exit.
//
// Closing the last descriptor of a multi-uprobe link makes the kernel wait for an RCU tasks-trace grace period in the
// closing process (40-100 ms measured on our VMs, two links released side by side), and a process's exit closes its
// descriptors the same way: the wait is on the daemon's exit path even when nothing can hit the probes any more.
// HandOffFileRelease forks a child that shares every open file; the child closes its standard streams at once (so
// whoever reads the daemon's output sees EOF when the daemon exits), waits until the caller's process has exited,
// then closes the rest (the kernel's release runs there) and exits. The caller's own closes only drop references.
//
// Only for a process that exits soon after (the files stay open until it does), and only for files whose late
// release harms nothing (probes of a target that has exited). The child calls only read, close and _exit, which are
// safe after fork in a threaded process. Returns false when the hand-off could not be set up (the caller then
// releases its files itself, as usual).
#ifndef RVBPFD_SRC_COMMON_RELEASE_IN_CHILD_H_
#define RVBPFD_SRC_COMMON_RELEASE_IN_CHILD_H_

namespace rvbpfd {

bool HandOffFileRelease();

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_RELEASE_IN_CHILD_H_
