#include "common/safe_file.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string_view>
#include <utility>

#include "common/capabilities.h"

namespace rvbpfd {
namespace {

constexpr int kTempAttempts = 16;       // O_EXCL collisions on a 64-bit random name: someone is guessing
constexpr size_t kMaxTempBaseBytes = 200;  // keeps ".<base>.<16 hex>.tmp" within NAME_MAX (255)

std::string RandomHex() {
  uint64_t r = 0;
  if (::getrandom(&r, sizeof(r), GRND_NONBLOCK) != static_cast<ssize_t>(sizeof(r))) {
    // No entropy yet (early boot): still unique per attempt, and O_EXCL|O_NOFOLLOW keeps a guessed name harmless.
    static uint64_t counter = 0;
    struct timespec ts {};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    r = (static_cast<uint64_t>(ts.tv_nsec) << 20) ^ (static_cast<uint64_t>(::getpid()) << 40) ^ ++counter;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, r >>= 4) out[static_cast<size_t>(i)] = kHex[r & 0xf];
  return out;
}

Error Unwritable(const std::string& path, std::string_view step, int err, std::string_view hint) {
  return Error(ErrorCode::kOutputUnwritable,
               ErrnoMessage("cannot create output file " + path + " (" + std::string(step) + ")", err) + "; " +
                   std::string(hint));
}

std::string JoinPath(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir == ".") return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// -o /dev/stdout, /dev/stderr, /dev/fd/N: the caller's own descriptor (those names are symlinks into /proc, which
// CreateAt would refuse; /dev belongs to root, so nobody else can have planted them). -1: not such a name.
int InheritedDescriptor(const std::string& path) {
  if (path == "/dev/stdout") return STDOUT_FILENO;
  if (path == "/dev/stderr") return STDERR_FILENO;
  constexpr std::string_view kFdDir = "/dev/fd/";
  if (path.size() > kFdDir.size() && path.size() <= kFdDir.size() + 4 && path.starts_with(kFdDir)) {
    int fd = 0;
    for (char c : std::string_view(path).substr(kFdDir.size())) {
      if (c < '0' || c > '9') return -1;
      fd = fd * 10 + (c - '0');
    }
    return fd;
  }
  return -1;
}

}  // namespace

Result<OutputFile> OutputFile::Create(const std::string& path, const OutputFileOptions& options) {
  if (const int inherited = InheritedDescriptor(path); inherited >= 0) {
    OutputFile file;
    file.path_ = path;
    file.fd_ = ::fcntl(inherited, F_DUPFD_CLOEXEC, 0);
    if (file.fd_ < 0) return Unwritable(path, "duplicating that descriptor", errno, options.fix_hint);
    file.done_ = false;
    return file;
  }
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name.empty() || name == "." || name == "..") {
    return Unwritable(path, "not a file name", EISDIR, options.fix_hint);
  }
  // O_RDONLY so that Commit can fsync the directory; O_PATH where it may only be searched, not read.
  int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0 && errno == EACCES) dir_fd = ::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    const int err = errno;
    return Unwritable(path, "opening its directory " + dir, err, options.fix_hint);
  }
  Result<OutputFile> file = CreateAt(dir_fd, dir, name, options);
  ::close(dir_fd);
  if (file.ok()) file->path_ = path;
  return file;
}

