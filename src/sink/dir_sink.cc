#include "sink/dir_sink.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <vector>

#include "common/safe_file.h"

namespace rvbpfd {
namespace {

constexpr size_t kMaxComponentBytes = 100;
constexpr std::string_view kProfileSuffix = ".pb.gz";
constexpr mode_t kDirMode = 0750;   // profiles name the code and command lines of the machine's processes
constexpr mode_t kFileMode = 0600;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { Reset(); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  // Closes now, returning close()'s errno (0 = ok): a late write error (NFS, quota) can surface only here.
  int Close() {
    if (fd_ < 0) return 0;
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }
  void Reset() { (void)Close(); }

 private:
  int fd_;
};

struct DirCloser {
  void operator()(DIR* d) const { closedir(d); }
};
using DirPtr = std::unique_ptr<DIR, DirCloser>;

bool IsTempName(std::string_view name) {
  return name.starts_with('.') && name.ends_with(".tmp") && name.find(".pb.gz.") != std::string_view::npos;
}

bool ParseDigits(std::string_view s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && end == s.data() + s.size() && *out >= 0;
}

// "<type>-<pid>-<from>-<until>.pb.gz" -> from.
bool ParseProfileName(std::string_view name, int64_t* from) {
  if (name.starts_with('.') || !name.ends_with(kProfileSuffix)) return false;
  std::string_view stem = name.substr(0, name.size() - kProfileSuffix.size());
  std::vector<std::string_view> fields;
  for (size_t start = 0;;) {
    const size_t dash = stem.find('-', start);
    fields.push_back(stem.substr(start, dash == std::string_view::npos ? std::string_view::npos : dash - start));
    if (dash == std::string_view::npos) break;
    start = dash + 1;
  }
  int64_t until = 0;
  return fields.size() == 4 && !fields[0].empty() && !fields[1].empty() && ParseDigits(fields[2], from) &&
         ParseDigits(fields[3], &until);
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

// mkdir -p with kDirMode for the directories it creates.
Status MakeDirs(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), kDirMode) == 0) continue;
    const int err = errno;
    struct stat st {};
    if (err == EEXIST && ::stat(prefix.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) continue;
    return Error(ErrorCode::kOutputUnwritable,
                 ErrnoMessage("--output-dir " + dir + ": creating " + prefix, err == EEXIST ? ENOTDIR : err) +
                     "; choose a directory rvbpfd can create and write");
  }
  return Status::Ok();
}

}  // namespace

std::string SanitizeFileComponent(std::string_view text, bool keep_dash) {
  std::string out;
  for (unsigned char c : text.substr(0, kMaxComponentBytes)) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                      c == '_' || (keep_dash && c == '-');
    out.push_back(keep ? static_cast<char>(c) : '_');
  }
  if (out.empty()) return "unknown";
  if (out[0] == '.') out[0] = '_';
  return out;
}

Result<std::unique_ptr<DirSink>> DirSink::Create(const std::string& dir, uint64_t max_total_bytes,
                                                 size_t max_queue, uint64_t max_service_bytes) {
  if (dir.empty()) return Error(ErrorCode::kUsage, "--output-dir is empty");
  if (max_total_bytes == 0) return Error(ErrorCode::kUsage, "--output-max-mb must be at least 1");
  std::string clean = dir;
  while (clean.size() > 1 && clean.back() == '/') clean.pop_back();
  if (Status made = MakeDirs(clean); !made) return made.error();

  // Prove a file can be created there now rather than losing the first interval's profiles.
  const std::string probe = clean + "/.rvbpfd-write-test." + std::to_string(::getpid()) + ".tmp";
  {
    Fd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, kFileMode));
    if (!fd.ok()) {
      return Error(ErrorCode::kOutputUnwritable,
                   ErrnoMessage("--output-dir " + clean + ": creating a file in it", errno) +
                       "; choose a writable directory (read-only filesystem? permissions?)");
    }
  }
  ::unlink(probe.c_str());

  std::unique_ptr<DirSink> sink(new DirSink(clean, max_total_bytes, max_service_bytes));
  if (Status scanned = sink->ScanExisting(); !scanned) return scanned.error();
  const uint64_t rotated = sink->Rotate();

  DeliveryWorkerOptions options;
  options.max_queue = max_queue;
  Result<std::unique_ptr<DeliveryWorker>> worker = DeliveryWorker::Start(
      std::move(options),
      [s = sink.get()](std::span<const ProfileUpload> uploads, const DeliveryContext&) {
        return std::vector<DeliveryOutcome>{s->Deliver(uploads.front())};  // max_batch 1: one file an attempt
      });
  if (!worker) return worker.error();
  sink->worker_ = std::move(worker).value();
  if (rotated > 0) sink->worker_->CountRotated(rotated);
  return sink;
}

