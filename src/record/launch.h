// Launch mode: find the CRuby VM binary a command will run before it runs (the uprobes must be attached before its
// first Ruby instruction), and start the command held at a gate until the probes are live.
#ifndef RVBPFD_SRC_RECORD_LAUNCH_H_
#define RVBPFD_SRC_RECORD_LAUNCH_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/invoking_user.h"
#include "elf/elf_file.h"

namespace rvbpfd {

struct LaunchPlan {
  std::string executable;       // absolute path that will be exec'd (after PATH lookup and #! resolution)
  std::string vm_path;          // the ELF holding the VM: the executable itself (static) or its libruby.so
  bool vm_is_shared_library = false;
  // The VM binary as parsed while planning, when it is the executable itself (a static ruby); null for a libruby,
  // which planning only locates.
  std::shared_ptr<ElfFile> vm_elf;
};

// Resolves argv[0] through PATH, follows one level of `#!` (including `#!/usr/bin/env ruby`), and finds the ELF that
// holds the VM: the executable if it defines `ruby_version`, else its DT_NEEDED libruby found through DT_RUNPATH /
// DT_RPATH ($ORIGIN expanded), LD_LIBRARY_PATH and the system library directories. Errors: kNotRuby (with what was
// found), kNoSuchProcess is never used here; a missing command is kUsage.
Result<LaunchPlan> PlanLaunch(const std::vector<std::string>& argv, const std::string& path_env,
                              const std::string& ld_library_path);

// A user account as the passwd database has it.
struct UserAccount {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  std::string home;
  std::string shell;
};

// The account and group databases (getpwnam_r, getpwuid_r, getgrouplist in production; fakes in tests).
struct UserDatabase {
  std::function<std::optional<UserAccount>(const std::string& name)> by_name;
  std::function<std::optional<UserAccount>(uid_t uid)> by_uid;
  // Supplementary groups of `name`, `gid` included (what initgroups would set).
  std::function<std::vector<gid_t>(const std::string& name, gid_t gid)> groups;
};
UserDatabase SystemUserDatabase();

// Who the launched command runs as, decided before fork: the child switches to it after the probes are attached
// and before execve.
struct LaunchIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, replacing root's
  std::string user;           // for USER/LOGNAME; empty when the uid has no passwd entry
  std::string home;           // for HOME; empty: left as it is
  std::string shell;          // for SHELL; empty: left as it is
};

// `user_flag` is --user: a user name or a numeric uid ("" when not given). The rule:
//   - --user given: that user (root only if named: --user root or --user 0); needs root unless it is oneself;
//   - else, root under sudo (SUDO_UID/SUDO_GID): the invoking user, so `sudo rvbpfd -- ruby app.rb` never runs
//     app.rb as root;
//   - else: nullopt, the command keeps rvbpfd's own identity (root when run as root without sudo).
// Errors are kUsage (unknown user) or kNoPrivilege (switching users without root).
Result<std::optional<LaunchIdentity>> DecideLaunchIdentity(const std::string& user_flag, const EnvLookup& env,
                                                           uid_t euid, const UserDatabase& db);

// The environment the command gets: `env` (NAME=VALUE entries) with HOME, USER, LOGNAME and SHELL set to the
// identity's where it has them (sudo leaves root's there).
std::vector<std::string> LaunchEnvironment(const std::vector<std::string>& env, const LaunchIdentity& identity);

// A forked child that waits at a gate before exec. Release() lets it exec; the destructor kills and reaps a child
// that was never released (so a failed attach never leaves the program running unobserved).
class HeldChild {
 public:
  // With `identity`, the child sets its groups, gid and uid to it (in that order, checking each) once released and
  // before execve, with LaunchEnvironment's environment; a failure is reported by Release like a failed exec.
  static Result<HeldChild> Spawn(const std::vector<std::string>& argv,
                                 const std::optional<LaunchIdentity>& identity = std::nullopt);
  HeldChild(HeldChild&& other) noexcept;
  HeldChild& operator=(HeldChild&&) = delete;
  HeldChild(const HeldChild&) = delete;
  ~HeldChild();

  pid_t pid() const { return pid_; }
  // Lets the child exec. Returns an error if exec (or dropping privileges) failed: the child reports the step and
  // errno through a CLOEXEC pipe.
  Status Release();
  // Non-blocking: true once the child has exited; fills its wait status.
  bool Reap(int* wait_status);

 private:
  HeldChild() = default;
  pid_t pid_ = -1;
  int gate_fd_ = -1;      // write end: closing it (or writing) releases the child
  int exec_err_fd_ = -1;  // read end: gets errno if execvp failed, EOF on success
  bool released_ = false;
  bool reaped_ = false;
};

}  // namespace rvbpfd

#endif  // RVBPFD_SRC_RECORD_LAUNCH_H_
