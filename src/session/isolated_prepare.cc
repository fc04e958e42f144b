#include "session/isolated_prepare.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <optional>
#include <thread>
#include <vector>

#include "elf/elf_file.h"
#include "session/vm_binary.h"

extern char** environ;

namespace rvbpfd {
namespace {

constexpr int kAnswerFd = 3;  // the child's end of the answer pipe
constexpr int kHandleFd = 4;  // the binary's O_PATH descriptor in the child
// An answer is a line and one error message (one line, a few hundred bytes): more is not an answer.
constexpr size_t kMaxMessageBytes = 4096;
constexpr size_t kMaxAnswerBytes = kMaxMessageBytes + 64;

bool WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

std::optional<uint64_t> ParseDecimal(std::string_view s) {
  uint64_t v = 0;
  if (s.empty() || s.size() > 10) return std::nullopt;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

Error Malformed(const std::string& path, std::string_view why) {
  return Error(ErrorCode::kInternal,
               "analysing " + path + " in a child process: its answer is malformed (" + std::string(why) + ")");
}

// A process-wide steady clock in ms, for the deadline.
int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Owns a posix_spawn file-actions object and an attribute object.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  SpawnSetup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attr);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

// Reaps `pid`, killing it if it has not exited by deadline_ms. Returns its wait status.
int Reap(pid_t pid, int64_t deadline_ms, bool* killed) {
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return 0;  // not our child any more (cannot happen: nothing else reaps it)
    if (NowMs() >= deadline_ms) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pid, SIGKILL);
  *killed = true;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

}  // namespace

std::string EncodePrepareAnswer(const Status& result) {
  if (result) return "ok\n";
  std::string message = result.error().message().substr(0, kMaxMessageBytes);
  return "error " + std::to_string(static_cast<int>(result.error().code())) + " " + std::to_string(message.size()) +
         "\n" + message;
}

Status DecodePrepareAnswer(std::string_view bytes, const std::string& path) {
  if (bytes == "ok\n") return Status::Ok();
  if (bytes.size() > kMaxAnswerBytes) return Malformed(path, "too long");
  const size_t nl = bytes.find('\n');
  if (nl == std::string_view::npos) return Malformed(path, bytes.empty() ? "empty" : "no line");
  std::string_view head = bytes.substr(0, nl);
  const std::string_view message = bytes.substr(nl + 1);
  if (head.substr(0, 6) != "error ") return Malformed(path, "not ok or error");
  head.remove_prefix(6);
  const size_t sp = head.find(' ');
  if (sp == std::string_view::npos) return Malformed(path, "no length");
  const std::optional<uint64_t> code = ParseDecimal(head.substr(0, sp));
  const std::optional<uint64_t> length = ParseDecimal(head.substr(sp + 1));
  if (!code || !length) return Malformed(path, "a field is not a number");
  const std::optional<ErrorCode> known = ErrorCodeFromExitStatus(static_cast<int64_t>(*code));
  if (!known) return Malformed(path, "unknown error code " + std::to_string(*code));
  if (*length != message.size() || *length > kMaxMessageBytes) return Malformed(path, "wrong message length");
  return Error(*known, std::string(message));
}

namespace {

// The child's standard fds on /dev/null, the answer pipe on kAnswerFd and the binary's descriptor (-1: none) on
// kHandleFd; default signal dispositions and an empty mask (the agent's threads block the daemon's signals and it
// ignores SIGPIPE: the child starts with neither). Returns 0 or the first posix_spawn error.
int SetUpChild(SpawnSetup& setup, int answer_fd, int handle_fd) {
  int rc = 0;
  rc = rc ? rc : posix_spawn_file_actions_addopen(&setup.actions, 0, "/dev/null", O_RDONLY, 0);
  rc = rc ? rc : posix_spawn_file_actions_addopen(&setup.actions, 1, "/dev/null", O_WRONLY, 0);
  rc = rc ? rc : posix_spawn_file_actions_addopen(&setup.actions, 2, "/dev/null", O_WRONLY, 0);
  rc = rc ? rc : posix_spawn_file_actions_adddup2(&setup.actions, answer_fd, kAnswerFd);
  if (handle_fd >= 0) rc = rc ? rc : posix_spawn_file_actions_adddup2(&setup.actions, handle_fd, kHandleFd);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  rc = rc ? rc : posix_spawnattr_setsigmask(&setup.attr, &none);
  rc = rc ? rc : posix_spawnattr_setsigdefault(&setup.attr, &all);
  rc = rc ? rc : posix_spawnattr_setflags(&setup.attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  return rc;
}

// The child's answer, read until it closes its end (*eof: it exits), the answer passes kMaxAnswerBytes (*too_long)
// or deadline_ms passes (neither set).
std::string ReadAnswer(int fd, int64_t deadline_ms, bool* eof, bool* too_long) {
  std::string answer;
  while (!*eof && !*too_long) {
    const int64_t left_ms = deadline_ms - NowMs();
    if (left_ms <= 0) break;
    pollfd pfd{fd, POLLIN, 0};
    const int n = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left_ms, 1000)));
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) continue;
    char buf[4096];
    const ssize_t got = read(fd, buf, sizeof(buf));
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) {
      *eof = true;
      break;
    }
    answer.append(buf, static_cast<size_t>(got));
    *too_long = answer.size() > kMaxAnswerBytes;
  }
  return answer;
}

