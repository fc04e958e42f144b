// The files of rvbpfd's per-binary caches (the probe sites, the stack layout, the file-identity hashes, the kernel
// layout), under --cache-dir (/var/cache/rvbpfd/sites by default). A cache may outlive its binaries, be edited or be
// cut short by a crash, so its readers check every field; and since an entry says where root puts probes into other
// users' processes, an entry is used only when nobody but root (or the user rvbpfd runs as) could have written it.
//
// Trust, StrictModes style (as OpenSSH judges ~/.ssh): the cache directory must be a directory owned by root or by
// rvbpfd's effective uid and not writable by group or others; so must every directory above it up to / (each reached
// from the one below through "..", so the chain checked is the directory's own, whatever symlinks the path went
// through), except that a directory above may be world-writable when it is sticky and owned by root (/tmp: nobody
// else can rename or remove what is ours in it). An entry must be a regular file (opened O_NOFOLLOW, judged by fstat
// of that descriptor) with the same owner and mode rules. What is not trusted is never read or written:
//   - ReadCacheFile and WriteCacheFile treat it as no cache (the analysis runs as if the cache were empty; the result
//     is correct, only slower) and report it once per path through the warning sink;
//   - the command line checks an explicitly given --cache-dir up front (CheckCacheDir) and refuses to start with
//     kUntrustedPath naming the path and what is wrong, since the operator asked for that directory.
#ifndef RVBPFD_SRC_COMMON_CACHE_FILE_H_
#define RVBPFD_SRC_COMMON_CACHE_FILE_H_

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/error.h"

namespace rvbpfd {

// What a stat result is to the cache: the directory itself, a directory above it, or an entry.
enum class CachePathRole { kDirectory, kAncestor, kEntry };

// Why a file with stat `st` in `role` is not trusted by a process of effective uid `euid` ("owned by uid 1000, not
// root or uid 0", "writable by group or others (mode 0777)", "is a symlink, not a regular file"); nullopt when it is.
std::optional<std::string> CacheStatProblem(const struct stat& st, uid_t euid, CachePathRole role);

// Checks the directory `dir` and every directory above it (see the header comment). A `dir` that does not exist yet
// is judged by its parent chain (WriteCacheFile creates it, mode 0755, owned by rvbpfd's user). Errors:
// kUntrustedPath naming the path and what is wrong; kIo when a directory cannot be opened for another reason than
// not existing.
Status CheckCacheDir(const std::string& dir, uid_t euid = geteuid());

// The text of `path` if it is a trusted (see above) regular file of at most max_bytes in a trusted directory (never
// blocks on a FIFO or device, never follows a symlink at the name, never reads past that size); nullopt otherwise,
// or when it cannot be read. An untrusted directory or entry is reported once to the warning sink.
std::optional<std::string> ReadCacheFile(const std::string& path, uint64_t max_bytes);

// Writes `text` to `path` atomically, best effort: a temporary file created O_EXCL|O_NOFOLLOW next to it (a planted
// symlink or a leftover is never followed or reused), mode 0644, renamed into place; the temporary is removed on
// every failure. `cache_dir` (path's directory) is created first when missing; nothing is written into a directory
// that is not trusted. A cache that cannot be written only costs the next run the computation, so failures are not
// reported.
void WriteCacheFile(const std::string& cache_dir, const std::string& path, const std::string& text);

// Where the warnings about untrusted cache paths go (one line each, once per path and process): stderr as
// "rvbpfd: warning: <line>" by default; the agent routes them to its log. Not thread-safe against concurrent calls of
// itself; the sink is called under a lock.
void SetCacheWarningSink(std::function<void(const std::string&)> sink);

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_CACHE_FILE_H_