Result<OutputFile> OutputFile::CreateAt(int dir_fd, const std::string& dir_label, const std::string& name,
                                        const OutputFileOptions& options) {
  const std::string path = JoinPath(dir_label, name);
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return Unwritable(path, "not a file name", EINVAL, options.fix_hint);
  }
  OutputFile file;
  file.path_ = path;
  file.name_ = name;
  file.sync_ = options.sync;
  file.dir_fd_ = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (file.dir_fd_ < 0) return Unwritable(path, "duplicating the directory descriptor", errno, options.fix_hint);

  struct stat existing {};
  if (::fstatat(file.dir_fd_, name.c_str(), &existing, AT_SYMLINK_NOFOLLOW) == 0) {
    if (S_ISLNK(existing.st_mode)) {
      return Error(ErrorCode::kOutputUnwritable,
                   "cannot create output file " + path + ": it is a symbolic link, which rvbpfd never writes "
                   "through; remove it or " + options.fix_hint);
    }
    if (S_ISDIR(existing.st_mode)) return Unwritable(path, "a directory is there", EISDIR, options.fix_hint);
    if ((S_ISFIFO(existing.st_mode) || S_ISCHR(existing.st_mode)) && options.allow_fifo_or_device) {
      file.fd_ = ::openat(file.dir_fd_, name.c_str(), O_WRONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
      if (file.fd_ < 0) {
        const int err = errno;
        return Unwritable(path, err == ENXIO ? "a FIFO with no reader" : "opening the existing FIFO or device", err,
                          options.fix_hint);
      }
      struct stat st {};
      if (::fstat(file.fd_, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode))) {
        return Unwritable(path, "it changed while being opened", EAGAIN, options.fix_hint);
      }
      const int flags = ::fcntl(file.fd_, F_GETFL);
      if (flags >= 0) ::fcntl(file.fd_, F_SETFL, flags & ~O_NONBLOCK);  // writes wait for the reader from now on
      file.done_ = false;
      return file;
    }
    if (!S_ISREG(existing.st_mode)) {
      return Unwritable(path, "something other than a regular file is there", EEXIST, options.fix_hint);
    }
  } else if (errno != ENOENT) {
    return Unwritable(path, "checking what is there", errno, options.fix_hint);
  }

  const std::string base = name.substr(0, kMaxTempBaseBytes);
  int err = EEXIST;
  for (int attempt = 0; attempt < kTempAttempts && file.fd_ < 0; ++attempt) {
    const std::string temp = "." + base + "." + RandomHex() + ".tmp";
    file.fd_ = ::openat(file.dir_fd_, temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                        options.mode);
    if (file.fd_ >= 0) {
      file.temp_name_ = temp;
    } else {
      err = errno;
      if (err != EEXIST) break;
    }
  }
  if (file.fd_ < 0) return Unwritable(path, "creating a temporary file beside it", err, options.fix_hint);
  file.created_ = true;
  file.done_ = false;
  // The umask must not widen or narrow what the caller asked for; then the invoking user gets the file.
  if (::fchmod(file.fd_, options.mode) != 0) return Unwritable(path, "setting its mode", errno, options.fix_hint);
  if (options.owner && ::fchown(file.fd_, options.owner->uid, options.owner->gid) != 0) {
    const int err = errno;
    if (err == EPERM) {
      return Error(ErrorCode::kNoPrivilege,
                   ErrnoMessage("giving output file " + path + " to the invoking user " +
                                    std::to_string(options.owner->uid) + ":" + std::to_string(options.owner->gid) +
                                    " (SUDO_UID/SUDO_GID)",
                                err) +
                       "; " + PrivilegeHint({kCapChown}));
    }
    return Unwritable(path, "giving it to the invoking user " + std::to_string(options.owner->uid) + ":" +
                                std::to_string(options.owner->gid) + " (SUDO_UID/SUDO_GID)",
                      err, options.fix_hint);
  }
  if (options.publish_at_create) {
    if (::renameat(file.dir_fd_, file.temp_name_.c_str(), file.dir_fd_, name.c_str()) != 0) {
      return Unwritable(path, "moving it into place", errno, options.fix_hint);
    }
    file.temp_name_.clear();
  }
  return file;
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : dir_fd_(std::exchange(other.dir_fd_, -1)),
      fd_(std::exchange(other.fd_, -1)),
      path_(std::move(other.path_)),
      name_(std::move(other.name_)),
      temp_name_(std::move(other.temp_name_)),
      created_(other.created_),
      done_(std::exchange(other.done_, true)),
      sync_(other.sync_) {}

OutputFile& OutputFile::operator=(OutputFile&& other) noexcept {
  if (this != &other) {
    Abandon();
    dir_fd_ = std::exchange(other.dir_fd_, -1);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    name_ = std::move(other.name_);
    temp_name_ = std::move(other.temp_name_);
    created_ = other.created_;
    done_ = std::exchange(other.done_, true);
    sync_ = other.sync_;
  }
  return *this;
}

OutputFile::~OutputFile() { Abandon(); }