// What the child's run came to: its decoded answer, or why there is none to trust (it ran past the deadline, its
// answer was too long, it did not exit after answering, a signal killed it, it exited without a word).
Status ChildResult(const std::string& path, const std::string& answer, bool eof, bool too_long, bool killed,
                   int status, std::chrono::milliseconds timeout) {
  const std::string ms = std::to_string(timeout.count());
  if (!eof && !too_long) {
    return Error(ErrorCode::kIo, "analysing " + path + " in a child process took more than " + ms +
                                     " ms (its reads stall or its analysis runs away); killed it");
  }
  if (too_long) return Malformed(path, "longer than " + std::to_string(kMaxAnswerBytes) + " bytes");
  if (killed) {
    return Error(ErrorCode::kIo, "analysing " + path + " in a child process: it answered but did not exit "
                                 "within " + ms + " ms; killed it");
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return Error(ErrorCode::kInternal, "analysing " + path + " in a child process: it was killed by signal " +
                                           std::to_string(sig) + " (" + strsignal(sig) + ")");
  }
  if (answer.empty()) {
    return Error(ErrorCode::kInternal, "analysing " + path + " in a child process: it exited with status " +
                                           std::to_string(WEXITSTATUS(status)) + " without an answer");
  }
  return DecodePrepareAnswer(answer, path);
}

}  // namespace

PrepareChildOutcome WarmBinaryCaches(const PrepareChildRequest& request) {
  PrepareChildOutcome out;
  const std::string& path = request.path;
  auto not_started = [&](const std::string& what, int err) {
    out.state = PrepareChildOutcome::State::kNotStarted;
    out.error = Error(ErrorCode::kIo, ErrnoMessage("starting the analysis child of " + path + ": " + what, err));
    return out;
  };
  if (request.cache_dir.empty()) {
    return not_started("no cache directory to hand the result over", EINVAL);
  }

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return not_started("pipe2", errno);
  FileFd answer_read(pipe_fds[0]);
  FileFd answer_write(pipe_fds[1]);
  // The child's fds 3 and 4 are dup2'd from these; above 10 neither source can be a target the other overwrites.
  FileFd answer_high(fcntl(answer_write.get(), F_DUPFD_CLOEXEC, 10));
  if (!answer_high.ok()) return not_started("fcntl(F_DUPFD_CLOEXEC)", errno);
  FileFd handle_high;
  if (request.handle != nullptr) {
    handle_high = FileFd(fcntl(request.handle->get(), F_DUPFD_CLOEXEC, 10));
    if (!handle_high.ok()) return not_started("fcntl(F_DUPFD_CLOEXEC) of the binary's descriptor", errno);
  }
  SpawnSetup setup;
  int rc = SetUpChild(setup, answer_high.get(), handle_high.ok() ? handle_high.get() : -1);
  if (rc != 0) return not_started("posix_spawn set-up", rc);

  std::vector<std::string> args = {request.exe,
                                   std::string(kPrepareChildCommand),
                                   handle_high.ok() ? "1" : "0",
                                   path,
                                   request.origin_path,
                                   request.ruby_version,
                                   request.cache_dir,
                                   request.want_stacks ? "1" : "0"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int64_t deadline_ms = NowMs() + request.timeout.count();
  rc = posix_spawn(&pid, request.exe.c_str(), &setup.actions, &setup.attr, argv.data(), environ);
  if (rc != 0) return not_started("posix_spawn " + request.exe, rc);
  answer_write.Reset();
  answer_high.Reset();
  handle_high.Reset();

  bool eof = false, too_long = false;
  const std::string answer = ReadAnswer(answer_read.get(), deadline_ms, &eof, &too_long);
  bool killed = false;
  const int status = Reap(pid, eof ? deadline_ms : 0, &killed);
  Status result = ChildResult(path, answer, eof, too_long, killed, status, request.timeout);
  if (!result) {
    out.state = PrepareChildOutcome::State::kFailed;
    out.error = result.error();
    return out;
  }
  out.state = PrepareChildOutcome::State::kWarmed;
  return out;
}

int RunPrepareChild(std::span<char* const> args) {
  auto answer = [](const Status& result) { return WriteAll(kAnswerFd, EncodePrepareAnswer(result)) ? 0 : 1; };
  if (args.size() != 6) {
    return answer(Error(ErrorCode::kUsage, std::string(kPrepareChildCommand) + " takes 6 arguments, not " +
                                               std::to_string(args.size())));
  }
  const std::string_view has_handle = args[0];
  const std::string path = args[1], origin_path = args[2], version = args[3], cache_dir = args[4];
  const std::string_view want_stacks = args[5];
  if ((has_handle != "0" && has_handle != "1") || (want_stacks != "0" && want_stacks != "1")) {
    return answer(Error(ErrorCode::kUsage, std::string(kPrepareChildCommand) + ": a flag is not 0 or 1"));
  }
  FileFd handle(has_handle == "1" ? kHandleFd : -1);
  Result<ElfFile> elf = handle.ok() ? ElfFile::OpenHandle(handle, path) : ElfFile::Open(path);
  if (!elf) return answer(elf.error());
  if (!origin_path.empty()) elf->set_origin_path(origin_path);
  Result<PreparedBinary> prepared = PrepareVmBinary(*elf, version, cache_dir, want_stacks == "1");
  return answer(prepared ? Status::Ok() : Status(prepared.error()));
}

}  // namespace rvbpfd
