#include "record/launch.h"

#include <elf.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/capabilities.h"
#include "elf/elf_file.h"

namespace rvbpfd {
namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::vector<std::string> SplitPath(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ':')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string LookupInPath(const std::string& name, const std::string& path_env) {
  if (name.find('/') != std::string::npos) return name;
  for (const std::string& dir : SplitPath(path_env)) {
    std::string candidate = dir + "/" + name;
    if (IsExecutableFile(candidate)) return candidate;
  }
  return "";
}

std::string Dirname(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Reads DT_NEEDED, DT_RPATH and DT_RUNPATH from the .dynamic section.
void ReadDynamic(const ElfFile& elf, std::vector<std::string>* needed, std::vector<std::string>* rpath,
                 std::vector<std::string>* runpath) {
  auto dynamic = elf.FindSection(".dynamic");
  auto dynstr = elf.FindSection(".dynstr");
  if (!dynamic || !dynstr) return;
  std::span<const uint8_t> dyn = elf.SectionData(*dynamic);
  std::span<const uint8_t> str = elf.SectionData(*dynstr);
  for (size_t off = 0; off + sizeof(Elf64_Dyn) <= dyn.size(); off += sizeof(Elf64_Dyn)) {
    Elf64_Dyn d;
    std::memcpy(&d, dyn.data() + off, sizeof(d));
    if (d.d_tag == DT_NULL) break;
    if (d.d_tag != DT_NEEDED && d.d_tag != DT_RUNPATH && d.d_tag != DT_RPATH) continue;
    if (d.d_un.d_val >= str.size()) continue;
    const char* s = reinterpret_cast<const char*>(str.data() + d.d_un.d_val);
    size_t len = strnlen(s, str.size() - d.d_un.d_val);
    std::string value(s, len);
    if (d.d_tag == DT_NEEDED) {
      needed->push_back(value);
    } else {
      for (const std::string& p : SplitPath(value)) (d.d_tag == DT_RPATH ? rpath : runpath)->push_back(p);
    }
  }
}

// What the child reports through the exec status pipe: the failing step and its errno.
enum ChildStep : int { kStepExec = 0, kStepSetgroups = 1, kStepSetgid = 2, kStepSetuid = 3 };

const char* ChildStepName(int step) {
  switch (step) {
    case kStepSetgroups: return "setting the command's supplementary groups (setgroups)";
    case kStepSetgid: return "switching the command to its group (setgid)";
    case kStepSetuid: return "switching the command to its user (setuid)";
    default: return "executing the command";
  }
}

std::optional<uid_t> ParseUid(const std::string& s) {
  uint32_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v == UINT32_MAX) return std::nullopt;
  return static_cast<uid_t>(v);
}

std::optional<UserAccount> FromPasswd(const struct passwd* pw) {
  if (pw == nullptr) return std::nullopt;
  return UserAccount{pw->pw_name ? pw->pw_name : "", pw->pw_uid, pw->pw_gid, pw->pw_dir ? pw->pw_dir : "",
                     pw->pw_shell ? pw->pw_shell : ""};
}

}  // namespace

UserDatabase SystemUserDatabase() {
  UserDatabase db;
  db.by_name = [](const std::string& name) -> std::optional<UserAccount> {
    struct passwd pw {};
    struct passwd* found = nullptr;
    std::vector<char> buf(16384);
    if (getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found) != 0) return std::nullopt;
    return FromPasswd(found);
  };
  db.by_uid = [](uid_t uid) -> std::optional<UserAccount> {
    struct passwd pw {};
    struct passwd* found = nullptr;
    std::vector<char> buf(16384);
    if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0) return std::nullopt;
    return FromPasswd(found);
  };
  db.groups = [](const std::string& name, gid_t gid) {
    std::vector<gid_t> groups(64);
    for (int attempt = 0; attempt < 4; ++attempt) {
      int n = static_cast<int>(groups.size());
      if (getgrouplist(name.c_str(), gid, groups.data(), &n) >= 0) {
        groups.resize(static_cast<size_t>(n));
        return groups;
      }
      groups.resize(static_cast<size_t>(n) > groups.size() ? static_cast<size_t>(n) : groups.size() * 2);
    }
    return std::vector<gid_t>{gid};
  };
  return db;
}