void OutputFile::CloseAll() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (dir_fd_ >= 0) ::close(dir_fd_);
  dir_fd_ = -1;
}

Status OutputFile::Commit() {
  if (done_) return Error(ErrorCode::kInternal, "committing output file " + path_ + " twice");
  auto fail = [&](std::string_view step, int err) {
    const Status st = Error(ErrorCode::kIo, ErrnoMessage(std::string(step) + " " + path_, err));
    Abandon();
    return st;
  };
  if (sync_ && created_ && ::fsync(fd_) != 0) return fail("syncing", errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) return fail("closing", errno);
  if (!temp_name_.empty()) {
    if (::renameat(dir_fd_, temp_name_.c_str(), dir_fd_, name_.c_str()) != 0) return fail("renaming into", errno);
    temp_name_.clear();
  }
  // The rename is durable only once the directory is synced; failing that is not worth losing the file over.
  if (sync_ && created_) (void)::fsync(dir_fd_);
  done_ = true;
  CloseAll();
  return Status::Ok();
}

void OutputFile::Abandon() {
  if (!done_ && created_ && dir_fd_ >= 0) {
    if (!temp_name_.empty()) {
      ::unlinkat(dir_fd_, temp_name_.c_str(), 0);
    } else if (fd_ >= 0) {
      // Published at Create: remove the name only while it still is this file (someone may have replaced it).
      struct stat mine {}, there {};
      if (::fstat(fd_, &mine) == 0 && ::fstatat(dir_fd_, name_.c_str(), &there, AT_SYMLINK_NOFOLLOW) == 0 &&
          mine.st_dev == there.st_dev && mine.st_ino == there.st_ino) {
        ::unlinkat(dir_fd_, name_.c_str(), 0);
      }
    }
  }
  done_ = true;
  CloseAll();
}

OutputFileStream::Buf::Buf(int fd, uint64_t max_bytes) : fd_(fd), max_bytes_(max_bytes) {
  setp(data_, data_ + sizeof(data_));
}

bool OutputFileStream::Buf::Drain() {
  const char* p = pbase();
  size_t left = static_cast<size_t>(pptr() - pbase());
  if (err_ == 0 && max_bytes_ != 0 && left > max_bytes_ - written_) {
    exceeded_ = true;
    err_ = EFBIG;
  }
  if (err_ == 0) written_ += left;
  while (left > 0 && err_ == 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err_ = n < 0 ? errno : EIO;
      break;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  setp(data_, data_ + sizeof(data_));
  return err_ == 0;
}

OutputFileStream::Buf::int_type OutputFileStream::Buf::overflow(int_type c) {
  if (!Drain()) return traits_type::eof();
  if (!traits_type::eq_int_type(c, traits_type::eof())) {
    *pptr() = traits_type::to_char_type(c);
    pbump(1);
  }
  return traits_type::not_eof(c);
}

int OutputFileStream::Buf::sync() { return Drain() ? 0 : -1; }

OutputFileStream::OutputFileStream(int fd, uint64_t max_bytes) : std::ostream(nullptr), buf_(fd, max_bytes) {
  rdbuf(&buf_);
}

Status WriteOutputFile(const std::string& path, const OutputFileOptions& options,
                       const std::function<Status(std::ostream&)>& write) {
  Result<OutputFile> file = OutputFile::Create(path, options);
  if (!file) return file.error();
  OutputFileStream out(file->fd(), options.max_bytes);
  Status st = write(out);
  out.flush();
  if (out.exceeded()) {
    st = Error(ErrorCode::kOutputTooLarge, "writing " + path + ": the output passed " + options.max_bytes_flag + " (" +
                                               std::to_string(options.max_bytes) + " bytes) and was removed; raise " +
                                               options.max_bytes_flag + " or export a smaller view");
  } else if (st && (!out || out.error() != 0)) {
    st = Error(ErrorCode::kIo, ErrnoMessage("writing " + path, out.error() != 0 ? out.error() : EIO) +
                                   "; free space there or choose another path with -o");
  }
  if (!st) {
    file->Abandon();
    return st;
  }
  return file->Commit();
}

}  // namespace rvbpfd
