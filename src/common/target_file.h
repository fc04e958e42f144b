// The one way rvbpfd opens a file a target process controls (its binaries through /proc/PID/root, /proc/PID/exe,
// /proc/PID/map_files/..., a trace file a user hands to `inspect`).
//
// Such a file may be a FIFO (open(2) would block forever), a device (/dev/zero reads without end), a directory, a
// symlink that leads out of the target's root (an absolute link under /proc/PID/root resolves against the daemon's
// root), or a sparse file whose size claims gigabytes. So every open here:
//   - never blocks: nothing is opened for reading before fstat said S_ISREG, and that open has O_NONBLOCK;
//   - resolves a path under "<...>/<pid>/root/<rest>" inside that root (openat2 RESOLVE_IN_ROOT on an O_PATH fd of
//     the root directory, with RESOLVE_NO_MAGICLINKS so /proc/self/... links inside it cannot lead out either);
//   - opens other paths as written: /proc/PID/exe and /proc/PID/map_files/RANGE are magic links the kernel resolves
//     to the mapped file itself, and a path the operator typed (`sites --binary`, `inspect FILE`) may be a symlink
//     they mean;
//   - opens O_PATH first and fstats it, so a FIFO never waits for a writer and a device driver is never called; only
//     a regular file is then reopened for reading (through /proc/self/fd/N: the same inode, no second path walk).
// MappedFile::Map then gives the content as memory bounded in size (read-only unless asked), in which holes of a sparse file cost no
// memory: data is read into an anonymous MAP_NORESERVE mapping page by page and all-zero pages are never written, so
// they stay unbacked. A copy rather than a mapping of the file itself, because a target that truncates its file while
// we parse a MAP_SHARED/MAP_PRIVATE file mapping would SIGBUS the daemon.
#ifndef RVBPFD_SRC_COMMON_TARGET_FILE_H_
#define RVBPFD_SRC_COMMON_TARGET_FILE_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace rvbpfd {

