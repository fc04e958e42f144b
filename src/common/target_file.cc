#include "common/target_file.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <memory>
#include <string_view>
#include <utility>

#include "common/capabilities.h"

namespace rvbpfd {
namespace {

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Error OpenFailure(const std::string& step, int err) {
  if (err == EACCES || err == EPERM) {
    return Error(ErrorCode::kNoPrivilege,
                 ErrnoMessage(step, err) + "; " + TargetFileAccessHint());
  }
  if (err == ENOSYS) {
    return Error(ErrorCode::kIo, ErrnoMessage(step, err) + "; openat2 needs Linux 5.6 or newer");
  }
  return Error(ErrorCode::kIo, ErrnoMessage(step, err));
}

std::string_view FileTypeName(mode_t mode) {
  switch (mode & S_IFMT) {
    case S_IFIFO: return "a FIFO";
    case S_IFDIR: return "a directory";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symlink";
    default: return "not a regular file";
  }
}

// openat2(2): glibc 2.36+ has no wrapper on every distribution we build on, so the syscall is called directly.
int OpenAt2(int dirfd, const char* path, uint64_t flags, uint64_t resolve) {
  struct open_how how {};
  how.flags = flags;
  how.resolve = resolve;
  for (;;) {
    const long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
    // EAGAIN: the kernel asks for a retry when a rename raced with a RESOLVE_IN_ROOT walk.
    if (fd < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    return static_cast<int>(fd);
  }
}

// Opens path with `flags`, confined to the target's root when the path has one. Returns the fd, or -1 with *err set
// and *failed_path naming what failed.
int OpenConfinedRaw(const std::string& path, int flags, int* err, std::string* failed_path) {
  const TargetPath tp = SplitTargetPath(path);
  *failed_path = path;
  if (tp.root_dir.empty()) {
    const int fd = open(path.c_str(), flags);
    *err = fd < 0 ? errno : 0;
    return fd;
  }
  // The root itself is a /proc magic link to the target's root directory: following it is the point.
  FileFd root(open(tp.root_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root.ok()) {
    *err = errno;
    *failed_path = tp.root_dir;
    return -1;
  }
  const int fd = OpenAt2(root.get(), tp.inside.c_str(), static_cast<uint64_t>(flags),
                         RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
  *err = fd < 0 ? errno : 0;
  return fd;
}

// `what` names the file in messages ("ELF file"; empty: the path alone).
Result<FileFd> OpenConfined(const std::string& path, int flags, std::string_view what = {}) {
  int err = 0;
  std::string failed;
  FileFd fd(OpenConfinedRaw(path, flags, &err, &failed));
  if (!fd.ok()) {
    const std::string step = "opening " + (what.empty() ? std::string() : std::string(what) + " ") + failed;
    if (err == ELOOP && failed == path && !SplitTargetPath(path).root_dir.empty()) {
      return Error(ErrorCode::kIo,
                   ErrnoMessage(step, err) + " (a /proc magic link or a symlink loop inside the process's root)");
    }
    return OpenFailure(step, err);
  }
  return fd;
}

}  // namespace

FileFd& FileFd::operator=(FileFd&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = o.Release();
  }
  return *this;
}

void FileFd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

TargetPath SplitTargetPath(const std::string& path) {
  TargetPath out;
  // The first "/<digits>/root" component pair followed by '/' or the end.
  for (size_t pos = path.find("/root"); pos != std::string::npos; pos = path.find("/root", pos + 1)) {
    const size_t after = pos + 5;
    if (after != path.size() && path[after] != '/') continue;
    const size_t prev = path.rfind('/', pos == 0 ? 0 : pos - 1);
    if (prev == std::string::npos || prev >= pos) continue;
    if (!AllDigits(std::string_view(path).substr(prev + 1, pos - prev - 1))) continue;
    out.root_dir = path.substr(0, after);
    out.inside = after == path.size() ? "/" : path.substr(after);
    return out;
  }
  return out;
}

Result<FileFd> OpenPathInRoot(const std::string& path) {
  return OpenConfined(path, O_PATH | O_CLOEXEC);
}

int StatInRoot(const std::string& path, struct stat* st) {
  int err = 0;
  std::string failed;
  FileFd fd(OpenConfinedRaw(path, O_PATH | O_CLOEXEC, &err, &failed));
  if (!fd.ok()) return err;
  if (fstat(fd.get(), st) != 0) return errno;
  return 0;
}

Result<FileFd> OpenRegularFile(const std::string& path, std::string_view what) {
  // First an O_PATH descriptor: it opens nothing (a FIFO does not wait for a writer, a device driver is not called),
  // and its fstat says what the file is before anything reads it.
  Result<FileFd> handle = OpenConfined(path, O_PATH | O_CLOEXEC, what);
  if (!handle) return handle.error();
  return ReopenRegularFile(*handle, path, what);
}

Result<FileFd> ReopenRegularFile(const FileFd& handle, const std::string& path, std::string_view what) {
  struct stat st;
  if (fstat(handle.get(), &st) != 0) return OpenFailure("fstat of " + std::string(what) + " " + path, errno);
  if (!S_ISREG(st.st_mode)) {
    return Error(ErrorCode::kIo, std::string(what) + " " + path + " is " + std::string(FileTypeName(st.st_mode)) +
                                     ", not a regular file");
  }
  // Then the readable descriptor, reopened from that same inode (no second path walk a rename could redirect).
  // O_NONBLOCK: a regular file never blocks on open, but should the inode change type under us it cannot wait.
  const std::string self = "/proc/self/fd/" + std::to_string(handle.get());
  FileFd fd(open(self.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (!fd.ok()) return OpenFailure("opening " + std::string(what) + " " + path, errno);
  return fd;
}

namespace {

// What fstat said of a file, as its identity; `stat_realtime_ns` is when it said so (0: not needed).
FileIdentity IdentityOf(const struct stat& st, int64_t stat_realtime_ns) {
  return FileIdentity{static_cast<uint64_t>(st.st_dev),
                      static_cast<uint64_t>(st.st_ino),
                      static_cast<uint64_t>(st.st_size),
                      static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec,
                      static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec,
                      stat_realtime_ns};
}

}  // namespace

Result<MappedFile> MappedFile::Map(const std::string& path, std::string_view what, uint64_t max_bytes,
                                   Options options) {
  Result<FileFd> fd = OpenRegularFile(path, what);
  if (!fd) return fd.error();
  return FromFd(fd->get(), path, what, max_bytes, options);
}

Result<MappedFile> MappedFile::FromFd(int fd, const std::string& path, std::string_view what, uint64_t max_bytes,
                                      Options options) {
  const bool allow_empty = options.allow_empty;
  const std::string name = std::string(what) + " " + path;
  struct stat st;
  if (fstat(fd, &st) != 0) return OpenFailure("fstat of " + name, errno);
  if (!S_ISREG(st.st_mode)) {
    return Error(ErrorCode::kIo, name + " is " + std::string(FileTypeName(st.st_mode)) + ", not a regular file");
  }
  if (st.st_size < 0 || static_cast<uint64_t>(st.st_size) > max_bytes) {
    return Error(ErrorCode::kIo, name + " is larger than " + std::to_string(max_bytes) + " bytes (" +
                                     std::to_string(st.st_size) + ")");
  }
  if (st.st_size == 0 && !allow_empty) return Error(ErrorCode::kIo, name + " is empty");
  MappedFile out;
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  out.identity_ = IdentityOf(st, static_cast<int64_t>(now.tv_sec) * 1'000'000'000 + now.tv_nsec);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size == 0) return out;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t mapped = (size + page - 1) / page * page;
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return Error(ErrorCode::kIo, ErrnoMessage("mapping " + std::to_string(size) +
                                                                        " bytes for " + name, errno));
  out.base_ = base;
  out.mapped_ = mapped;
  auto* dst = static_cast<uint8_t*>(base);
  // The deferred ranges, shrunk to the whole pages they cover within the file, sorted and merged.
  std::vector<std::pair<uint64_t, uint64_t>> deferred;
  for (auto [begin, end] : options.deferred) {
    begin = begin > size ? size : (begin + page - 1) / page * page;
    end = std::min(end, size) / page * page;
    if (begin < end) deferred.emplace_back(begin, end);
  }
  std::sort(deferred.begin(), deferred.end());
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& r : deferred) {
    if (!merged.empty() && r.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  size_t next_deferred = 0;  // the first merged range not entirely before the read position

  // Reads the data extents only (SEEK_DATA/SEEK_HOLE; a file system without them reports one extent), through a
  // bounce buffer, and copies the pages that are not all zeros: the anonymous pages of holes and zero runs stay the
  // shared zero page.
  constexpr size_t kChunk = 1u << 20;
  std::unique_ptr<uint8_t[]> buf(new uint8_t[kChunk]);
  uint64_t end_of_data = 0;  // bytes of the file seen so far (less than size when the file shrank while we read)
  uint64_t pos = 0;
  while (pos < size) {
    off_t data = lseek(fd, static_cast<off_t>(pos), SEEK_DATA);
    if (data < 0) {
      if (errno == ENXIO) {  // only a hole (or EOF) from pos on
        end_of_data = size;
        break;
      }
      data = static_cast<off_t>(pos);  // SEEK_DATA unsupported: treat the rest as data
    }
    off_t hole = lseek(fd, data, SEEK_HOLE);
    if (hole < 0 || static_cast<uint64_t>(hole) > size) hole = static_cast<off_t>(size);
    uint64_t at = static_cast<uint64_t>(data);
    const uint64_t extent_end = std::max<uint64_t>(static_cast<uint64_t>(hole), at);
    bool eof = false;
    while (at < extent_end) {
      while (next_deferred < merged.size() && merged[next_deferred].second <= at) ++next_deferred;
      uint64_t limit = extent_end;
      if (next_deferred < merged.size()) {
        const auto [begin, end] = merged[next_deferred];
        if (begin <= at) {  // inside a deferred range: not read now
          at = std::min(end, extent_end);
          continue;
        }
        limit = std::min(limit, begin);
      }
      const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, limit - at));
      const ssize_t n = pread(fd, buf.get(), want, static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        Error e = OpenFailure("reading " + name, errno);
        out.Reset();
        return e;
      }
      if (n == 0) {
        eof = true;
        break;
      }
      for (size_t off = 0; off < static_cast<size_t>(n);) {
        // Copy page-aligned pieces of the destination so a zero page is skipped whole.
        const uint64_t file_off = at + off;
        const size_t piece = static_cast<size_t>(std::min<uint64_t>(page - file_off % page, n - off));
        const uint8_t* p = buf.get() + off;
        const bool zero = p[0] == 0 && (piece == 1 || std::memcmp(p, p + 1, piece - 1) == 0);
        if (!zero) {
          std::memcpy(dst + file_off, p, piece);
          out.copied_ += piece;
          // In file order: extend the last range or start one.
          if (!out.written_.empty() && out.written_.back().second == file_off) {
            out.written_.back().second = file_off + piece;
          } else {
            out.written_.emplace_back(file_off, file_off + piece);
          }
        }
        off += piece;
      }
      at += static_cast<uint64_t>(n);
    }
    end_of_data = at;
    if (eof) break;
    pos = std::max<uint64_t>(extent_end, at);
    if (pos >= size) end_of_data = size;
  }
  if (!options.writable && mprotect(base, mapped, PROT_READ) != 0) {
    Error e(ErrorCode::kIo, ErrnoMessage("mprotect of the copy of " + name, errno));
    out.Reset();
    return e;
  }
  out.size_ = std::min(end_of_data, size);
  if (out.size_ == 0 && !allow_empty) {
    out.Reset();
    return Error(ErrorCode::kIo, name + " is empty");
  }
  out.writable_ = options.writable;
  for (auto& [begin, end] : merged) end = std::min(end, out.size_);
  std::erase_if(merged, [](const auto& r) { return r.first >= r.second; });
  if (!merged.empty()) {
    const int held = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (held < 0) {
      Error e = OpenFailure("duplicating the descriptor of " + name, errno);
      out.Reset();
      return e;
    }
    out.deferred_fd_ = FileFd(held);
    out.deferred_ = std::move(merged);
    out.name_ = name;
  }
  return out;
}

Status MappedFile::LoadDeferred() {
  if (deferred_error_) return *deferred_error_;
  if (deferred_.empty()) return Status::Ok();
  auto fail = [this](Error e) {
    deferred_error_ = e;
    deferred_.clear();
    deferred_fd_.Reset();
    return e;
  };
  struct stat st;
  if (fstat(deferred_fd_.get(), &st) != 0) return fail(OpenFailure("fstat of " + name_, errno));
  if (!(IdentityOf(st, 0) == identity_)) {
    return fail(Error(ErrorCode::kIo, name_ + " changed after it was first read (another size, time or inode)"));
  }
  if (!writable_ && mprotect(base_, mapped_, PROT_READ | PROT_WRITE) != 0) {
    return fail(Error(ErrorCode::kIo, ErrnoMessage("mprotect of the copy of " + name_, errno)));
  }
  auto* dst = static_cast<uint8_t*>(base_);
  std::optional<Error> err;
  for (const auto& [begin, end] : deferred_) {
    for (uint64_t at = begin; at < end && !err;) {
      const ssize_t n = pread(deferred_fd_.get(), dst + at, static_cast<size_t>(end - at), static_cast<off_t>(at));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        err = OpenFailure("reading " + name_, errno);
      } else if (n == 0) {
        err = Error(ErrorCode::kIo, name_ + " is shorter than when it was first read");
      } else {
        at += static_cast<uint64_t>(n);
        copied_ += static_cast<uint64_t>(n);
      }
    }
    if (err) break;
  }
  if (!writable_ && mprotect(base_, mapped_, PROT_READ) != 0 && !err) {
    err = Error(ErrorCode::kIo, ErrnoMessage("mprotect of the copy of " + name_, errno));
  }
  if (err) return fail(*err);
  // The deferred ranges are written now: merge them into written_ (both sorted; adjacent or overlapping ranges join).
  std::vector<std::pair<uint64_t, uint64_t>> all;
  all.reserve(written_.size() + deferred_.size());
  std::merge(written_.begin(), written_.end(), deferred_.begin(), deferred_.end(), std::back_inserter(all));
  written_.clear();
  for (const auto& r : all) {
    if (!written_.empty() && r.first <= written_.back().second) {
      written_.back().second = std::max(written_.back().second, r.second);
    } else {
      written_.push_back(r);
    }
  }
  deferred_.clear();
  deferred_fd_.Reset();
  return Status::Ok();
}

MappedFile::MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this == &o) return *this;
  Reset();
  base_ = std::exchange(o.base_, nullptr);
  size_ = std::exchange(o.size_, 0);
  mapped_ = std::exchange(o.mapped_, 0);
  copied_ = std::exchange(o.copied_, 0);
  written_ = std::move(o.written_);
  o.written_.clear();
  identity_ = o.identity_;
  writable_ = o.writable_;
  name_ = std::move(o.name_);
  deferred_fd_ = std::move(o.deferred_fd_);
  deferred_ = std::move(o.deferred_);
  o.deferred_.clear();
  deferred_error_ = std::move(o.deferred_error_);
  o.deferred_error_.reset();
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (base_ != nullptr) munmap(base_, mapped_);
  base_ = nullptr;
  mapped_ = 0;
  size_ = 0;
  copied_ = 0;
  written_.clear();
  deferred_.clear();
  deferred_fd_.Reset();
  deferred_error_.reset();
}

}  // namespace rvbpfd
