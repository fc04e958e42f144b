// Bounded reads of small files (/proc entries, the agent's config file) for src/ops.
//
// /proc/PID/* files of other processes are read as root from files a hostile process influences (its environ, its
// cgroup path), so every read has a byte cap and reports the errno of the step that failed.
#ifndef RVBPFD_SRC_OPS_FILE_READ_H_
#define RVBPFD_SRC_OPS_FILE_READ_H_

#include <cstddef>
#include <string>

namespace rvbpfd {

struct SmallFile {
  std::string data;        // at most max_bytes bytes
  bool truncated = false;  // the file had more than max_bytes bytes
  int err = 0;             // errno of open/read when the read failed (data is then empty), 0 on success
};

// Reads at most `max_bytes` bytes of `path` (open O_RDONLY|O_CLOEXEC, read until EOF or the cap; EINTR retried).
// Never throws; a failure is reported in `err`.
SmallFile ReadSmallFile(const std::string& path, size_t max_bytes);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_OPS_FILE_READ_H_