// Owns one file descriptor.
class FileFd {
 public:
  FileFd() = default;
  explicit FileFd(int fd) : fd_(fd) {}
  FileFd(FileFd&& o) noexcept : fd_(o.Release()) {}
  FileFd& operator=(FileFd&& o) noexcept;
  FileFd(const FileFd&) = delete;
  FileFd& operator=(const FileFd&) = delete;
  ~FileFd() { Reset(); }
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// Where the root-relative part of a path starts: for "<prefix>/<digits>/root/<rest>" (a /proc/PID/root path, or a
// test's fake tree of the same shape) root_dir is "<prefix>/<digits>/root" and inside is "/<rest>"; otherwise
// root_dir is empty.
struct TargetPath {
  std::string root_dir;
  std::string inside;
};
TargetPath SplitTargetPath(const std::string& path);

// Opens `path` O_RDONLY for reading its content, following the rules above; the fd is known to be a regular file.
// Errors: kIo naming the path and the step ("is a FIFO", "is a directory", "leads outside the process's root", an
// errno); kNoPrivilege for EACCES/EPERM. `what` names the file in messages ("ELF file", "trace file").
Result<FileFd> OpenRegularFile(const std::string& path, std::string_view what);

// Opens `path` O_PATH (no read, nothing executed) with the same root-confined resolution, for stat and for handing the
// kernel /proc/self/fd/N (uprobe attach). Any file type is accepted; the caller fstats.
Result<FileFd> OpenPathInRoot(const std::string& path);

// The readable descriptor of the file an O_PATH `handle` (OpenPathInRoot's) refers to, after checking it is a regular
// file: no second path walk, so it is the very inode the handle names. `path` and `what` name it in messages; errors
// as OpenRegularFile's.
Result<FileFd> ReopenRegularFile(const FileFd& handle, const std::string& path, std::string_view what);

// stat of a target's file without following it out of its root (OpenPathInRoot + fstat). Returns errno (0: ok).
int StatInRoot(const std::string& path, struct stat* st);

struct MapOptions {
  bool allow_empty = false;  // an empty file is an error unless set
  // The copy stays writable: libelf and libdw decompress and relocate sections in place in the image they are given.
  // It is our private anonymous memory, so writes never reach the file.
  bool writable = false;
  // File byte ranges [first, second) not copied now but by MappedFile::LoadDeferred, when something needs them (an
  // ELF file's debug sections: ~80% of an unstripped VM binary, read only when no cache has what they give). Only the
  // whole pages inside a range are deferred; the copy reads as zeros there until loaded.
  std::vector<std::pair<uint64_t, uint64_t>> deferred;
};

// What fstat said of a file when it was opened, and when. The kernel sets st_ctime on every change of a file's content
// or metadata and no user can set it back, so (dev, ino, size, mtime, ctime) names one content of one file, as long as
// the change came after a clock tick past the recorded ctime (see Settled).
struct FileIdentity {
  uint64_t dev = 0, ino = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;  // st_mtim, st_ctim: ns since the epoch
  int64_t stat_realtime_ns = 0;        // CLOCK_REALTIME right after the fstat
  bool operator==(const FileIdentity& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns;
  }
  // True when the file had not changed for `settle_ns` before the fstat: a change made after it (while or after the
  // file was read) then gets a later ctime, even from a file system that keeps timestamps at a coarse granularity, so
  // a cache keyed by this identity never pairs it with content read mid-change.
  bool Settled(int64_t settle_ns) const {
    return mtime_ns + settle_ns <= stat_realtime_ns && ctime_ns + settle_ns <= stat_realtime_ns;
  }
};

// A size-bounded copy of a regular file's content (see the header comment), read-only unless asked. Move-only.
class MappedFile {
 public:
  using Options = MapOptions;
  // Maps at most max_bytes; a larger file is an error ("larger than N bytes").
  static Result<MappedFile> Map(const std::string& path, std::string_view what, uint64_t max_bytes,
                                Options options = {});
  // Same, from an fd already known to be a regular file (OpenRegularFile).
  static Result<MappedFile> FromFd(int fd, const std::string& path, std::string_view what, uint64_t max_bytes,
                                   Options options = {});

  MappedFile() = default;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return static_cast<const uint8_t*>(base_); }
  uint64_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data(), static_cast<size_t>(size_)}; }
  // Pages of the file that held data and were copied (the rest are holes or zeros and cost no memory), for tests.
  uint64_t copied_bytes() const { return copied_; }
  // The byte ranges [begin, end) of the copy that were written (sorted, disjoint); every other byte is zero. The rest
  // is untouched anonymous memory that readers should skip: some kernels give such a page real memory when it is
  // read (SparseContentSha256Hex takes these ranges). Deferred ranges join once loaded.
  const std::vector<std::pair<uint64_t, uint64_t>>& written_ranges() const { return written_; }
  // The file as its fstat described it before anything was read, for caches keyed by file identity.
  const FileIdentity& identity() const { return identity_; }
  // Copies the deferred ranges (MapOptions::deferred) from the file, once; later calls return the first call's
  // result. Fails (kIo) when the file is no longer what was copied (another identity: written, truncated or replaced
  // since) or cannot be read to its size; the ranges then stay zeros. Not thread-safe.
  Status LoadDeferred();
  bool has_deferred() const { return !deferred_.empty(); }

 private:
  void Reset();
  void* base_ = nullptr;
  uint64_t size_ = 0;
  uint64_t mapped_ = 0;  // length of the mapping (size_ rounded up to pages; 0 when nothing is mapped)
  uint64_t copied_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> written_;  // see written_ranges()
  FileIdentity identity_;
  bool writable_ = false;
  std::string name_;                                     // for messages ("ELF file /path")
  FileFd deferred_fd_;                                   // the file, held while ranges are deferred
  std::vector<std::pair<uint64_t, uint64_t>> deferred_;  // page-aligned, sorted, disjoint, within size_
  std::optional<Error> deferred_error_;                  // LoadDeferred's failure, kept for later calls
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_COMMON_TARGET_FILE_H_
