#include "target/pid_namespace.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace rvbpfd {
namespace {

// A task's status file is ~1.5 KB; NSpid comes before the signal masks.
constexpr size_t kMaxStatusBytes = 16384;

// fstat of a file opened through procfs; errno on failure.
int StatProcFile(const ProcFs& procfs, const std::string& path, struct stat* st) {
  int fd = procfs.OpenFile(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = fstat(fd, st) == 0 ? 0 : errno;
  close(fd);
  return err;
}

// At most max bytes of a file opened through procfs; false on any error.
bool ReadBounded(const ProcFs& procfs, const std::string& path, size_t max, std::string* out) {
  int fd = procfs.OpenFile(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->assign(max, '\0');
  size_t got = 0;
  bool ok = true;
  while (got < max) {
    ssize_t n = read(fd, out->data() + got, max - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ok = false;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  out->resize(got);
  return ok;
}

Error StepError(const std::string& what, int err) {
  if (err == ENOENT || err == ESRCH) return Error(ErrorCode::kNoSuchProcess, ErrnoMessage(what, err));
  if (err == EACCES || err == EPERM) {
    return Error(ErrorCode::kNoPrivilege, ErrnoMessage(what, err) + "; run as root or grant CAP_SYS_PTRACE");
  }
  return Error(ErrorCode::kIo, ErrnoMessage(what, err));
}

}  // namespace

Result<TargetPidNamespace> ReadPidNamespace(int pid, const ProcFs& procfs) {
  struct stat own{}, target{};
  const std::string own_path = procfs.root() + "/self/ns/pid";
  if (int err = StatProcFile(procfs, own_path, &own); err != 0) {
    Error e = StepError("reading rvbpfd's own pid namespace (" + own_path + ")", err);
    return Error(e.code() == ErrorCode::kNoSuchProcess ? ErrorCode::kIo : e.code(), e.message());
  }
  const std::string path = procfs.PidPath(pid, "ns/pid");
  if (int err = StatProcFile(procfs, path, &target); err != 0) {
    return StepError("reading the pid namespace of pid " + std::to_string(pid) + " (" + path + ")", err);
  }
  TargetPidNamespace out;
  if (own.st_dev == target.st_dev && own.st_ino == target.st_ino) return out;
  // The kernel's dev_t (MKDEV: major << 20 | minor), which bpf_get_ns_current_pid_tgid compares, not stat's.
  out.ns.dev = (static_cast<uint64_t>(major(target.st_dev)) << 20) | minor(target.st_dev);
  out.ns.ino = target.st_ino;

  const std::string task_dir = procfs.PidPath(pid, "task");
  int dfd = procfs.OpenFile(task_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return StepError("listing the threads of pid " + std::to_string(pid) + " (" + task_dir + ")", errno);
  DIR* d = fdopendir(dfd);
  if (d == nullptr) {
    int err = errno;
    close(dfd);
    return StepError("listing the threads of pid " + std::to_string(pid), err);
  }
  std::string status;
  while (struct dirent* de = readdir(d)) {
    if (out.threads.size() >= kMaxNamespaceThreads) break;
    char* end = nullptr;
    errno = 0;
    unsigned long tid = strtoul(de->d_name, &end, 10);
    if (de->d_name[0] < '0' || de->d_name[0] > '9' || *end != '\0' || errno != 0 || tid == 0 || tid > UINT32_MAX) {
      continue;
    }
    if (!ReadBounded(procfs, task_dir + "/" + de->d_name + "/status", kMaxStatusBytes, &status)) continue;
    // The thread's tid in the process's namespace: the last NSpid field (the directory names it in the procfs').
    std::optional<int> inner = ParseNsPid(status);
    if (!inner) continue;
    out.threads.emplace_back(static_cast<uint32_t>(*inner), static_cast<uint32_t>(tid));
  }
  closedir(d);
  return out;
}

std::optional<uint32_t> ReadTaskNsTid(const ProcFs& procfs, int pid, int tid) {
  std::string status;
  if (pid <= 0 || tid <= 0) return std::nullopt;
  const std::string path = procfs.PidPath(pid, "task/" + std::to_string(tid) + "/status");
  if (!ReadBounded(procfs, path, kMaxStatusBytes, &status)) return std::nullopt;
  std::optional<int> inner = ParseNsPid(status);
  if (!inner) return std::nullopt;
  return static_cast<uint32_t>(*inner);
}

std::optional<std::string> ParseTaskComm(std::string_view text) {
  text = text.substr(0, text.find('\n'));
  if (text.size() > kMaxTaskCommBytes) text = text.substr(0, kMaxTaskCommBytes);
  if (text.empty()) return std::nullopt;
  return std::string(text);
}

std::optional<std::string> ReadTaskComm(const ProcFs& procfs, int pid, int tid) {
  std::string comm;
  if (pid <= 0 || tid <= 0) return std::nullopt;
  const std::string path = procfs.PidPath(pid, "task/" + std::to_string(tid) + "/comm");
  if (!ReadBounded(procfs, path, kMaxTaskCommBytes + 1, &comm)) return std::nullopt;
  return ParseTaskComm(comm);
}

}  // namespace rvbpfd
