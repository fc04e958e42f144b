// The files of rvbpfd's per-binary caches (the probe sites, the stack layout), under a directory only root writes
// (--cache-dir, /var/cache/rvbpfd/sites by default). A cache may outlive its binaries, be edited or be cut short by a
// crash, so its readers trust nothing in it; these two functions only make reading bounded and writing atomic.
#ifndef RVBPFD_SRC_COMMON_CACHE_FILE_H_
#define RVBPFD_SRC_COMMON_CACHE_FILE_H_

#include <cstdint>
#include <optional>
#include <string>

namespace rvbpfd {

// The text of `path` if it is a regular file of at most max_bytes (never blocks on a FIFO or device, never follows
// the file past that size); nullopt otherwise, or when it cannot be read.
std::optional<std::string> ReadCacheFile(const std::string& path, uint64_t max_bytes);

// Writes `text` to `path` atomically, best effort: a temporary file created O_EXCL|O_NOFOLLOW next to it (a planted
// symlink or a leftover is never followed or reused), mode 0644, renamed into place; the temporary is removed on
// every failure. `cache_dir` (path's directory) is created first when missing. A cache that cannot be written only
// costs the next run the computation, so failures are not reported.
void WriteCacheFile(const std::string& cache_dir, const std::string& path, const std::string& text);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_CACHE_FILE_H_