Result<std::optional<LaunchIdentity>> DecideLaunchIdentity(const std::string& user_flag, const EnvLookup& env,
                                                           uid_t euid, const UserDatabase& db) {
  std::optional<UserAccount> account;
  if (!user_flag.empty()) {
    account = db.by_name(user_flag);
    if (!account) {
      if (std::optional<uid_t> uid = ParseUid(user_flag)) {
        account = db.by_uid(*uid);
        if (!account) {
          return Error(ErrorCode::kUsage, "--user " + user_flag + ": uid " + user_flag +
                                              " has no passwd entry (its group would be unknown); give a user name");
        }
      } else {
        return Error(ErrorCode::kUsage, "--user " + user_flag + ": no such user");
      }
    }
    if (euid != 0 && account->uid != euid) {
      return Error(ErrorCode::kNoPrivilege,
                   "--user " + user_flag + ": running the command as another user needs root (run rvbpfd with sudo)");
    }
  } else if (std::optional<UserIds> invoker = SudoInvoker(env, euid)) {
    account = db.by_uid(invoker->uid);
    if (!account) {
      // A uid without a passwd entry (e.g. from a container's sudo): its ids, no supplementary groups.
      LaunchIdentity id;
      id.uid = invoker->uid;
      id.gid = invoker->gid;
      id.groups = {invoker->gid};
      return std::optional<LaunchIdentity>(std::move(id));
    }
    account->gid = invoker->gid;  // sudo's record of the invoker's primary group wins over the passwd default
  } else {
    return std::optional<LaunchIdentity>();
  }
  LaunchIdentity id;
  id.uid = account->uid;
  id.gid = account->gid;
  id.groups = db.groups(account->name, account->gid);
  id.user = account->name;
  id.home = account->home;
  id.shell = account->shell;
  return std::optional<LaunchIdentity>(std::move(id));
}

std::vector<std::string> LaunchEnvironment(const std::vector<std::string>& env, const LaunchIdentity& identity) {
  std::vector<std::pair<std::string, std::string>> set;
  if (!identity.home.empty()) set.emplace_back("HOME", identity.home);
  if (!identity.user.empty()) {
    set.emplace_back("USER", identity.user);
    set.emplace_back("LOGNAME", identity.user);
  }
  if (!identity.shell.empty()) set.emplace_back("SHELL", identity.shell);
  std::vector<std::string> out;
  for (const std::string& kv : env) {
    const std::string name = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const auto& [n, v] : set) replaced |= n == name;
    if (!replaced) out.push_back(kv);
  }
  for (const auto& [n, v] : set) out.push_back(n + "=" + v);
  return out;
}

Result<LaunchPlan> PlanLaunch(const std::vector<std::string>& argv, const std::string& path_env,
                              const std::string& ld_library_path) {
  if (argv.empty()) return Error(ErrorCode::kUsage, "no command given after --");
  LaunchPlan plan;
  plan.executable = LookupInPath(argv[0], path_env);
  if (plan.executable.empty() || !IsExecutableFile(plan.executable)) {
    return Error(ErrorCode::kUsage, "command not found or not executable: " + argv[0]);
  }
  std::string elf_path = plan.executable;
  // One level of #!: scripts such as bin/rails or `bundle` name their interpreter there.
  {
    std::ifstream in(elf_path, std::ios::binary);
    char magic[2] = {0, 0};
    in.read(magic, 2);
    if (in && magic[0] == '#' && magic[1] == '!') {
      std::string line;
      std::getline(in, line);
      std::istringstream words(line);
      std::string interp, arg;
      words >> interp >> arg;
      if (interp == "/usr/bin/env" && !arg.empty()) interp = LookupInPath(arg, path_env);
      if (interp.empty() || !IsExecutableFile(interp)) {
        return Error(ErrorCode::kNotRuby, plan.executable + ": its #! interpreter '" + line + "' was not found");
      }
      elf_path = interp;
    }
  }
  Result<ElfFile> exe = ElfFile::Open(elf_path);
  if (!exe) return Error(ErrorCode::kNotRuby, elf_path + " is not a CRuby executable: " + exe.error().message());
  if (auto sym = exe->FindSymbol("ruby_version"); sym && sym->shndx != SHN_UNDEF) {
    plan.vm_path = elf_path;
    plan.vm_is_shared_library = false;
    plan.vm_elf = std::make_shared<ElfFile>(std::move(*exe));
    return plan;
  }
  std::vector<std::string> needed, rpath, runpath;
  ReadDynamic(*exe, &needed, &rpath, &runpath);
  std::string libruby;
  for (const std::string& n : needed) {
    if (n.rfind("libruby", 0) == 0) libruby = n;
  }
  if (libruby.empty()) {
    return Error(ErrorCode::kNotRuby, elf_path + " neither defines ruby_version nor links libruby: not CRuby");
  }
  // ld.so's order: DT_RPATH (only without DT_RUNPATH), LD_LIBRARY_PATH, DT_RUNPATH, then the system directories. An
  // LD_LIBRARY_PATH naming another libruby (a copy, another build) wins over the executable's RUNPATH.
  std::vector<std::string> search;
  if (runpath.empty()) search = rpath;
  for (const std::string& dir : SplitPath(ld_library_path)) search.push_back(dir);
  search.insert(search.end(), runpath.begin(), runpath.end());
  for (std::string& dir : search) {
    size_t pos = dir.find("$ORIGIN");
    if (pos != std::string::npos) dir.replace(pos, 7, Dirname(elf_path));
  }
  for (const char* dir : {"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib",
                          "/usr/lib", "/usr/local/lib"}) {
    search.push_back(dir);
  }
  for (const std::string& dir : search) {
    std::string candidate = dir + "/" + libruby;
    if (access(candidate.c_str(), R_OK) == 0) {
      char resolved[PATH_MAX];
      plan.vm_path = realpath(candidate.c_str(), resolved) ? resolved : candidate;
      plan.vm_is_shared_library = true;
      return plan;
    }
  }
  return Error(ErrorCode::kNotRuby, elf_path + " needs " + libruby +
                                        " but it was not found in its RUNPATH, LD_LIBRARY_PATH or the system library "
                                        "directories; attach with --pid instead");
}

