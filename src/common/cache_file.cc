#include "common/cache_file.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <utility>

#include "common/target_file.h"

namespace rvbpfd {
namespace {

// Deeper chains are refused (a real cache directory is a few levels below /).
constexpr int kMaxDepth = 64;

struct WarningState {
  std::mutex mu;
  std::set<std::string> warned;  // paths already reported
  std::function<void(const std::string&)> sink;
};

WarningState& Warnings() {
  static WarningState* state = new WarningState();  // never destroyed: helper threads may warn during exit
  return *state;
}

void WarnOnce(const std::string& path, const std::string& line) {
  WarningState& w = Warnings();
  std::lock_guard<std::mutex> lock(w.mu);
  if (!w.warned.insert(path).second) return;
  if (w.sink) {
    w.sink(line);
  } else {
    std::fprintf(stderr, "rvbpfd: warning: %s\n", line.c_str());
  }
}

std::string ModeText(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string ParentName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The name messages use for `dir`: its canonical path when it resolves, else as given.
std::string DisplayName(const std::string& dir) {
  char buf[PATH_MAX];
  if (realpath(dir.c_str(), buf) != nullptr) return buf;
  return dir;
}

// The one-line error for `problem` of directory `name` (the cache directory `cache` itself, or one above it).
Error Untrusted(const std::string& name, const std::string& cache, const std::string& problem) {
  if (name == cache) {
    return Error(ErrorCode::kUntrustedPath, "cache directory " + cache + " " + problem +
                                                "; use a directory only root writes (chown root, chmod go-w)");
  }
  return Error(ErrorCode::kUntrustedPath, "directory " + name + " above cache directory " + cache + " " + problem +
                                              "; use a --cache-dir whose parents only root writes");
}

// Checks the directory open at `fd` (O_PATH, named `name`; `role` kDirectory when it is the cache directory `cache`
// itself, kAncestor when it is one above it) and every directory above it.
Status CheckChain(FileFd fd, const std::string& name, const std::string& cache, CachePathRole role, uid_t euid) {
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Error(ErrorCode::kIo, ErrnoMessage("fstat of directory " + name, errno));
  if (std::optional<std::string> p = CacheStatProblem(st, euid, role)) return Untrusted(name, cache, *p);
  std::string cur = name;
  for (int depth = 0; depth < kMaxDepth; ++depth) {
    FileFd parent(openat(fd.get(), "..", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!parent.ok()) return Error(ErrorCode::kIo, ErrnoMessage("opening the directory above " + cur, errno));
    struct stat pst;
    if (fstat(parent.get(), &pst) != 0) {
      return Error(ErrorCode::kIo, ErrnoMessage("fstat of the directory above " + cur, errno));
    }
    if (pst.st_dev == st.st_dev && pst.st_ino == st.st_ino) return Status::Ok();  // "/" is its own parent
    cur = ParentName(cur);
    if (std::optional<std::string> p = CacheStatProblem(pst, euid, CachePathRole::kAncestor)) {
      return Untrusted(cur, cache, *p);
    }
    fd = std::move(parent);
    st = pst;
  }
  return Error(ErrorCode::kUntrustedPath,
               "cache directory " + cache + " is more than " + std::to_string(kMaxDepth) + " directories below /");
}

// An O_PATH descriptor of the trusted directory `dir`; an Error when it is not trusted or cannot be opened (*missing
// set when it does not exist).
Result<FileFd> OpenTrustedDir(const std::string& dir, uid_t euid, bool* missing) {
  *missing = false;
  FileFd fd(open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd.ok()) {
    *missing = errno == ENOENT;
    return Error(ErrorCode::kIo, ErrnoMessage("opening cache directory " + dir, errno));
  }
  // The walk consumes a duplicate: the caller gets the very directory that was judged, not a second path walk.
  FileFd walk(fcntl(fd.get(), F_DUPFD_CLOEXEC, 0));
  if (!walk.ok()) return Error(ErrorCode::kIo, ErrnoMessage("duplicating the descriptor of " + dir, errno));
  const std::string name = DisplayName(dir);
  Status st = CheckChain(std::move(walk), name, name, CachePathRole::kDirectory, euid);
  if (!st) return st.error();
  return fd;
}

}  // namespace

std::optional<std::string> CacheStatProblem(const struct stat& st, uid_t euid, CachePathRole role) {
  const bool want_dir = role != CachePathRole::kEntry;
  if (want_dir && !S_ISDIR(st.st_mode)) return std::string("is not a directory");
  if (!want_dir && !S_ISREG(st.st_mode)) {
    return std::string(S_ISLNK(st.st_mode) ? "is a symlink, not a regular file" : "is not a regular file");
  }
  if (st.st_uid != 0 && st.st_uid != euid) {
    return "is owned by uid " + std::to_string(st.st_uid) + ", not by root or uid " + std::to_string(euid);
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    // /tmp: others may add names there but not move or remove ours.
    const bool sticky_root_parent = role == CachePathRole::kAncestor && (st.st_mode & S_ISVTX) != 0 && st.st_uid == 0;
    if (!sticky_root_parent) return "is writable by group or others (mode " + ModeText(st.st_mode) + ")";
  }
  return std::nullopt;
}

Status CheckCacheDir(const std::string& dir, uid_t euid) {
  bool missing = false;
  Result<FileFd> fd = OpenTrustedDir(dir, euid, &missing);
  if (fd) return Status::Ok();
  if (!missing) return fd.error();
  // Not created yet: WriteCacheFile will make it in its parent, which must be trusted as a directory above it.
  const std::string parent = ParentName(dir);
  FileFd pfd(open(parent.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!pfd.ok()) return Status::Ok();  // no parent either: nothing will ever be cached there
  return CheckChain(std::move(pfd), DisplayName(parent), dir, CachePathRole::kAncestor, euid);
}

std::optional<std::string> ReadCacheFile(const std::string& path, uint64_t max_bytes) {
  const std::string dir = ParentName(path);
  const uid_t euid = geteuid();
  bool missing = false;
  Result<FileFd> dfd = OpenTrustedDir(dir, euid, &missing);
  if (!dfd) {
    if (dfd.error().code() == ErrorCode::kUntrustedPath) {
      WarnOnce(dir, dfd.error().message() + "; not using the cache there");
    }
    return std::nullopt;
  }
  FileFd handle(openat(dfd->get(), BaseName(path).c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!handle.ok()) return std::nullopt;
  struct stat st;
  if (fstat(handle.get(), &st) != 0) return std::nullopt;
  if (std::optional<std::string> p = CacheStatProblem(st, euid, CachePathRole::kEntry)) {
    WarnOnce(path, "cache entry " + path + " " + *p + "; ignored (computed afresh)");
    return std::nullopt;
  }
  Result<FileFd> fd = ReopenRegularFile(handle, path, "cache file");
  if (!fd) return std::nullopt;
  Result<MappedFile> m = MappedFile::FromFd(fd->get(), path, "cache file", max_bytes);
  if (!m) return std::nullopt;
  return std::string(reinterpret_cast<const char*>(m->data()), m->size());
}

void WriteCacheFile(const std::string& cache_dir, const std::string& path, const std::string& text) {
  mkdir(cache_dir.c_str(), 0755);
  const std::string dir = ParentName(path);
  bool missing = false;
  Result<FileFd> dfd = OpenTrustedDir(dir, geteuid(), &missing);
  if (!dfd) {
    if (dfd.error().code() == ErrorCode::kUntrustedPath) {
      WarnOnce(dir, dfd.error().message() + "; not using the cache there");
    }
    return;
  }
  const std::string name = BaseName(path);
  const std::string tmp = name + ".tmp." + std::to_string(getpid());
  const int fd = openat(dfd->get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return;
  size_t done = 0;
  bool ok = true;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = false;
      break;
    }
    done += static_cast<size_t>(n);
  }
  // fchmod: the umask may have taken bits of 0644 away, never added any; the mode is what readers require.
  ok = fchmod(fd, 0644) == 0 && ok;
  ok = close(fd) == 0 && ok;
  if (!ok || renameat(dfd->get(), tmp.c_str(), dfd->get(), name.c_str()) != 0) {
    unlinkat(dfd->get(), tmp.c_str(), 0);
  }
}

void SetCacheWarningSink(std::function<void(const std::string&)> sink) {
  WarningState& w = Warnings();
  std::lock_guard<std::mutex> lock(w.mu);
  w.sink = std::move(sink);
}

}  // namespace rvbpfd