DirSink::~DirSink() { worker_.reset(); }

Status DirSink::ScanExisting() {
  DirPtr top(::opendir(dir_.c_str()));
  if (!top) {
    return Error(ErrorCode::kOutputUnwritable,
                 ErrnoMessage("--output-dir " + dir_ + ": listing it", errno) + "; fix its permissions");
  }
  const int top_fd = ::dirfd(top.get());
  while (const dirent* app = ::readdir(top.get())) {
    const std::string app_name = app->d_name;
    if (app_name == "." || app_name == "..") continue;
    struct stat st {};
    if (::fstatat(top_fd, app_name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) continue;
    const int sub_fd = ::openat(top_fd, app_name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub_fd < 0) continue;  // not ours to manage if we cannot read it
    DirPtr sub(::fdopendir(sub_fd));
    if (!sub) {
      ::close(sub_fd);
      continue;
    }
    while (const dirent* file = ::readdir(sub.get())) {
      const std::string name = file->d_name;
      struct stat fst {};
      if (::fstatat(sub_fd, name.c_str(), &fst, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(fst.st_mode)) continue;
      if (IsTempName(name)) {
        ::unlinkat(sub_fd, name.c_str(), 0);  // a write interrupted by a crash: never a complete profile
        continue;
      }
      int64_t from = 0;
      if (!ParseProfileName(name, &from)) continue;
      IndexFile(FileEntry{from, MtimeNs(fst), dir_ + "/" + app_name + "/" + name, static_cast<uint64_t>(fst.st_size),
                          app_name});
    }
  }
  return Status::Ok();
}

void DirSink::IndexFile(FileEntry entry) {
  Unindex(entry.path);  // rewritten in place by rename
  total_bytes_ += entry.size;
  ServiceFiles& service = services_[entry.app];
  service.bytes += entry.size;
  service.files.insert(entry);
  by_path_.emplace(entry.path, std::move(entry));
}

void DirSink::Unindex(const std::string& path) {
  const auto old = by_path_.find(path);
  if (old == by_path_.end()) return;
  total_bytes_ -= old->second.size;
  const auto service = services_.find(old->second.app);
  service->second.bytes -= old->second.size;
  service->second.files.erase(old->second);
  if (service->second.files.empty()) services_.erase(service);
  by_path_.erase(old);
}

uint64_t DirSink::service_bytes_for_test(const std::string& app) const {
  const auto it = services_.find(app);
  return it == services_.end() ? 0 : it->second.bytes;
}

Result<int> DirSink::OpenAppDir(const std::string& app, bool create) const {
  Fd top(::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!top.ok()) return Error(ErrorCode::kOutputUnwritable, ErrnoMessage("opening --output-dir " + dir_, errno));
  const std::string where = dir_ + "/" + app;
  if (create && ::mkdirat(top.get(), app.c_str(), kDirMode) != 0 && errno != EEXIST) {
    return Error(ErrorCode::kOutputUnwritable, ErrnoMessage("creating " + where, errno));
  }
  // O_NOFOLLOW: a <dir>/<service> planted as a symlink would send root's writes (and rotation's deletes) elsewhere.
  const int fd = ::openat(top.get(), app.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP || err == ENOTDIR) {
      return Error(ErrorCode::kOutputUnwritable,
                   where + " is a symbolic link or not a directory; rvbpfd never writes through one (remove it)");
    }
    return Error(ErrorCode::kOutputUnwritable, ErrnoMessage("opening " + where, err));
  }
  return fd;
}

void DirSink::RemoveProfile(const std::string& path) const {
  // path is dir_ + "/" + app + "/" + name (IndexFile's form).
  if (path.size() <= dir_.size() + 1) return;
  const std::string rel = path.substr(dir_.size() + 1);
  const size_t slash = rel.find('/');
  if (slash == std::string::npos) return;
  Result<int> app = OpenAppDir(rel.substr(0, slash), /*create=*/false);
  if (!app) return;  // gone or replaced by a symlink: nothing of ours to remove there
  Fd fd(*app);
  ::unlinkat(fd.get(), rel.substr(slash + 1).c_str(), 0);
}

void DirSink::RemoveOldest(const std::string& app) {
  const std::string path = services_.at(app).files.begin()->path;
  RemoveProfile(path);  // ENOENT: someone else removed it; either way it no longer counts
  Unindex(path);
}

uint64_t DirSink::Rotate() {
  uint64_t deleted = 0;
  if (max_service_bytes_ != 0) {
    std::vector<std::string> over;
    for (const auto& [app, service] : services_) {
      if (service.bytes > max_service_bytes_) over.push_back(app);
    }
    for (const std::string& app : over) {
      for (; services_.contains(app) && services_.at(app).bytes > max_service_bytes_; ++deleted) RemoveOldest(app);
    }
  }
  for (; total_bytes_ > max_total_bytes_ && !services_.empty(); ++deleted) {
    auto largest = services_.begin();
    for (auto it = services_.begin(); it != services_.end(); ++it) {
      if (it->second.bytes > largest->second.bytes) largest = it;
    }
    RemoveOldest(largest->first);
  }
  return deleted;
}

std::string DirSink::PathFor(const ProfileUpload& upload) const {
  const auto pid = upload.labels.find("pid");
  std::string path = dir_;
  path += '/';
  path += SanitizeFileComponent(upload.app_name, /*keep_dash=*/true);
  path += '/';
  path += SanitizeFileComponent(upload.profile_type, /*keep_dash=*/false);
  path += '-';
  path += SanitizeFileComponent(pid == upload.labels.end() ? "" : pid->second, /*keep_dash=*/false);
  path += '-' + std::to_string(std::max<int64_t>(upload.from_unix_s, 0));
  path += '-' + std::to_string(std::max<int64_t>(upload.until_unix_s, 0));
  path += kProfileSuffix;
  return path;
}

void DirSink::Submit(ProfileUpload upload) { worker_->Submit(std::move(upload)); }

void DirSink::SubmitAll(std::vector<ProfileUpload> uploads) { worker_->SubmitAll(std::move(uploads)); }

bool DirSink::Flush(std::chrono::milliseconds deadline) { return worker_->Flush(deadline); }

SinkStats DirSink::stats() const { return worker_->stats(); }

DeliveryOutcome DirSink::Deliver(const ProfileUpload& upload) {
  const std::string path = PathFor(upload);
  const size_t slash = path.rfind('/');
  const std::string app_dir = path.substr(0, slash);
  const std::string base = path.substr(slash + 1);
  if (upload.pprof_gz.size() > max_total_bytes_) {
    return DeliveryOutcome::Failed("not written: " + path + " would be " + std::to_string(upload.pprof_gz.size()) +
                                   " bytes, more than the whole --output-max-mb cap (" +
                                   std::to_string(max_total_bytes_) + " bytes)");
  }
  if (max_service_bytes_ != 0 && upload.pprof_gz.size() > max_service_bytes_) {
    return DeliveryOutcome::Failed("not written: " + path + " would be " + std::to_string(upload.pprof_gz.size()) +
                                   " bytes, more than the --output-service-max-mb cap (" +
                                   std::to_string(max_service_bytes_) + " bytes)");
  }
  const std::string app_name = path.substr(dir_.size() + 1, slash - dir_.size() - 1);
  Result<int> app_fd = OpenAppDir(app_name, /*create=*/true);
  if (!app_fd) return DeliveryOutcome::Failed(app_fd.error().message());
  Fd app(*app_fd);
  OutputFileOptions options;
  options.mode = kFileMode;
  options.owner = SudoInvokerOfProcess();
  options.sync = true;
  options.fix_hint = "check --output-dir";
  Result<OutputFile> file = OutputFile::CreateAt(app.get(), app_dir, base, options);
  if (!file) return DeliveryOutcome::Failed(file.error().message());
  std::string_view rest = upload.pprof_gz;
  while (!rest.empty()) {
    const ssize_t n = ::write(file->fd(), rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return DeliveryOutcome::Failed(ErrnoMessage("writing " + path, n < 0 ? errno : EIO));
    rest.remove_prefix(static_cast<size_t>(n));
  }
  struct stat st {};
  if (::fstat(file->fd(), &st) != 0) return DeliveryOutcome::Failed(ErrnoMessage("checking " + path, errno));
  if (Status committed = file->Commit(); !committed) return DeliveryOutcome::Failed(committed.error().message());

  IndexFile(FileEntry{std::max<int64_t>(upload.from_unix_s, 0), MtimeNs(st), path, upload.pprof_gz.size(), app_name});
  if (const uint64_t deleted = Rotate(); deleted > 0) worker_->CountRotated(deleted);
  return DeliveryOutcome::Delivered();
}

}  // namespace rvbpfd