Result<HeldChild> HeldChild::Spawn(const std::vector<std::string>& argv,
                                   const std::optional<LaunchIdentity>& identity) {
  if (argv.empty()) return Error(ErrorCode::kUsage, "no command given after --");
  // Everything the child needs is built here: between fork and exec only async-signal-safe calls.
  std::vector<std::string> env_strings;
  std::vector<char*> cenv;
  if (identity) {
    std::vector<std::string> current;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) current.emplace_back(*e);
    env_strings = LaunchEnvironment(current, *identity);
    for (std::string& kv : env_strings) cenv.push_back(kv.data());
    cenv.push_back(nullptr);
  }
  int gate[2], err_pipe[2];
  if (pipe2(gate, O_CLOEXEC) != 0) return Error(ErrorCode::kIo, ErrnoMessage("creating the launch gate pipe", errno));
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(gate[0]);
    close(gate[1]);
    return Error(ErrorCode::kIo, ErrnoMessage("creating the exec status pipe", errno));
  }
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(gate[0]);
    close(gate[1]);
    close(err_pipe[0]);
    close(err_pipe[1]);
    return Error(ErrorCode::kIo, ErrnoMessage("fork for the launched command", e));
  }
  if (pid == 0) {
    // Child: wait at the gate. Only async-signal-safe calls until exec.
    close(gate[1]);
    close(err_pipe[0]);
    char go = 0;
    ssize_t n;
    do {
      n = read(gate[0], &go, 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1 || go != 'g') _exit(127);  // the daemon gave up: never run unobserved
    close(gate[0]);
    auto report = [&](int step) {
      const int msg[2] = {step, errno};
      ssize_t w = write(err_pipe[1], msg, sizeof(msg));
      (void)w;
      _exit(127);
    };
    if (identity) {
      // Groups first (needs root), then the gid, then the uid (after which nothing can be regained); each checked,
      // so the command never runs with a half-dropped identity.
      if (setgroups(identity->groups.size(), identity->groups.data()) != 0) report(kStepSetgroups);
      if (setgid(identity->gid) != 0) report(kStepSetgid);
      if (setuid(identity->uid) != 0) report(kStepSetuid);
      if (identity->uid != 0 && (setuid(0) == 0 || geteuid() != identity->uid)) {
        errno = EPERM;
        report(kStepSetuid);
      }
      execvpe(cargv[0], cargv.data(), cenv.data());
    } else {
      execvp(cargv[0], cargv.data());
    }
    report(kStepExec);
  }
  close(gate[0]);
  close(err_pipe[1]);
  HeldChild child;
  child.pid_ = pid;
  child.gate_fd_ = gate[1];
  child.exec_err_fd_ = err_pipe[0];
  return child;
}

HeldChild::HeldChild(HeldChild&& other) noexcept
    : pid_(other.pid_), gate_fd_(other.gate_fd_), exec_err_fd_(other.exec_err_fd_), released_(other.released_),
      reaped_(other.reaped_) {
  other.pid_ = -1;
  other.gate_fd_ = -1;
  other.exec_err_fd_ = -1;
}

HeldChild::~HeldChild() {
  if (gate_fd_ >= 0) close(gate_fd_);  // EOF at the gate: an unreleased child exits without exec
  if (exec_err_fd_ >= 0) close(exec_err_fd_);
  if (pid_ > 0 && !reaped_) {
    if (!released_) {
      int status;
      waitpid(pid_, &status, 0);
    }
    // A released child keeps running after rvbpfd stops (e.g. on Ctrl-C it got the signal itself); not our business
    // to kill a program the user launched.
  }
}

Status HeldChild::Release() {
  char go = 'g';
  if (write(gate_fd_, &go, 1) != 1) return Error(ErrorCode::kIo, ErrnoMessage("releasing the launched command", errno));
  close(gate_fd_);
  gate_fd_ = -1;
  released_ = true;
  int msg[2] = {0, 0};  // {ChildStep, errno}
  ssize_t n;
  do {
    n = read(exec_err_fd_, msg, sizeof(msg));
  } while (n < 0 && errno == EINTR);
  close(exec_err_fd_);
  exec_err_fd_ = -1;
  if (n == sizeof(msg)) {
    int status;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    if (msg[0] == kStepExec) return Error(ErrorCode::kUsage, ErrnoMessage(ChildStepName(msg[0]), msg[1]));
    return Error(ErrorCode::kNoPrivilege, ErrnoMessage(ChildStepName(msg[0]), msg[1]) + "; " +
                                              PrivilegeHint({kCapSetgid, kCapSetuid}) + " (or --user root)");
  }
  return Status::Ok();
}

bool HeldChild::Reap(int* wait_status) {
  if (reaped_) return true;
  pid_t r = waitpid(pid_, wait_status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    return true;
  }
  return false;
}

}  // namespace rvbpfd
